"""Prefect flows: the search and knowledge ingestion; later open-ended design,
supernet training and benchmark regression."""

from nas.workspace import configure_prefect_env

configure_prefect_env()

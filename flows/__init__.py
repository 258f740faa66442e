"""Prefect flows: the search (this issue), and later knowledge ingestion,
open-ended design, supernet training and benchmark regression."""

from nas.workspace import configure_prefect_env

configure_prefect_env()

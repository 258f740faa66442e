"""Prefect tasks: thin, cached, retryable wrappers over `nas` functions."""

from nas.workspace import configure_prefect_env

configure_prefect_env()

"""Prefect tasks: thin, cached, retryable wrappers over `nas` functions."""

from nas.secrets import install_log_scrubbing
from tasks.env import configure_prefect_env

configure_prefect_env()
install_log_scrubbing()  # also in task worker processes (runner=processes, dask, ray), which skip `nas.cli.main`

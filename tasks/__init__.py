"""Prefect tasks: thin, cached, retryable wrappers over `nas` functions.

Importing them changes no setting: an entry point that runs flows calls
`tasks.env.configure_prefect_env()` before Prefect is first imported (the CLI's search, serve and
ingest commands, the tests' conftest, the benchmarks), and each task installs the log scrubbing
itself (`install_log_scrubbing`), so it holds in task worker processes too."""

"""Prefect flows, each stage a cached, retryable task: search (`search`, and
`entry` from Hydra overrides), knowledge ingestion (`knowledge`), supernet
training (`supernet`), benchmark regression (`regression`); `serve` serves
prefect.yaml's deployments of them (`nas serve`); `artifacts` is what a search shows in the UI.

Importing them changes no setting: call `tasks.env.configure_prefect_env()` first (before
Prefect is imported), as the CLI does, so Prefect's home and the evaluation cache are under
NASFLOW_HOME."""

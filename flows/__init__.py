"""Prefect flows, each stage a cached, retryable task: search (`search`, and
`entry` from Hydra overrides), knowledge ingestion (`knowledge`), supernet
training (`supernet`), benchmark regression (`regression`); `serve` serves
prefect.yaml's deployments of them (`nas serve`); `artifacts` is what a search shows in the UI."""

from tasks.env import configure_prefect_env

configure_prefect_env()

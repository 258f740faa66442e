"""Prefect flows, each stage a cached, retryable task: search (`search`, and
`entry` from Hydra overrides), knowledge ingestion (`knowledge`), supernet
training (`supernet`), benchmark regression (`regression`); `deployments` reads
prefect.yaml's deployments of them and serves them (`nas serve`); `prefect_server` is the Prefect
server a command talks to, `shared_server` the local one the commands share; `task_runners` builds
the flow's Prefect task runner from the `runner` group; `artifacts` is what a search shows in the UI.

Importing them changes no setting: call `tasks.env.configure_prefect_env()` first (before
Prefect is imported), as the CLI does, so Prefect's home and the evaluation cache are under
NASFLOW_HOME."""

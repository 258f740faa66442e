"""Flows started with Hydra overrides, as `nas` takes them on the command line, so
any search or ingestion can be launched from the Prefect UI or `prefect
deployment run` with nothing but a list of strings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

RUN_DIR = "hydra.run.dir="


def compose(overrides: list[str]) -> dict[str, Any]:
    """`nas.cli.compose_config`, with an unknown group option named in one line as the CLI does."""
    from nas.cli import compose_config, validate_group_overrides

    validate_group_overrides(overrides)
    return compose_config(overrides)


@flow(name="nas-search-overrides", persist_result=False)
def search_overrides_flow(overrides: list[str] | None = None, root: str = "runs") -> dict[str, Any]:
    """Any `nas search` (table, supernet, open-ended design) under the chosen runner;
    writes to `hydra.run.dir=DIR` when given (resuming a run there), else ROOT/<flow run name>."""
    from nas.cli import execute
    from nas.search.spec import SearchSpec

    overrides = list(overrides or [])
    dirs = [o[len(RUN_DIR):] for o in overrides if o.startswith(RUN_DIR)]
    cfg = compose([o for o in overrides if not o.startswith(RUN_DIR)])
    run_dir = Path(dirs[-1] if dirs else Path(root) / flow_run.get_name()).resolve()
    summary = execute(SearchSpec.from_config(cfg), run_dir, cfg.get("runner") or {}, progress=False)
    return {"run_dir": str(run_dir), **summary}


@flow(name="nas-ingest-overrides", persist_result=False)
def ingest_overrides_flow(paths: list[str] | None = None, overrides: list[str] | None = None,
                          out: str | None = None) -> dict[str, Any]:
    """`nas knowledge ingest PATHS [overrides] --prefect`; no paths reads the built-in corpus."""
    from flows.knowledge import ingest_flow
    from nas.knowledge.config import KnowledgeConfig
    from nas.llm import LLMConfig

    cfg = compose(list(overrides or []))
    settings = {"llm": cfg["llm"], "knowledge": cfg["knowledge"]}
    LLMConfig.from_dict(settings["llm"])  # bad settings fail before any paper is read
    KnowledgeConfig.from_dict(settings["knowledge"])
    return ingest_flow(settings, list(paths or []), out)

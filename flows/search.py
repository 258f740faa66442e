"""The search flow: drives ask → evaluate (cached tasks) → tell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from nas.search.loop import SearchLoop
from nas.search.spec import SearchSpec
from tasks.evaluate import PrefectExecutor
from tasks.llm import prefect_calls


@flow(name="nas-search", persist_result=False, validate_parameters=False)
def search_flow(spec: dict[str, Any], run_dir: str, retries: int = 1,
                progress: bool = True) -> dict[str, Any]:
    search = SearchSpec.from_dict(spec)
    space = search.build_space()
    executor = PrefectExecutor(search, search.build_evaluator(space), retries)
    loop = SearchLoop(search, Path(run_dir), executor, progress=progress, runner="prefect",
                      llm_calls=prefect_calls)
    return loop.run_search()


def run_search_flow(spec: SearchSpec, run_dir: Path, *, workers: int, retries: int,
                    progress: bool) -> dict[str, Any]:
    named = search_flow.with_options(
        task_runner=ThreadPoolTaskRunner(max_workers=workers),
        flow_run_name=f"{spec.strategy.name}-{spec.space.name}-{spec.evaluator.name}-s{spec.seed}",
    )
    return named(spec.to_dict(), str(run_dir), retries, progress)

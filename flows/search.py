"""The search flow: drives ask → evaluate (cached tasks) → tell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.runners import build_task_runner, shared_api
from nas.search.loop import SearchLoop
from nas.search.spec import SearchSpec
from tasks.evaluate import PrefectExecutor
from tasks.llm import prefect_calls


@flow(name="nas-search", persist_result=False, validate_parameters=False)
def search_flow(spec: dict[str, Any], run_dir: str, retries: int = 1,
                progress: bool = True, runner: str = "prefect") -> dict[str, Any]:
    search = SearchSpec.from_dict(spec)
    space = search.build_space()
    executor = PrefectExecutor(search, search.build_evaluator(space), retries)
    loop = SearchLoop(search, Path(run_dir), executor, progress=progress, runner=runner,
                      llm_calls=prefect_calls)
    return loop.run_search()


def run_search_flow(spec: SearchSpec, run_dir: Path, *, progress: bool, retries: int = 1, workers: int = 4,
                    runner: dict[str, Any] | None = None) -> dict[str, Any]:
    """`runner` (the config group's dict) picks the task runner: threads, processes,
    Dask or Ray; without one, a thread pool of `workers`."""
    runner = runner or {"name": "prefect", "workers": workers}
    named = search_flow.with_options(
        task_runner=build_task_runner(runner),
        flow_run_name=f"{spec.strategy.name}-{spec.space.name}-{spec.evaluator.name}-s{spec.seed}",
    )
    with shared_api(runner):
        return named(spec.to_dict(), str(run_dir), retries, progress, runner.get("name", "prefect"))

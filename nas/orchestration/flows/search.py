"""The search flow: drives ask → evaluate (cached tasks) → tell, and publishes the
search's report, top trials and progress as artifacts (nas/orchestration/flows/artifacts.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from nas.orchestration.flows.artifacts import SearchArtifacts
from nas.orchestration.flows.runners import build_task_runner, shared_api
from nas.report import write_run_report
from nas.search.loop import SearchLoop, trusts_self_reported
from nas.search.spec import SearchSpec
from nas.orchestration.tasks.evaluate import PrefectExecutor
from nas.orchestration.tasks.llm import prefect_calls


@flow(name="nas-search", persist_result=False, validate_parameters=False)
def search_flow(spec: dict[str, Any], run_dir: str, retries: int = 1,
                progress: bool = True, runner: str = "prefect") -> dict[str, Any]:
    search = SearchSpec.from_dict(spec)
    space = search.build_space()
    executor = PrefectExecutor(search, search.build_evaluator(space), retries)
    artifacts = SearchArtifacts(run_name(search), search.trials, trusts_self_reported(search))
    artifacts.start()
    loop = SearchLoop(search, Path(run_dir), executor, progress=progress, runner=runner,
                      llm_calls=prefect_calls, on_batch=artifacts.on_batch)
    summary = loop.run_search()
    write_run_report(Path(run_dir), summary)
    artifacts.finish(Path(run_dir), summary)
    return summary


def run_name(spec: SearchSpec) -> str:
    """`<strategy>-<space>-s<seed>`: the flow run's name in the UI, and a deployment run's dir."""
    return f"{spec.strategy.name}-{spec.space.name}-s{spec.seed}"


def run_search_flow(spec: SearchSpec, run_dir: Path, *, progress: bool, retries: int = 1, workers: int = 4,
                    runner: dict[str, Any] | None = None) -> dict[str, Any]:
    """`runner` (the config group's dict) picks the task runner: threads, processes,
    Dask or Ray; without one, a thread pool of `workers`."""
    runner = runner or {"name": "prefect", "workers": workers}
    named = search_flow.with_options(
        task_runner=build_task_runner(runner),
        flow_run_name=run_name(spec),
    )
    with shared_api(runner):
        return named(spec.to_dict(), str(run_dir), retries, progress, runner.get("name", "prefect"))

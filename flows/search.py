"""The search flow: drives ask → evaluate (cached tasks) → tell, and publishes the
search's report, top trials and progress as artifacts (flows/artifacts.py). Started inside
another flow run (a deployment's `nas-search-overrides`), the search runs as that run, not as a
nested one: the runs list then shows one run per search, holding its task runs and artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from prefect.context import FlowRunContext, TaskRunContext
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from flows.artifacts import SearchArtifacts
from flows.placement import open_executor
from flows.runners import build_task_runner, shared_api
from nas.execute import RUNNERS, SearchRunner
from nas.report import RunReport
from nas.search.loop import SearchLoop, trusts_self_reported
from nas.search.spec import Search, SearchSpec
from tasks.llm import prefect_calls


@flow(name="nas-search", persist_result=False, validate_parameters=False)
def search_flow(spec: dict[str, Any], run_dir: str, retries: int = 1,
                progress: bool = True, runner: str = "prefect",
                runner_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    built = Search.of(SearchSpec.from_dict(spec))  # the caller's parts when it runs in this process
    search, evaluator = built.spec, built.evaluator
    executor = open_executor(runner_settings or {"name": runner}, search, evaluator, retries)
    artifacts = SearchArtifacts(run_name(search), search.trials, trusts_self_reported(search))
    artifacts.start()
    loop = SearchLoop(search, Path(run_dir), executor, progress=progress, runner=runner,
                      llm_calls=prefect_calls, on_batch=artifacts.on_batch,
                      evaluator_fingerprint=evaluator.fingerprint(), search=built)
    try:
        summary = loop.run_search()
    finally:  # stopped by an interrupt or an error: what still runs is cancelled (resume re-queues it)
        executor.close()
    report = RunReport(Path(run_dir), summary)  # plotted in a child process, alongside the artifacts
    try:
        artifacts.finish(Path(run_dir), summary)
    finally:
        report.wait()
    ui = url_for("flow-run", obj_id=flow_run.get_id())  # None on Prefect's temporary server: it has no UI
    return summary | ({"ui": ui} if ui else {})


def run_name(spec: SearchSpec) -> str:
    """`<strategy>-<space>-s<seed>`: the flow run's name in the UI, and a deployment run's dir."""
    return f"{spec.strategy.name}-{spec.space.name}-s{spec.seed}"


def run_search_flow(spec: SearchSpec | Search, run_dir: Path, *, progress: bool, retries: int = 1,
                    workers: int = 4, runner: dict[str, Any] | None = None) -> dict[str, Any]:
    """`runner` (the config group's dict) picks the task runner: threads, processes,
    Dask or Ray; without one, a thread pool of `workers`. A built `Search` is handed to the flow."""
    if isinstance(spec, Search):
        spec.ready()
        spec = spec.spec
    runner = runner or {"name": "prefect", "workers": workers}
    args = (spec.to_dict(), str(run_dir), retries, progress, runner.get("name", "prefect"), dict(runner))
    with shared_api(runner, show=progress):
        context = FlowRunContext.get()
        if context is None or TaskRunContext.get() is not None:  # a task's search stays its own flow run
            return search_flow.with_options(task_runner=build_task_runner(runner), flow_run_name=run_name(spec))(*args)
        # in a flow run already: its body, with this search's task runner, so the tasks are that run's
        with build_task_runner(runner) as task_runner, context.model_copy(update={"task_runner": task_runner}):
            return search_flow.fn(*args)


class FlowRunner(SearchRunner):
    """The search as the `nas-search` flow, its evaluations tasks of the configured task
    runner (flows/runners.py); the flow takes over the built search (`Search.of`)."""

    def run(self, search: Search, run_dir: Path, progress: bool) -> dict[str, Any]:
        return run_search_flow(search, run_dir, runner=self.settings, retries=int(self.settings.get("retries", 1)),
                               progress=progress)


@RUNNERS.register("prefect")
class ThreadsFlowRunner(FlowRunner):
    """Evaluations on a thread pool of `workers`."""


@RUNNERS.register("processes")
class ProcessesFlowRunner(FlowRunner):
    """Evaluations in a pool of `workers` processes."""


@RUNNERS.register("dask")
class DaskFlowRunner(FlowRunner):
    """Evaluations on a local Dask cluster or a scheduler's (`address`)."""


@RUNNERS.register("ray")
class RayFlowRunner(FlowRunner):
    """Evaluations on a local Ray or a cluster's (`address`)."""

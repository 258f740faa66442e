"""The search flow: drives ask → evaluate (cached tasks) → tell, and publishes the
search's report, top trials and progress as artifacts (flows/artifacts.py). Started inside
another flow run (a deployment's `nas-search-overrides`), the search runs as that run, not as a
nested one: the runs list then shows one run per search, holding its task runs and artifacts."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from prefect import Flow, flow
from prefect.context import FlowRunContext, TaskRunContext
from prefect.runtime import flow_run
from prefect.utilities.urls import url_for

from flows.artifacts import SearchArtifacts
from flows.heartbeat import heartbeats, quick_heartbeats
from flows.placement import open_executor
from flows.task_runners import build_task_runner, shared_api
from nas.execute import RUNNERS, SearchRunner
from nas.report import RunReport
from nas.search.loop import SearchLoop, trusts_self_reported
from nas.search.session import Session
from nas.search.spec import SearchSpec
from tasks.llm import prefect_calls

# The session a `FlowRunner` hands to the flow it calls in this process, set for that one call:
# the flow's parameters are data (a flow run's must serialise), its held run dir and built parts
# are not. A flow run without one (a library call, a run elsewhere) opens its own.
_HANDED: ContextVar[Session | None] = ContextVar("nas_search_session", default=None)


class PlainParametersFlow(Flow[Any, Any]):
    """A flow whose parameters, when they are JSON data (dicts, lists, tuples, strings, numbers,
    booleans, None), are sent to the API as such, as Prefect's encoder gives them (tuples as lists);
    Prefect's own serialisation imports FastAPI for that encoder, a tenth of a second of every
    search's start. Anything else goes to Prefect's. `with_options` keeps the class."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        try:
            return {key: json_data(value) for key, value in parameters.items()}
        except TypeError:
            return super().serialize_parameters(parameters)

    def with_options(self, **options: Any) -> PlainParametersFlow:
        copy = super().with_options(**options)
        copy.__class__ = PlainParametersFlow  # Prefect's copy is a plain Flow
        return copy  # type: ignore[return-value]


def json_data(value: Any) -> Any:
    """`value` as JSON data, as FastAPI's `jsonable_encoder` gives it; TypeError for anything else."""
    if value is None or type(value) in (str, int, float, bool):  # exactly: an Enum's member is its value there
        return value
    if type(value) in (list, tuple):
        return [json_data(v) for v in value]
    if type(value) is dict and all(type(k) is str for k in value):
        return {k: json_data(v) for k, v in value.items()}
    raise TypeError(f"not JSON data: {type(value).__name__}")


def plain_parameters(flow_: Flow[Any, Any]) -> PlainParametersFlow:
    flow_.__class__ = PlainParametersFlow
    return flow_  # type: ignore[return-value]


@plain_parameters
@flow(name="nas-search", persist_result=False, validate_parameters=False)
def search_flow(spec: dict[str, Any], run_dir: str, retries: int = 1,
                progress: bool = True, runner: str = "prefect",
                runner_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    with _session(SearchSpec.from_dict(spec), Path(run_dir)) as session, heartbeats():
        return _search(session, retries, progress, runner, runner_settings)


@contextmanager
def _session(spec: SearchSpec, run_dir: Path) -> Iterator[Session]:
    """The session handed over for this call, else one opened here. Not in the flow's body: a
    Dask or Ray task runner pickles the flow (its function by value, with the globals it names)
    for each task it sends, and a ContextVar does not pickle."""
    handed = _HANDED.get()
    if handed is not None and handed.run.path == run_dir and handed.search.spec == spec:
        yield handed
        return
    with Session.open(spec.build(), run_dir) as session:
        yield session


def _search(session: Session, retries: int, progress: bool, runner: str,
            runner_settings: dict[str, Any] | None) -> dict[str, Any]:
    """The flow's body, on its session."""
    search, evaluator, run_dir = session.search.spec, session.search.evaluator, session.run.path
    executor = open_executor(runner_settings or {"name": runner}, search, evaluator, retries)
    artifacts = SearchArtifacts(run_name(search), search.trials, trusts_self_reported(search))
    artifacts.start()
    loop = SearchLoop.of(session, executor, progress=progress, runner=runner, llm_calls=prefect_calls,
                         on_batch=artifacts.on_batch, evaluator_fingerprint=evaluator.fingerprint())
    report = RunReport.start(run_dir)  # its child imports matplotlib while the search runs
    try:
        summary = loop.run_search()
    except BaseException:
        report.discard()
        raise
    finally:  # stopped by an interrupt or an error: what still runs is cancelled (resume re-queues it)
        executor.close()
    report.send(summary)  # plotted in the child, alongside the artifacts
    try:
        artifacts.finish(run_dir, summary)
    finally:
        report.wait()
    ui = url_for("flow-run", obj_id=flow_run.get_id())  # None on Prefect's temporary server: it has no UI
    return summary | ({"ui": ui} if ui else {})


def run_name(spec: SearchSpec) -> str:
    """`<strategy>-<space>-s<seed>`: the flow run's name in the UI, and a deployment run's dir."""
    return f"{spec.strategy.name}-{spec.space.name}-s{spec.seed}"


def run_search_flow(spec: SearchSpec, run_dir: Path, *, progress: bool, retries: int, workers: int = 4,
                    runner: dict[str, Any] | None = None, session: Session | None = None) -> dict[str, Any]:
    """`runner` (the config group's dict) picks the task runner: threads, processes,
    Dask or Ray; without one, a thread pool of `workers`. `session`: the caller's opened search
    (`spec` in `run_dir`, held and read), which the flow runs instead of opening its own."""
    runner = runner or {"name": "prefect", "workers": workers}
    args = (spec.to_dict(), str(run_dir), retries, progress, runner.get("name", "prefect"), dict(runner))
    handed = _HANDED.set(session)
    try:
        with shared_api(runner, show=progress):
            context = FlowRunContext.get()
            if context is None or TaskRunContext.get() is not None:  # a task's search stays its own flow run
                with quick_heartbeats():  # the run's end waits for no heartbeat thread's second
                    return search_flow.with_options(task_runner=build_task_runner(runner),
                                                    flow_run_name=run_name(spec))(*args)
            # in a flow run already: its body, with this search's task runner, so the tasks are that run's
            with build_task_runner(runner) as task_runner, context.model_copy(update={"task_runner": task_runner}):
                return search_flow.fn(*args)
    finally:
        _HANDED.reset(handed)


class FlowRunner(SearchRunner):
    """The search as the `nas-search` flow, its evaluations tasks of the configured task
    runner (flows/task_runners.py); the flow runs the session it is handed."""

    def run(self, session: Session, progress: bool) -> dict[str, Any]:
        return run_search_flow(session.search.spec, session.run.path, runner=self.settings,
                               retries=int(self.settings.get("retries", 1)), progress=progress, session=session)


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

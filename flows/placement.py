"""Where each evaluation task runs on a cluster: its share of a GPU (a Dask `GPU` resource
annotation, Ray `num_gpus`, fractional when `runner.per_gpu` packs small models) and, on Ray,
how often it is re-run when its worker dies (Dask: the scheduler's `allowed-failures`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from prefect.context import FlowRunContext
from prefect.task_runners import TaskRunner

from flows.task_runners import count_setting, positive_setting
from nas.evaluators.base import Evaluator
from nas.search.spec import SearchSpec
from tasks.evaluate import PrefectExecutor


@dataclass(frozen=True)
class Placement:
    engine: str  # "dask", "ray", or "" (threads, processes: nothing to place)
    gpu_share: float | None  # of one GPU, per evaluation; None: the cluster has no GPUs, ask for none
    max_retries: int  # Ray: re-runs of a task whose worker died

    def __call__(self) -> AbstractContextManager[Any]:
        """The context each evaluation is submitted in."""
        if self.engine == "dask" and self.gpu_share is not None:
            import dask  # lazy: loads dask (start-up time)

            return dask.annotate(resources={"GPU": self.gpu_share})
        if self.engine == "ray":
            from prefect_ray.context import remote_options  # lazy: loads prefect_ray (start-up time)

            gpus = {} if self.gpu_share is None else {"num_gpus": self.gpu_share}
            return remote_options(max_retries=self.max_retries, **gpus)
        return nullcontext()


def cluster_gpus(task_runner: TaskRunner) -> float:
    """GPUs the started task runner's cluster offers (local or at `address`): 0 for threads/processes."""
    kind = type(task_runner).__name__
    if kind == "DaskTaskRunner":
        workers = task_runner.client.scheduler_info(n_workers=-1)["workers"].values()  # type: ignore[attr-defined]
        return float(sum(w.get("resources", {}).get("GPU", 0) for w in workers))
    if kind == "RayTaskRunner":
        import ray  # lazy: loads ray (start-up time)

        return float(ray.cluster_resources().get("GPU", 0))
    return 0.0


def placement_for(runner: dict[str, Any], task_runner: TaskRunner) -> Placement | Callable[[], Any]:
    """Asks the cluster for GPUs only when it has some, so one config serves CPU and GPU clusters."""
    engine = {"DaskTaskRunner": "dask", "RayTaskRunner": "ray"}.get(type(task_runner).__name__, "")
    if not engine:
        return nullcontext
    per_gpu = positive_setting(runner, "per_gpu", 1)
    share = 1.0 / per_gpu if cluster_gpus(task_runner) > 0 else None
    return Placement(engine, share, count_setting(runner, "max_retries", 2))


def open_executor(runner: dict[str, Any], spec: SearchSpec, evaluator: Evaluator, retries: int,
                  cached: bool = True) -> PrefectExecutor:
    """The flow's executor, placing evaluations on the flow's (started) task runner; call inside the flow.
    `cached=False`: every evaluation runs, none is served from Prefect's cache (benchmarks)."""
    context = FlowRunContext.get()
    if context is None:
        raise RuntimeError("open_executor: call it inside a flow run (it uses the flow's task runner)")
    return PrefectExecutor(spec, evaluator, retries, placement_for(runner, context.task_runner), cached)

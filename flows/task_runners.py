"""The flow's Prefect task runner, built from the `runner` config group, so one
search scales from a thread pool to processes, a Dask cluster or Ray without
code changes: evaluations are tasks, and the task runner decides where they run."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker
from typing import Any

from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from flows.prefect_server import prefect_api
from nas.errors import ConfigError, MissingDependencyError
from nas.search.slots import assign_slots, visible_gpus

FLOW_RUNNERS = ("prefect", "processes", "dask", "ray")


def build_task_runner(runner: dict[str, Any], gpus: list[str] | None = None) -> TaskRunner:
    """`runner` is the config group's dict; raises a one-line error before any work starts.
    `gpus`: the devices a local cluster gets (default: this machine's, `visible_gpus`)."""
    name = runner.get("name", "prefect")
    if name == "prefect":
        return ThreadPoolTaskRunner(max_workers=positive_setting(runner, "workers", 4))
    if name == "processes":
        return InterruptibleProcessPool(max_workers=positive_setting(runner, "workers", 2))
    if name == "dask":
        # distributed logs each worker's start and stop at INFO; read when it is first imported.
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        try:
            from prefect_dask import DaskTaskRunner  # lazy: an optional extra, refused in one line when missing
        except ImportError:
            raise MissingDependencyError("runner=dask needs prefect-dask: pip install prefect-dask==0.3.7") from None
        max_retries = count_setting(runner, "max_retries", 2)
        per_gpu = positive_setting(runner, "per_gpu", 1)
        if runner.get("address"):  # its scheduler's `allowed-failures` decides re-runs after a lost worker
            return DaskTaskRunner(address=str(runner["address"]))
        gpus = visible_gpus() if gpus is None else gpus
        if gpus:  # one worker process per slot, each seeing its own GPU
            slots = assign_slots(gpus, per_gpu=per_gpu)
            return DaskTaskRunner(cluster_class=slot_cluster, cluster_kwargs={
                "slots": [(s.gpu, s.share) for s in slots], "max_retries": max_retries,
                "dashboard_address": runner.get("dashboard_address")})
        # Worker processes, not threads: evaluations are CPU-bound Python (the GIL).
        return DaskTaskRunner(cluster_class=local_cluster, cluster_kwargs={
            "n_workers": positive_setting(runner, "n_workers", 2),
            "threads_per_worker": positive_setting(runner, "threads_per_worker", 1),
            "processes": True, "dashboard_address": runner.get("dashboard_address"), "max_retries": max_retries})
    if name == "ray":
        # Ray >= 2.5x writes a token into ~/.ray unless told not to; a local Ray needs none.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        try:
            from prefect_ray import RayTaskRunner  # lazy: an optional extra, refused in one line when missing
        except ImportError:
            raise MissingDependencyError("runner=ray needs prefect-ray and ray: pip install 'nasflow[ray]'") from None
        count_setting(runner, "max_retries", 2)  # used per task (flows/placement.py): a bad value fails now
        positive_setting(runner, "per_gpu", 1)
        address = runner.get("address") or None
        if address is not None:
            return RayTaskRunner(address=address)
        gpus = visible_gpus() if gpus is None else gpus
        init: dict[str, Any] = {"include_dashboard": False, "num_gpus": len(gpus),
                                "object_store_memory": positive_setting(runner, "object_store_mb", 128) * 2**20}
        if runner.get("num_cpus") is not None:
            init["num_cpus"] = positive_setting(runner, "num_cpus", 1)
        return RayTaskRunner(init_kwargs=init)
    raise ConfigError(f"unknown runner '{name}' (valid: local, {', '.join(FLOW_RUNNERS)})")


def _ignore_interrupt() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class InterruptibleProcessPool(ProcessPoolTaskRunner):
    """Prefect's process pool, for Ctrl-C: a terminal sends SIGINT to the whole process group,
    and an idle worker died of it with a traceback, so workers ignore it. The flow's process
    handles it and on its way out stops the workers rather than wait for their evaluations
    (finished ones are in the task cache; a resume evaluates the others again)."""

    def __init__(self, max_workers: int | None = None) -> None:
        super().__init__(max_workers=max_workers, initializer=_ignore_interrupt)

    def __enter__(self) -> InterruptibleProcessPool:
        # A worker stopped mid-task leaves the semaphores of Prefect's per-task state registered;
        # the resource tracker (shared with the workers, started here unless running) removes
        # them at exit, and its warning about them would follow the one interrupt line.
        saved = list(sys.warnoptions)
        sys.warnoptions.append("ignore::UserWarning:multiprocessing.resource_tracker")
        try:
            resource_tracker.ensure_running()
        finally:
            sys.warnoptions[:] = saved
        return super().__enter__()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        # Ctrl-C, SIGTERM (Prefect's TerminationSignal), exit: not an evaluation's error
        if exc_type is not None and not issubclass(exc_type, Exception) and self._executor is not None:
            for process in list(self._executor._processes.values()):
                process.terminate()
        super().__exit__(exc_type, exc_value, traceback)


@contextmanager
def shared_api(runner: dict[str, Any], show: bool = False) -> Iterator[None]:
    """With no server configured, the shared local server (NASFLOW_PREFECT_SERVER=local, the CLI's
    default) or the flow's temporary one starts here (`show`: with a status line). Task runs in
    other processes report to the flow's Prefect API; each worker would otherwise start its own
    temporary server on the same database (slow, and they contend for it), so its URL is passed on."""
    with prefect_api(show) as url:
        if runner.get("name", "prefect") == "prefect" or url is None:
            yield
            return
        with temporary_settings(updates={PREFECT_API_URL: url}):
            yield


def positive_setting(runner: dict[str, Any], key: str, default: int) -> int:
    value = runner.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"runner.{key}: expected a positive integer, got {value!r}")
    return value


def count_setting(runner: dict[str, Any], key: str, default: int) -> int:
    value = runner.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"runner.{key}: expected a non-negative integer, got {value!r}")
    return value


def local_cluster(max_retries: int, **kwargs: Any) -> Any:
    """A `LocalCluster` whose scheduler re-runs a task lost with its worker `max_retries` times, then
    fails it (`KilledWorker`): a candidate that kills every worker it lands on becomes a failed trial."""
    import dask  # lazy: loads dask (start-up time)
    from distributed import LocalCluster  # lazy: loads distributed (start-up time)

    with dask.config.set({"distributed.scheduler.allowed-failures": max_retries}):
        return LocalCluster(**kwargs)


def slot_cluster(slots: list[tuple[str, float]], max_retries: int, dashboard_address: str | None) -> Any:
    """dask-cuda style: one single-threaded worker process per slot (`nas.search.slots`), seeing only
    its GPU (CUDA_VISIBLE_DEVICES) and offering its share of it as the `GPU` resource."""
    import dask  # lazy: loads dask (start-up time)
    from distributed import Nanny, Scheduler, SpecCluster  # lazy: loads distributed (start-up time)

    workers = {f"slot-{i}": {"cls": Nanny, "options": {
        "nthreads": 1, "resources": {"GPU": share}, "env": {"CUDA_VISIBLE_DEVICES": gpu}}}
        for i, (gpu, share) in enumerate(slots)}
    with dask.config.set({"distributed.scheduler.allowed-failures": max_retries}):
        return SpecCluster(workers=workers, scheduler={
            "cls": Scheduler, "options": {"dashboard_address": dashboard_address}})

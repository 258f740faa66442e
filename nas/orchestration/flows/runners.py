"""The flow's Prefect task runner, built from the `runner` config group, so one
search scales from a thread pool to processes, a Dask cluster or Ray without
code changes: evaluations are tasks, and the task runner decides where they run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from nas.errors import ConfigError, MissingDependencyError

FLOW_RUNNERS = ("prefect", "processes", "dask", "ray")


def build_task_runner(runner: dict[str, Any]) -> TaskRunner:
    """`runner` is the config group's dict; raises a one-line error before any work starts."""
    name = runner.get("name", "prefect")
    if name == "prefect":
        return ThreadPoolTaskRunner(max_workers=_positive(runner, "workers", 4))
    if name == "processes":
        return ProcessPoolTaskRunner(max_workers=_positive(runner, "workers", 2))
    if name == "dask":
        # distributed logs each worker's start and stop at INFO; read when it is first imported.
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        try:
            from prefect_dask import DaskTaskRunner
        except ImportError:
            raise MissingDependencyError("runner=dask needs prefect-dask: pip install prefect-dask==0.3.7") from None
        if runner.get("address"):
            return DaskTaskRunner(address=str(runner["address"]))
        # Worker processes, not threads: evaluations are CPU-bound Python (the GIL).
        return DaskTaskRunner(cluster_kwargs={
            "n_workers": _positive(runner, "n_workers", 2),
            "threads_per_worker": _positive(runner, "threads_per_worker", 1),
            "processes": True, "dashboard_address": runner.get("dashboard_address")})
    if name == "ray":
        try:
            from prefect_ray import RayTaskRunner
        except ImportError:
            raise MissingDependencyError("runner=ray needs prefect-ray and ray: pip install 'nasflow[ray]'") from None
        address = runner.get("address") or None
        local = address is None and runner.get("num_cpus") is not None
        return RayTaskRunner(address=address, init_kwargs={"num_cpus": _positive(runner, "num_cpus", 1)} if local else {})
    raise ConfigError(f"unknown runner '{name}' (valid: local, {', '.join(FLOW_RUNNERS)})")


@contextmanager
def shared_api(runner: dict[str, Any]) -> Iterator[None]:
    """Task runs in other processes report to the flow's Prefect API; with no
    server configured each worker would start its own ephemeral one on the same
    database (slow, and they contend for it), so start it here and pass its URL on."""
    if runner.get("name", "prefect") == "prefect" or PREFECT_API_URL.value():
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the one Prefect would start for the flow (one per process)
    server.start()
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        yield


def _positive(runner: dict[str, Any], key: str, default: int) -> int:
    value = runner.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"runner.{key}: expected a positive integer, got {value!r}")
    return value

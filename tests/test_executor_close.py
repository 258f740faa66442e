"""The Prefect executor's `close()`: a search that stops (an interrupt, an error) cancels the
evaluations still running on the task runner's engine instead of leaving them to run on."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from nas.search.spec import Component, SearchSpec, build_evaluator
from nas.spaces import SPACES
from tasks.evaluate import PrefectExecutor


def executor() -> PrefectExecutor:
    space = SPACES.create("nb201", {})
    return PrefectExecutor(SearchSpec(Component("nb201", {}), Component("random", {}), Component("table", {})),
                           build_evaluator(Component("table", {}), space), 0)


def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


GATE = threading.Event()  # the Dask worker runs in this process (processes=False): released at the end


def blocked() -> bool:
    return GATE.wait(60)


def test_close_cancels_a_running_dask_future():
    distributed = pytest.importorskip("distributed")

    with distributed.Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        try:
            _close_cancels_running(client)
        finally:
            GATE.set()  # the worker's thread ends, so the cluster stops at once


def _close_cancels_running(client) -> None:
    from prefect_dask.task_runners import PrefectDaskFuture

    running = client.submit(blocked, pure=False)
    deadline = time.monotonic() + 30
    while not any(client.processing().values()):  # started on the worker
        assert time.monotonic() < deadline, "the slow task never started"
        time.sleep(0.05)
    ex = executor()
    ex._running[0] = (PrefectDaskFuture(uuid.uuid4(), running), time.perf_counter())
    ex.close()
    deadline = time.monotonic() + 10
    while running.status != "cancelled":
        assert time.monotonic() < deadline, f"still {running.status} 10 s after close()"
        time.sleep(0.05)
    assert ex._running == {}


def test_close_cancels_a_thread_pool_future_not_yet_started_and_forgets_the_running_one():
    """A thread cannot be stopped, but what waits for a thread never starts."""
    from prefect.futures import PrefectConcurrentFuture

    gate = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(gate.wait, 30)
        waiting = pool.submit(slow, 0.0)
        ex = executor()
        for ticket, fut in enumerate((running, waiting)):
            ex._running[ticket] = (PrefectConcurrentFuture(uuid.uuid4(), fut), time.perf_counter())
        ex.close()
        assert waiting.cancelled() and not running.cancelled()
        assert ex._running == {}
        gate.set()

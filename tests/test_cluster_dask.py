"""Dask cluster executor: one worker process per GPU slot (each seeing only its GPU, offering
it as the `GPU` resource), evaluations that ask for their share, a worker killed in the middle
of an evaluation (the candidate re-runs on another, nothing lost or duplicated), and a
candidate whose every worker dies (a failed trial saying why), and the asynchronous search loop
(`budget.in_flight`) driving the cluster. GPUs are faked: ids only."""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from prefect_dask import DaskTaskRunner

from flows.placement import Placement, open_executor
from flows.task_runners import build_task_runner, shared_api, slot_cluster
from nas.core.trial import read_history
from nas.errors import ConfigError
from nas.search.loop import AsyncExecutor, SearchLoop
from nas.search.spec import Component
from support.cluster import candidates, inside_flow, slow_spec, wait_for

FAKE_GPUS = ["0", "1"]
MAX_RETRIES = 1  # a lost worker's task is run once more, then fails


def test_gpu_slots_become_dask_workers_with_a_share_each():
    runner = build_task_runner({"name": "dask", "per_gpu": 2}, gpus=["3", "5"])
    assert runner.cluster_class is slot_cluster
    assert runner.cluster_kwargs == {"slots": [("3", 0.5), ("5", 0.5), ("3", 0.5), ("5", 0.5)],
                                     "max_retries": 2, "dashboard_address": None}
    cpu = build_task_runner({"name": "dask", "n_workers": 3}, gpus=[])
    assert cpu.cluster_kwargs["n_workers"] == 3 and "slots" not in cpu.cluster_kwargs
    with pytest.raises(ConfigError, match=r"^runner.max_retries: expected a non-negative integer, got -1$"):
        build_task_runner({"name": "dask", "max_retries": -1}, gpus=[])


@pytest.fixture(scope="module")
def cluster():
    with slot_cluster([(gpu, 1.0) for gpu in FAKE_GPUS], MAX_RETRIES, None) as c, shared_api({"name": "dask"}):
        yield c


def in_cluster(cluster, body):
    return inside_flow.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))(body)


def busy_worker_pid(client) -> int | None:
    """The pid of a worker running an evaluation now, if any."""
    busy = [addr for addr, keys in client.processing().items() if keys]
    if not busy:
        return None
    try:
        return client.run(os.getpid, workers=busy[:1])[busy[0]]
    except OSError:  # that worker has just died
        return None


def test_each_worker_sees_only_its_gpu_and_evaluations_ask_for_it(cluster):
    def body():
        from prefect.context import FlowRunContext

        client = FlowRunContext.get().task_runner.client
        seen = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"])
        executor = open_executor({"name": "dask", "per_gpu": 2}, slow_spec(), slow_spec().build_evaluator(
            slow_spec().build_space()), retries=0)
        return sorted(seen.values()), executor

    seen, executor = in_cluster(cluster, body)
    assert isinstance(executor, AsyncExecutor)  # what the asynchronous loop drives
    placement = executor.placement
    assert seen == FAKE_GPUS
    assert placement == Placement("dask", 0.5, 2)


def test_killed_worker_mid_evaluation_reruns_the_candidate_elsewhere(cluster):
    spec = slow_spec()
    evaluator = spec.build_evaluator(spec.build_space())
    cands = candidates(spec, 3, seed=1)

    def body():
        from prefect.context import FlowRunContext

        client = FlowRunContext.get().task_runner.client
        executor = open_executor({"name": "dask"}, spec, evaluator, retries=0)
        for ticket, cand in enumerate(cands):
            executor.submit(ticket, cand)
        victim = wait_for(lambda: busy_worker_pid(client))
        os.kill(victim, signal.SIGKILL)
        return victim, [executor.next_done() for _ in cands]

    victim, done = in_cluster(cluster, body)
    assert sorted(t for t, _ in done) == [0, 1, 2]  # each candidate exactly once
    for ticket, (result, cached, _) in done:
        assert result.ok and not cached, result.error
        assert result.accuracy == evaluator.table.score(cands[ticket].arch)
    assert victim != os.getpid()


def test_candidate_that_kills_every_worker_becomes_a_failed_trial(cluster):
    spec = slow_spec()
    evaluator = spec.build_evaluator(spec.build_space())
    [cand] = candidates(spec, 1, seed=2)

    def body():
        from prefect.context import FlowRunContext

        client = FlowRunContext.get().task_runner.client
        executor = open_executor({"name": "dask"}, spec, evaluator, retries=0)
        executor.submit(7, cand)
        killed: list[int] = []
        for _ in range(MAX_RETRIES + 1):  # every run of it loses its worker

            def next_victim() -> int | None:
                pid = busy_worker_pid(client)
                return pid if pid not in killed else None

            killed.append(wait_for(next_victim))
            os.kill(killed[-1], signal.SIGKILL)
        return executor.next_done()

    ticket, (result, cached, _) = in_cluster(cluster, body)
    assert ticket == 7 and not result.ok and not cached
    assert result.error.startswith("evaluator crashed: KilledWorker:"), result.error


def test_asynchronous_search_runs_on_the_cluster_each_ask_told_once(cluster, tmp_path):
    spec = replace(slow_spec(), strategy=Component("random"), trials=6, in_flight=2,
                   evaluator=Component("simulated", {"median_seconds": 0.2, "sigma": 0.5}))
    evaluator = spec.build_evaluator(spec.build_space())

    def body():
        executor = open_executor({"name": "dask"}, spec, evaluator, retries=0)
        return SearchLoop(spec, Path(tmp_path), executor, progress=False, runner="dask").run_search()

    summary = in_cluster(cluster, body)
    records = read_history(tmp_path / "history.jsonl")
    assert summary["trials"] == 6 and summary["cache_hits"] == 0
    assert sorted(r.ask for r in records) == list(range(6)) and len({r.key for r in records}) == 6
    for r in records:
        assert r.error is None and r.accuracy == evaluator.score(spec.build_space().decode(r.encoding)).accuracy

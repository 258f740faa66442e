"""Ray cluster executor, for real on a small local Ray (2 CPUs, no dashboard, a small object
store, one faked GPU): evaluations ask for `num_gpus=1/per_gpu`, a worker killed in the middle
of an evaluation (the candidate re-runs: `max_retries`), nothing lost or duplicated, and a
candidate whose every worker dies (a failed trial saying why)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flows.placement import Placement, open_executor
from flows.task_runners import build_task_runner, shared_api
from nas.errors import ConfigError
from support.cluster import candidates, inside_flow, slow_spec, wait_for

ray = pytest.importorskip("ray")  # the `ray` extra (installed by `.[test]`)
psutil = pytest.importorskip("psutil")
from prefect_ray import RayTaskRunner  # noqa: E402  (after the skip)

RUNNER = {"name": "ray", "num_cpus": 2, "per_gpu": 2, "max_retries": 1, "object_store_mb": 80}


def test_local_ray_is_small_and_offers_the_gpus_it_was_given():
    runner = build_task_runner(RUNNER, gpus=["0"])
    assert runner.init_kwargs == {"include_dashboard": False, "num_gpus": 1, "num_cpus": 2,
                                  "object_store_memory": 80 * 2**20, "namespace": "prefect"}
    assert build_task_runner({"name": "ray", "address": "10.0.0.5:6379"}).address == "10.0.0.5:6379"
    assert os.environ["RAY_AUTH_MODE"] == "disabled"  # no token written into ~/.ray
    with pytest.raises(ConfigError, match=r"^runner.per_gpu: expected a positive integer, got 0$"):
        build_task_runner({"name": "ray", "address": "h:6379", "per_gpu": 0})


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module; each flow's RayTaskRunner finds it initialised and keeps it.
    Its workers unpickle the test flow (tests/support), so they get the tests folder on their path."""
    tests = str(Path(__file__).resolve().parent)
    ray.init(**build_task_runner(RUNNER, gpus=["0"]).init_kwargs,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}})
    try:
        with shared_api(RUNNER):
            yield
    finally:
        ray.shutdown()


def in_cluster(body):
    return inside_flow.with_options(task_runner=RayTaskRunner())(body)


def evaluating_pid(skip: list[int]) -> int | None:
    """A Ray worker process running an evaluation now (not one of `skip`)."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and cmd[0].startswith("ray::evaluate") and proc.pid not in skip:
            return proc.pid
    return None


def test_killed_worker_mid_evaluation_reruns_the_candidate(cluster):
    spec = slow_spec()
    evaluator = spec.build_evaluator(spec.build_space())
    cands = candidates(spec, 3, seed=11)

    def body():
        executor = open_executor(RUNNER, spec, evaluator, retries=0)
        for ticket, cand in enumerate(cands):
            executor.submit(ticket, cand)
        victim = wait_for(lambda: evaluating_pid([]))
        psutil.Process(victim).kill()
        return executor.placement, [executor.next_done() for _ in cands]

    placement, done = in_cluster(body)
    assert placement == Placement("ray", 0.5, 1)  # two evaluations share the (faked) GPU
    assert sorted(t for t, _ in done) == [0, 1, 2]  # each candidate exactly once
    for ticket, (result, cached, _) in done:
        assert result.ok and not cached, result.error
        assert result.accuracy == evaluator.table.score(cands[ticket].arch)


def test_candidate_that_kills_every_worker_becomes_a_failed_trial(cluster):
    spec = slow_spec()
    evaluator = spec.build_evaluator(spec.build_space())
    [cand] = candidates(spec, 1, seed=12)

    def body():
        executor = open_executor(RUNNER, spec, evaluator, retries=0)
        executor.submit(5, cand)
        killed: list[int] = []
        for _ in range(RUNNER["max_retries"] + 1):  # every run of it loses its worker
            killed.append(wait_for(lambda: evaluating_pid(killed)))
            psutil.Process(killed[-1]).kill()
        return executor.next_done()

    ticket, (result, cached, _) = in_cluster(body)
    assert ticket == 5 and not result.ok and not cached
    assert result.error.startswith("evaluator crashed:") and "died" in result.error, result.error

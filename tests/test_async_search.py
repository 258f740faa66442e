"""Asynchronous steady-state search (`budget.in_flight`) and the local worker pool:
history in completion order with unique ask indices, resume re-queues the candidates in
flight (none lost, none twice), a killed worker's candidate runs again on a fresh one
and fails with the reason after `max_attempts` deaths, and slots pin workers to GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import NAS, ROOT
from nas.core.trial import Candidate, read_history
from nas.errors import ConfigError
from nas.evaluators.simulated import SimulatedClock, SimulatedEvaluator
from nas.execute import LocalRunner
from nas.pool import WorkerPool
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.rundir import RunDir
from nas.search.session import Session
from nas.search.slots import Slot, assign_slots, visible_gpus
from nas.search.spec import Component, Search, SearchSpec
from nas.spaces.nb201.space import NB201Space

SIMULATED = Component("simulated", {"median_seconds": 1.0, "sigma": 1.0})


@pytest.fixture(scope="module")
def clock_evaluator() -> SimulatedEvaluator:
    return SimulatedEvaluator(NB201Space(), median_seconds=1.0, sigma=1.0)


def spec_of(trials: int = 30, in_flight: int = 4, strategy: str = "rea", **params) -> SearchSpec:
    return SearchSpec(space=Component("nb201"), strategy=Component(strategy, {"population_size": 8, **params}
                                                                   if strategy == "rea" else params),
                      evaluator=SIMULATED, seed=3, trials=trials, in_flight=in_flight)


def lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]


def test_async_history_is_in_completion_order_with_unique_ask_indices(tmp_path, clock_evaluator):
    clock = SimulatedClock(clock_evaluator, workers=4)
    summary = SearchLoop(spec_of(), tmp_path, clock, progress=False).run_search()
    records = lines(tmp_path)
    asks = [r["ask"] for r in records]
    assert summary["trials"] == 30 and [r["trial"] for r in records] == list(range(30))
    assert sorted(asks) == list(range(30)) and asks != sorted(asks)  # completion order, not ask order
    assert len({r["key"] for r in records}) == 30
    assert not json.loads((tmp_path / "state.json").read_text())["in_flight"]
    assert any(r["strategy"]["origin"] == "mutation" for r in records)  # REA bred while others ran


def test_batch_records_carry_no_ask_field_and_keep_their_identity(tmp_path):
    spec = SearchSpec(space=Component("nb201"), strategy=Component("rea"), evaluator=Component("table"),
                      trials=3)
    SearchLoop(spec, tmp_path, LocalExecutor(spec.build_evaluator(NB201Space()), None), progress=False).run_search()
    assert all("ask" not in r for r in lines(tmp_path))
    assert "in_flight" not in json.loads((tmp_path / "state.json").read_text())
    assert spec.identity() != replace(spec, in_flight=2).identity()


class Crash(Exception):
    """Stands for kill -9: nothing after it runs."""


class CrashingClock(SimulatedClock):
    def __init__(self, evaluator, workers: int, after: int) -> None:
        super().__init__(evaluator, workers)
        self.left = after

    def next_done(self):
        if self.left == 0:
            raise Crash
        self.left -= 1
        return super().next_done()


@pytest.mark.parametrize("torn", [False, True], ids=["between-steps", "after-append-before-state"])
def test_resume_requeues_the_candidates_in_flight_none_lost_none_twice(tmp_path, clock_evaluator, monkeypatch,
                                                                       torn):
    spec = spec_of(trials=24)
    if torn:  # the crash falls between a line's append and the state that counts it
        real = RunDir.save_state

        def save_state(self, fields, history_lines, *args, **kwargs):
            if history_lines == 10:  # the first save counting line 10 follows its append
                raise Crash
            real(self, fields, history_lines, *args, **kwargs)

        monkeypatch.setattr(RunDir, "save_state", save_state)
    with pytest.raises(Crash):
        SearchLoop(spec, tmp_path, CrashingClock(clock_evaluator, 4, after=-1 if torn else 9),
                   progress=False).run_search()
    monkeypatch.undo()
    state = json.loads((tmp_path / "state.json").read_text())
    in_flight = {e["ask"]: e["encoding"] for e in state["in_flight"]}
    assert len(in_flight) == 4
    before = lines(tmp_path)
    assert len(before) == state["history_lines"] + (1 if torn else 0)

    summary = SearchLoop(spec, tmp_path, SimulatedClock(clock_evaluator, 4), progress=False).run_search()
    after = lines(tmp_path)
    assert summary["trials"] == 24 and summary["resumed_trials"] == state["history_lines"]
    assert after[: state["history_lines"]] == before[: state["history_lines"]]
    assert sorted(r["ask"] for r in after) == list(range(24))  # none lost, none twice
    assert len({r["key"] for r in after}) == 24
    done = {r["ask"]: r["encoding"] for r in after}
    assert all(done[ask] == enc for ask, enc in in_flight.items())  # the re-queued ones, as asked


def test_resume_with_fewer_trials_requeues_only_what_fits(tmp_path, clock_evaluator):
    with pytest.raises(Crash):
        SearchLoop(spec_of(trials=24), tmp_path, CrashingClock(clock_evaluator, 4, after=9), progress=False).run_search()
    state = json.loads((tmp_path / "state.json").read_text())
    done, asks = state["history_lines"], sorted(e["ask"] for e in state["in_flight"])
    assert len(asks) == 4
    summary = SearchLoop(spec_of(trials=done + 2), tmp_path, SimulatedClock(clock_evaluator, 4),
                         progress=False).run_search()
    after = lines(tmp_path)
    assert len(after) == done + 2 and summary["trials"] == done + 2
    assert sorted(r["ask"] for r in after[done:]) == asks[:2]  # the first asked of those in flight


def test_in_flight_is_refused_for_batch_strategies_batch_sizes_and_batch_executors(tmp_path, clock_evaluator):
    with pytest.raises(ConfigError, match=r"^budget.in_flight=4: strategy=nader works in batches .*"
                                          r"use budget.in_flight=1 with it, or strategy=.*rea"):
        spec = SearchSpec(space=Component("nader"), strategy=Component("nader"),
                          evaluator=Component("quick"), in_flight=4)
        spec.build_strategy(spec.build_space())
    with pytest.raises(ConfigError, match=r"^budget.in_flight=4 .*use budget.batch_size=1"):
        SearchSpec(space=Component("nb201"), strategy=Component("rea"), evaluator=Component("table"),
                   in_flight=4, batch_size=2)
    run = RunDir(tmp_path / "runner")
    with pytest.raises(ConfigError, match=r"^runner=local: unknown key 'worker' \(valid: name, workers, per_gpu, "
                                          r"max_attempts\)$"), run.lock():
        LocalRunner({"name": "local", "worker": 2}).run(Session(Search(spec_of(), None, None, None), run, None),  # type: ignore[arg-type]
                                                        False)
    with pytest.raises(ConfigError, match=r"^budget.in_flight=4: runner=local evaluates in batches only"):
        SearchLoop(spec_of(), tmp_path, LocalExecutor(clock_evaluator, None), progress=False).run_search()
    assert not (tmp_path / "state.json").exists()  # refused before the run dir was touched


def test_slots_pin_workers_to_gpus_from_cuda_visible_devices():
    gpus = visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"})
    slots = assign_slots(gpus, per_gpu=2)
    assert [s.gpu for s in slots] == ["0", "1", "2", "0", "1", "2"] and {s.share for s in slots} == {0.5}
    assert [s.env() for s in assign_slots(gpus, per_gpu=2, workers=4)][3] == {"CUDA_VISIBLE_DEVICES": "0"}
    assert assign_slots(visible_gpus({"CUDA_VISIBLE_DEVICES": ""}), workers=3) == [Slot(i, None) for i in range(3)]


def _killer(pool: WorkerPool, ticket: int, times: int, stop: threading.Event) -> list[int]:
    """Kill -9 whichever worker is evaluating `ticket`, `times` times."""
    killed: list[int] = []

    def loop() -> None:
        while len(killed) < times and not stop.is_set():
            pid = pool.pids.get(ticket)
            if pid is not None and pid not in killed:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.01)

    threading.Thread(target=loop, daemon=True).start()
    return killed


@pytest.mark.slow  # four worker interpreters start (each imports torch for the NB201 cost model)
def test_worker_killed_mid_evaluation_reruns_then_fails_after_max_attempts(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    spec = replace(spec_of(), evaluator=Component("simulated", {"median_seconds": 0.5, "sigma": 0.01}))
    pool = WorkerPool.from_settings(spec.to_dict(), {"per_gpu": 2, "workers": 1, "max_attempts": 2}, 1)
    stop = threading.Event()
    try:
        worker_env = Path(f"/proc/{pool._workers[0].process.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=0" in worker_env  # the slot's GPU, not all three
        space, rng = NB201Space(), np.random.default_rng(0)
        once, twice = Candidate(space.sample(rng)), Candidate(space.sample(rng))
        killed = _killer(pool, 0, 1, stop)
        pool.submit(0, once)
        ticket, (result, _, _) = pool.next_done()
        assert ticket == 0 and result.ok and len(killed) == 1  # re-run on a fresh worker
        killed = _killer(pool, 1, 2, stop)
        pool.submit(1, twice)
        ticket, (result, _, _) = pool.next_done()
        assert ticket == 1 and not result.ok and len(killed) == 2
        assert result.error.startswith("worker process died 2 times evaluating it (last exit code -9)")
        assert pool.stats.deaths == 3
    finally:
        stop.set()
        pool.close()


@pytest.mark.slow
def test_cli_kill_9_mid_async_search_then_resume_loses_and_repeats_nothing(tmp_path, nas_env):
    run_dir = tmp_path / "run"
    args = ["search", "space=nb201", "evaluator=simulated", "runner=local", "budget.in_flight=2",
            "runner.workers=1",  # one queued behind the running one: both in flight, one worker to start
            "budget.trials=12", "evaluator.median_seconds=0.2", "evaluator.sigma=0.5", "progress=false",
            f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([*NAS, *args], env=nas_env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    hist = run_dir / "history.jsonl"
    deadline = time.time() + 120
    while not (hist.exists() and hist.read_text().count("\n") >= 3):
        assert proc.poll() is None and time.time() < deadline, "search ended before it could be killed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # the search alone; its workers see their socket close and exit
    proc.wait()
    in_flight = {e["ask"] for e in json.loads((run_dir / "state.json").read_text())["in_flight"]}
    assert in_flight

    out = subprocess.run([*NAS, *args], env=nas_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    records = read_history(hist)
    asks = [r.ask for r in records]
    assert len(records) == 12 and sorted(asks) == list(range(12))  # type: ignore[type-var]
    assert in_flight <= set(asks) and len({r.key for r in records}) == 12


def test_simulated_durations_are_deterministic_per_architecture_and_heavy_tailed(clock_evaluator):
    space, rng = NB201Space(), np.random.default_rng(1)
    archs = [space.sample(rng) for _ in range(400)]
    durations = np.array([clock_evaluator.duration(a) for a in archs])
    assert [clock_evaluator.duration(a) for a in archs[:5]] == list(durations[:5])  # same key, same time
    assert 0.7 < np.median(durations) < 1.4 and durations.max() > 8 * np.median(durations)  # a long tail
    pareto = SimulatedEvaluator(space, distribution="pareto", median_seconds=1.0, pareto_alpha=1.5)
    assert 0.8 < np.median([pareto.duration(a) for a in archs]) < 1.25
    with pytest.raises(ConfigError, match=r"^evaluator.distribution: expected one of lognormal, pareto, got 'x'"):
        SimulatedEvaluator(space, distribution="x")

"""Run-directory integrity: one writer per run dir (an OS lock naming its pid),
history without state and more than one batch past the state are errors, every
history line is checked on resume, and self-reported results never count as
best unless the evaluator's config trusts them."""

from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import NAS, ROOT
from nas.compare import load_curves
from nas.core.trial import TrialRecord, best_record, best_so_far, read_history
from nas.errors import ConfigError, RunDirError
from nas.evaluators.table import TableEvaluator
from nas.export.selection import load_trial
from nas.report import write_run_report
from nas.search.loop import LocalExecutor, SearchLoop, summarise, trusts_self_reported
from nas.search.rundir import RunDir
from nas.search.session import Session
from nas.search.spec import Component, Search, SearchSpec
from nas.spaces.nb201.space import NB201Space

NEW_DIR = "use a new hydra.run.dir"
# Holds the run dir's lock in a process of its own until killed.
HOLD = ("import sys, time\n"
        "from nas.search.rundir import RunDir\n"
        "held = RunDir(sys.argv[1]).lock()\n"
        "held.__enter__()\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n")
TRY = ("import sys\n"
       "from nas.search.rundir import RunDir\n"
       "with RunDir(sys.argv[1]).lock():\n"
       "    print('locked')\n")


@pytest.fixture(scope="module")
def evaluator() -> TableEvaluator:
    return TableEvaluator(NB201Space())


def make_spec(seed: int = 4, trials: int = 10, batch_size: int = 1, strategy: str = "rea",
              evaluator: Component = Component("table")) -> SearchSpec:
    return SearchSpec(space=Component("nb201"), strategy=Component(strategy), evaluator=evaluator,
                      seed=seed, trials=trials, batch_size=batch_size)


def search(spec: SearchSpec, run_dir: Path, evaluator, executor=None) -> dict[str, Any]:
    return SearchLoop(spec, run_dir, executor or LocalExecutor(evaluator, None), progress=False).run_search()


def keys(run_dir: Path) -> list[str]:
    return [json.loads(line)["key"] for line in (run_dir / "history.jsonl").read_text().splitlines()]


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file in the dir (Hydra's included) and its bytes, but transient temp files."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.endswith(".tmp")}


@pytest.fixture
def holder(tmp_path):
    """Start a process that holds a run dir's lock; returns (start(dir) -> Popen)."""
    procs: list[subprocess.Popen] = []

    def start(run_dir: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "locked"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def try_lock(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TRY, str(run_dir)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


# --- one writer per run dir ------------------------------------------------------------------------------

def test_second_search_fails_at_once_naming_the_holder_and_changes_nothing(tmp_path, evaluator, holder):
    run_dir = tmp_path / "run"
    search(make_spec(trials=6), run_dir, evaluator)
    before = snapshot(run_dir)
    proc = holder(run_dir)
    start = time.monotonic()
    with pytest.raises(RunDirError) as info:
        search(make_spec(trials=12), run_dir, evaluator)
    assert str(info.value) == f"{run_dir} is in use by another search (pid {proc.pid}); wait for it or {NEW_DIR}"
    assert time.monotonic() - start < 5  # no waiting for the holder
    after = snapshot(run_dir)
    assert after.pop(".lock") == f"{proc.pid}\n".encode()
    assert after == {k: v for k, v in before.items() if k != ".lock"}
    proc.kill()  # a dead holder's lock is gone with it: the search resumes
    proc.wait()
    summary = search(make_spec(trials=12), run_dir, evaluator)
    assert summary["resumed_trials"] == 6 and summary["trials"] == 12


def test_a_second_lock_in_the_same_process_is_refused_and_the_first_released_after(tmp_path):
    """A search takes its run dir's lock once (its `Session`); a second search in this process
    trying the same dir is refused as another process's would be, saying the holder is this one."""
    run = RunDir(tmp_path / "run")
    with run.lock():
        assert run.held and run.lock_path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(RunDirError) as info:
            with RunDir(tmp_path / "run").lock():
                pass
        assert str(info.value) == (f"{run.path} is in use by another search (pid {os.getpid()}, this process); "
                                   f"wait for it or {NEW_DIR}")
        assert run.held and try_lock(run.path).returncode != 0  # still held after the refusal
    assert not run.held and run.lock_path.read_text() == ""
    out = try_lock(run.path)
    assert out.returncode == 0 and out.stdout == "locked\n", out.stderr


def test_a_session_holds_its_run_dir_and_reads_it_once(tmp_path, evaluator):
    """A search's `Session` is made holding the lock; opening a second one on the dir is refused."""
    search = Search(make_spec(), evaluator.space, make_spec().build_strategy(evaluator.space), evaluator)
    with pytest.raises(RuntimeError, match="needs .*'s lock held"):
        Session(search, RunDir(tmp_path / "run"), None)
    with Session.open(search, tmp_path / "run") as session:
        assert session.run.held and session.resume is None
        with pytest.raises(RunDirError, match=r"in use by another search \(pid \d+, this process\)"):
            with Session.open(search, tmp_path / "run"):
                pass
        summary = SearchLoop.of(session, LocalExecutor(evaluator, None), progress=False).run_search()
    assert not session.run.held and summary["trials"] == 10


def test_second_process_is_refused_with_one_line(tmp_path):
    run = RunDir(tmp_path / "run")
    with run.lock():
        out = try_lock(run.path)
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        f"nas.errors.RunDirError: {run.path} is in use by another search (pid {os.getpid()}); "
        f"wait for it or {NEW_DIR}")


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_forked_child_does_not_keep_the_lock(tmp_path):
    """A worker forked during the search must not hold the run dir after the search ends."""
    run = RunDir(tmp_path / "run")
    with run.lock():
        child = multiprocessing.get_context("fork").Process(target=_sleep, args=(60,))
        child.start()
    try:
        out = try_lock(run.path)
        assert out.returncode == 0, out.stderr
    finally:
        child.kill()
        child.join()


@pytest.mark.slow
def test_two_nas_searches_on_one_run_dir(tmp_path, nas_env):
    """Two real `nas search` processes: the second stops at once with one line naming the first's
    pid; the first's history is never cut or interleaved, and resumes afterwards."""
    run_dir = tmp_path / "run"
    overrides = ["space=nb201", "strategy=random", "evaluator=table", "evaluator.simulated_cost_seconds=0.1"]
    args = ["search", *overrides, "budget.trials=2000", "runner=local", "progress=false",
            f"hydra.run.dir={run_dir}"]
    log = tmp_path / "first.log"
    with open(log, "w") as out:
        first = subprocess.Popen([*NAS, *args], env=nas_env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    history = run_dir / "history.jsonl"
    try:
        deadline = time.time() + 240
        while not (history.exists() and history.read_text().count("\n") >= 3):
            assert first.poll() is None and time.time() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        seen = history.read_bytes()
        names = set(snapshot(run_dir))
        second = subprocess.run([*NAS, *args], env=nas_env, cwd=ROOT, capture_output=True, text=True,
                                timeout=240)
        assert first.poll() is None, "the first search ended before the second tried"
        errors = [line for line in second.stderr.splitlines() if line.strip()]
        assert second.returncode == 2 and errors == [
            f"nas: error: {run_dir} is in use by another search (pid {first.pid}); wait for it or {NEW_DIR}"]
        assert history.read_bytes().startswith(seen)  # nothing cut
        assert set(snapshot(run_dir)) == names  # no new files
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    assert [r["trial"] for r in lines] == list(range(len(lines)))
    assert len({r["key"] for r in lines}) == len(lines)  # one random search, no second trajectory mixed in
    from nas.config import compose_config

    spec = dataclasses.replace(SearchSpec.from_config(compose_config(overrides)), trials=len(lines) + 2)
    summary = search(spec, run_dir, spec.build_evaluator(spec.build_space()))
    assert summary["trials"] == len(lines) + 2 and summary["resumed_trials"] >= len(lines) - 1


# --- state and history --------------------------------------------------------------------------------

@pytest.fixture
def finished(tmp_path, evaluator) -> Path:
    search(make_spec(trials=10), tmp_path / "run", evaluator)
    return tmp_path / "run"


def test_missing_state_of_a_finished_run_is_an_error_and_keeps_history(finished, evaluator):
    before = (finished / "history.jsonl").read_bytes()
    (finished / "state.json").unlink()
    with pytest.raises(RunDirError) as info:
        search(make_spec(trials=10), finished, evaluator)
    assert str(info.value) == (f"{finished / 'history.jsonl'} exists but state.json is missing (a search writes "
                               f"it first); restore {finished / 'state.json'} or {NEW_DIR}")
    assert (finished / "history.jsonl").read_bytes() == before


def test_state_is_written_before_the_first_history_line(tmp_path, evaluator):
    class Killed:
        def evaluate(self, candidates):
            raise KeyboardInterrupt("killed during the first evaluation")

    with pytest.raises(KeyboardInterrupt):
        search(make_spec(trials=10), tmp_path / "run", evaluator, executor=Killed())
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["history_lines"] == 0 and not (tmp_path / "run" / "history.jsonl").exists()
    search(make_spec(trials=10), tmp_path / "run", evaluator)
    search(make_spec(trials=10), tmp_path / "ref", evaluator)
    assert keys(tmp_path / "run") == keys(tmp_path / "ref")


def set_history_lines(run_dir: Path, n: int) -> None:
    path = run_dir / "state.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "history_lines": n}))


@pytest.mark.parametrize("batch_size, cut", [(1, 2), (3, 4), (3, 9)])
def test_more_than_one_batch_past_the_state_is_an_error(tmp_path, evaluator, batch_size, cut):
    run_dir = tmp_path / "run"
    search(make_spec(trials=12, batch_size=batch_size), run_dir, evaluator)
    before = (run_dir / "history.jsonl").read_bytes()
    set_history_lines(run_dir, 12 - cut)
    with pytest.raises(RunDirError) as info:
        search(make_spec(trials=12, batch_size=batch_size), run_dir, evaluator)
    assert str(info.value).startswith(f"{run_dir / 'history.jsonl'}: has 12 lines but state.json records "
                                      f"{12 - cut}, more than one batch ({batch_size})")
    assert (run_dir / "history.jsonl").read_bytes() == before


def test_crash_between_append_and_state_save_resumes_with_batches(tmp_path, evaluator, monkeypatch):
    spec = make_spec(seed=6, trials=12, batch_size=3)
    search(spec, tmp_path / "ref", evaluator)
    real, calls = RunDir.save_state, []

    def killed_at_third(self, *args, **kwargs):  # the initial state, batch 1, then killed after batch 2's lines
        calls.append(args[1])
        if len(calls) == 3:
            raise KeyboardInterrupt("killed before state.json was replaced")
        real(self, *args, **kwargs)

    monkeypatch.setattr(RunDir, "save_state", killed_at_third)
    with pytest.raises(KeyboardInterrupt):
        search(spec, tmp_path / "run", evaluator)
    monkeypatch.setattr(RunDir, "save_state", real)
    assert len(keys(tmp_path / "run")) == 6
    assert json.loads((tmp_path / "run" / "state.json").read_text())["history_lines"] == 3
    summary = search(spec, tmp_path / "run", evaluator)
    assert summary["resumed_trials"] == 3 and keys(tmp_path / "run") == keys(tmp_path / "ref")


BAD_LINES = [
    ("trial", "2", "field 'trial' must be an integer, got '2'"),
    ("trial", True, "field 'trial' must be an integer, got True"),
    ("trial", 2.0, "field 'trial' must be an integer, got 2.0"),
    ("trial", 5, "field 'trial' is 5 but line 3 holds trial 2"),
    ("key", 7, "field 'key' must be a string, got 7"),
    ("accuracy", "91.5", "field 'accuracy' must be null or a finite number, got '91.5'"),
    ("accuracy", math.nan, "field 'accuracy' must be null or a finite number, got nan"),
    ("error", 0, "field 'error' must be null or a string, got 0"),
    ("error", "boom", "fields 'error' and 'accuracy' are both set; a failed trial has no accuracy"),
    ("metrics", [], "field 'metrics' must be an object, got []"),
    ("params", "1e6", "field 'params' must be null or a number, got '1e6'"),
    ("cached", "no", "field 'cached' must be true or false, got 'no'"),
    ("encoding", None, "field 'encoding' must be not null, got None"),
    ("key", ..., "field 'key' missing"),
    (None, [1, 2], "not a JSON object"),
]


@pytest.mark.parametrize("field, value, message", BAD_LINES,
                         ids=[f"{f}={v!r}" for f, v, _ in BAD_LINES])
def test_bad_history_line_names_file_line_and_field(finished, evaluator, field, value, message):
    path = finished / "history.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    record = json.loads(lines[2])
    if field is None:
        record = value
    elif value is ...:
        del record[field]
    else:
        record[field] = value
    lines[2] = json.dumps(record) + "\n"
    path.write_text("".join(lines))
    before = path.read_bytes()
    with pytest.raises(RunDirError) as info:
        search(make_spec(trials=12), finished, evaluator)
    assert str(info.value) == f"{path}:3: {message}; restore the file or {NEW_DIR}"
    assert path.read_bytes() == before
    with pytest.raises(RunDirError) as info:  # report, compare and export read it the same way
        read_history(path)
    assert str(info.value) == f"{path}:3: {message}"


def test_a_blank_line_in_history_is_named_not_read_as_a_trial_mismatch(finished, evaluator):
    path = finished / "history.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*lines[:9], "\n", *lines[9:]]))
    before = path.read_bytes()
    with pytest.raises(RunDirError) as info:
        search(make_spec(trials=12), finished, evaluator)
    assert str(info.value) == (f"{path}:10: empty line between records; restore the file or {NEW_DIR} "
                               "(only a torn last line is repaired)")
    assert path.read_bytes() == before
    with pytest.raises(RunDirError, match=r"history.jsonl:10: empty line between records$"):
        read_history(path)


def test_a_leftover_line_is_checked_before_it_is_cut(finished, evaluator):
    """The crash case cuts only lines of the next trial's number."""
    path = finished / "history.jsonl"
    record = json.loads(path.read_text().splitlines()[-1])
    with open(path, "a") as fh:
        fh.write(json.dumps({**record, "trial": 11}) + "\n")
    with pytest.raises(RunDirError, match=r"history.jsonl:11: field 'trial' is 11 but line 11 holds trial 10"):
        search(make_spec(trials=12), finished, evaluator)


# --- self-reported results ---------------------------------------------------------------------------

class SelfReporting:
    """The table's results, with `keys` marked as the sandbox marks a model that trained itself."""

    def __init__(self, evaluator, keys: set[str]) -> None:
        self.inner, self.keys = LocalExecutor(evaluator, None), keys

    def evaluate(self, candidates):
        out = []
        for cand, (result, cached, wall) in zip(candidates, self.inner.evaluate(candidates)):
            if cand.arch.key() in self.keys:
                result = dataclasses.replace(result, metrics={**result.metrics, "self_reported": 1.0})
            out.append((result, cached, wall))
        return out


def test_counts_for_best_rule():
    measured = TrialRecord(0, "a", "a", 90.0)
    reported = TrialRecord(1, "b", "b", 95.0, metrics={"self_reported": 1.0})
    failed = TrialRecord(2, "c", "c", None, metrics={"self_reported": 1.0}, error="boom")
    assert [r.counts_for_best(False) for r in (measured, reported, failed)] == [True, False, False]
    assert [r.counts_for_best(True) for r in (measured, reported, failed)] == [True, True, False]
    assert best_so_far([reported, measured, reported]) == [None, 90.0, 90.0]
    assert best_so_far([reported, measured, reported], trust=True) == [95.0, 95.0, 95.0]
    assert best_record([reported], False) is None


def test_trust_comes_from_the_evaluator_config():
    trusting = make_spec(evaluator=Component("table", {"trust_self_reported": True}))
    assert trusts_self_reported(trusting) and trusts_self_reported(trusting.to_dict())
    assert not trusts_self_reported(make_spec()) and not trusts_self_reported(make_spec().to_dict())
    assert not trusts_self_reported(make_spec(evaluator=Component("table", {"trust_self_reported": "yes"})))
    assert not trusts_self_reported({})  # a summary.json without a spec
    # it changes what the strategy learns from: a run that trusts them is another search (the default keeps
    # the identities of runs from before it counted)
    assert trusting.identity() != make_spec().identity()
    assert make_spec(evaluator=Component("table", {"trust_self_reported": False})).identity() == make_spec().identity()


@pytest.mark.parametrize("trust", [False, True])
def test_self_reported_results_are_not_best_unless_trusted(tmp_path, evaluator, trust):
    spec = make_spec(seed=2, trials=20, strategy="random",
                     evaluator=Component("table", {"trust_self_reported": trust}))
    search(spec, tmp_path / "plain", evaluator)
    plain = read_history(tmp_path / "plain" / "history.jsonl")
    ranked = sorted(plain, key=lambda r: r.accuracy, reverse=True)
    top, runner_up = ranked[0], ranked[1]
    run = tmp_path / "run"
    summary = search(spec, run, evaluator, executor=SelfReporting(evaluator, {top.key}))
    best = top if trust else runner_up
    assert summary["self_reported"] == 1
    assert (summary["best"]["trial"], summary["best"]["accuracy"]) == (best.trial, best.accuracy)
    expected_curve = best_so_far([r if r is not top or trust else dataclasses.replace(r, accuracy=None)
                                  for r in plain])
    assert summary["best_at"] == {"10": expected_curve[9]}
    write_run_report(run, summary)
    report = (run / "report.md").read_text()
    top_rows = report.split("## Top")[1].split("![best so far]")[0]
    assert (top.encoding.replace("|", "\\|") in top_rows) is trust
    assert ("| 1 | %d | %.2f (self-reported, not verified) |" % (top.trial, top.accuracy) in top_rows) is trust
    assert ("best accuracy | %.2f (self-reported by the model's own code, not verified) |" % top.accuracy
            in report) is trust
    assert f"self-reported 1{'' if trust else ': not ranked'})" in report
    curves = load_curves([run])
    (group,) = curves.values()
    assert group[0]["curve"] == expected_curve
    assert (top.trial in {p["trial"] for p in group[0]["points"]}) is trust
    _, chosen = load_trial(run, None)
    assert chosen.trial == best.trial


@pytest.mark.parametrize("trust", [False, True])
def test_strategies_learn_from_self_reported_results_only_when_trusted(tmp_path, evaluator, trust):
    """A forged score must not steer the search: untrusted, a self-reported trial is told as a
    failed one (`TrialRecord.as_told`), on `tell`, on resume (`restore`) and to the screen's predictor."""
    spec = make_spec(seed=2, trials=12, strategy="bananas",
                     evaluator=Component("table", {"trust_self_reported": trust}))
    plain = tmp_path / "plain"
    search(spec, plain, evaluator)
    marked = set(keys(plain)[::2])
    run = tmp_path / "run"
    loop = SearchLoop(spec, run, SelfReporting(evaluator, marked), progress=False)
    loop.run_search()
    told = {r.encoding for r in loop.strategy.history}
    recorded = read_history(run / "history.jsonl")
    reported = {r.encoding for r in recorded if r.self_reported}
    assert reported and (reported <= told) is trust and (not reported & told) is not trust
    assert told - reported == {r.encoding for r in recorded if not r.self_reported}
    more = dataclasses.replace(spec, trials=14)  # resumed: `restore` rebuilds the data from the history
    resumed = SearchLoop(more, run, SelfReporting(evaluator, marked), progress=False)
    resumed.run_search()
    history = read_history(run / "history.jsonl")
    assert {r.encoding for r in resumed.strategy.history} == {r.encoding for r in history if r.counts_for_best(trust)}
    unscored = TrialRecord(0, "a", "a", 99.9, metrics={"self_reported": 1.0}, params=1, flops=1).as_told(False)
    assert (unscored.accuracy, unscored.params, unscored.flops, unscored.ok) == (None, None, None, False)
    assert "self-reported by the model's own code, not verified" in unscored.error


def test_export_says_when_only_self_reported_trials_succeeded(tmp_path, evaluator):
    from nas.export import ExportError

    spec = make_spec(seed=2, trials=3, strategy="random")
    search(spec, tmp_path / "plain", evaluator)
    every = set(keys(tmp_path / "plain"))
    summary = search(spec, tmp_path / "run", evaluator, executor=SelfReporting(evaluator, every))
    assert summary["best"] is None and summary["self_reported"] == 3 and summary["failed"] == 0
    with pytest.raises(ExportError, match="every successful trial is self-reported"):
        load_trial(tmp_path / "run", None)
    assert load_trial(tmp_path / "run", 1)[1].trial == 1  # chosen explicitly, it is exported


def test_summarise_counts_self_reported():
    history = [TrialRecord(0, "a", "a", 97.0, metrics={"self_reported": 1.0}, params=1, flops=1),
               TrialRecord(1, "b", "b", 80.0, params=1, flops=1)]
    summary = summarise(make_spec(), history, 1.0, resumed=0, runner="local", exhausted=None)
    assert summary["self_reported"] == 1 and summary["best"]["key"] == "b" and summary["failed"] == 0


def test_train_evaluator_accepts_trust_as_a_bool_outside_its_fingerprint():
    from nas.config import compose_config

    def evaluator(*overrides: str):
        spec = SearchSpec.from_config(compose_config(["evaluator=quick", "data=digits", *overrides]))
        return spec, spec.build_evaluator(spec.build_space())

    spec, plain = evaluator()
    trusting_spec, trusting = evaluator("evaluator.trust_self_reported=true")
    assert plain.trust_self_reported is False and trusting.trust_self_reported is True
    assert plain.fingerprint() == trusting.fingerprint() and spec.identity() != trusting_spec.identity()
    with pytest.raises(ConfigError, match="parameter 'trust_self_reported' must be bool, got 1"):
        evaluator("evaluator.trust_self_reported=1")


def test_a_start_that_failed_leaves_no_run_dir_but_a_started_search_keeps_its_files(tmp_path):
    """`.lock` and `.hydra/` alone are what a start writes before the search: removed; anything else keeps the dir."""
    unstarted, started = RunDir(tmp_path / "unstarted"), RunDir(tmp_path / "started")
    for run in (unstarted, started):
        with run.lock():
            (run.path / ".hydra").mkdir()
            (run.path / ".hydra" / "config.yaml").write_text("seed: 0\n")
            if run is started:
                run.state_path.write_text("{}")
            run.discard_unstarted()
    assert not unstarted.path.exists()
    assert sorted(p.name for p in started.path.iterdir()) == [".hydra", ".lock", "state.json"]
    with unstarted.lock():  # the lock is free again, on a new file
        assert unstarted.lock_path.exists()


def test_saved_trials_counts_the_records_a_resume_keeps_past_empty_lines(tmp_path):
    """An empty line (an editor's, a copy's) made it 0: it counts what `prepare` would keep."""
    run = RunDir(tmp_path)
    run.state_path.write_text(json.dumps({"history_lines": 3}))
    rows = [{"trial": 0}, {"trial": 1, "screened": True}, {"trial": 2}, {"trial": 3}]  # the 4th: after the state
    run.history_path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" +
                                "\n".join(json.dumps(r) for r in rows[2:]) + "\n\n")
    assert run.saved_trials() == 2  # trials 0 and 2; the screened one is no trial of the budget
    run.history_path.write_text("{not json\n")
    assert run.saved_trials() == 0

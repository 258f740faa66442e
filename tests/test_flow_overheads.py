"""What a search flow's own start and end cost, cut without losing what Prefect gives: the run's
heartbeats (the same events as the engine's) that stop at once instead of the engine's thread
ending its second of sleep; the report's child importing matplotlib while the search runs (its files
there when the flow returns; none from a search that failed); parameters sent as Prefect would send
them, without importing FastAPI's encoder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.flow_engine import FlowRunEngine
from prefect.flows import Flow
from prefect.settings import get_current_settings

from flows import heartbeat
from flows.heartbeat import heartbeats, quick_heartbeats
from flows.search import search_flow
from nas.core.trial import TrialRecord
from nas.execute import execute
from nas.report import RunReport
from nas.search import rundir
from nas.search.spec import Component, SearchSpec

ROOT = Path(__file__).resolve().parents[1]


def _run(deployment: bool) -> FlowRun:
    return FlowRun(id=uuid.uuid4(), name="random-nb201-s0", flow_id=uuid.uuid4(), tags=["nas", "table"],
                   deployment_id=uuid.uuid4() if deployment else None)


@pytest.mark.parametrize("deployment", [False, True])
def test_heartbeats_are_the_engines_and_stop_at_once(monkeypatch, deployment):
    run = _run(deployment)
    sent: list[dict] = []
    monkeypatch.setattr(heartbeat, "emit_event", lambda **event: sent.append(event))
    monkeypatch.setattr(heartbeat.FlowRunContext, "get", lambda: SimpleNamespace(flow_run=run, flow=search_flow))
    before = {t.ident for t in threading.enumerate()}
    outside = get_current_settings().model_dump()
    with quick_heartbeats():
        assert get_current_settings().flows.heartbeat_frequency is None  # the engine sends none
        inside = get_current_settings().model_dump()
        assert inside["flows"].pop("heartbeat_frequency") is None
        assert inside == outside | {"flows": {k: v for k, v in outside["flows"].items() if k != "heartbeat_frequency"}}
        with heartbeats():
            assert get_current_settings().flows.heartbeat_frequency == 180  # a nested flow beats on its own
            deadline = time.monotonic() + 10
            while not sent and time.monotonic() < deadline:
                time.sleep(0.01)
            (beat,) = [t for t in threading.enumerate() if t.name == "nas-heartbeat"]
            assert beat.daemon  # a heartbeat never holds the process open past its flow
            start = time.perf_counter()
        ended = time.perf_counter() - start
    assert ended < 0.2, f"the body's end waited {ended:.2f}s for the heartbeat thread"
    assert {t.ident for t in threading.enumerate()} <= before  # the thread is gone
    assert len(sent) == 1  # the first at once, the next after 180 s
    engine = FlowRunEngine(flow=search_flow, flow_run=run)
    resource, related = engine._build_heartbeat_event_template()  # what Prefect's own thread sends
    assert sent[0]["event"] == "prefect.flow-run.heartbeat" and sent[0]["resource"] == resource
    assert sorted(map(json.dumps, sent[0]["related"])) == sorted(json.dumps(dict(r)) for r in related)


def test_no_heartbeats_of_ours_where_the_engine_sends_them(monkeypatch):
    """Outside `quick_heartbeats` (a deployment's run, whose body runs the search) the engine's
    heartbeats were never turned off: the body sends none of its own."""
    sent: list[dict] = []
    monkeypatch.setattr(heartbeat, "emit_event", lambda **event: sent.append(event))
    monkeypatch.setattr(heartbeat.FlowRunContext, "get", lambda: SimpleNamespace(flow_run=_run(False), flow=search_flow))
    with heartbeats():
        time.sleep(0.05)
    assert sent == [] and get_current_settings().flows.heartbeat_frequency == 180


def _summary(run_dir: Path) -> dict:
    """A finished 3-trial table search's summary, its history.jsonl in `run_dir` (its report removed)."""
    spec = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"),
                      trials=3)
    summary = execute(spec, run_dir, {"name": "local"}, progress=False)
    for name in ("best_so_far.png", "report.md"):
        (run_dir / name).unlink()
    return summary


def test_report_child_started_early_draws_when_sent_the_summary(tmp_path):
    report = RunReport.start(tmp_path)  # as the search starts: it imports matplotlib meanwhile
    summary = _summary(tmp_path)  # the search runs, writing history.jsonl
    report.send(summary)
    report.wait()
    assert (tmp_path / "best_so_far.png").stat().st_size > 1000
    assert f"| best accuracy | {summary['best']['accuracy']:.2f} |" in (tmp_path / "report.md").read_text()


def test_a_failed_searchs_report_child_writes_nothing(tmp_path, capsys):
    _summary(tmp_path)
    report = RunReport.start(tmp_path)
    report.discard()  # the loop raised (an interrupt, an error)
    assert report.proc.returncode is not None  # stopped and reaped, not left to finish its imports
    assert not (tmp_path / "best_so_far.png").exists() and not (tmp_path / "report.md").exists()
    assert capsys.readouterr().err == ""  # no "report not written" warning for a search that failed


def test_parameters_are_sent_as_prefect_sends_them():
    spec = SearchSpec(space=Component("nb201"), strategy=Component("rea", {"population_size": 10}),
                      evaluator=Component("table"), trials=100).to_dict()
    params = {"spec": spec, "run_dir": "/tmp/run", "retries": 1, "progress": False, "runner": "prefect",
              "runner_settings": {"name": "prefect", "workers": 4}}
    flow_ = search_flow.with_options(flow_run_name="random-nb201-s0")
    assert type(flow_) is type(search_flow)
    assert flow_.serialize_parameters(params) == Flow.serialize_parameters(flow_, params)
    odd = {"run_dir": Path("/tmp/run"), "spec": {1: "a"}}  # not JSON data: Prefect's encoder, as before
    assert flow_.serialize_parameters(odd) == Flow.serialize_parameters(flow_, odd)
    assert flow_.serialize_parameters(odd)["run_dir"] == "/tmp/run"


def test_sending_a_searchs_parameters_imports_no_fastapi():
    probe = ("import sys; from flows.search import search_flow; "
             "search_flow.serialize_parameters({'spec': {'a': (1, 2.5, None, True)}, 'run_dir': 'x'}); "
             "print('fastapi' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def _file_events(monkeypatch) -> list[tuple[str, str, str]]:
    """(fsync|replace, file name, thread name) of every fsync and rename from here on."""
    events: list[tuple[str, str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name, threading.current_thread().name))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("replace", Path(dst).name, threading.current_thread().name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


TABLE_SPEC = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"),
                        trials=4)


def test_a_trials_history_line_is_on_disk_before_the_fsynced_state_that_counts_it(tmp_path, monkeypatch):
    """Trials slower than SYNC_EVERY_S (here every trial): each state is fsynced, with the history
    line it counts, in one fsync's wait (the line's from a second thread), before it replaces the old."""
    monkeypatch.setattr(rundir, "SYNC_EVERY_S", 0.0)
    events = _file_events(monkeypatch)
    execute(TABLE_SPEC, tmp_path / "run", {"name": "local"}, progress=False)
    states = [i for i, e in enumerate(events) if e[:2] == ("replace", "state.json")]
    assert len(states) == 1 + 4  # the first before any trial, then one a trial
    for before, after in zip(states, states[1:]):
        synced = [e for e in events[before + 1:after] if e[0] == "fsync"]
        assert ("fsync", "history.jsonl", "fsync") in synced, events[before + 1:after]  # from the second thread
        assert any(e[1].startswith(".state.json.") for e in synced)  # the new state's temp file
    assert sum(e[1] == "history.jsonl" for e in events) == 4


def test_fast_trials_are_fsynced_once_a_second_and_when_the_search_ends(tmp_path, monkeypatch):
    """Trials faster than SYNC_EVERY_S: only the first state is fsynced as it is saved; the others
    are renamed without an fsync, and the search's end fsyncs the last state and every history
    line, after the last rename and before summary.json."""
    monkeypatch.setattr(rundir, "SYNC_EVERY_S", 3600.0)
    events = _file_events(monkeypatch)
    execute(TABLE_SPEC, tmp_path / "run", {"name": "local"}, progress=False)
    states = [i for i, e in enumerate(events) if e[:2] == ("replace", "state.json")]
    assert len(states) == 1 + 4
    assert [e for e in events[:states[0]] if e[0] == "fsync"][-1][1].startswith(".state.json.")
    assert not [e for e in events[states[0] + 1:states[-1]] if e[0] == "fsync"]
    summary = next(i for i, e in enumerate(events) if e[:2] == ("replace", "summary.json"))
    synced = {e[1] for e in events[states[-1] + 1:summary] if e[0] == "fsync"}
    assert {"state.json", "history.jsonl"} <= synced, events[states[-1]:]
    assert (tmp_path / "run" / "history.jsonl").read_text().count("\n") == 4


def test_a_state_is_fsynced_once_sync_every_s_has_passed(tmp_path, monkeypatch):
    """The boundary: a save exactly SYNC_EVERY_S after the last fsynced one is fsynced (with the
    history appended since), one a moment earlier is not."""
    now = [0.0]
    run = rundir.RunDir(tmp_path, clock=lambda: now[0])
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name),
                                                 real_fsync(fd))[1])
    record = TrialRecord(trial=0, key="k", encoding="e", accuracy=1.0, params=None, flops=None, cost_seconds=0.0)
    for at, expect in [(0.0, True), (rundir.SYNC_EVERY_S - 1e-6, False), (rundir.SYNC_EVERY_S, True),
                       (2 * rundir.SYNC_EVERY_S - 1e-3, False)]:
        now[0] = at
        run.append([record], sync=False)
        synced.clear()
        run.save_state({}, 1, {}, 0.0)
        assert any(name.startswith(".state.json.") for name in synced) is expect, (at, synced)
        assert ("history.jsonl" in synced) is expect, (at, synced)
    synced.clear()
    run.sync()
    assert {"state.json", "history.jsonl"} <= set(synced)
    synced.clear()
    run.sync()  # nothing left unsynced
    assert synced == []


def test_syncing_together_says_the_other_files_error(tmp_path):
    from nas.io import fsync_together

    with open(tmp_path / "a", "wb") as fh:
        with pytest.raises(FileNotFoundError):
            fsync_together(fh.fileno(), tmp_path / "missing")


def test_cli_latency_splits_a_search_at_its_log_lines(tmp_path):
    """benchmarks/cli_latency.py's phases: command start -> "run dir:" -> the last trial line -> the
    end, from search.log's local-time millisecond stamps; an earlier command's lines (a resumed dir)
    are not this one's; a log without both lines gives no phases."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from cli_latency import phases
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    start = time.mktime((2026, 12, 3, 9, 0, 0, 0, 0, -1))
    log = tmp_path / "search.log"
    log.write_text("[2026-12-03 08:59:58,000][nas.progress][INFO] - trial 50/100, best 93.00, elapsed 1.0s\n"
                   "[2026-12-03 09:00:01,250][nas.start][INFO] - run dir: /x\n"
                   "[2026-12-03 09:00:01,260][nas.progress][INFO] - random on nb201: 100 trials\n"
                   "[2026-12-03 09:00:01,300][nas.progress][INFO] - trial 51/100, best 93.00, elapsed 0.1s\n"
                   "[2026-12-03 09:00:01,400][nas.other][INFO] - trial 99/100 from another logger\n"
                   "[2026-12-03 09:00:02,000][nas.progress][INFO] - trial 100/100, best 93.10, elapsed 0.8s\n",
                   encoding="utf-8")
    assert phases(log, start, start + 2.5) == {"to_run_dir_s": 1.25, "trials_s": 0.75, "after_last_trial_s": 0.5}
    log.write_text("[2026-12-03 09:00:01,250][nas.start][INFO] - run dir: /x\n", encoding="utf-8")
    assert phases(log, start, start + 2.5) == {}
    assert phases(tmp_path / "missing.log", start, start + 2.5) == {}


@pytest.mark.parametrize("lines, sync, left", [
    (1, True, False),  # appended with its fsync: nothing left for the end's
    (0, False, False),  # nothing appended: nothing to fsync
    (1, False, True),  # appended without: the end fsyncs it with the state
])
def test_the_searchs_end_fsyncs_only_history_lines_appended_without_their_fsync(tmp_path, monkeypatch, lines, sync,
                                                                                left):
    run = rundir.RunDir(tmp_path / "a" / "b" / "run")  # its parents made with it (by the lock)
    with run.lock():
        run.save_state({"f": 1}, 0, {}, 0.0)  # the first state: fsynced as saved
        events = _file_events(monkeypatch)
        record = TrialRecord(trial=0, key="k", encoding="e", accuracy=1.0, params=None, flops=None, cost_seconds=0.0)
        run.append([record] * lines, sync=sync)
        appended = len(events)
        run.sync()
    assert appended == (1 if lines and sync else 0)
    assert {e[1] for e in events[appended:] if e[0] == "fsync"} == ({"state.json", "history.jsonl"} if left else set())

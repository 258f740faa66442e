"""Slow steps with nothing to count say what they do (nas/status.py): a sweep's job checks and
Prefect's temporary server start were tens of silent seconds before the first line."""

from __future__ import annotations

import sys
import types

import pytest

import nas.status
from nas.cli import search as search_cli
from nas.status import status


def test_off_a_terminal_a_step_says_what_it_does_once(capsys):
    with status("loading", tty=False):
        pass
    with status("counting", total=3, tty=False):  # a counted step that ends at once says nothing
        pass
    assert capsys.readouterr().err == "loading ...\n"


def test_a_step_run_without_progress_says_nothing(capsys):
    """`show=False` replaces the callers' `status(...) if show else nullcontext()`."""
    with status("loading", show=False, tty=False):
        pass
    with status("counting", total=2, show=False, tty=True) as advance:
        advance()
    assert capsys.readouterr().err == ""


def test_a_sweeps_job_checks_show_progress_and_a_bad_first_job_still_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(search_cli, "search_job", lambda cfg, existing, built: None)  # the checks alone, no run
    monkeypatch.setattr(nas.status, "PLAIN_AFTER_S", 0.0)
    search_cli.main(["-m", "space=nb201", "seed=0,1"])
    assert "checking 2 jobs ...\n" in capsys.readouterr().err
    search_cli.main(["-m", "space=nb201", "seed=0,1", "progress=false"])
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(nas.status, "PLAIN_AFTER_S", 3600.0)
    with pytest.raises(SystemExit):
        search_cli.main(["-m", "space=nb201", "strategy=nader,random"])
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("nas: error: strategy=nader searches space=nader"), err


def test_one_jobs_build_says_what_it_checks_only_with_progress(monkeypatch, tmp_path, capsys):
    """A single job's build (2-5 s of torch imports) was silent; a component's error after it is still one line."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(search_cli, "search_job", lambda cfg, existing, built: None)  # the checks alone, no run
    monkeypatch.setattr(nas.status, "PLAIN_AFTER_S", 0.0)  # off a terminal it says so once the build has run
    search_cli.main(["space=nb201"])
    assert capsys.readouterr().err == "checking space=nb201, strategy=bananas and evaluator=table ...\n"
    search_cli.main(["space=nb201", "progress=false"])
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        search_cli.main(["space=nb201", "evaluator.simulated_cost_seconds=-1"])  # the evaluator's own check
    err = capsys.readouterr().err.splitlines()
    assert err == ["nas: error: evaluator.simulated_cost_seconds must be >= 0, got -1"], err


def test_the_temporary_prefect_server_starts_with_a_status_line(monkeypatch, capsys):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.prefect_server import start_temporary_server

    class Server:
        running, starts = False, 0

        def start(self) -> None:
            Server.starts += 1
            Server.running = True

    fake = types.ModuleType("prefect.server.api.server")
    fake.SubprocessASGIServer = Server  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "prefect.server.api.server", fake)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert isinstance(start_temporary_server(show=True), Server)
        start_temporary_server(show=True)  # already running: nothing to say
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert start_temporary_server(show=True) is None  # a configured server: none of ours
    assert Server.starts == 1
    assert capsys.readouterr().err == "starting Prefect's temporary server ...\n"
    Server.running = False
    with temporary_settings(updates={PREFECT_API_URL: None}):
        start_temporary_server(show=False)  # without progress it starts silently
    assert Server.starts == 2 and capsys.readouterr().err == ""


def test_a_local_worker_pool_says_it_is_starting(monkeypatch, tmp_path, capsys):
    """runner=local with budget.in_flight > 1: the workers' start was 20 s without a line."""
    from nas.execute import LocalRunner
    from nas.pool import WorkerPool
    from nas.search.rundir import RunDir
    from nas.search.session import Session
    from nas.search.spec import Component, Search, SearchSpec

    class Started(Exception):
        pass

    def start(*args, **kwargs):
        raise Started  # the status is up by now; no processes needed to see it

    monkeypatch.setattr(WorkerPool, "from_settings", start)
    spec = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"),
                      trials=2, in_flight=2)
    run = RunDir(tmp_path)
    with pytest.raises(Started), run.lock():
        LocalRunner({"name": "local"}).run(Session(Search(spec, None, None, None), run, None),  # type: ignore[arg-type]
                                           progress=True)
    assert capsys.readouterr().err == "starting the worker pool ...\n"

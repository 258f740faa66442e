"""pytest plugin for benchmarks/mutation.py's coverage map: each test's lines under its own context.

Loaded as `-p covcontext` (benchmarks/ on PYTHONPATH) in a run whose processes coverage measures
through COVERAGE_PROCESS_START (coverage's own .pth starts it in every Python process, xdist workers
and the subprocesses tests start alike). Around each test (set-up, call and teardown) it switches the
in-process context to the test's node id and puts that id in NASFLOW_COV_CONTEXT, which the coverage
config names as the static context of any process started meanwhile (a `nas` CLI run, a Prefect
server), so their lines count for the test too. Lines run outside any test (imports at collection)
keep the empty context. The controller (or the only process, without xdist) writes every test's
outcome and duration to $NASFLOW_COVMAP_DIR/tests.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ENV = "NASFLOW_COV_CONTEXT"
_tests: dict[str, dict] = {}


def _switch(name: str) -> None:
    import coverage

    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(name)
    os.environ[ENV] = name


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _switch(item.nodeid)
    try:
        yield
    finally:
        _switch("")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return  # the controller sees every worker's reports
    entry = _tests.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
    entry["seconds"] += report.duration
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
    if getattr(report, "wasxfail", None) is not None:
        entry["outcome"] = "xfail"


def pytest_sessionfinish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import coverage

        cov = coverage.Coverage.current()
        if cov is not None:  # a worker may be ended without running atexit
            cov.stop()
            cov.save()
        return
    folder = os.environ.get("NASFLOW_COVMAP_DIR")
    if folder:
        Path(folder, "tests.json").write_text(json.dumps(_tests))

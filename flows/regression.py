"""The nightly benchmark-regression flow: each probe of the suite is a Prefect
task (retried once, never cached: a regression run must measure afresh), the
comparison with the stored baseline is the final task, and the flow run fails
when anything regressed, so the UI shows it red. Served as a cron deployment
by import path `flows.regression:regression_flow`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from nas.regression.judge import Plan, RegressionFailed, failed_probe, finish, plan
from nas.regression.probes import get_suite, run_probe


@task(retries=1, retry_delay_seconds=5, cache_policy=NO_CACHE, persist_result=False,
      task_run_name="probe-{name}")
def probe_task(suite: str, name: str, out: str) -> dict[str, Any]:
    return run_probe(suite, name, Path(out))


@task(cache_policy=NO_CACHE, persist_result=False, task_run_name="compare-{suite}")
def compare_task(suite: str, p: Plan, results: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    return finish(p, results, wall_s=wall_s)


@flow(name="nas-regression", persist_result=False, validate_parameters=False)
def regression_flow(suite: str = "nightly", baseline: str | None = None, out: str | None = None) -> dict:
    """Probes run one after another: concurrent probes would distort each other's timings."""
    logger = get_run_logger()
    p = plan(get_suite(suite), baseline, out)  # a bad suite or baseline fails the run before any probe
    start = time.perf_counter()
    results = []
    for probe in p.suite.probes:
        state = probe_task(suite, probe.name, str(p.out), return_state=True)
        result = state.result(raise_on_failure=False)
        results.append(result if state.is_completed() else failed_probe(probe.name, result))
    report = compare_task(suite, p, results, round(time.perf_counter() - start, 1))
    for line in report["failures"]:
        logger.error(line)
    if report["failures"]:
        raise RegressionFailed(f"suite '{suite}': {len(report['failures'])} metric(s) regressed or missing: "
                               + "; ".join(report["failures"]) + f" (report: {report['out']}/report.md)")
    logger.info("suite '%s': no regression (report: %s/report.md)", suite, report["out"])
    return report

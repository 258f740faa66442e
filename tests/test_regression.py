"""The benchmark-regression suite: comparison logic, baselines, the `nas regress`
CLI on the `smoke` suite against the committed baseline (and a tampered copy),
and the Prefect flow failing on a regression. Timings are never asserted: the
smoke baseline records its timing metrics without a tolerance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_nas
from nas.regression.judge import (
    HIGHER,
    LOWER,
    BaselineError,
    Metric,
    Probe,
    Suite,
    baseline_from,
    compare,
    default_baseline,
    failure_lines,
    judge,
    load_baseline,
    plan,
)
from nas.regression.probes import SUITES, ProbeSkipped, run_suite

SMOKE = default_baseline("smoke")


def metric(value, direction=HIGHER, tolerance=None, timing=False):
    return {"value": value, "direction": direction, "tolerance": tolerance, "timing": timing, "unit": ""}


def probe(name, metrics=None, skipped=None, error=None):
    return {"name": name, "metrics": metrics or {}, "skipped": skipped, "error": error, "seconds": 1.0}


def write(path: Path, obj) -> Path:
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.mark.parametrize("value, base, direction, tol, status", [
    (93.50, 93.52, HIGHER, {"abs": 0.05}, "ok"),
    (93.47, 93.52, HIGHER, {"abs": 0.05}, "ok"),          # exactly at the bound
    (93.40, 93.52, HIGHER, {"abs": 0.05}, "regressed"),
    (93.60, 93.52, HIGHER, {"abs": 0.05}, "improved"),
    (21.0, 10.0, LOWER, {"rel": 1.0}, "regressed"),        # > 2x slower
    (19.0, 10.0, LOWER, {"rel": 1.0}, "ok"),
    (4.0, 10.0, LOWER, {"rel": 0.5}, "improved"),
    (40.0, 100.0, HIGHER, {"rel": 0.5}, "regressed"),      # throughput halved and more
    (1.0, 100.0, HIGHER, None, "info"),                    # no tolerance: recorded, never compared
])
def test_judge(value, base, direction, tol, status):
    assert judge(value, base, direction, tol) == status


def test_compare_statuses_and_failure_lines():
    baseline = {"metrics": {
        "table.a": metric(93.5, tolerance={"abs": 0.05}), "table.b": metric(93.5, tolerance={"abs": 0.05}),
        "table.gone": metric(1.0, tolerance={"abs": 0}), "design.trials": metric(2, tolerance={"abs": 0}),
        "llm.tokens_per_s": metric(70.0, tolerance={"rel": 0.5}, timing=True)}}
    results = [probe("table", {"table.a": metric(93.51), "table.b": metric(92.0), "table.extra": metric(3.0)}),
               probe("design", error="RuntimeError: boom"), probe("llm", skipped="no model")]
    rows = {r["metric"]: r for r in compare(baseline, results)}
    assert {k: r["status"] for k, r in rows.items()} == {
        "table.a": "ok", "table.b": "regressed", "table.gone": "missing", "table.extra": "new",
        "design.trials": "missing", "llm.tokens_per_s": "skipped"}
    assert rows["llm.tokens_per_s"]["note"] == "no model"
    assert rows["table.b"]["ratio"] == pytest.approx(92.0 / 93.5)
    lines = failure_lines(list(rows.values()))
    assert len(lines) == 3 and all("\n" not in line for line in lines)
    assert any(line.startswith("REGRESSED table.b: 92 vs baseline 93.5") for line in lines)
    assert "MISSING design.trials: in the baseline, probe failed: RuntimeError: boom" in lines


@pytest.mark.parametrize("content, problem", [
    ("{not json", "corrupt JSON at line 1"),
    ([1, 2], "expected an object with a 'metrics' object"),
    ({"suite": "nightly", "metrics": {}}, "baseline is for suite 'nightly', not 'smoke'"),
    ({"suite": "smoke", "metrics": {"m": {"value": "x", "direction": HIGHER}}}, "metric 'm': 'value' must be"),
    ({"suite": "smoke", "metrics": {"m": {"value": 1, "direction": "up"}}}, "metric 'm': 'direction' must be"),
    ({"suite": "smoke", "metrics": {"m": metric(1, tolerance={"pct": 5})}}, "metric 'm': 'tolerance' must be"),
    ({"suite": "smoke", "metrics": {"m": metric(1, tolerance={"abs": -1})}}, "must be a non-negative number"),
])
def test_malformed_baseline_is_one_line_naming_the_file(tmp_path, content, problem):
    path = write(tmp_path / "b.json", content)
    with pytest.raises(BaselineError) as err:
        load_baseline(path, "smoke")
    message = str(err.value)
    assert message.startswith(str(path)) and problem in message and "\n" not in message


def test_update_keeps_tuned_tolerances_and_skipped_probes():
    previous = {"metrics": {"table.a": metric(93.0, tolerance={"abs": 0.2}),
                            "llm.tokens_per_s": metric(70.0, tolerance={"rel": 0.5}, timing=True)}}
    results = [probe("table", {"table.a": metric(93.4, tolerance={"abs": 0.05}), "table.n": metric(5.0)}),
               probe("llm", skipped="no model")]
    new = baseline_from("nightly", results, previous)
    assert new["metrics"]["table.a"] == metric(93.4, tolerance={"abs": 0.2})
    assert new["metrics"]["llm.tokens_per_s"]["value"] == 70.0 and new["skipped"] == {"llm": "no model"}
    assert "table.n" in new["metrics"] and new["suite"] == "nightly"


def test_update_refuses_to_rewrite_an_installed_baseline(tmp_path, monkeypatch):
    installed = tmp_path / "lib" / "site-packages" / "nas" / "regression" / "baselines" / "smoke.json"
    monkeypatch.setattr("nas.regression.judge.default_baseline", lambda suite: installed)
    with pytest.raises(BaselineError, match=r"would rewrite the installed package's .*: pass --baseline PATH"):
        plan(SUITES["smoke"], update=True)
    assert plan(SUITES["smoke"], tmp_path / "mine.json", update=True).baseline_path == (tmp_path / "mine.json").resolve()


def test_run_suite_update_then_compare(tmp_path, monkeypatch):
    """In-process, with stand-in probes: a skip is recorded, a crash blocks the update and later
    shows as missing metrics, a drop beyond tolerance regresses."""
    value = {"x": 1.0}

    def good(workdir, overrides):
        return {"x": Metric(value["x"], HIGHER, {"abs": 0.1}), "secs": Metric(2.0, LOWER, {"rel": 1.0}, timing=True)}

    def skip(workdir, overrides):
        raise ProbeSkipped("no LLM here")

    def crash(workdir, overrides):
        raise RuntimeError("boom")

    baseline = tmp_path / "unit.json"
    monkeypatch.setitem(SUITES, "unit", Suite("unit", (Probe("good", good), Probe("crash", crash)), False))
    report = run_suite("unit", baseline, tmp_path / "a", update=True, progress=False)
    assert not report["baseline_updated"] and not baseline.exists()
    assert report["failures"] == ["ERROR probe crash: RuntimeError: boom (baseline not written)"]

    monkeypatch.setitem(SUITES, "unit", Suite("unit", (Probe("good", good), Probe("skip", skip)), False))
    report = run_suite("unit", baseline, tmp_path / "b", update=True, progress=False)
    written = load_baseline(baseline, "unit")
    assert report["baseline_updated"] and written["skipped"] == {"skip": "no LLM here"}
    assert written["metrics"]["good.secs"]["tolerance"] is None  # timings not compared in this suite

    value["x"] = 0.8
    monkeypatch.setitem(SUITES, "unit", Suite("unit", (Probe("good", good), Probe("crash", crash)), False))
    written["metrics"]["crash.y"] = metric(1.0, tolerance={"abs": 0})
    write(baseline, written)
    report = run_suite("unit", baseline, tmp_path / "c", progress=False)
    assert report["failures"] == ["MISSING crash.y: in the baseline, probe failed: RuntimeError: boom",
                                  "REGRESSED good.x: 0.8 vs baseline 1, 0.8x (tolerance abs 0.1, higher is better)"]
    assert {p.name for p in (tmp_path / "c").iterdir()} >= {"report.json", "report.md", "ratios.png"}


def test_committed_baselines_are_valid():
    for suite in ("smoke", "nightly"):
        baseline = load_baseline(default_baseline(suite), suite)
        timings = [e for e in baseline["metrics"].values() if e["timing"]]
        if suite == "smoke":  # a seconds-long run on a loaded machine must never fail on speed
            assert timings and all(e["tolerance"] is None for e in timings)


def test_cli_bad_input_exits_2_with_one_line(nas_env, tmp_path):
    missing = tmp_path / "none.json"
    out = run_nas(["regress", "--suite", "smoke", "--baseline", str(missing), "--out", str(tmp_path / "r")], nas_env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"nas: error: {missing}: baseline not found (create it: nas regress --suite smoke --update-baseline)"]
    out = run_nas(["regress", "--suite", "weekly"], nas_env)
    assert out.returncode == 2 and "unknown suite 'weekly' (valid: smoke, nightly)" in out.stderr


def tampered(tmp_path: Path) -> Path:
    """The committed smoke baseline with one metric raised beyond its tolerance."""
    data = json.loads(SMOKE.read_text())
    data["metrics"]["table.rea.best_at_25"]["value"] += 0.5
    return write(tmp_path / "tampered.json", data)


@pytest.mark.slow
def test_cli_smoke_suite_against_committed_and_tampered_baselines(nas_env, tmp_path):
    out = run_nas(["regress", "--suite", "smoke", "--no-progress", "--out", str(tmp_path / "ok")], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads((tmp_path / "ok" / "report.json").read_text())
    assert report["ok"] and report["baseline"] == str(SMOKE)
    assert out.stdout.splitlines()[-1].startswith("PASS: suite 'smoke': nothing regressed (")
    assert {r["status"] for r in report["metrics"]} <= {"ok", "info"}
    assert (tmp_path / "ok" / "report.md").is_file() and (tmp_path / "ok" / "ratios.png").is_file()

    out = run_nas(["regress", "--suite", "smoke", "--no-progress", "--baseline", str(tampered(tmp_path)),
                   "--out", str(tmp_path / "bad")], nas_env)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[0].startswith("nas regress: REGRESSED table.rea.best_at_25: ") and len(lines) == 2
    assert "FAILED: 1 problem(s)" in lines[1]
    assert out.stdout.splitlines()[-1].startswith("FAIL: suite 'smoke': 1 problem(s) (")


@pytest.mark.slow
def test_flow_fails_on_regression(prefect_home, tmp_path):
    from flows.regression import regression_flow
    from nas.regression.judge import RegressionFailed

    with pytest.raises(RegressionFailed, match="table.rea.best_at_25"):
        regression_flow(suite="smoke", baseline=str(tampered(tmp_path)), out=str(tmp_path / "run"))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [r["metric"] for r in report["metrics"] if r["status"] == "regressed"] == ["table.rea.best_at_25"]
    assert [p["name"] for p in report["probes"]] == ["table", "throughput"]


def test_cli_prints_a_header_a_verdict_per_row_and_pass_or_fail_matching_its_exit_code(tmp_path, monkeypatch,
                                                                                        capsys):
    """The real `nas regress` main and run_suite on stand-in probes, against a baseline it wrote."""
    from nas.cli.main import main as nas_main

    value = {"x": 1.0}

    def good(workdir, overrides):
        return {"x": Metric(value["x"], HIGHER, {"abs": 0.1}), "secs": Metric(2.0, LOWER, None, timing=True)}

    monkeypatch.setitem(SUITES, "unit", Suite("unit", (Probe("good", good),), False))
    baseline = tmp_path / "unit.json"

    def regress(out: str) -> tuple[int, list[str], list[str]]:
        with pytest.raises(SystemExit) as exc:
            nas_main(["regress", "--suite", "unit", "--no-progress", "--baseline", str(baseline),
                      "--out", str(tmp_path / out), *(["--update-baseline"] if out == "u" else [])])
            raise SystemExit(0)
        captured = capsys.readouterr()
        return exc.value.code, captured.out.splitlines(), captured.err.splitlines()

    code, out, err = regress("u")
    assert code == 0 and out[-1] == f"PASS: suite 'unit': baseline written: {baseline.resolve()} (2 new)"
    code, out, err = regress("ok")
    assert code == 0 and not err
    assert out[0].split() == ["metric", "value", "baseline", "verdict"]
    assert out[1].split() == ["good.secs", "2", "2", "info", "(no", "tolerance)"]
    assert out[2].split() == ["good.x", "1", "1", "ok"]
    assert out[-1] == "PASS: suite 'unit': nothing regressed (1 info, 1 ok)"
    value["x"] = 0.8
    code, out, err = regress("bad")
    assert code == 1
    assert out[2].split() == ["!!", "good.x", "0.8", "1", "REGRESSED"]
    assert out[-1] == "FAIL: suite 'unit': 1 problem(s) (1 info, 1 regressed; exit 1)"
    assert err[0].startswith("nas regress: REGRESSED good.x: 0.8 vs baseline 1") and len(err) == 2

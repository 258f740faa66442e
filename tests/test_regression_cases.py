"""The regression suite's pieces case by case (issue 52, the library mutation run): the judging at
and either side of each bound, the baseline checks, the report's text and plot, and each probe on
stand-ins with a scripted clock, so every number a probe reports is checked exactly. The table
probe runs for real: it reproduces the committed baselines' accuracies."""

from __future__ import annotations

import dataclasses
import json
import types
from pathlib import Path

import pytest
import torch

from nas.errors import ConfigError, MissingDependencyError, NasError
from nas.regression import judge as J
from nas.regression import probes as P
from nas.regression.judge import HIGHER, LOWER, BaselineError, Metric, Probe, Suite


def metric(value, direction=HIGHER, tolerance=None, timing=False, unit=""):
    return {"value": value, "direction": direction, "tolerance": tolerance, "timing": timing, "unit": unit}


def result(name, metrics=None, skipped=None, error=None, seconds=1.0):
    return {"name": name, "metrics": metrics or {}, "skipped": skipped, "error": error, "seconds": seconds}


class Clock:
    """time.perf_counter for the probes module only: the scripted readings, in order."""

    def __init__(self, *readings: float):
        self.readings = list(readings)

    def perf_counter(self) -> float:
        return self.readings.pop(0)


def clock(monkeypatch, *readings: float) -> Clock:
    c = Clock(*readings)
    monkeypatch.setattr(P, "time", c)
    return c


# ---------------------------------------------------------------- judge

@pytest.mark.parametrize("value, base, direction, tol, status", [
    (10.5, 10.0, HIGHER, {"abs": 0.5}, "ok"),           # at the upper bound
    (10.6, 10.0, HIGHER, {"abs": 0.5}, "improved"),
    (9.5, 10.0, HIGHER, {"abs": 0.5}, "ok"),            # at the lower bound
    (9.4, 10.0, HIGHER, {"abs": 0.5}, "regressed"),
    (10.0, 10.0, HIGHER, {"abs": 0}, "ok"),             # a zero tolerance: equal is ok
    (10.001, 10.0, HIGHER, {"abs": 0}, "improved"),
    (9.999, 10.0, HIGHER, {"abs": 0}, "regressed"),
    (9.4, 10.0, LOWER, {"abs": 0.5}, "improved"),
    (10.6, 10.0, LOWER, {"abs": 0.5}, "regressed"),
    (10.5, 10.0, LOWER, {"abs": 0.5}, "ok"),
    (-10.0, -5.0, HIGHER, {"rel": 1.0}, "ok"),          # rel of |base|: margin 5
    (-10.1, -5.0, HIGHER, {"rel": 1.0}, "regressed"),
    (15.0, 10.0, HIGHER, {"rel": 0.5}, "ok"),           # margin 0.5 * 10 = 5, at the bound
    (15.1, 10.0, HIGHER, {"rel": 0.5}, "improved"),
    (4.9, 10.0, HIGHER, {"rel": 0.5}, "regressed"),
    (3.0, 2.0, HIGHER, {"rel": 0.4}, "improved"),       # margin 0.8, not 0.4 // 2 = 0
    (2.5, 2.0, HIGHER, {"rel": 0.4}, "ok"),
    (1e9 + 1, 1e9, HIGHER, {"abs": 0}, "ok"),           # within the float slack of a large base
    (1e9 + 5, 1e9, HIGHER, {"abs": 0}, "improved"),
    (5.0, 10.0, LOWER, None, "info"),
])
def test_judge_at_and_either_side_of_each_bound(value, base, direction, tol, status):
    assert J.judge(value, base, direction, tol) == status


def test_metrics_are_frozen_and_compared_higher_untimed_by_default():
    m = Metric(1.5)
    assert (m.direction, m.tolerance, m.timing, m.unit) == (HIGHER, None, False, "")
    for frozen, field in ((m, "value"), (Probe("p", dict), "name"), (Suite("s", (), False), "name")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(frozen, field, None)
    assert Probe("p", dict).params == {}


def test_a_suite_finds_its_probe_by_name_or_lists_the_valid_ones():
    a, b = Probe("a", dict), Probe("b", dict)
    suite = Suite("s", (a, b), False)
    assert suite.probe("a") is a and suite.probe("b") is b
    with pytest.raises(ConfigError, match=r"^suite 's' has no probe 'c' \(valid: a, b\)$"):
        suite.probe("c")


@pytest.mark.parametrize("err, line", [
    (RuntimeError("first\nsecond"), "RuntimeError: first"),
    (ValueError(), "ValueError: "),
])
def test_a_failed_probe_keeps_the_first_line_of_its_error(err, line):
    assert J.failed_probe("p", err) == {"name": "p", "metrics": {}, "skipped": None, "error": line, "seconds": None}


@pytest.mark.parametrize("compare_timings, timing, kept", [
    (False, False, True), (False, True, False), (True, True, True), (True, False, True)])
def test_a_timing_keeps_its_tolerance_only_where_the_suite_compares_timings(compare_timings, timing, kept):
    m = Metric(3, LOWER, {"rel": 0.5}, timing=timing, unit="s")
    got = J.metric_dict(m, Suite("s", (), compare_timings))
    assert got == {"value": 3.0, "direction": LOWER, "tolerance": {"rel": 0.5} if kept else None,
                   "timing": timing, "unit": "s"}
    assert type(got["value"]) is float


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_probe_value_that_is_not_finite_is_refused(value):
    with pytest.raises(NasError, match="non-finite value"):
        J.metric_dict(Metric(value), Suite("s", (), False))


# ---------------------------------------------------------------- baselines

def test_the_default_baseline_is_the_package_s_file_of_the_suite():
    path = J.default_baseline("smoke")
    assert path.name == "smoke.json" and path.parent.name == "baselines" and path.is_file()


@pytest.mark.parametrize("entry, problem", [
    (1.0, "expected an object, got 1.0"),
    ({"value": True, "direction": HIGHER}, "'value' must be a finite number, got True"),
    ({"value": float("inf"), "direction": HIGHER}, "'value' must be a finite number, got inf"),
    ({"value": None, "direction": HIGHER}, "'value' must be a finite number, got None"),
    ({"value": 1, "direction": None}, "'direction' must be"),
    (metric(1, tolerance={"abs": 1, "rel": 1}), "'tolerance' must be null"),
    (metric(1, tolerance={}), "'tolerance' must be null"),
    (metric(1, tolerance=[1]), "'tolerance' must be null"),
    (metric(1, tolerance={"abs": True}), "tolerance must be a non-negative number, got True"),
    (metric(1, tolerance={"rel": "1"}), "tolerance must be a non-negative number, got '1'"),
    (metric(1, tolerance={"abs": -0.1}), "tolerance must be a non-negative number, got -0.1"),
    (metric(1, tolerance={"rel": float("inf")}), "tolerance must be a non-negative number, got inf"),
    (metric(1, tolerance={"rel": float("nan")}), "tolerance must be a non-negative number, got nan"),
])
def test_a_bad_baseline_entry_names_its_problem(entry, problem):
    assert problem in (J._entry_problem(entry) or "")


@pytest.mark.parametrize("entry", [
    metric(0), metric(-2.5, LOWER), metric(1, tolerance={"abs": 0}), metric(1, tolerance={"rel": 0.5}),
    metric(1, tolerance={"abs": 1}), {"value": 1, "direction": LOWER}])
def test_a_good_baseline_entry_has_no_problem(entry):
    assert J._entry_problem(entry) is None


def test_a_missing_baseline_says_how_to_create_it_and_a_good_one_loads(tmp_path):
    with pytest.raises(BaselineError, match=r"nope.json: baseline not found \(create it: nas regress --suite "
                                            r"smoke --update-baseline\)"):
        J.load_baseline(tmp_path / "nope.json", "smoke")
    path = tmp_path / "b.json"
    data = {"suite": "smoke", "metrics": {"m": metric(1.0, tolerance={"abs": 0})}}
    path.write_text(json.dumps(data))
    assert J.load_baseline(path, "smoke") == data
    path.write_text(json.dumps({"suite": "smoke", "metrics": []}))
    with pytest.raises(BaselineError, match="expected an object with a 'metrics' object"):
        J.load_baseline(path, "smoke")
    path.write_text(json.dumps({"suite": "smoke", "metrics": {"m": 1}}))
    with pytest.raises(BaselineError, match="metric 'm': expected an object"):
        J.load_baseline(path, "smoke")


def test_a_new_baseline_without_a_previous_one_takes_the_run_s_entries_as_they_are(monkeypatch):
    monkeypatch.setattr(J, "machine", lambda: {"cpus": 1})
    results = [result("table", {"table.a": metric(1.0, tolerance={"abs": 0.1}), "table.b": metric(2.0)}),
               result("llm", error="RuntimeError: x"), result("design", skipped="no model")]
    new = J.baseline_from("smoke", results, None, ["a=b"])
    assert new["metrics"] == {"table.a": metric(1.0, tolerance={"abs": 0.1}), "table.b": metric(2.0)}
    assert list(new["metrics"]) == ["table.a", "table.b"]
    assert new["skipped"] == {"llm": "RuntimeError: x", "design": "no model"}
    assert (new["suite"], new["overrides"], new["machine"], new["nasflow"]) == ("smoke", ["a=b"], {"cpus": 1},
                                                                                J.__version__)


def test_a_new_baseline_keeps_the_old_entries_of_skipped_or_failed_probes_only():
    previous = {"metrics": {"llm.tps": metric(7.0), "design.trials": metric(2.0), "table.gone": metric(1.0),
                            "table.a": metric(1.0, LOWER, {"rel": 0.2})}}
    results = [result("table", {"table.a": metric(3.0, HIGHER, {"abs": 1})}), result("llm", skipped="no model"),
               result("design", error="RuntimeError: boom")]
    new = J.baseline_from("s", results, previous)
    assert new["metrics"] == {"design.trials": metric(2.0), "llm.tps": metric(7.0),
                              "table.a": metric(3.0, LOWER, {"rel": 0.2})}


# ---------------------------------------------------------------- comparison and report

def test_each_compared_row_carries_its_values_ratio_and_the_baseline_s_direction():
    baseline = {"metrics": {"t.a": metric(4.0, LOWER, {"abs": 1}, unit="s"), "t.zero": metric(0.0, HIGHER, {"abs": 1}),
                            "t.gone": metric(2.0, LOWER, {"rel": 0.1}), "u.x": metric(1.0)}}
    results = [result("t", {"t.a": metric(2.0, HIGHER, None, unit="ms"), "t.zero": metric(0.5),
                            "t.new": metric(5.0, LOWER, {"abs": 2}, unit="%")}), result("u")]
    rows = {r["metric"]: r for r in J.compare(baseline, results)}
    assert list(rows) == ["t.a", "t.gone", "t.new", "t.zero", "u.x"]
    assert rows["t.a"] == {"metric": "t.a", "value": 2.0, "baseline": 4.0, "unit": "ms", "direction": LOWER,
                           "tolerance": {"abs": 1}, "ratio": 0.5, "note": "", "status": "improved"}
    assert rows["t.zero"]["ratio"] is None and rows["t.zero"]["status"] == "ok"
    assert rows["t.new"] == {"metric": "t.new", "value": 5.0, "baseline": None, "unit": "%", "direction": LOWER,
                             "tolerance": {"abs": 2}, "ratio": None, "note": "", "status": "new"}
    assert rows["t.gone"] == {"metric": "t.gone", "value": None, "baseline": 2.0, "unit": "", "direction": LOWER,
                              "tolerance": {"rel": 0.1}, "ratio": None, "note": "not measured", "status": "missing"}
    assert (rows["u.x"]["status"], rows["u.x"]["note"]) == ("missing", "not measured")


def test_failure_lines_name_regressions_with_or_without_a_ratio_and_nothing_else():
    rows = [{"metric": "a", "status": "regressed", "value": 1.0, "baseline": 0.0, "ratio": None,
             "tolerance": {"rel": 0.5}, "direction": LOWER},
            {"metric": "b", "status": "regressed", "value": 1.0, "baseline": 2.0, "ratio": 0.5,
             "tolerance": {"abs": 0.25}, "direction": HIGHER},
            {"metric": "c", "status": "missing", "note": "not measured"},
            {"metric": "d", "status": "ok"}, {"metric": "e", "status": "improved"}, {"metric": "f", "status": "new"}]
    assert J.failure_lines(rows) == [
        "REGRESSED a: 1 vs baseline 0 (tolerance rel 0.5, lower is better)",
        "REGRESSED b: 1 vs baseline 2, 0.5x (tolerance abs 0.25, higher is better)",
        "MISSING c: in the baseline, not measured"]


def test_the_markdown_report_has_a_header_the_failures_a_row_per_metric_and_per_probe():
    report = {"suite": "s", "baseline": "/b.json", "created": "T", "counts": {"ok": 1, "regressed": 1},
              "failures": ["REGRESSED x"],
              "metrics": [{"metric": "a", "direction": HIGHER, "value": 2.0, "unit": "%", "baseline": 1.0,
                           "ratio": 2.0, "tolerance": {"abs": 1}, "status": "improved", "note": ""},
                          {"metric": "b", "direction": LOWER, "value": None, "unit": "", "baseline": 1.5,
                           "ratio": None, "tolerance": None, "status": "skipped", "note": "a|b"}],
              "probes": [result("p", seconds=1.5), result("q", skipped="no|llm", seconds=None),
                         result("r", error="E: x", seconds=0.25)]}
    assert J.render_markdown(report) == "\n".join([
        "# Regression: suite `s`", "", "Baseline `/b.json`; T; 1 ok, 1 regressed", "",
        "**Failures:**", "", "- REGRESSED x", "",
        "| metric | current | baseline | ratio | tolerance | status |", "| --- | ---: | ---: | ---: | --- | --- |",
        "| a ↑ | 2 % | 1 | 2.000 | abs 1 | improved |",
        "| b ↓ |   | 1.5 |  | none | skipped (a/b) |",
        "", "| probe | seconds | outcome |", "| --- | ---: | --- |",
        "| p | 1.5 | ok |", "| q |  | skipped: no/llm |", "| r | 0.25 | error: E: x |"]) + "\n"
    report["failures"] = []
    assert "**Failures:**" not in J.render_markdown(report)


def test_the_ratio_plot_shows_each_compared_metric_oriented_so_that_more_is_better(monkeypatch, tmp_path):
    seen: dict = {}

    class Axes:
        def barh(self, names, values, color):
            seen.update(names=names, values=values, color=color)

        def __getattr__(self, name):
            return lambda *a, **k: None

    plt = types.SimpleNamespace(subplots=lambda figsize: (seen.setdefault("figsize", figsize), Axes()))
    monkeypatch.setattr(J, "_pyplot", lambda: plt)
    monkeypatch.setattr(J, "save_figure", lambda fig, path: seen.update(path=path))
    rows = [{"metric": "up", "ratio": 1.25, "value": 5.0, "direction": HIGHER, "status": "improved"},
            {"metric": "down", "ratio": 0.5, "value": 1.0, "direction": LOWER, "status": "regressed"},
            {"metric": "odd", "ratio": 2.0, "value": 2.0, "direction": HIGHER, "status": "new"},
            {"metric": "none", "ratio": None, "value": 1.0, "direction": HIGHER, "status": "ok"},
            {"metric": "zero", "ratio": 0.0, "value": 0.0, "direction": HIGHER, "status": "ok"}]
    J.plot_ratios(rows, tmp_path / "r.png")
    assert seen["figsize"] == (7, pytest.approx(0.3 * 3 + 1.2))
    assert seen["names"] == ["up", "down", "odd"] and seen["values"] == [1.25, 2.0, 2.0]
    assert seen["color"] == ["tab:green", "tab:red", "tab:gray"] and seen["path"] == tmp_path / "r.png"


@pytest.mark.parametrize("tol, text", [(None, "none"), ({"abs": 0.05}, "abs 0.05"), ({"rel": 2.0}, "rel 2")])
def test_a_tolerance_reads_as_its_kind_and_number(tol, text):
    assert J._tol(tol) == text


@pytest.mark.parametrize("x, text", [(None, ""), (0.0, "0"), (1234567.0, "1.23457e+06"), (93.5212, "93.5212")])
def test_a_number_in_the_report_has_six_significant_digits(x, text):
    assert J._num(x) == text


def test_the_machine_and_the_time_of_a_report():
    got = J.machine()
    assert set(got) == {"cpus", "python", "platform"} and got["cpus"] >= 1
    assert J._now().utcoffset().total_seconds() == 0


def test_a_plan_loads_the_baseline_unless_updating_one_that_does_not_exist_yet(tmp_path):
    suite = Suite("u", (), False)
    with pytest.raises(BaselineError, match="baseline not found"):
        J.plan(suite, tmp_path / "u.json", tmp_path / "o")
    p = J.plan(suite, tmp_path / "u.json", tmp_path / "o", update=True)
    assert (p.baseline, p.update, p.out, p.suite) == (None, True, (tmp_path / "o").resolve(), suite)
    (tmp_path / "u.json").write_text(json.dumps({"suite": "u", "metrics": {"m": metric(1.0)}}))
    assert J.plan(suite, tmp_path / "u.json", tmp_path / "o", update=True).baseline["metrics"] == {"m": metric(1.0)}
    assert J.plan(suite, tmp_path / "u.json", tmp_path / "o").update is False
    (tmp_path / "file").write_text("")
    with pytest.raises(NasError):
        J.plan(suite, tmp_path / "u.json", tmp_path / "file")


def test_a_plan_rewrites_a_site_packages_baseline_only_when_given_as_a_path(tmp_path, monkeypatch):
    installed = tmp_path / "dist-packages" / "u.json"
    installed.parent.mkdir()
    installed.write_text(json.dumps({"suite": "u", "metrics": {}}))
    monkeypatch.setattr(J, "default_baseline", lambda suite: installed)
    suite = Suite("u", (), False)
    with pytest.raises(BaselineError, match="would rewrite the installed package's"):
        J.plan(suite, None, tmp_path / "o", update=True)
    assert J.plan(suite, None, tmp_path / "o").baseline == {"suite": "u", "metrics": {}}  # comparing is fine
    assert J.plan(suite, installed, tmp_path / "o", update=True).baseline_path == installed.resolve()


def test_the_default_run_folder_is_dated_under_runs_regression(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "u.json").write_text(json.dumps({"suite": "u", "metrics": {}}))
    p = J.plan(Suite("u", (), False), tmp_path / "u.json")
    assert p.out.parent == (tmp_path / "runs" / "regression").resolve() and len(p.out.name) == 19


def test_finish_counts_the_statuses_and_passes_only_without_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(J, "plot_ratios", lambda rows, path: path.write_text("png"))
    base = {"suite": "u", "metrics": {"p.a": metric(1.0, tolerance={"abs": 0}), "p.b": metric(1.0, tolerance={"abs": 0})}}
    p = J.Plan(Suite("u", (), False), tmp_path / "b.json", base, tmp_path / "new" / "o", False)  # made with its parent
    report = J.finish(p, [result("p", {"p.a": metric(1.0), "p.b": metric(2.0), "p.c": metric(0.0)})], ["x=1"], 2.5)
    assert report["counts"] == {"improved": 1, "new": 1, "ok": 1} and list(report["counts"]) == ["improved", "new", "ok"]
    assert (report["ok"], report["failures"], report["baseline_updated"], report["wall_s"]) == (True, [], False, 2.5)
    assert report["overrides"] == ["x=1"] and json.loads((tmp_path / "new" / "o" / "report.json").read_text()) == report
    assert (tmp_path / "new" / "o" / "report.md").read_text() == J.render_markdown(report)
    report = J.finish(p, [result("p", {"p.a": metric(0.0)})])
    assert not report["ok"] and report["counts"] == {"missing": 1, "regressed": 1}
    # no baseline to compare with: nothing fails; an update without errors writes it
    p = J.Plan(Suite("u", (), False), tmp_path / "b.json", None, tmp_path / "new" / "o", True)
    report = J.finish(p, [result("p", {"p.a": metric(1.0)})])
    assert report["ok"] and report["baseline_updated"] and report["counts"] == {"new": 1}
    assert J.load_baseline(tmp_path / "b.json", "u")["metrics"] == {"p.a": metric(1.0)}


# ---------------------------------------------------------------- the probes

def test_the_suites_report_what_their_committed_baselines_hold():
    for name in ("smoke", "nightly"):
        suite = P.get_suite(name)
        table = suite.probe("table").params
        assert table["trials"] == max(table["at"])  # the last point is the run's budget
        names = {f"table.{s}.best_at_{n}" for s in table["strategies"] for n in table["at"]} | {"table.trials_per_s"}
        baseline = J.load_baseline(J.default_baseline(name), name)["metrics"]
        assert {m for m in baseline if m.startswith("table.")} == names
        assert suite.compare_timings is (name == "nightly")
    assert P.get_suite("nightly").probe("design").params["trials"] == J.load_baseline(
        J.default_baseline("nightly"), "nightly")["metrics"]["design.trials"]["value"]  # compared with abs 0
    # the settings nightly.json's design metrics were measured at (its LLM tokens follow the Modifier's tries)
    assert P.get_suite("nightly").probe("design").params == {"trials": 2, "lif_tries": 2}
    assert [p.name for p in P.get_suite("nightly").probes] == ["table", "throughput", "llm", "design"]
    with pytest.raises(ConfigError, match=r"^unknown suite 'x' \(valid: smoke, nightly\)$"):
        P.get_suite("x")


@pytest.mark.parametrize("strategy", ["random", "rea"])
def test_the_smoke_table_probe_reproduces_the_committed_baseline(strategy, tmp_path):
    params = dict(P.get_suite("smoke").probe("table").params, strategies=(strategy,))
    got = P.table_probe(tmp_path, [], **params)
    baseline = J.load_baseline(J.default_baseline("smoke"), "smoke")["metrics"]
    for n in params["at"]:
        assert got[f"{strategy}.best_at_{n}"] == Metric(baseline[f"table.{strategy}.best_at_{n}"]["value"], HIGHER,
                                                        {"abs": 0.05}, unit="%")


@pytest.mark.parametrize("strategy", ["random", "rea", "reinforce", "evolution"])
def test_the_nightly_table_probe_reproduces_the_committed_baseline_at_25_trials(strategy, tmp_path):
    params = dict(P.get_suite("nightly").probe("table").params, strategies=(strategy,), trials=25, at=(25,))
    got = P.table_probe(tmp_path, [], **params)
    expected = J.load_baseline(J.default_baseline("nightly"), "nightly")["metrics"][f"table.{strategy}.best_at_25"]
    assert got[f"{strategy}.best_at_25"].value == expected["value"]


def test_the_table_probe_pads_a_stopped_run_with_its_best_and_counts_trials_per_second(monkeypatch, tmp_path):
    runs = []

    class Loop:
        def __init__(self, spec, run_dir, executor, progress):
            runs.append((spec.strategy.name, spec.seed, spec.trials, run_dir.name, progress))
            self.run_dir = run_dir

        def run_search(self):
            return {"trials": 2 if self.run_dir.name.endswith("s0") else 3}

    curves = {"random_s0": [80.0, 90.0], "random_s1": [70.0, 75.0, 95.0]}
    monkeypatch.setattr(P, "SearchLoop", Loop)
    monkeypatch.setattr(P, "LocalExecutor", lambda evaluator, cache: None)
    monkeypatch.setattr(P, "read_history", lambda path: path.parent.name)
    monkeypatch.setattr(P, "best_so_far", lambda name: curves[name])
    clock(monkeypatch, 10.0, 10.5, 20.0, 20.25)  # runs of 0.5 s and 0.25 s: 5 trials in 0.75 s
    got = P.table_probe(tmp_path, [], strategies=("random",), seeds=2, trials=4, at=(1, 3, 4))
    assert runs == [("random", 0, 4, "random_s0", False), ("random", 1, 4, "random_s1", False)]
    assert got == {"random.best_at_1": Metric(75.0, HIGHER, {"abs": 0.05}, unit="%"),
                   "random.best_at_3": Metric(92.5, HIGHER, {"abs": 0.05}, unit="%"),
                   "random.best_at_4": Metric(92.5, HIGHER, {"abs": 0.05}, unit="%"),
                   "trials_per_s": Metric(6.67, HIGHER, {"rel": 0.5}, timing=True, unit="trials/s")}
    curves["random_s0"] = [80.1234567]
    clock(monkeypatch, 0.0, 1.0, 1.0, 2.0)
    got = P.table_probe(tmp_path, [], strategies=("random",), seeds=2, trials=4, at=(1,))
    assert got["random.best_at_1"].value == 75.0617  # mean of 80.1234567 and 70, to 4 decimals


def test_the_throughput_probe_times_a_fixed_set_of_cells_and_a_fixed_input(monkeypatch):
    import numpy as np

    evaluated, inputs, built = [], [], []

    class Net(torch.nn.Module):
        def forward(self, x):
            inputs.append(x)
            return x

    def build(self, cell, num_classes):
        built.append((cell.to_string(), num_classes))
        return Net()

    monkeypatch.setattr(P.NB201Space, "build", build)
    monkeypatch.setattr(P, "TableEvaluator", lambda space: types.SimpleNamespace(evaluate=evaluated.append))
    # 3 lookups in 0.007 s; then 2 warm-ups (started, never timed) and passes of 0.0123456 s and 0.0223456 s
    clock(monkeypatch, 100.0, 100.007, 0.0, 0.0, 0.0, 0.0123456, 0.0, 0.0223456)
    got = P.throughput_probe(Path("."), [], lookups=3, forward_repeats=2)
    assert got == {"table_evals_per_s": Metric(428.6, HIGHER, {"rel": 0.5}, timing=True, unit="evals/s"),
                   "forward_ms": Metric(17.35, LOWER, {"rel": 1.0}, timing=True, unit="ms")}
    space = P.NB201Space()
    rng = np.random.default_rng(0)
    cells = [space.sample(rng) for _ in range(3)]
    assert evaluated == [cells[0], *cells]  # one warm-up lookup, then each cell once
    assert built == [(P.FORWARD_CELL, 10)]
    expected = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert len(inputs) == 4 and all(torch.equal(x, expected) for x in inputs)


class Server:
    made: list = []
    stopped: list = []
    base_url, alias = "http://127.0.0.1:9/v1", "m"

    def __init__(self, **kwargs):
        Server.made.append(kwargs)

    def start(self):
        pass

    def stop(self):
        Server.stopped.append(True)


def _llm(monkeypatch, llm, tokens=(25, 25)):
    Server.made, Server.stopped = [], []
    asked: list = []
    replies = iter(tokens)

    def create(**kwargs):
        asked.append(kwargs)
        return types.SimpleNamespace(usage=types.SimpleNamespace(completion_tokens=next(replies)))

    sdk = types.SimpleNamespace(chat=types.SimpleNamespace(completions=types.SimpleNamespace(create=create)))
    made: list = []
    monkeypatch.setitem(__import__("sys").modules, "openai",
                        types.SimpleNamespace(OpenAI=lambda **k: made.append(k) or sdk))
    monkeypatch.setattr(P, "LocalServer", Server)
    monkeypatch.setattr(P, "check_config", lambda overrides: {"llm": llm})
    return asked, made


def test_the_llm_probe_measures_the_embedded_model_with_its_configured_server(monkeypatch, tmp_path):
    local = {"n_ctx": 2048, "n_threads": 3, "startup_timeout_s": 9, "prompt_cache_mb": 16}
    asked, made = _llm(monkeypatch, {"backend": "local", "local": local})
    clock(monkeypatch, 0.0, 1.234, 10.0, 11.0, 20.0, 22.0)  # start-up, then calls of 1 s and 2 s
    got = P.llm_probe(tmp_path, [], calls=2, max_tokens=8)
    assert got == {"tokens_per_s": Metric(16.67, HIGHER, {"rel": 0.5}, timing=True, unit="tokens/s"),
                   "startup_s": Metric(1.23, LOWER, None, timing=True, unit="s")}  # 50 tokens in 3 s
    assert Server.made == [{"n_ctx": 2048, "n_threads": 3, "startup_timeout_s": 9.0, "prompt_cache_mb": 16,
                            "log_path": tmp_path / "llm-server.log"}] and Server.stopped == [True]
    assert made == [{"base_url": Server.base_url, "api_key": "local", "max_retries": 0}]
    assert [a["messages"][0]["content"].split(" for ")[0] for a in asked] == ["Describe design idea 1",
                                                                            "Describe design idea 2"]
    assert all((a["model"], a["temperature"], a["max_tokens"]) == ("m", 0.0, 8) for a in asked)


def test_the_llm_probe_defaults_its_server_settings(monkeypatch, tmp_path):
    _llm(monkeypatch, {"backend": "local"}, tokens=(5,))
    clock(monkeypatch, 0.0, 1.0, 0.0, 1.0)
    P.llm_probe(tmp_path, [], calls=1, max_tokens=8)
    assert Server.made[0] == {"n_ctx": 4096, "n_threads": None, "startup_timeout_s": 120.0,
                              "prompt_cache_mb": P.PROMPT_CACHE_MB, "log_path": tmp_path / "llm-server.log"}


@pytest.mark.parametrize("llm, reason", [({"backend": "openai"}, "llm.backend is 'openai'"),
                                         (None, "llm.backend is 'None'")])
def test_the_llm_probe_skips_another_backend(monkeypatch, tmp_path, llm, reason):
    _llm(monkeypatch, llm)
    with pytest.raises(P.ProbeSkipped, match=reason):
        P.llm_probe(tmp_path, [], calls=1, max_tokens=8)
    assert Server.made == []


def test_the_llm_probe_skips_when_the_server_cannot_start(monkeypatch, tmp_path):
    _llm(monkeypatch, {"backend": "local"})

    def start(self):
        raise MissingDependencyError("no llama-server")

    monkeypatch.setattr(Server, "start", start)
    with pytest.raises(P.ProbeSkipped, match="^no llama-server$"):
        P.llm_probe(tmp_path, [], calls=1, max_tokens=8)


def _design(monkeypatch, cfg_llm, summary, history, calls):
    monkeypatch.setattr(P, "check_config", lambda overrides: calls.append(("config", overrides)) or
                        {"llm": cfg_llm})
    monkeypatch.setattr(P.SearchSpec, "from_config", staticmethod(lambda cfg: cfg))

    def execute(spec, run_dir, runner, progress):
        calls.append(("execute", run_dir.exists(), runner, progress))
        if isinstance(summary, Exception):
            raise summary
        return summary

    monkeypatch.setattr(P, "execute", execute)
    monkeypatch.setattr(P, "stop_shared", lambda: calls.append("stop"))
    monkeypatch.setattr(P, "knowledge_store", types.SimpleNamespace(close_client=lambda path: calls.append("close")))
    monkeypatch.setattr(P, "read_history", lambda path: history)


def test_the_design_probe_reports_a_fresh_run_s_counts_and_wall_time(monkeypatch, tmp_path):
    from nas.core.trial import TrialRecord

    calls: list = []
    (tmp_path / "design-run").mkdir()
    (tmp_path / "design-run" / "history.jsonl").write_text("")  # an earlier try: measured afresh
    history = [TrialRecord(0, "k", {}, 91.0), TrialRecord(1, "l", {}, 50.0)]
    _design(monkeypatch, {"backend": "openai"}, {"trials": 2}, history, calls)
    clock(monkeypatch, 100.0, 112.34)
    got = P.design_probe(tmp_path, ["x=1"], trials=3, lif_tries=4)
    assert got == {"trials": Metric(2, HIGHER, {"abs": 0}), "proposals": Metric(0, HIGHER, {"abs": 0}),
                   "valid": Metric(0, HIGHER, None), "llm_tokens": Metric(0, LOWER, None),
                   "wall_s": Metric(12.3, LOWER, {"rel": 2.0}, timing=True, unit="s"),
                   "root_accuracy": Metric(91.0, HIGHER, {"abs": 3.0}, unit="%")}
    config = calls[0][1]
    assert {"budget.trials=3", "strategy.lif_tries=4", "seed=0", "llm.cache=false"} <= set(config)
    assert config[-1] == "x=1"
    assert calls[1:] == [("execute", False, {"name": "local"}, False), "stop", "close"]


@pytest.mark.parametrize("history", [[], "untrained"])
def test_the_design_probe_has_no_root_accuracy_when_the_root_did_not_train(monkeypatch, tmp_path, history):
    from nas.core.trial import TrialRecord

    records = [] if history == [] else [TrialRecord(0, "k", {}, None)]
    _design(monkeypatch, {"backend": "openai"}, {"trials": 1}, records, [])
    assert "root_accuracy" not in P.design_probe(tmp_path, [], trials=1, lif_tries=1)


def test_the_design_probe_skips_a_local_llm_that_is_missing_and_a_run_that_lacks_a_dependency(monkeypatch, tmp_path):
    calls: list = []
    _design(monkeypatch, {"backend": "local"}, {"trials": 1}, [], calls)

    def missing():
        raise MissingDependencyError("no model file")

    monkeypatch.setattr(P, "model_path", missing)
    with pytest.raises(P.ProbeSkipped, match="^no model file$"):
        P.design_probe(tmp_path, [], trials=1, lif_tries=1)
    assert [c for c in calls if c[0] == "execute"] == []
    monkeypatch.setattr(P, "model_path", lambda: calls.append("model"))
    monkeypatch.setattr(P, "check_server_deps", lambda: calls.append("deps"))
    _design(monkeypatch, {"backend": "local"}, MissingDependencyError("no embedder"), [], calls)
    with pytest.raises(P.ProbeSkipped, match="^no embedder$"):
        P.design_probe(tmp_path, [], trials=1, lif_tries=1)
    assert calls[-5:] == ["model", "deps", ("execute", False, {"name": "local"}, False), "stop", "close"]
    monkeypatch.setattr(P, "model_path", missing)  # another backend never looks for the model
    _design(monkeypatch, {"backend": "openai"}, {"trials": 1}, [], calls)
    assert P.design_probe(tmp_path, [], trials=1, lif_tries=1)["trials"].value == 1


def test_a_probe_s_metrics_are_named_after_it_and_its_folder_made_each_time(monkeypatch, tmp_path):
    def good(workdir, overrides, k):
        assert workdir == tmp_path / "new" / "probes" / "p" and overrides == ["a=1"]
        return {"x": Metric(k, LOWER, {"rel": 1.0}, timing=True)}

    monkeypatch.setitem(P.SUITES, "t", Suite("t", (Probe("p", good, {"k": 2}),), compare_timings=False))
    clock(monkeypatch, 1.0, 2.0, 3.0, 4.0)
    for _ in range(2):  # a retry finds its folder there
        got = P.run_probe("t", "p", tmp_path / "new", ["a=1"])
        assert got == {"name": "p", "metrics": {"p.x": metric(2.0, LOWER, None, timing=True)}, "skipped": None,
                       "error": None, "seconds": 1.0}


def test_run_suite_records_a_crash_and_its_wall_time(monkeypatch, tmp_path):
    def crash(workdir, overrides):
        raise RuntimeError("boom")

    monkeypatch.setitem(P.SUITES, "t", Suite("t", (Probe("c", crash),), compare_timings=False))
    monkeypatch.setattr(J, "plot_ratios", lambda rows, path: None)
    (tmp_path / "b.json").write_text(json.dumps({"suite": "t", "metrics": {"c.y": metric(1.0)}}))
    clock(monkeypatch, 10.0, 11.0, 13.26)  # the crashed probe's start, no end
    report = P.run_suite("t", tmp_path / "b.json", tmp_path / "o", progress=False)
    assert report["wall_s"] == 3.3 and report["probes"] == [J.failed_probe("c", RuntimeError("boom"))]
    assert report["failures"] == ["MISSING c.y: in the baseline, probe failed: RuntimeError: boom"]
    assert not report["baseline_updated"]


def test_the_progress_bar_advances_once_per_finished_step():
    bar = P._progress(True, 2)
    with bar as entered:
        assert entered is bar
        for name in ("a", "b", "compare"):
            bar.step(name)
        task = bar.bar.tasks[0]
        assert (task.completed, task.total, task.description) == (2, 2, "compare")
        assert bar.bar.live.is_started
    assert not bar.bar.live.is_started
    off = P._progress(False, 2)
    with off:
        off.step("a")
    assert off.bar is None and off.started

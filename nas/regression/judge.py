"""Judging a regression run: baselines (package data, `nas/regression/baselines/<suite>.json`,
read through importlib.resources so an installed `nas` finds them), the comparison of a
run's metrics with them, and the report (report.json, report.md, ratios.png). Pure
library: the probes that produce the metrics are nas/regression/probes.py.

A baseline holds, per metric, the value, the direction and a tolerance (`{"abs": x}`
or `{"rel": x}`, or null: recorded, never compared). Timings are compared as ratios
only where the suite says so (`nightly`): a few-second `smoke` run on a loaded
machine says nothing about speed.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Sequence

from nas import __version__
from nas.errors import ConfigError, NasError
from nas.io import atomic_write_json, atomic_write_text, check_output, read_json
from nas.report import _pyplot, save_figure

HIGHER, LOWER = "higher_is_better", "lower_is_better"


class BaselineError(ConfigError):
    """A baseline file is missing or malformed: bad input, not a regression."""


class RegressionFailed(NasError):
    """The run regressed; raised by the flow so its run shows as failed."""


@dataclass(frozen=True)
class Metric:
    value: float
    direction: str = HIGHER
    tolerance: dict[str, float] | None = None  # None: informational, never compared
    timing: bool = False  # wall-clock: compared only in suites with compare_timings
    unit: str = ""


@dataclass(frozen=True)
class Probe:
    name: str
    fn: Callable[..., dict[str, Metric]]
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Suite:
    """Probes run one after another, and whether their timings are compared."""

    name: str
    probes: tuple[Probe, ...]
    compare_timings: bool

    def probe(self, name: str) -> Probe:
        for probe in self.probes:
            if probe.name == name:
                return probe
        raise ConfigError(f"suite '{self.name}' has no probe '{name}' "
                          f"(valid: {', '.join(p.name for p in self.probes)})")


def failed_probe(name: str, err: BaseException) -> dict[str, Any]:
    """A crashed probe's result: its metrics then show as missing."""
    message = str(err).splitlines()[0] if str(err) else ""
    return {"name": name, "metrics": {}, "skipped": None, "error": f"{type(err).__name__}: {message}",
            "seconds": None}


def metric_dict(m: Metric, suite: Suite) -> dict[str, Any]:
    """A probe's metric as stored; a timing gets no tolerance where the suite does not compare timings."""
    value = float(m.value)
    if not math.isfinite(value):
        raise NasError(f"probe produced a non-finite value {value}")
    tolerance = m.tolerance if (suite.compare_timings or not m.timing) else None
    return {"value": value, "direction": m.direction, "tolerance": tolerance, "timing": m.timing, "unit": m.unit}


# ---------------------------------------------------------------- baselines

def default_baseline(suite: str) -> Path:
    """The shipped baseline; `--update-baseline` rewrites it in place (a source checkout's file
    in an editable install)."""
    return Path(str(resources.files("nas.regression") / "baselines" / f"{suite}.json"))


def load_baseline(path: Path, suite: str) -> dict[str, Any]:
    """The validated baseline; every problem is one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise BaselineError(f"{path}: baseline not found (create it: nas regress --suite {suite} --update-baseline)")
    try:
        data = read_json(path)
    except NasError as err:
        raise BaselineError(str(err)) from None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        raise BaselineError(f"{path}: malformed baseline: expected an object with a 'metrics' object")
    if data.get("suite") != suite:
        raise BaselineError(f"{path}: baseline is for suite {data.get('suite')!r}, not '{suite}'")
    for name, entry in data["metrics"].items():
        problem = _entry_problem(entry)
        if problem:
            raise BaselineError(f"{path}: metric '{name}': {problem}")
    return data


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return f"expected an object, got {entry!r}"
    value = entry.get("value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"'value' must be a finite number, got {value!r}"
    if entry.get("direction") not in (HIGHER, LOWER):
        return f"'direction' must be '{HIGHER}' or '{LOWER}', got {entry.get('direction')!r}"
    tol = entry.get("tolerance")
    if tol is None:
        return None
    if not isinstance(tol, dict) or len(tol) != 1 or next(iter(tol)) not in ("abs", "rel"):
        return f"'tolerance' must be null, {{\"abs\": x}} or {{\"rel\": x}}, got {tol!r}"
    x = next(iter(tol.values()))
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= 0 or not math.isfinite(x):
        return f"tolerance must be a non-negative number, got {x!r}"
    return None


def baseline_from(suite: str, results: list[dict[str, Any]], previous: dict[str, Any] | None,
                  overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A new baseline from a run. Tolerances and directions already in `previous` are kept (they may
    have been tuned by hand), and so are the entries of probes skipped this time."""
    old = (previous or {}).get("metrics", {})
    metrics: dict[str, Any] = {}
    skipped = {r["name"]: r["skipped"] or r["error"] for r in results if r["skipped"] or r["error"]}
    for r in results:
        for name, m in r["metrics"].items():
            entry = dict(m)
            if name in old:
                entry.update(direction=old[name]["direction"], tolerance=old[name].get("tolerance"))
            metrics[name] = entry
    for name, entry in old.items():
        if name.split(".", 1)[0] in skipped:
            metrics[name] = entry
    return {"suite": suite, "created": _now().isoformat(timespec="seconds"), "nasflow": __version__,
            "machine": machine(), "overrides": list(overrides), "skipped": skipped,
            "metrics": dict(sorted(metrics.items()))}


# ---------------------------------------------------------------- comparison

def judge(value: float, base: float, direction: str, tolerance: dict[str, float] | None) -> str:
    """ok / regressed / improved (beyond tolerance, in the metric's direction), or info."""
    if tolerance is None:
        return "info"
    margin = tolerance["abs"] if "abs" in tolerance else tolerance["rel"] * abs(base)
    margin += 1e-9 * max(1.0, abs(base))  # a value exactly at the bound is within it
    gain = value - base if direction == HIGHER else base - value
    return "regressed" if gain < -margin else "improved" if gain > margin else "ok"


def compare(baseline: dict[str, Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per metric in either the baseline or the run."""
    probes = {r["name"]: r for r in results}
    current = {name: m for r in results for name, m in r["metrics"].items()}
    expected = baseline.get("metrics", {})
    rows = []
    for name in sorted(set(expected) | set(current)):
        base, cur = expected.get(name), current.get(name)
        new, old = cur or base or {}, base or cur or {}  # each name is in one of them at least
        row = {"metric": name, "value": cur and cur["value"], "baseline": base and base["value"],
               "unit": new.get("unit", ""), "direction": old["direction"],
               "tolerance": old.get("tolerance"), "ratio": None, "note": ""}
        if base is None:
            row["status"] = "new"
        elif cur is None:
            probe = probes.get(name.split(".", 1)[0]) or {}
            if probe.get("skipped"):
                row["status"], row["note"] = "skipped", probe["skipped"]
            else:
                row["status"] = "missing"
                row["note"] = f"probe failed: {probe['error']}" if probe.get("error") else "not measured"
        else:
            row["status"] = judge(cur["value"], base["value"], base["direction"], base.get("tolerance"))
            if base["value"]:
                row["ratio"] = cur["value"] / base["value"]
        rows.append(row)
    return rows


def failure_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One loud line per regressed or missing metric."""
    lines = []
    for r in rows:
        if r["status"] == "regressed":
            ratio = f", {r['ratio']:.3g}x" if r["ratio"] is not None else ""
            lines.append(f"REGRESSED {r['metric']}: {r['value']:.6g} vs baseline {r['baseline']:.6g}{ratio} "
                         f"(tolerance {_tol(r['tolerance'])}, {r['direction'].replace('_', ' ')})")
        elif r["status"] == "missing":
            lines.append(f"MISSING {r['metric']}: in the baseline, {r['note']}")
    return lines


# ---------------------------------------------------------------- the report

@dataclass
class Plan:
    """What a run will do, checked before any probe starts, so bad input costs no probe time."""

    suite: Suite
    baseline_path: Path
    baseline: dict[str, Any] | None
    out: Path
    update: bool


def plan(suite: Suite, baseline: str | Path | None = None, out: str | Path | None = None,
         update: bool = False) -> Plan:
    path = Path(baseline) if baseline else default_baseline(suite.name)
    if update and not baseline and {"site-packages", "dist-packages"} & set(path.parts):
        raise BaselineError(f"--update-baseline would rewrite the installed package's {path}: "
                            f"pass --baseline PATH to write your own baseline")
    loaded = load_baseline(path, suite.name) if (not update or path.exists()) else None
    folder = Path(out) if out else Path("runs") / "regression" / _now().strftime("%Y-%m-%d_%H-%M-%S")
    check_output(folder, directory=True)  # a file in the way fails before the probes run
    return Plan(suite, path.resolve(), loaded, folder.resolve(), update)


def finish(p: Plan, results: list[dict[str, Any]], overrides: Sequence[str] = (),
           wall_s: float | None = None) -> dict[str, Any]:
    """Compare, write report.json / report.md / ratios.png, and the baseline if updating."""
    rows = compare(p.baseline or {"metrics": {}}, results)
    errors = [f"ERROR probe {r['name']}: {r['error']}" for r in results if r["error"]]
    update = p.update and not errors  # a baseline is never written from a run whose probe crashed
    if p.update:
        lines = [f"{e} (baseline not written)" for e in errors]
    else:
        lines = failure_lines(rows) if p.baseline is not None else []
    counts = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    report = {"suite": p.suite.name, "baseline": str(p.baseline_path), "out": str(p.out),
              "created": _now().isoformat(timespec="seconds"), "wall_s": wall_s, "overrides": list(overrides),
              "machine": machine(), "probes": results, "metrics": rows, "counts": counts,
              "failures": lines, "ok": not lines, "baseline_updated": update}
    p.out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(p.out / "report.json", report)
    atomic_write_text(p.out / "report.md", render_markdown(report))
    plot_ratios(rows, p.out / "ratios.png")
    if update:
        atomic_write_json(p.baseline_path, baseline_from(p.suite.name, results, p.baseline, overrides))
    return report


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Regression: suite `{report['suite']}`", "",
             f"Baseline `{report['baseline']}`; {report['created']}; "
             + ", ".join(f"{n} {s}" for s, n in report["counts"].items()), ""]
    if report["failures"]:
        lines += ["**Failures:**", "", *[f"- {line}" for line in report["failures"]], ""]
    lines += ["| metric | current | baseline | ratio | tolerance | status |", "| --- | ---: | ---: | ---: | --- | --- |"]
    for r in report["metrics"]:
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.3f}"
        status = r["status"] + (f" ({r['note']})" if r["note"] else "")
        arrow = "↑" if r["direction"] == HIGHER else "↓"
        lines.append(f"| {r['metric']} {arrow} | {_num(r['value'])} {r['unit']} | {_num(r['baseline'])} | {ratio} "
                     f"| {_tol(r['tolerance'])} | {status.replace('|', '/')} |")
    lines += ["", "| probe | seconds | outcome |", "| --- | ---: | --- |"]
    for p in report["probes"]:
        outcome = f"skipped: {p['skipped']}" if p["skipped"] else f"error: {p['error']}" if p["error"] else "ok"
        lines.append(f"| {p['name']} | {_num(p['seconds'])} | {outcome.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def plot_ratios(rows: list[dict[str, Any]], path: Path) -> None:
    """Current against baseline per compared metric, oriented so that > 1 is better."""

    shown = [r for r in rows if r["ratio"] is not None and r["value"]]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.3 * len(shown) + 1.2))
    colors = {"regressed": "tab:red", "improved": "tab:green", "ok": "tab:blue", "info": "tab:gray"}
    values = [r["ratio"] if r["direction"] == HIGHER else 1 / r["ratio"] for r in shown]
    ax.barh([r["metric"] for r in shown], values, color=[colors.get(r["status"], "tab:gray") for r in shown])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("performance relative to baseline (> 1 better; red regressed, grey not compared)")
    save_figure(fig, path)


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def _tol(tol: dict[str, float] | None) -> str:
    if tol is None:
        return "none"
    kind, x = next(iter(tol.items()))
    return f"abs {x:g}" if kind == "abs" else f"rel {x:g}"


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def _now() -> datetime:
    return datetime.now(timezone.utc)

"""The benchmark-regression suite: a fixed set of probes, each returning named
metrics, compared with a baseline stored in the repository, so a change that
makes searches worse or the code slower is caught the night it lands.

Plain Python (`nas regress`); `nas/orchestration/flows/regression.py` runs the same probes as
Prefect tasks. A baseline holds, per metric, the value, the direction and a
tolerance (`{"abs": x}` or `{"rel": x}`, or null: recorded, never compared).
Timings are compared as ratios only where the suite says so (`nightly`): a
few-second `smoke` run on a loaded machine says nothing about speed.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from nas import __version__
from nas.errors import ConfigError, MissingDependencyError, NasError
from nas.io import atomic_write_json, atomic_write_text, read_json
from nas.search.record import best_so_far, read_history

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ROOT / "benchmarks" / "baselines"
HIGHER, LOWER = "higher_is_better", "lower_is_better"


class BaselineError(ConfigError):
    """A baseline file is missing or malformed: bad input, not a regression."""


class RegressionFailed(NasError):
    """The run regressed; raised by the flow so its run shows as failed."""


class ProbeSkipped(Exception):
    """The probe cannot run on this machine (e.g. no LLM); the reason is recorded instead."""


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
    name: str
    probes: tuple[Probe, ...]
    compare_timings: bool

    def probe(self, name: str) -> Probe:
        for probe in self.probes:
            if probe.name == name:
                return probe
        raise ConfigError(f"suite '{self.name}' has no probe '{name}' "
                          f"(valid: {', '.join(p.name for p in self.probes)})")


# ---------------------------------------------------------------- probes

TABLE_STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {  # as benchmarks/collm_nb201.py
    "random": ("random", {"unique": True}),
    "rea": ("rea", {"population_size": 20, "sample_size": 5, "unique": True}),
    "reinforce": ("reinforce", {"learning_rate": 0.01, "momentum": 0.9}),
    "evolution": ("evolution", {"population_size": 20, "parent_ratio": 0.25, "mutation_ratio": 0.5,
                                "mutate_prob": 0.1}),
}
FORWARD_CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|nor_conv_3x3~2|"


def table_probe(workdir: Path, overrides: Sequence[str], strategies: Sequence[str], seeds: int,
                trials: int, at: Sequence[int]) -> dict[str, Metric]:
    """Best table accuracy at N trials, mean over fixed seeds: deterministic, so the tolerance is tight."""
    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.spec import Component, SearchSpec

    metrics: dict[str, Metric] = {}
    seconds, done = 0.0, 0
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for label in strategies:
            name, params = TABLE_STRATEGIES[label]
            curves = []
            for seed in range(seeds):
                spec = SearchSpec(space=Component("nb201"), strategy=Component(name, params),
                                  evaluator=Component("table"), seed=seed, trials=trials)
                run_dir = Path(tmp) / f"{label}_s{seed}"
                start = time.perf_counter()
                summary = SearchLoop(spec, run_dir, LocalExecutor(spec.build_evaluator(spec.build_space()), None),
                                     progress=False).run_search()
                seconds += time.perf_counter() - start
                done += summary["trials"]
                curve = best_so_far(read_history(run_dir / "history.jsonl"))
                curves.append(curve + [curve[-1]] * (trials - len(curve)))  # stopped early: keeps its best
            for n in at:
                metrics[f"{label}.best_at_{n}"] = Metric(round(statistics.fmean(c[n - 1] for c in curves), 4),
                                                          HIGHER, {"abs": 0.05}, unit="%")
    metrics["trials_per_s"] = Metric(round(done / seconds, 2), HIGHER, {"rel": 0.5}, timing=True,
                                     unit="trials/s")
    return metrics


def throughput_probe(workdir: Path, overrides: Sequence[str], lookups: int,
                     forward_repeats: int) -> dict[str, Metric]:
    """Table evaluations/s and, if asked, the forward time of a fixed NB201 network (batch 16, 32×32)."""
    import numpy as np

    from nas.evaluators.table import TableEvaluator
    from nas.spaces.nb201.space import NB201Space

    space = NB201Space()
    evaluator = TableEvaluator(space)
    rng = np.random.default_rng(0)
    cells = [space.sample(rng) for _ in range(min(lookups, 2000))]
    evaluator.evaluate(cells[0])
    start = time.perf_counter()
    for i in range(lookups):
        evaluator.evaluate(cells[i % len(cells)])
    metrics = {"table_evals_per_s": Metric(round(lookups / (time.perf_counter() - start), 1), HIGHER,
                                           {"rel": 0.5}, timing=True, unit="evals/s")}
    if forward_repeats:
        import torch

        from nas.spaces.nb201.arch import NB201Cell

        net = space.build(NB201Cell.from_string(FORWARD_CELL), num_classes=10).eval()
        x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        times = []
        with torch.no_grad():
            for i in range(forward_repeats + 2):  # two warm-up passes
                start = time.perf_counter()
                net(x)
                if i >= 2:
                    times.append(time.perf_counter() - start)
        metrics["forward_ms"] = Metric(round(1000 * statistics.median(times), 2), LOWER, {"rel": 1.0},
                                       timing=True, unit="ms")
    return metrics


def llm_probe(workdir: Path, overrides: Sequence[str], calls: int, max_tokens: int) -> dict[str, Metric]:
    """Completion tokens/s of the embedded model (the `llm=local` path), temperature 0."""
    from nas.cli.main import compose_config
    from nas.llm.local import LocalServer

    llm = compose_config(list(overrides)).get("llm") or {}
    if llm.get("backend") != "local":
        raise ProbeSkipped(f"llm.backend is '{llm.get('backend')}'; this probe measures the embedded model")
    local = llm.get("local") or {}
    server = LocalServer(n_ctx=int(local.get("n_ctx", 4096)), n_threads=local.get("n_threads"),
                         startup_timeout_s=float(local.get("startup_timeout_s", 120)),
                         log_path=workdir / "llm-server.log")
    try:
        start = time.perf_counter()
        server.start()
    except MissingDependencyError as err:
        raise ProbeSkipped(str(err)) from None
    startup = time.perf_counter() - start
    try:
        from openai import OpenAI

        sdk = OpenAI(base_url=server.base_url, api_key="local", max_retries=0)
        tokens, seconds = 0, 0.0
        for i in range(calls):
            start = time.perf_counter()
            reply = sdk.chat.completions.create(
                model=server.alias, temperature=0.0, max_tokens=max_tokens,
                messages=[{"role": "user", "content": f"Describe design idea {i + 1} for a small image "
                                                      "classifier block in a few sentences."}])
            seconds += time.perf_counter() - start
            tokens += reply.usage.completion_tokens
    finally:
        server.stop()
    return {"tokens_per_s": Metric(round(tokens / seconds, 2), HIGHER, {"rel": 0.5}, timing=True, unit="tokens/s"),
            "startup_s": Metric(round(startup, 2), LOWER, None, timing=True, unit="s")}


def design_probe(workdir: Path, overrides: Sequence[str], trials: int, lif_tries: int) -> dict[str, Metric]:
    """A tiny open-ended design run (the default job: NADER, the configured LLM, digits, evaluator=quick):
    the root block trains and the LLM path proposes, with few Modifier retries to bound the LLM time;
    an LLM's output varies, so tolerances are loose."""
    from nas.cli.main import compose_config, execute
    from nas.llm.local import stop_shared
    from nas.search.spec import SearchSpec

    run_dir = workdir / "design-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a retried probe measures afresh, never resumes
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        cfg = compose_config(["space=nader", "strategy=nader", "evaluator=quick", "data=digits", "recipe=quick",
                              f"budget.trials={trials}", "seed=0", "llm.cache=false",  # measure afresh
                              f"strategy.lif_tries={lif_tries}", f"knowledge.path={Path(tmp) / 'qdrant'}",
                              *overrides])
        llm = cfg.get("llm") or {}
        if llm.get("backend") == "local":
            from nas.llm.local import check_server_deps, model_path

            try:
                model_path()
                check_server_deps()
            except MissingDependencyError as err:
                raise ProbeSkipped(str(err)) from None
        start = time.perf_counter()
        try:
            summary = execute(SearchSpec.from_config(cfg), run_dir, {"name": "local"}, progress=False)
        except MissingDependencyError as err:  # e.g. the embedding model of the knowledge store
            raise ProbeSkipped(str(err)) from None
        finally:
            stop_shared()
            from nas.knowledge.store import close_client

            close_client(path=Path(tmp) / "qdrant")
        wall = time.perf_counter() - start
    history = read_history(run_dir / "history.jsonl")
    design = summary.get("design") or {}
    metrics = {
        "trials": Metric(summary["trials"], HIGHER, {"abs": 0}),
        "proposals": Metric(design.get("proposals", 0), HIGHER, {"abs": 0}),
        "valid": Metric(design.get("valid", 0), HIGHER, None),
        "llm_tokens": Metric((summary.get("llm") or {}).get("total", {}).get("tokens", 0), LOWER, None),
        "wall_s": Metric(round(wall, 1), LOWER, {"rel": 2.0}, timing=True, unit="s"),
    }
    if history and history[0].accuracy is not None:  # absent: the root did not train → "missing"
        metrics["root_accuracy"] = Metric(round(history[0].accuracy, 2), HIGHER, {"abs": 3.0}, unit="%")
    return metrics


SUITES: dict[str, Suite] = {
    "smoke": Suite("smoke", (
        Probe("table", table_probe, {"strategies": ("random", "rea"), "seeds": 2, "trials": 25, "at": (10, 25)}),
        Probe("throughput", throughput_probe, {"lookups": 5000, "forward_repeats": 0}),
    ), compare_timings=False),
    "nightly": Suite("nightly", (
        Probe("table", table_probe, {"strategies": tuple(TABLE_STRATEGIES), "seeds": 5, "trials": 100,
                                     "at": (25, 50, 100)}),
        Probe("throughput", throughput_probe, {"lookups": 50000, "forward_repeats": 10}),
        Probe("llm", llm_probe, {"calls": 3, "max_tokens": 64}),
        Probe("design", design_probe, {"trials": 2, "lif_tries": 2}),
    ), compare_timings=True),
}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise ConfigError(f"unknown suite '{name}' (valid: {', '.join(SUITES)})")
    return SUITES[name]


def run_probe(suite: str, name: str, out: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """One probe → {name, metrics, skipped, error, seconds}; a crash propagates (Prefect retries it)."""
    probe = get_suite(suite).probe(name)
    workdir = Path(out) / "probes" / name
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result: dict[str, Any] = {"name": name, "metrics": {}, "skipped": None, "error": None}
    try:
        metrics = probe.fn(workdir=workdir, overrides=list(overrides), **probe.params)
        result["metrics"] = {f"{name}.{k}": _metric_dict(m, get_suite(suite)) for k, m in metrics.items()}
    except ProbeSkipped as why:
        result["skipped"] = str(why)
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def failed_probe(name: str, err: BaseException) -> dict[str, Any]:
    message = str(err).splitlines()[0] if str(err) else ""
    return {"name": name, "metrics": {}, "skipped": None, "error": f"{type(err).__name__}: {message}",
            "seconds": None}


def _metric_dict(m: Metric, suite: Suite) -> dict[str, Any]:
    value = float(m.value)
    if not math.isfinite(value):
        raise NasError(f"probe produced a non-finite value {value}")
    tolerance = m.tolerance if (suite.compare_timings or not m.timing) else None
    return {"value": value, "direction": m.direction, "tolerance": tolerance, "timing": m.timing, "unit": m.unit}


# ---------------------------------------------------------------- baselines

def default_baseline(suite: str) -> Path:
    return BASELINES / f"{suite}.json"


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
        row = {"metric": name, "value": cur and cur["value"], "baseline": base and base["value"],
               "unit": (cur or base).get("unit", ""), "direction": (base or cur)["direction"],
               "tolerance": (base or cur).get("tolerance"), "ratio": None, "note": ""}
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


# ---------------------------------------------------------------- running and reporting

@dataclass
class Plan:
    """What a run will do, checked before any probe starts, so bad input costs no probe time."""

    suite: Suite
    baseline_path: Path
    baseline: dict[str, Any] | None
    out: Path
    update: bool


def plan(suite: str, baseline: str | Path | None = None, out: str | Path | None = None,
         update: bool = False) -> Plan:
    spec = get_suite(suite)
    path = Path(baseline) if baseline else default_baseline(suite)
    loaded = load_baseline(path, suite) if (not update or path.exists()) else None
    folder = Path(out) if out else Path("runs") / "regression" / _now().strftime("%Y-%m-%d_%H-%M-%S")
    return Plan(spec, path.resolve(), loaded, folder.resolve(), update)


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


def run_suite(suite: str, baseline: str | Path | None = None, out: str | Path | None = None, *,
              overrides: Sequence[str] = (), update: bool = False, progress: bool = True) -> dict[str, Any]:
    """Every probe of the suite in turn (never concurrently: timings must not compete), then the report."""
    p = plan(suite, baseline, out, update)
    start = time.perf_counter()
    results = []
    with _progress(progress, len(p.suite.probes)) as bar:
        for probe in p.suite.probes:
            bar.step(probe.name)
            try:
                results.append(run_probe(suite, probe.name, p.out, overrides))
            except Exception as err:  # a crashed probe is reported (its metrics "missing"), not fatal
                results.append(failed_probe(probe.name, err))
        bar.step("compare")
    return finish(p, results, overrides, round(time.perf_counter() - start, 1))


class _progress:
    """A rich progress bar over the probes on stderr (or nothing)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.bar, self.task, self.started = enabled, total, None, None, False

    def __enter__(self) -> "_progress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("[bold]regression[/] {task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), console=Console(file=sys.stderr))
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=self.total)
        return self

    def step(self, name: str) -> None:
        """The previous step is done; `name` starts."""
        if self.bar is not None:
            self.bar.update(self.task, description=name, advance=1 if self.started else 0)
        self.started = True

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


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
    from nas.report import _pyplot, save_figure

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

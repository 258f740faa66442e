"""Aggregate many runs (e.g. a Hydra multirun) into a statistics report: per
strategy and space, mean ± std of best accuracy at chosen trial counts, curves
with bands, paired Wilcoxon tests against a baseline group, and Pareto fronts
of accuracy against params and FLOPs.

Numbers on one axis must mean the same thing, so runs that differ in dataset,
space, evaluator settings, budget or constraint are refused unless asked
(`allow_mixed`, then each setting is its own group)."""

from __future__ import annotations

import json
import math
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from nas.core.dotted import flatten, result_neutral
from nas.core.trial import best_so_far, read_history
from nas.errors import ConfigError, NasError
from nas.io import atomic_write_json, atomic_write_text, check_output, read_json_object
from nas.report import _pyplot, save_figure
from nas.search.loop import trusts_self_reported
from nas.search.pareto import Objective, non_dominated_sort
from nas.spaces.nb201.table import default_table_path, load_table
from nas.strategies.base import random_only_note

MIN_PAIRS = 5  # below this the exact two-sided test cannot reach p < 0.0625, so no p-value is given
PARETO_METRICS = ("params", "flops")
ACCURACY = Objective("accuracy", maximize=True)
BANDS = ("std", "iqr")  # curve bands: mean ± 1 std, or median with the interquartile range
AUTO_AT = (0.25, 0.5, 0.75, 1.0)  # default trial counts: these fractions of the shortest run
LABEL_FIELDS = ("space", "evaluator")  # settings the group label already shows


def find_runs(paths: list[Path]) -> list[Path]:
    runs = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise NasError(f"compare: {p} does not exist")
        runs += [s.parent for s in sorted(p.rglob("summary.json"))]
    if not runs:
        raise NasError(f"compare: no summary.json found under {', '.join(map(str, paths))}")
    return sorted(set(runs))


def run_setting(summary: dict[str, Any]) -> dict[str, Any]:
    """What runs must share to be compared on one axis, as flat dotted fields: dataset, space
    and evaluator settings, budget.trials, constraint (from summary.json's spec; a summary
    without one, from an older version, gives only the space and evaluator names)."""
    spec = summary.get("spec") or {}
    space = spec.get("space") or {"name": summary["space"]}
    evaluator = spec.get("evaluator") or {"name": summary["evaluator"]}
    fields: dict[str, Any] = {}
    data = (evaluator.get("params") or {}).get("data")
    if isinstance(data, dict) and "name" in data:
        fields["dataset"] = data["name"]
    fields["space"] = space["name"]
    fields.update(_settings("space", space.get("params") or {}))
    fields["evaluator"] = evaluator["name"]
    fields.update(_settings("evaluator", evaluator.get("params") or {}))
    fields.pop("evaluator.data.name", None)  # it is `dataset`
    if "trials" in spec:
        fields["budget.trials"] = spec["trials"]
    fields.update(_settings("constraint", spec.get("constraint") or {}))
    return fields


def _settings(prefix: str, node: dict[str, Any]) -> dict[str, Any]:
    """`node` as dotted fields under `prefix`, less the settings that change no result
    (runs may differ in them and still share an axis)."""
    return {name: value for name, value in flatten(node, prefix).items() if not result_neutral(name)}


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def mixed_fields(settings: dict[Path, dict[str, Any]]) -> list[str]:
    """Fields in which some runs differ (a field a run lacks is unknown there, not different)."""
    fields = dict.fromkeys(f for s in settings.values() for f in s)
    return [f for f in fields if len({_show(s[f]) for s in settings.values() if f in s}) > 1]


def check_compatible(settings: dict[Path, dict[str, Any]]) -> None:
    """One line naming two runs and the first field they differ in (ConfigError)."""
    mixed = mixed_fields(settings)
    if not mixed:
        return
    field = mixed[0]
    having = [(run, _show(s[field])) for run, s in settings.items() if field in s]
    (run_a, a), (run_b, b) = having[0], next(h for h in having if h[1] != having[0][1])
    more = f" (and {len(mixed) - 1} more field{'s' * (len(mixed) > 2)})" if len(mixed) > 1 else ""
    raise ConfigError(f"compare: {run_a} has {field}={a} but {run_b} has {field}={b}{more}: refusing to put "
                      f"them on one axis (pass --allow-mixed to compare them anyway, one group per setting)")


def strategy_settings(summary: dict[str, Any]) -> dict[str, Any]:
    """The strategy's parameters as flat fields without the 'strategy.' prefix, and how it was
    asked (`budget.batch_size`, `budget.in_flight`: they change what it learns before each ask);
    none for a summary without a spec."""
    spec = summary.get("spec") or {}
    fields = _settings("strategy", (spec.get("strategy") or {}).get("params") or {})
    out = {f.removeprefix("strategy."): v for f, v in fields.items()}
    out.update({f"budget.{k}": spec[k] for k in ("batch_size", "in_flight") if k in spec})
    return out


def load_curves(runs: list[Path], allow_mixed: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Group label ('strategy[param=value, …] @ space/evaluator', the parameters being those that
    differ between runs of that strategy, plus '[field=value, …]' for the settings that differ when
    `allow_mixed`) → [{seed, curve, points, run, strategy, space, evaluator, setting, fields,
    random_only}]; `points` are the trials that count for best (`TrialRecord.counts_for_best`), kept for
    the Pareto fronts. Runs that differ in a setting raise ConfigError unless `allow_mixed`; runs that
    differ in strategy parameters are compared, each setting its own group."""
    summaries = {run: read_json_object(run / "summary.json") for run in runs}
    settings = {run: run_setting(s) for run, s in summaries.items()}
    if not allow_mixed:
        check_compatible(settings)
    shown = [f for f in mixed_fields(settings) if f not in LABEL_FIELDS]
    params = {run: strategy_settings(s) for run, s in summaries.items()}
    names = {s["strategy"] for s in summaries.values()}
    tuned = {n: mixed_fields({r: params[r] for r, s in summaries.items() if s["strategy"] == n}) for n in names}
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run, summary in summaries.items():
        history = read_history(run / "history.jsonl")
        extra = ", ".join(f"{f}={_show(settings[run].get(f, '?'))}" for f in shown)
        setting = f"{summary['space']}/{summary['evaluator']}" + (f" [{extra}]" if extra else "")
        spec = summary.get("spec") or {}
        own = ", ".join(f"{f}={_show(params[run].get(f, '?'))}" for f in tuned[summary["strategy"]])
        # screened and unscreened runs, and runs with other strategy parameters, side by side
        strategy_label = summary["strategy"] + (f"[{own}]" if own else "") + screen_label(spec)
        label = f"{strategy_label} @ {setting}"
        trust = trusts_self_reported(spec)
        points = [{k: getattr(r, k) for k in ("trial", "key", "encoding", "accuracy", "params", "flops")}
                  for r in history if r.counts_for_best(trust)]
        strategy = spec.get("strategy") or {}
        random_only = random_only_note(summary["strategy"], strategy.get("params") or {}, spec["trials"]) \
            if "trials" in spec else None
        groups[label].append({"seed": summary["seed"], "curve": best_so_far(history, trust), "points": points,
                              "screened": sum(1 for r in history if r.screened),
                              "run": str(run), "strategy": strategy_label, "space": summary["space"],
                              "evaluator": summary["evaluator"], "setting": setting, "fields": settings[run],
                              "random_only": random_only})
    return dict(groups)


def screen_label(spec: dict[str, Any]) -> str:
    """'+screen(x4,predictor)' for a run with screening on, '' otherwise (and for runs older than it)."""
    node = spec.get("screen") or {}
    factor, scorer = node.get("factor", 1), node.get("scorer", "?")
    return f"+screen(x{factor},{scorer})" if isinstance(factor, int) and factor > 1 else ""


def auto_at(groups: dict[str, list[dict[str, Any]]]) -> list[int]:
    """Quartiles of the shortest run's length, so that every cell has every run."""
    shortest = min(len(r["curve"]) for runs in groups.values() for r in runs)
    return sorted({max(1, int(q * shortest + 0.5)) for q in AUTO_AT})


def beyond_warning(groups: dict[str, list[dict[str, Any]]], at: list[int]) -> str | None:
    """One line for the asked trial counts that some runs never reached."""
    lengths = [len(r["curve"]) for runs in groups.values() for r in runs]
    beyond = [n for n in at if n > min(lengths)]
    if not beyond:
        return None
    short = sum(1 for n in lengths if n < max(beyond))
    return (f"--at {' '.join(map(str, beyond))}: beyond the length of {short} of {len(lengths)} runs "
            f"(shortest: {min(lengths)} trials); those runs are left out of these cells ('-' where none is left)")


def duplicate_seed_warnings(groups: dict[str, list[dict[str, Any]]]) -> list[str]:
    """A seed with several runs in a group is counted several times in its mean and std
    (e.g. the same runs passed twice under different paths, or a sweep's settings merged)."""
    out = []
    for label, runs in sorted(groups.items()):
        dups = {seed: rs for seed, rs in _by_seed(runs).items() if len(rs) > 1}
        if dups:
            seeds = ", ".join(f"{seed} ({len(rs)} runs)" for seed, rs in sorted(dups.items()))
            first = next(iter(dups.values()))
            out.append(f"{label}: duplicate seeds {seeds}, e.g. {first[0]['run']} and {first[1]['run']}: "
                       f"each run counts in the mean and std, so these seeds weigh more")
    return out


def random_only_notes(groups: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Groups whose budget never leaves the strategy's random start: label → note."""
    out = {}
    for label, runs in sorted(groups.items()):
        notes = [r["random_only"] for r in runs if r["random_only"]]
        if notes:
            count = "" if len(notes) == len(runs) else f"{len(notes)} of {len(runs)} runs: "
            out[label] = count + notes[0]
    return out


def aggregate(groups: dict[str, list[dict[str, Any]]], at: list[int]) -> dict[str, Any]:
    out = {}
    for label, runs in sorted(groups.items()):
        row: dict[str, Any] = {"runs": len(runs), "seeds": sorted(r["seed"] for r in runs), "at": {},
                               "screened": float(np.mean([r.get("screened", 0) for r in runs]))}
        for n in at:
            vals = _values_at(runs, n)
            row["at"][str(n)] = None if not vals else {
                "mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                "n": len(vals),
            }
        out[label] = row
    return out


def _values_at(runs: list[dict[str, Any]], n: int) -> list[float]:
    return [r["curve"][n - 1] for r in runs if len(r["curve"]) >= n and r["curve"][n - 1] is not None]


# --- paired tests ---------------------------------------------------------------------------

def baseline_groups(groups: dict[str, list[dict[str, Any]]], baseline: str) -> list[str]:
    """Labels `baseline` names: an exact label, or a strategy name (one group per space/evaluator)."""
    if baseline in groups:
        return [baseline]
    matched = sorted(label for label, runs in groups.items() if runs[0]["strategy"] == baseline)
    if not matched:
        raise ConfigError(f"compare: --baseline '{baseline}' matches no group "
                          f"(groups: {'; '.join(sorted(groups))})")
    axes = [(groups[label][0]["space"], groups[label][0]["evaluator"]) for label in matched]
    if len(set(axes)) < len(axes):
        raise ConfigError(f"compare: --baseline '{baseline}' is ambiguous, it matches {len(matched)} groups "
                          f"({'; '.join(matched)}): name one in full")
    return matched


def paired_tests(groups: dict[str, list[dict[str, Any]]], baseline: str, at: list[int]) -> dict[str, Any]:
    """Each other group against the baseline group on its space/evaluator, runs paired by seed.

    Runs with one seed share luck (REA's random initial population is random
    search's first trials at the same seed), which pairing takes out; a seed
    with several runs in a group (e.g. a hyper-parameter sweep) has no single
    partner and is left out.
    """
    base_labels = baseline_groups(groups, baseline)
    base_by_setting = {_setting(groups[b]): b for b in base_labels}
    out: dict[str, Any] = {}
    for label, runs in sorted(groups.items()):
        if label in base_labels:
            continue
        base = base_by_setting.get(_setting(runs))
        if base is None:
            out[label] = {"baseline": None, "note": f"no baseline group on {_setting(runs)}", "at": {}}
            continue
        mine, theirs = _by_seed(runs), _by_seed(groups[base])
        common = sorted(set(mine) & set(theirs))
        paired = [s for s in common if len(mine[s]) == 1 and len(theirs[s]) == 1]
        entry: dict[str, Any] = {"baseline": base, "seeds": paired, "at": {}, "note": None}
        if not common:
            entry["note"] = f"no seeds in common with {base}"
        else:
            if len(paired) < len(common):
                entry["note"] = f"seeds with several runs left out: {sorted(set(common) - set(paired))}"
            pairs = [(mine[s][0]["curve"], theirs[s][0]["curve"]) for s in paired]
            for n in at:
                diffs = [a[n - 1] - b[n - 1] for a, b in pairs
                         if len(a) >= n and len(b) >= n and a[n - 1] is not None and b[n - 1] is not None]
                entry["at"][str(n)] = wilcoxon_paired(diffs)
        out[label] = entry
    _holm(out)
    return out


def _setting(runs: list[dict[str, Any]]) -> str:
    return runs[0]["setting"]


def _by_seed(runs: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list] = defaultdict(list)
    for r in runs:
        out[r["seed"]].append(r)
    return out


def wilcoxon_paired(diffs: list[float]) -> dict[str, Any]:
    """Two-sided Wilcoxon signed-rank test on paired differences (group − baseline)."""
    from scipy.stats import wilcoxon  # lazy: loads scipy (start-up time)

    d = np.asarray(diffs, dtype=float)
    res: dict[str, Any] = {"pairs": len(d), "median_diff": float(np.median(d)) if len(d) else None,
           "better": int((d > 0).sum()), "worse": int((d < 0).sum()), "tied": int((d == 0).sum()),
           "statistic": None, "p_value": None, "p_holm": None, "reason": None}
    if len(d) < MIN_PAIRS:
        res["reason"] = f"too few pairs ({len(d)} < {MIN_PAIRS})"
    elif not d.any():
        res["reason"] = "all differences are zero"
    else:
        test = wilcoxon(d)
        res["statistic"], res["p_value"] = float(test.statistic), float(test.pvalue)
    return res


def _holm(tests: dict[str, Any]) -> None:
    """Holm-Bonferroni over every p-value of the report, so that reading many
    tests (groups × trial counts) still bounds the chance of any false claim."""
    cells = sorted((c for t in tests.values() for c in t["at"].values() if c["p_value"] is not None),
                   key=lambda c: c["p_value"])
    running = 0.0
    for i, c in enumerate(cells):
        running = max(running, min(1.0, (len(cells) - i) * c["p_value"]))
        c["p_holm"] = running


# --- Pareto fronts --------------------------------------------------------------------------

def pareto_fronts(groups: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per metric and group, the non-dominated (accuracy ↑, metric ↓) trials over all its runs."""
    out: dict[str, Any] = {}
    for metric in PARETO_METRICS:
        objectives = (ACCURACY, Objective(metric, maximize=False))
        per_group = {}
        for label, runs in sorted(groups.items()):
            pts = [{**p, "seed": r["seed"], "run": r["run"]} for r in runs for p in r["points"]
                   if _finite(p.get(metric)) and _finite(p["accuracy"])]
            if not pts:
                continue
            # only the most accurate point per metric value can be on the front; this keeps
            # non_dominated_sort's n×n matrix small (NB201 has a few dozen distinct sizes)
            best: dict[float, dict[str, Any]] = {}
            for p in pts:
                if p[metric] not in best or p["accuracy"] > best[p[metric]]["accuracy"]:
                    best[p[metric]] = p
            cands = list(best.values())
            front = non_dominated_sort([[p[o.name] for o in objectives] for p in cands],
                                       [o.maximize for o in objectives])[0]
            per_group[label] = {"trials": len(pts),
                                "front": sorted((cands[i] for i in front), key=lambda p: p[metric])}
        out[metric] = {"groups": per_group,
                       "note": None if per_group else f"no successful trial has {metric}"}
    return out


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# --- reference lines ------------------------------------------------------------------------

def expected_best(values: Any, n_max: int) -> list[float]:
    """Expected best of n distinct uniform draws from `values`, for n = 1..n_max: random search
    without repeats. With a_1 ≤ … ≤ a_N sorted, P(best ≤ a_k) = C(k, n) / C(N, n)."""
    a = np.sort(np.asarray(values, dtype=float))
    k = np.arange(1, len(a) + 1, dtype=float)
    cdf = k / len(a)
    out = []
    for n in range(1, min(n_max, len(a)) + 1):
        if n > 1:  # C(k, n) / C(k, n-1) over C(N, n) / C(N, n-1)
            cdf = cdf * np.maximum(k - n + 1, 0.0) / (len(a) - n + 1)
        out.append(float(np.diff(cdf, prepend=0.0) @ a))
    return out


def table_reference(settings: list[dict[str, Any]], length: int) -> tuple[dict[str, Any] | None, str | None]:
    """For NB201 table runs without a constraint, the table's optimum and random search's expected
    best curve over `length` trials: (reference, None), or (None, why not) when the runs are table
    runs but the table cannot be read; (None, None) for other runs (no distribution is known)."""

    first = settings[0]
    keys = ("space", "evaluator", "evaluator.path", "evaluator.metric")
    if first.get("space") != "nb201" or first.get("evaluator") != "table" \
            or any(s.get(k) != first.get(k) for s in settings for k in keys) \
            or any(v is not None for s in settings for f, v in s.items() if f.startswith("constraint.")):
        return None, None
    metric = first.get("evaluator.metric") or "baseline_accuracy"
    try:
        path = first.get("evaluator.path") or default_table_path()
        values = list(load_table(str(Path(path).expanduser().resolve()), metric).values())
    except NasError as err:
        return None, f"no reference lines: {err}"
    source = "NB201 table" + ("" if metric == "baseline_accuracy" else f", {metric}")
    return {"source": source, "optimum": max(values),
            "random_expected": expected_best(values, length)}, None


# --- the report -----------------------------------------------------------------------------

def compare(paths: list[Path], out_dir: Path, at: list[int] | None = None, baseline: str | None = None,
            band: str = "std", allow_mixed: bool = False) -> dict[str, Any]:
    """Write compare.json, compare.md, compare.png and pareto.png (if any trial has params or
    FLOPs) to `out_dir`; returns what compare.json holds. `at` None: quartiles of the shortest run."""
    if at is not None and (not at or any(n <= 0 for n in at)):
        raise NasError(f"compare: trial counts must be positive integers, got {at}")
    if band not in BANDS:
        raise ConfigError(f"compare: unknown band '{band}' (valid: {', '.join(BANDS)})")
    out_dir = check_output(Path(out_dir), directory=True)  # a file in the way fails before the work
    groups = load_curves(find_runs(paths), allow_mixed)
    warned = []
    if at is None:
        at = auto_at(groups)
    else:
        warned.append(beyond_warning(groups, at))
    warned += duplicate_seed_warnings(groups)
    length = max(len(r["curve"]) for g in groups.values() for r in g)
    reference, why_not = table_reference([r["fields"] for g in groups.values() for r in g], length)
    warned.append(why_not)
    tests = None if baseline is None else paired_tests(groups, baseline, at)
    pareto = pareto_fronts(groups)
    report: dict[str, Any] = {"at": at, "groups": aggregate(groups, at), "band": band, "baseline": baseline,
              "notes": random_only_notes(groups), "warnings": [w for w in warned if w],
              "reference": reference, "tests": tests, "pareto": pareto,
              "figures": {"curves": "compare.png",
                          "pareto": "pareto.png" if any(pareto[m]["groups"] for m in pareto) else None}}
    plot_curves(groups, out_dir / "compare.png", band, reference)
    if report["figures"]["pareto"]:
        plot_pareto(groups, pareto, out_dir / "pareto.png")
    else:  # an earlier compare's front would pass for this one's
        (out_dir / "pareto.png").unlink(missing_ok=True)
    atomic_write_json(out_dir / "compare.json", report)
    atomic_write_text(out_dir / "compare.md", render_report(report))
    return report


def render_table(table: dict[str, Any], at: list[int], notes: dict[str, str] | None = None,
                 reference: dict[str, Any] | None = None) -> str:
    """Groups with a note (random search in disguise) are marked †; a known random-search
    expectation is a last row."""
    notes = notes or {}
    screened = any(row.get("screened") for row in table.values())  # the column only where some run screened
    head = "| strategy @ space/evaluator | runs | " + ("screened / run | " if screened else "") \
        + " | ".join(f"best @ {n}" for n in at) + " |"
    lines = [head, "| --- | --- | " + ("--- | " if screened else "") + " | ".join("---" for _ in at) + " |"]
    for label, row in table.items():
        cells = []
        for n in at:
            s = row["at"][str(n)]
            cells.append("-" if s is None else f"{s['mean']:.2f} ± {s['std']:.2f} (n={s['n']})")
        mark = " †" if label in notes else ""
        count = f"{row.get('screened', 0):.0f} | " if screened else ""
        lines.append(f"| {label}{mark} | {row['runs']} | {count}" + " | ".join(cells) + " |")
    if reference is not None:
        expected = reference["random_expected"]
        cells = [f"{expected[n - 1]:.2f}" if n <= len(expected) else "-" for n in at]
        lines.append(f"| random search, expected ({reference['source']}) | - | " + ("- | " if screened else "")
                     + " | ".join(cells) + " |")
    lines.append("")
    if reference is not None:
        lines.append(f"Optimum of the {reference['source']}: {reference['optimum']:.2f}.")
    if screened:
        lines.append("Screened / run: candidates asked and scored but not evaluated (screen.factor); "
                     "not trials, not failures.")
    lines += [f"- † {label}: {note}" for label, note in notes.items()]
    return "\n".join(lines).rstrip("\n") + "\n"


def render_tests(tests: dict[str, Any], baseline: str) -> str:
    lines = [f"Wilcoxon signed-rank test (two-sided), runs paired by seed, on best accuracy so far; "
             f"difference = group − baseline (`{baseline}`). p (Holm) corrects for all tests below. "
             f"No p-value under {MIN_PAIRS} pairs: the exact test's smallest p with n pairs is 2/2ⁿ.", "",
             "| group | baseline | trials | pairs | median diff | better/worse/tied | p | p (Holm) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for label, t in tests.items():
        if t["note"]:
            notes.append(f"- {label}: {t['note']}")
        for n, c in t["at"].items():
            med = "-" if c["median_diff"] is None else f"{c['median_diff']:+.2f}"
            p = c["reason"] if c["p_value"] is None else _fmt_p(c["p_value"])
            holm = "-" if c["p_holm"] is None else _fmt_p(c["p_holm"])
            lines.append(f"| {label} | {t['baseline']} | {n} | {c['pairs']} | {med} | "
                         f"{c['better']}/{c['worse']}/{c['tied']} | {p} | {holm} |")
    if not tests:
        notes.append("- no group besides the baseline")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _fmt_p(p: float) -> str:
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


def render_pareto(pareto: dict[str, Any]) -> str:
    lines = ["Non-dominated trials (higher accuracy, fewer params / FLOPs) over all runs of a group; "
             "the points are in compare.json.", "",
             "| group | metric | trials | front size | most accurate | smallest |",
             "| --- | --- | --- | --- | --- | --- |"]
    notes = []
    for metric, entry in pareto.items():
        if entry["note"]:
            notes.append(f"- {metric}: {entry['note']}")
        for label, g in entry["groups"].items():
            small, acc = g["front"][0], g["front"][-1]
            lines.append(f"| {label} | {metric} | {g['trials']} | {len(g['front'])} | "
                         f"{acc['accuracy']:.2f}% at {_fmt_int(acc[metric])} | "
                         f"{small['accuracy']:.2f}% at {_fmt_int(small[metric])} |")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _fmt_int(v: float) -> str:
    """Three significant digits and a unit, the unit chosen after rounding (999,999 is 1M, not 1e+03k)."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale * 0.9995:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.3g}"


def render_report(report: dict[str, Any]) -> str:
    runs = sum(row["runs"] for row in report["groups"].values())
    band = "±1 std" if report["band"] == "std" else "interquartile range"
    parts = [f"# Comparison of {runs} runs", ""]
    if report["warnings"]:
        parts += ["## Warnings", "", *(f"- {w}" for w in report["warnings"]), ""]
    parts += ["## Best accuracy so far (mean ± std (n))", "",
              render_table(report["groups"], report["at"], report["notes"], report["reference"]),
              f"![best-so-far curves, mean with {band}](compare.png)", ""]
    if report["tests"] is not None:
        parts += ["## Paired tests against the baseline", "", render_tests(report["tests"], report["baseline"])]
    parts += ["## Pareto fronts", "", render_pareto(report["pareto"])]
    if report["figures"]["pareto"]:
        parts += ["![Pareto fronts](pareto.png)", ""]
    return "\n".join(parts)


# --- figures --------------------------------------------------------------------------------


LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # 7 and 4 are coprime: 28 groups before a pair repeats


def curve_styles(labels: list[str]) -> dict[str, dict[str, Any]]:
    """Colour, line style and marker per group: groups with identical curves (REA and random
    search during REA's random start) must not hide each other, nor need colour to be told apart."""
    return {label: {"color": f"C{i % 10}", "linestyle": LINESTYLES[i % len(LINESTYLES)],
                    "marker": MARKERS[i % len(MARKERS)]} for i, label in enumerate(labels)}


def plot_curves(groups: dict[str, list[dict[str, Any]]], path: Path, band: str = "std",
                reference: dict[str, Any] | None = None) -> list[str]:
    """Mean ± 1 std (band='std') or median and interquartile range (band='iqr', robust to one
    lucky seed) of the best-so-far curves, with the table's optimum and random search's
    expected curve when known; returns the legend's entries."""
    from matplotlib.ticker import MaxNLocator  # lazy: loads matplotlib (start-up time)

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = sorted(groups)
    styles = curve_styles(labels)
    notes = random_only_notes(groups)
    longest = 1
    for i, label in enumerate(labels):
        runs = groups[label]
        length = min(len(r["curve"]) for r in runs)
        longest = max(longest, length)
        mat = np.array([[np.nan if v is None else v for v in r["curve"][:length]] for r in runs], dtype=float)
        xs = np.arange(1, length + 1)
        with warnings.catch_warnings():  # columns where every run has only failures
            warnings.simplefilter("ignore", RuntimeWarning)
            if band == "std":
                mid = np.nanmean(mat, axis=0)
                std = np.nanstd(mat, axis=0)
                lo, hi = mid - std, mid + std
            else:
                lo, mid, hi = np.nanpercentile(mat, [25, 50, 75], axis=0)
        every = max(1, length // 8)  # markers staggered per group: identical curves show each one's
        mark = " †" if label in notes else ""
        ax.plot(xs, mid, label=f"{label}{mark} (n={len(runs)})", ms=4,
                markevery=(i * every // len(labels), every), **styles[label])
        ax.fill_between(xs, lo, hi, alpha=0.2, color=styles[label]["color"])
    if reference is not None:
        expected = reference["random_expected"][:longest]
        ax.plot(np.arange(1, len(expected) + 1), expected, color="gray", linestyle=(0, (1, 1)),
                label=f"random search, expected ({reference['source']})")
        ax.axhline(reference["optimum"], color="black", linewidth=0.8, linestyle=(0, (5, 2)),
                   label=f"optimum {reference['optimum']:.2f}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trials" + ("  († random search in disguise: see compare.md)" if notes else ""))
    ax.set_ylabel("best accuracy so far (%)")
    ax.set_title("best-so-far accuracy, " + ("mean ± std" if band == "std" else "median and IQR") + " over seeds")
    ax.grid(alpha=0.3)
    legend = ax.legend(loc="lower right", fontsize=8)
    entries = [t.get_text() for t in legend.get_texts()]
    save_figure(fig, path)
    return entries


def plot_pareto(groups: dict[str, list[dict[str, Any]]], pareto: dict[str, Any], path: Path) -> None:
    """One panel per metric that some group has: every trial faint, the front as a staircase."""
    plt = _pyplot()
    metrics = [m for m in PARETO_METRICS if pareto[m]["groups"]]
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.5 * len(metrics), 4.5), squeeze=False)
    colours = {label: f"C{i % 10}" for i, label in enumerate(sorted(groups))}
    for ax, metric in zip(axes[0], metrics):
        for label, g in pareto[metric]["groups"].items():
            pts = [(p[metric], p["accuracy"]) for r in groups[label] for p in r["points"] if _finite(p.get(metric))]
            ax.scatter(*zip(*pts), s=4, alpha=0.15, color=colours[label])
            xs, ys = [p[metric] for p in g["front"]], [p["accuracy"] for p in g["front"]]
            ax.plot(xs, ys, drawstyle="steps-post", marker="o", ms=3, color=colours[label],
                    label=f"{label} ({len(xs)} on front)")
        # zoom on the fronts: a few collapsed cells (10% on NB201) would squash them to a line
        accs = [p["accuracy"] for g in pareto[metric]["groups"].values() for p in g["front"]]
        pad = max(0.05 * (max(accs) - min(accs)), 0.5)
        ax.set_ylim(min(accs) - pad, max(accs) + pad)
        sizes = [p[metric] for rows in groups.values() for r in rows for p in r["points"] if _finite(p.get(metric))]
        if sizes and min(sizes) > 0:  # sizes span decades: a linear axis crowds its labels
            ax.set_xscale("log")
        ax.set_xlabel(f"{metric} (log scale)" if ax.get_xscale() == "log" else metric)
        ax.set_ylabel("accuracy (%), trials below the fronts cut off")
        ax.set_title(f"Pareto front: accuracy vs {metric}")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    missing = [m for m in PARETO_METRICS if m not in metrics]
    if missing:
        fig.suptitle(f"no panel for {', '.join(missing)}: no successful trial has it", fontsize=9)
    save_figure(fig, path)

"""nasflow's strategies against Optuna's samplers on the NB201 CIFAR-10 table (issue 41): the
tools a user would pick instead, in the same harness, on the same `baseline_accuracy` values.

Every method runs through the library (`nas/`, local executor, one table evaluator for all):
nasflow's `random`, `rea`, `evolution`, `bananas` and the space's default (conf/space_defaults/
nb201.yaml: the row of the strategy it names), and Optuna's samplers through `strategy=optuna`
(TPE as Optuna defaults it, multivariate; TPE independent; random; GP only when one whole
`nas search` of `--process-trials` finishes within `--gp-timeout`). Every candidate is distinct (repeats are answered from the run's
history), so "best at n" is the best of n distinct cells.

Per method: best at 25/50/100/200 (mean, std, median, seeds at the table optimum), the loop's
seconds per search (to 100 trials and to the end) and, for one seed, the whole `nas search`
process. Tests, at each budget: the default against each Optuna sampler, paired (Wilcoxon
signed-rank over seeds: same seed, same first state) and unpaired (Mann-Whitney U), plus
`bananas` against TPE. Slow methods (`bananas`, GP: ~50 s a 200-trial search on 2 cores) run
seed after seed, in turn, while `--budget-seconds` lasts, after the fast ones: with `--budget-seconds`, the fast methods
get seeds (at least 5) for half of it; the JSON says how many seeds each method got.

    python benchmarks/peers.py                            # 20 seeds x 200 trials
    python benchmarks/peers.py --seeds 3 --trials 50 --no-process --gp-timeout 0   # proves it runs
    python benchmarks/peers.py --budget-seconds 600       # as many slow seeds as fit in 10 minutes

Writes benchmarks/results/peers.json and peers.png (mean best-so-far curves, shaded std)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json, read_json  # noqa: E402
from nas.search.loop import LocalExecutor, SearchLoop  # noqa: E402
from nas.search.record import TrialRecord, best_so_far, read_history  # noqa: E402
from nas.search.spec import Component, SearchSpec  # noqa: E402

OPTIMUM = 94.0664  # analog-nasbench's best baseline_accuracy over NB201's 15,625 cells
BUDGETS = (25, 50, 100, 200)
NASFLOW = ("random", "rea", "evolution", "bananas")
# label -> (strategy=, its parameters beyond conf/strategy/<name>.yaml, `nas search` overrides alike)
OPTUNA: dict[str, dict[str, Any]] = {
    "optuna_tpe": {"sampler": "tpe"},
    "optuna_tpe_independent": {"sampler": "tpe", "sampler_params": {"multivariate": False}},
    "optuna_random": {"sampler": "random"},
    "optuna_gp": {"sampler": "gp"},
}
SLOW = ("bananas", "optuna_gp")  # seeds after the fast methods, in turn, while the time budget lasts
FAST_SHARE = 0.5     # of --budget-seconds: the fast methods' seeds (at least 5), the rest for timings and SLOW
OVERRIDES = {"optuna_tpe_independent": ["+strategy.sampler_params.multivariate=false"]}


def conf_params(name: str) -> dict[str, Any]:
    """The strategy's parameters as `nas search strategy=NAME` has them (conf/strategy/NAME.yaml)."""
    data = yaml.safe_load((ROOT / "conf" / "strategy" / f"{name}.yaml").read_text())
    return {k: v for k, v in data.items() if k != "name"}


def space_default(space: str = "nb201") -> str:
    for entry in yaml.safe_load((ROOT / "conf" / "space_defaults" / f"{space}.yaml").read_text())["defaults"]:
        if isinstance(entry, dict) and "/strategy" in entry:
            return str(entry["/strategy"])
    raise SystemExit(f"conf/space_defaults/{space}.yaml names no strategy")


def method(label: str) -> tuple[str, dict[str, Any]]:
    if label in OPTUNA:
        return "optuna", {**conf_params("optuna"), **OPTUNA[label]}
    return label, conf_params(label)


def run(label: str, seed: int, trials: int, evaluator, workdir: Path) -> dict[str, Any]:
    name, params = method(label)
    spec = SearchSpec(space=Component("nb201"), strategy=Component(name, params), evaluator=Component("table"),
                      seed=seed, trials=trials)
    run_dir = workdir / f"{label}_s{seed}"
    at_100: list[float] = []
    start = time.perf_counter()

    def on_batch(history: list[TrialRecord]) -> None:
        if len(history) >= min(100, trials) and not at_100:
            at_100.append(time.perf_counter() - start)

    SearchLoop(spec, run_dir, LocalExecutor(evaluator, None), progress=False, on_batch=on_batch).run_search()
    loop = time.perf_counter() - start
    history = read_history(run_dir / "history.jsonl")
    keys = [r.key for r in history]
    if len(set(keys)) != len(keys):
        raise SystemExit(f"{label} seed {seed}: {len(keys) - len(set(keys))} repeated candidates")
    curve = [float(v) if v is not None else float("nan") for v in best_so_far(history)]
    out = {"curve": curve, "loop_seconds": loop, "loop_seconds_100": at_100[0] if at_100 else None}
    if name == "optuna":  # how much of the search was Optuna's: repeats it proposed, random fills after them
        summary = read_json(run_dir / "summary.json")["optuna"]
        out |= {"study_trials": summary["study_trials"], "repeats": summary["repeats_answered"],
                "random_fills": sum(r.strategy.get("origin") == "random" for r in history)}
    return out


def process_seconds(label: str, trials: int, workdir: Path, timeout: float) -> dict[str, Any]:
    """One whole `nas search` (seed 0): start-up, search, report. On timeout, how far it got."""
    name, _ = method(label)
    run_dir = workdir / f"process_{label}"
    args = [sys.executable, "-m", "nas.cli.main", "search", "space=nb201", "evaluator=table", f"strategy={name}",
            f"budget.trials={trials}", "seed=0", "runner=local", "progress=false", f"hydra.run.dir={run_dir}"]
    if label in OPTUNA:
        args.append(f"strategy.sampler={OPTUNA[label]['sampler']}")
    args += OVERRIDES.get(label, [])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["NASFLOW_HOME"] = str(workdir / "home")
    start = time.perf_counter()
    try:
        out = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        done = len(read_history(run_dir / "history.jsonl")) if (run_dir / "history.jsonl").exists() else 0
        return {"trials": trials, "finished": False, "timeout_seconds": timeout, "trials_done": done}
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"nas search strategy={name} failed: {out.stderr[-1500:]}")
    return {"trials": trials, "finished": True, "seconds": round(seconds, 2)}


def p_values(a: np.ndarray, b: np.ndarray, paired: bool) -> dict[str, float | None]:
    from scipy.stats import mannwhitneyu, wilcoxon

    out: dict[str, float | None] = {"mann_whitney_p": round(float(mannwhitneyu(a, b).pvalue), 5)}
    if paired:
        diff = a - b
        out["wilcoxon_p"] = 1.0 if not np.any(diff) else round(float(wilcoxon(a, b).pvalue), 5)
    return out


def summarise(curves: np.ndarray, budgets: list[int]) -> dict[str, Any]:
    return {str(n): {"mean": round(float(curves[:, n - 1].mean()), 4),
                     "std": round(float(curves[:, n - 1].std(ddof=1)), 4) if len(curves) > 1 else 0.0,
                     "median": round(float(np.median(curves[:, n - 1])), 4),
                     "at_optimum": int(np.sum(curves[:, n - 1] >= OPTIMUM - 1e-9))} for n in budgets}


def compare(a_label: str, b_label: str, runs: dict[str, dict[int, dict[str, Any]]], budgets: list[int]) -> dict:
    """`a` against `b` at each budget: mean difference (a - b), paired on their common seeds and unpaired."""
    common = sorted(set(runs[a_label]) & set(runs[b_label]))
    out: dict[str, Any] = {"seeds_paired": len(common)}
    for n in budgets:
        a = np.array([runs[a_label][s]["curve"][n - 1] for s in sorted(runs[a_label])])
        b = np.array([runs[b_label][s]["curve"][n - 1] for s in sorted(runs[b_label])])
        pa = np.array([runs[a_label][s]["curve"][n - 1] for s in common])
        pb = np.array([runs[b_label][s]["curve"][n - 1] for s in common])
        entry: dict[str, Any] = {"mean_diff": round(float(a.mean() - b.mean()), 4)}
        if len(a) > 1 and len(b) > 1:
            entry |= p_values(a, b, paired=False)
        if len(common) > 1:
            entry |= {k: v for k, v in p_values(pa, pb, paired=True).items() if k == "wilcoxon_p"}
        diff, p = entry["mean_diff"], entry.get("wilcoxon_p")
        entry["verdict"] = ("better (p < 0.05)" if p is not None and p < 0.05 and diff > 0 else
                            "worse (p < 0.05)" if p is not None and p < 0.05 and diff < 0 else
                            "tie within 0.05" if abs(diff) < 0.05 else "not significant")
        out[str(n)] = entry
    return out


def plot(runs: dict[str, dict[int, dict[str, Any]]], default: str, trials: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    x = np.arange(1, trials + 1)
    for label, by_seed in runs.items():
        if not by_seed:
            continue
        curves = np.array([r["curve"] for r in by_seed.values()])
        mean, std = curves.mean(axis=0), curves.std(axis=0)
        name = f"{label} (default)" if label == default else label
        line, = ax.plot(x, mean, label=f"{name}, {len(curves)} seeds", lw=2 if label in (default, "optuna_tpe") else 1.2,
                        ls="-" if label in NASFLOW else "--")
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.12)
    ax.axhline(OPTIMUM, color="k", lw=0.8, ls=":", label=f"table optimum {OPTIMUM}")
    ax.set_xscale("log")
    ax.set_xlim(10, trials)
    ax.set_ylim(92.8, 94.15)
    ax.set_xlabel("distinct candidates evaluated")
    ax.set_ylabel("best CIFAR-10 test accuracy so far (%)")
    ax.set_title("NB201 table: nasflow strategies (solid) vs Optuna samplers (dashed), mean ± std")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--budget-seconds", type=float, default=None,
                    help="stop starting slow-method seeds (bananas, GP) once the benchmark has run this long")
    ap.add_argument("--gp-timeout", type=float, default=180.0,
                    help="Optuna's GPSampler joins the slow methods only if one whole `nas search` of --process-trials "
                         "finishes within it; 0 skips it")
    ap.add_argument("--no-process", action="store_true", help="skip the whole-process timings")
    ap.add_argument("--process-trials", type=int, default=100, help="trials of each whole-process timing")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peers.json")
    args = ap.parse_args()
    budgets = [n for n in BUDGETS if n <= args.trials]
    default = space_default("nb201")
    fast = [m for m in (*NASFLOW, *OPTUNA) if m not in SLOW]
    slow = [m for m in SLOW if m != "optuna_gp"]  # GP joins if its probe finishes
    runs: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in (*NASFLOW, *OPTUNA)}
    process: dict[str, Any] = {}
    notes: list[str] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        table = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"))
        evaluator = table.build_evaluator(table.build_space())  # the table loaded once, for every run
        for seed in range(args.seeds):  # seeds outermost: load on the machine falls on every method alike
            if args.budget_seconds is not None and seed >= 5 and \
                    time.perf_counter() - start > FAST_SHARE * args.budget_seconds:
                notes.append(f"fast methods: {seed} of {args.seeds} seeds (0-{seed - 1}) fit in {FAST_SHARE:.0%} of "
                             f"--budget-seconds={args.budget_seconds:.0f} on this machine's load")
                break
            for label in fast:
                runs[label][seed] = run(label, seed, args.trials, evaluator, work)
            print(f"seed {seed}: " + "  ".join(f"{m} {runs[m][seed]['curve'][-1]:.2f}" for m in fast), flush=True)
        if not args.no_process:
            for label in [*fast, *slow]:
                process[label] = process_seconds(label, args.process_trials, work, timeout=600)
                print(f"process {label}: {process[label]}", flush=True)
        if args.gp_timeout > 0:
            probe = process_seconds("optuna_gp", args.process_trials, work, timeout=args.gp_timeout)
            process["optuna_gp"] = probe
            if probe["finished"]:
                slow.append("optuna_gp")
            else:
                notes.append(f"optuna_gp: no seeds; one `nas search` of {args.process_trials} trials did not finish "
                             f"in --gp-timeout={args.gp_timeout:.0f} s ({probe['trials_done']} trials done)")
                print(notes[-1], flush=True)
        for seed in range(args.seeds):
            if args.budget_seconds is not None and time.perf_counter() - start > args.budget_seconds and seed >= 2:
                break
            for label in slow:
                runs[label][seed] = run(label, seed, args.trials, evaluator, work)
                print(f"seed {seed}: {label} {runs[label][seed]['curve'][-1]:.2f} "
                      f"({runs[label][seed]['loop_seconds']:.1f} s)", flush=True)
    for label in slow:
        if len(runs[label]) < args.seeds:
            notes.append(f"{label}: {len(runs[label])} of {args.seeds} seeds (seeds 0-{len(runs[label]) - 1}) fit "
                         f"in --budget-seconds={args.budget_seconds}; its tests pair on those seeds")

    methods: dict[str, Any] = {}
    for label, by_seed in runs.items():
        if not by_seed:
            continue
        curves = np.array([by_seed[s]["curve"] for s in sorted(by_seed)])
        loops = np.array([by_seed[s]["loop_seconds"] for s in sorted(by_seed)])
        at_100 = [by_seed[s]["loop_seconds_100"] for s in sorted(by_seed) if by_seed[s]["loop_seconds_100"]]
        name, params = method(label)
        methods[label] = {
            "strategy": name, "params": params, "seeds": sorted(by_seed),
            "best_at": summarise(curves, budgets),
            "loop_seconds": {"mean": round(float(loops.mean()), 3), "median": round(float(np.median(loops)), 3),
                             "to_100_mean": round(float(np.mean(at_100)), 3) if at_100 else None},
            **({"process": process[label]} if label in process else {}),
        }
        if name == "optuna":
            methods[label]["per_search"] = {k: round(float(np.mean([by_seed[s][k] for s in by_seed])), 1)
                                            for k in ("study_trials", "repeats", "random_fills")}
    if "optuna_gp" in process and "optuna_gp" not in methods:
        methods["optuna_gp"] = {"strategy": "optuna", "params": method("optuna_gp")[1], "seeds": [],
                                "process": process["optuna_gp"]}
    samplers = [m for m in OPTUNA if runs[m]]
    tests = {f"{default} (default) vs {m}": compare(default, m, runs, budgets) for m in samplers}
    if runs["bananas"]:
        tests["bananas vs optuna_tpe"] = compare("bananas", "optuna_tpe", runs, budgets)
        tests[f"bananas vs {default}"] = compare("bananas", default, runs, budgets)
    tpe_loop = methods["optuna_tpe"]["loop_seconds"]["to_100_mean"] if "optuna_tpe" in methods else None
    payload = {
        "benchmark": "peers", "issue": 41, "space": "nb201", "evaluator": "table",
        "metric": "CIFAR-10 test accuracy (analog-nasbench baseline_accuracy)", "table_optimum": OPTIMUM,
        "default_strategy": default, "seeds": args.seeds, "trials": args.trials, "budgets": budgets,
        "candidates": "distinct: every method's repeats are answered from its run's history",
        "methods": methods, "tests": tests,
        "loop_seconds_to_100_vs_tpe": {m: round(v["loop_seconds"]["to_100_mean"] / tpe_loop, 2)
                                       for m, v in methods.items()
                                       if tpe_loop and v.get("loop_seconds", {}).get("to_100_mean")},
        "notes": notes, "optuna_version": _version("optuna"), "cpu_cores": os.cpu_count(),
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    atomic_write_json(args.out, payload)
    plot(runs, default, args.trials, args.out.with_suffix(".png"))
    for label, m in methods.items():
        if "best_at" in m:
            row = "  ".join(f"@{n}: {v['mean']:.3f}±{v['std']:.3f} ({v['at_optimum']})" for n, v in m["best_at"].items())
            print(f"{label:24s} {row}  loop {m['loop_seconds']['mean']:.2f}s")
    for name, t in tests.items():
        print(name, {n: (v["mean_diff"], v.get("wilcoxon_p"), v.get("mann_whitney_p")) for n, v in t.items()
                     if n != "seeds_paired"})
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

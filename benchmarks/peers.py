"""nasflow's strategies against Optuna's samplers on the NB201 CIFAR-10 table (issue 41): the
tools a user would pick instead, in the same harness, on the same `baseline_accuracy` values.

Every method runs through the library (`nas/`, local executor, one table evaluator for all):
nasflow's `random`, `rea`, `evolution`, `bananas` and the space's default (conf/space_defaults/
nb201.yaml: the row of the strategy it names), and Optuna's samplers through `strategy=optuna`
(TPE as Optuna defaults it, multivariate; TPE independent; random; GP only when one whole
`nas search` of `--process-trials` finishes within `--gp-timeout`). Every candidate is distinct (repeats are answered from the run's
history), so "best at n" is the best of n distinct cells.

Per method: best at 25/50/100/200 (mean, std, median, seeds at the table optimum), the loop's
seconds per search (to 100 trials and to the end), wall and this process's CPU (the CPU seconds
hold on cores other jobs share) and, for one seed, the whole `nas search` process; for `bananas`
and TPE one search of `--long-trials` (1,000) with its CPU seconds per 100 trials along the way.
Tests, at each budget: the default against every other method, paired (Wilcoxon signed-rank over
seeds: same seed, same first state) and unpaired (Mann-Whitney U); with `--before DIR` (a
checkout of an earlier commit), `bananas` against that version's (`bananas_before`, to
`--before-trials`). The slow method (GP) runs seed after seed while `--budget-seconds` lasts,
after the fast ones: with `--budget-seconds`, the fast methods get seeds (at least 5) for half
of it; the JSON says how many seeds each method got.

    python benchmarks/peers.py                            # 20 seeds x 200 trials, 1,000-trial rows
    python benchmarks/peers.py --seeds 3 --trials 50 --no-process --gp-timeout 0 --long-trials 0   # proves it runs
    git worktree add --detach /tmp/bananas_before <commit> && python benchmarks/peers.py --before /tmp/bananas_before
    python benchmarks/peers.py --only optuna_tpe_independent --no-process --long-trials 0 --gp-timeout 0
    python benchmarks/peers.py --only optuna_gp --trials 100 --no-process --long-trials 0 --budget-seconds 1200

`--only` merges rows into the existing JSON (each row keeps its per-seed curves, as steps, for that).

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

from nas.core.constraint import Constraint  # noqa: E402
from nas.core.trial import TrialRecord, best_so_far, read_history  # noqa: E402
from nas.io import atomic_write_json, read_json  # noqa: E402
from nas.search.loop import LocalExecutor, SearchLoop  # noqa: E402
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
MARKS = (100, 200, 500, 1000)  # history lengths at which the loop's seconds are read
LONG = ("bananas", "optuna_tpe")  # the --long-trials rows: how their loop time grows to 1,000 trials
SLOW = ("optuna_gp",)  # seeds after the fast methods, in turn, while the time budget lasts
FAST_SHARE = 0.5     # of --budget-seconds: the fast methods' seeds (at least 5), the rest for timings and SLOW
OVERRIDES = {"optuna_tpe_independent": ["+strategy.sampler_params.multivariate=false"]}
NB201, TABLE, NO_LIMIT = Component("nb201"), Component("table"), Constraint()


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


def run(label: str, seed: int, trials: int, evaluator, workdir: Path, space: Component = NB201,
        scorer: Component = TABLE, constraint: Constraint = NO_LIMIT) -> dict[str, Any]:
    """One search of `label` through the library, as `nas search` runs it: `evaluator` is built
    once by the caller (`scorer` is its spec, recorded in the run dir); best-so-far and seconds."""
    name, params = method(label)
    spec = SearchSpec(space=space, strategy=Component(name, params), evaluator=scorer, seed=seed, trials=trials,
                      constraint=constraint)
    run_dir = workdir / f"{label}_s{seed}_t{trials}"  # a fresh run dir per length: never a resumed shorter run
    marks = [n for n in MARKS if n < trials] + [trials]
    wall_at: dict[str, float] = {}
    cpu_at: dict[str, float] = {}  # this process's CPU seconds: what the method costs, whatever else the cores run
    start, cpu_start = time.perf_counter(), time.process_time()

    def on_batch(history: list[TrialRecord]) -> None:
        for n in marks:
            if len(history) >= n and str(n) not in wall_at:
                wall_at[str(n)] = round(time.perf_counter() - start, 4)
                cpu_at[str(n)] = round(time.process_time() - cpu_start, 4)

    SearchLoop(spec, run_dir, LocalExecutor(evaluator, None), progress=False, on_batch=on_batch).run_search()
    loop, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    history = read_history(run_dir / "history.jsonl")
    keys = [r.key for r in history]
    if len(set(keys)) != len(keys):
        raise SystemExit(f"{label} seed {seed}: {len(keys) - len(set(keys))} repeated candidates")
    curve = [float(v) if v is not None else float("nan") for v in best_so_far(history)]
    out = {"curve": curve, "loop_seconds": loop, "loop_cpu_seconds": cpu, "loop_seconds_at": wall_at,
           "loop_cpu_seconds_at": cpu_at, "loop_seconds_100": wall_at.get("100")}
    if name == "optuna":  # how much of the search was Optuna's: repeats it proposed, random fills after them
        summary = read_json(run_dir / "summary.json")["optuna"]
        out |= {"study_trials": summary["study_trials"], "repeats": summary["repeats_answered"],
                "random_fills": sum(r.strategy.get("origin") == "random" for r in history)}
    return out


# Run in a subprocess with another checkout's `nas` first on the path (`--before`): its `bananas`
# through its own peers.py `run`, so the comparison is against that version's code as it was.
BEFORE_WORKER = """
import json, sys, tempfile
from pathlib import Path
root, (first, last), trials, out = Path(sys.argv[1]), map(int, sys.argv[2].split(":")), int(sys.argv[3]), sys.argv[4]
sys.path[:0] = [str(root), str(root / "benchmarks")]
import peers
from nas.search.spec import Component, SearchSpec
assert Path(peers.__file__).resolve().parent == (root / "benchmarks").resolve(), peers.__file__
table = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"))
evaluator = table.build_evaluator(table.build_space())
from nas.io import atomic_write_json
runs = {}
with tempfile.TemporaryDirectory() as tmp:
    for seed in range(first, last):  # written after each seed: a cut-short run keeps the seeds it finished
        runs[seed] = peers.run("bananas", seed, trials, evaluator, Path(tmp))
        atomic_write_json(Path(out), {"params": peers.conf_params("bananas"), "runs": runs})
        print(f"before seed {seed}: {runs[seed]['curve'][-1]:.2f} ({runs[seed]['loop_seconds']:.1f} s)", flush=True)
"""


def before_process(root: Path, seeds: range, trials: int, out: Path) -> subprocess.Popen:
    """`bananas` of the checkout at `root` (e.g. `git worktree add /tmp/bananas_before <commit>`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    return subprocess.Popen([sys.executable, "-c", BEFORE_WORKER, str(root), f"{seeds.start}:{seeds.stop}",
                             str(trials), str(out)], cwd=root, env=env)


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


def summarise(curves: np.ndarray, budgets: list[int], optimum: float | None = OPTIMUM) -> dict[str, Any]:
    """Best at each budget over seeds; `at_optimum` counts the seeds at a known optimum (None: unknown)."""
    return {str(n): {"mean": round(float(curves[:, n - 1].mean()), 4),
                     "std": round(float(curves[:, n - 1].std(ddof=1)), 4) if len(curves) > 1 else 0.0,
                     "median": round(float(np.median(curves[:, n - 1])), 4),
                     **({"at_optimum": int(np.sum(curves[:, n - 1] >= optimum - 1e-9))} if optimum else {})}
            for n in budgets}


def compare(a_label: str, b_label: str, runs: dict[str, dict[int, dict[str, Any]]], budgets: list[int]) -> dict:
    """`a` against `b` at each budget: mean difference (a - b), paired on their common seeds and unpaired."""
    common = sorted(set(runs[a_label]) & set(runs[b_label]))
    out: dict[str, Any] = {"seeds_paired": len(common)}
    reached = min(len(r["curve"]) for label in (a_label, b_label) for r in runs[label].values())
    for n in [n for n in budgets if n <= reached]:  # e.g. GP's shorter searches
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


def plot(runs: dict[str, dict[int, dict[str, Any]]], default: str, trials: int, path: Path,
         points: dict[str, dict[str, Any]] | None = None, optimum: float | None = OPTIMUM,
         ylim: tuple[float, float] | None = (92.8, 94.15), ylabel: str = "best CIFAR-10 test accuracy so far (%)",
         title: str = "NB201 table: nasflow strategies (solid) vs Optuna samplers (dashed), mean ± std") -> None:
    """Mean best-so-far curves with their std; `points`: rows kept from an earlier JSON without
    per-seed curves, drawn as mean ± std at their budgets."""
    import matplotlib  # lazy: matplotlib only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after choosing the backend

    fig, ax = plt.subplots(figsize=(8, 5))
    for k, (label, best_at) in enumerate((points or {}).items()):  # nudged apart: rows share the budgets
        ax.errorbar([int(n) * 1.025 ** (k + 1) for n in best_at], [v["mean"] for v in best_at.values()],
                    yerr=[v["std"] for v in best_at.values()], marker="o" if label in NASFLOW else "s", ms=4,
                    capsize=2, lw=0.8, ls="none",
                    label=f"{label}: mean ± std at budgets (earlier run)" + (" (default)" if label == default else ""))
    for label, by_seed in runs.items():
        if not by_seed:
            continue
        curves = np.array([r["curve"] for r in by_seed.values()])
        x = np.arange(1, curves.shape[1] + 1)  # bananas_before may be shorter
        mean, std = curves.mean(axis=0), curves.std(axis=0)
        name = f"{label} (default)" if label == default else label
        line, = ax.plot(x, mean, label=f"{name}, {len(curves)} seeds", lw=2 if label in (default, "optuna_tpe") else 1.2,
                        ls="-" if label in NASFLOW else "--")
        ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.12)
    if optimum:
        ax.axhline(optimum, color="k", lw=0.8, ls=":", label=f"table optimum {optimum}")
    ax.set_xscale("log")
    ax.set_xlim(min(10, trials // 2), trials * (1.2 if points else 1))  # room for the nudged points
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_xlabel("distinct candidates evaluated")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
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
                    help="stop starting slow-method seeds (GP) once the benchmark has run this long")
    ap.add_argument("--gp-timeout", type=float, default=180.0,
                    help="Optuna's GPSampler joins the slow methods only if one whole `nas search` of --process-trials "
                         "finishes within it; 0 skips it")
    ap.add_argument("--no-process", action="store_true", help="skip the whole-process timings")
    ap.add_argument("--process-trials", type=int, default=100, help="trials of each whole-process timing")
    ap.add_argument("--long-trials", type=int, default=1000,
                    help="one longer search per --long-seeds of bananas and TPE: the loop's seconds at 100-1000; 0 skips")
    ap.add_argument("--long-seeds", type=int, default=1)
    ap.add_argument("--long-only", action="store_true",
                    help="run only the --long-trials rows and write them into the existing --out JSON's `long`")
    ap.add_argument("--before", type=Path, default=None,
                    help="a checkout of an earlier version (git worktree add DIR COMMIT): its bananas, run alongside, "
                         "is the row bananas_before and the test `bananas vs bananas_before`")
    ap.add_argument("--before-results", type=Path, nargs="+", default=None,
                    help="the JSON files `before_process` wrote (e.g. two seed ranges run side by side), instead of "
                         "running --before again")
    ap.add_argument("--before-trials", type=int, default=100)
    ap.add_argument("--skip", nargs="+", default=[], choices=[*NASFLOW, *OPTUNA],
                    help="methods left out (the JSON's notes say so), e.g. the costly TPE independent on a busy machine")
    ap.add_argument("--only", nargs="+", default=None, choices=[*NASFLOW, *OPTUNA],
                    help="run only these methods and merge them into the existing --out JSON: its other rows kept, "
                         "the tests recomputed where both rows hold per-seed curves, the PNG redrawn (the default "
                         "is rerun too when its row holds no curves: the paired tests need them)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "peers.json")
    args = ap.parse_args()
    if args.long_only:
        return long_only(args)
    budgets = [n for n in BUDGETS if n <= args.trials]
    default = space_default("nb201")
    earlier = merge_base(args.out, args.only, default, args.seeds, args.trials) if args.only else None
    skipped = args.skip if earlier is None else [m for m in (*NASFLOW, *OPTUNA) if m not in earlier["rerun"]]
    if "optuna_gp" in skipped:
        args.gp_timeout = 0
    named_gp = earlier is not None and "optuna_gp" in earlier["rerun"]  # asked for by name: joins without a probe
    fast = [m for m in (*NASFLOW, *OPTUNA) if m not in SLOW and m not in skipped]
    slow = [m for m in SLOW if m != "optuna_gp"]  # GP joins if its probe finishes (or `--only` names it)
    runs: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in (*NASFLOW, *OPTUNA)}
    process: dict[str, Any] = {}
    long: dict[str, Any] = {}
    notes: list[str] = [f"{m}: skipped (--skip)" for m in args.skip]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        before_out = args.before_results or [work / "before.json"]
        before = (before_process(args.before, range(args.seeds), args.before_trials, before_out[0])
                  if args.before and not args.before_results else None)  # with both: DIR only names the commit
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
        if args.long_trials:
            for label in LONG:
                by_seed = {seed: run(label, seed, args.long_trials, evaluator, work) for seed in range(args.long_seeds)}
                long[label] = long_row(by_seed, args.long_trials)
                print(f"long {label}: {long[label]['loop_cpu_seconds_at']} CPU s", flush=True)
        if not args.no_process:
            for label in [*fast, *slow]:
                process[label] = process_seconds(label, args.process_trials, work, timeout=600)
                print(f"process {label}: {process[label]}", flush=True)
        if named_gp:
            slow.append("optuna_gp")
        elif args.gp_timeout > 0:
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
        before_info: dict[str, Any] = {}
        if before is not None and before.wait() != 0:
            raise SystemExit(f"--before {args.before}: its bananas failed (exit {before.returncode})")
        if args.before or args.before_results:
            parts = [read_json(path) for path in before_out]
            runs["bananas_before"] = {int(k): v for d in parts for k, v in d["runs"].items() if int(k) < args.seeds}
            before_info = {"checkout": str(args.before) if args.before else None, "params": parts[0]["params"],
                           "commit": _commit(args.before) if args.before else None,
                           "results": [str(p) for p in args.before_results] if args.before_results else None}
    for label in slow:
        if len(runs[label]) < args.seeds:
            notes.append(f"{label}: {len(runs[label])} of {args.seeds} seeds (seeds 0-{len(runs[label]) - 1}) fit "
                         f"in --budget-seconds={args.budget_seconds}; its tests pair on those seeds")

    methods: dict[str, Any] = {}
    for label, by_seed in runs.items():
        if not by_seed:
            continue
        methods[label] = method_row("bananas" if label == "bananas_before" else label, by_seed, budgets)
        if label == "bananas_before":
            methods[label] |= {"params": before_info.pop("params"), "before": before_info}
        if label in process:
            methods[label]["process"] = process[label]
    if "optuna_gp" in process and "optuna_gp" not in methods:
        methods["optuna_gp"] = {"strategy": "optuna", "params": method("optuna_gp")[1], "seeds": [],
                                "process": process["optuna_gp"]}
    if earlier is not None:  # the tests are made there, over the merged rows
        return merge(args, earlier, methods, runs, notes, time.perf_counter() - start)
    tests = tests_of(runs, default, budgets)
    payload = {
        "benchmark": "peers", "issue": 41, "space": "nb201", "evaluator": "table",
        "metric": "CIFAR-10 test accuracy (analog-nasbench baseline_accuracy)", "table_optimum": OPTIMUM,
        "default_strategy": default, "seeds": args.seeds, "trials": args.trials, "budgets": budgets,
        "candidates": "distinct: every method's repeats are answered from its run's history",
        "methods": methods, "tests": tests,
        "loop_seconds_to_100_vs_tpe": ratios(methods, "to_100_mean"),
        "loop_cpu_seconds_to_100_vs_tpe": ratios(methods, "cpu_to_100_mean"),
        "long": {"trials": args.long_trials, "seeds": list(range(args.long_seeds)), "methods": long} if long else None,
        "notes": notes, "optuna_version": _version("optuna"), "cpu_cores": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join(["python benchmarks/peers.py", *sys.argv[1:]]),
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    atomic_write_json(args.out, payload)
    plot(runs, default, args.trials, args.out.with_suffix(".png"))
    for label, m in methods.items():
        if "best_at" in m:
            row = "  ".join(f"@{n}: {v['mean']:.3f}±{v['std']:.3f} ({v['at_optimum']})" for n, v in m["best_at"].items())
            print(f"{label:24s} {row}  loop {m['loop_seconds']['mean']:.2f}s cpu {m['loop_seconds']['cpu_mean']}")
    for name, t in tests.items():
        print(name, {n: (v["mean_diff"], v.get("wilcoxon_p"), v.get("mann_whitney_p")) for n, v in t.items()
                     if n != "seeds_paired"})
    print("to 100 vs TPE (wall, CPU):", payload["loop_seconds_to_100_vs_tpe"], payload["loop_cpu_seconds_to_100_vs_tpe"])
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def tests_of(runs: dict[str, dict[int, dict[str, Any]]], default: str, budgets: list[int]) -> dict[str, Any]:
    """The default against every other method with runs; `bananas` against TPE when it is not the
    default, and against `bananas_before` when that row ran."""
    others = [m for m in (*NASFLOW, *OPTUNA) if runs.get(m) and m != default]
    tests = {f"{default} (default) vs {m}": compare(default, m, runs, budgets) for m in others}
    if default != "bananas" and runs.get("bananas") and runs.get("optuna_tpe"):
        tests["bananas vs optuna_tpe"] = compare("bananas", "optuna_tpe", runs, budgets)
    if runs.get("bananas_before") and runs.get("bananas"):
        tests["bananas vs bananas_before"] = compare("bananas", "bananas_before", runs, budgets)
    return tests


def merge_base(path: Path, only: list[str], default: str, seeds: int, trials: int) -> dict[str, Any]:
    """The JSON `--only` merges into, and the methods to run: `only`, and the default when its row
    holds no per-seed curves (a JSON written before rows kept them); that rerun replaces its row, so
    it must cover the row's seeds and trials."""
    if not path.is_file():
        raise SystemExit(f"--only merges into an existing --out JSON: {path} does not exist")
    payload = read_json(path)
    if payload.get("default_strategy") != default:
        raise SystemExit(f"--only: {path} was written for default {payload.get('default_strategy')!r}, "
                         f"conf/space_defaults/nb201.yaml now names {default!r}: run the whole benchmark")
    rerun = list(dict.fromkeys([*only, *([] if "curves" in payload["methods"].get(default, {}) else [default])]))
    row = payload["methods"].get(default, {})
    if default in rerun and (seeds < len(row.get("seeds", [])) or trials < payload["trials"]):
        raise SystemExit(f"--only reruns the default {default} (its row in {path} holds no per-seed curves) and would "
                         f"replace its {len(row['seeds'])} seeds x {payload['trials']} trials: pass --seeds "
                         f"{len(row['seeds'])} --trials {payload['trials']}")
    return {"payload": payload, "rerun": rerun}


def stored_runs(row: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """A JSON row's per-seed curves as `run` returns them (what `compare` and `plot` read)."""
    return {seed: {"curve": unsteps(points)} for seed, points in zip(row["seeds"], row["curves"], strict=True)}


def merge(args: argparse.Namespace, earlier: dict[str, Any], methods: dict[str, Any],
          runs: dict[str, dict[int, dict[str, Any]]], notes: list[str], seconds: float) -> None:
    """Write the rows just run into the earlier JSON: its other rows kept, every test whose two rows
    hold curves recomputed (the rest kept as they were), the figure redrawn from the curves (rows
    without them as points at their budgets)."""
    payload, rerun = earlier["payload"], earlier["rerun"]
    default, budgets = payload["default_strategy"], payload["budgets"]
    old = payload["methods"]
    if default in rerun and "best_at" in old.get(default, {}) and default in methods:
        same = all(old[default]["best_at"].get(n, {}).get("mean") == v["mean"]
                   for n, v in methods[default]["best_at"].items())
        notes.append(f"{default} (default): rerun for the per-seed curves its row lacked; its best_at "
                     + ("matches the earlier run's" if same else "differs from the earlier run's (replaced)"))
    merged = {**old, **{m: {**old.get(m, {}), **row} for m, row in methods.items()}}
    every = {m: runs[m] if runs.get(m) else stored_runs(row) for m, row in merged.items() if runs.get(m) or "curves" in row}
    tests = {**payload["tests"], **tests_of(every, default, budgets)}
    kept_notes = [n for n in payload.get("notes", []) if not any(n.startswith(f"{m}:") for m in rerun)]
    payload |= {
        "methods": merged, "tests": tests, "notes": kept_notes + notes,
        "loop_seconds_to_100_vs_tpe": ratios(merged, "to_100_mean"),
        "loop_cpu_seconds_to_100_vs_tpe": ratios(merged, "cpu_to_100_mean"),
        "merges": [*payload.get("merges", []), {
            "methods": rerun, "seeds": {m: methods[m]["seeds"] for m in rerun if m in methods},
            "command": " ".join(["python benchmarks/peers.py", *sys.argv[1:]]), "wall_seconds": round(seconds, 1),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()], "optuna_version": _version("optuna")}],
    }
    atomic_write_json(args.out, payload)
    points = {m: row["best_at"] for m, row in merged.items() if m not in every and row.get("best_at")}
    plot(every, default, payload["trials"], args.out.with_suffix(".png"), points=points)
    for name in rerun:
        for test, result in tests.items():
            if name in test:
                print(test, {n: (v["mean_diff"], v.get("wilcoxon_p")) for n, v in result.items() if n != "seeds_paired"})
    print(f"merged {', '.join(rerun)} into {args.out} and redrew {args.out.with_suffix('.png')}")


def method_row(label: str, by_seed: dict[int, dict[str, Any]], budgets: list[int],
               optimum: float | None = OPTIMUM) -> dict[str, Any]:
    """A method's JSON row from its runs: best at each budget it reached, loop seconds, and its
    per-seed best-so-far curves (`curves`, as steps) so a later `--only` run can test against it."""
    seeds = sorted(by_seed)
    curves = np.array([by_seed[s]["curve"] for s in seeds])
    loops = np.array([by_seed[s]["loop_seconds"] for s in seeds])
    at_100 = [by_seed[s]["loop_seconds_100"] for s in seeds if by_seed[s]["loop_seconds_100"]]
    cpu = [by_seed[s]["loop_cpu_seconds"] for s in seeds if "loop_cpu_seconds" in by_seed[s]]
    cpu_100 = [by_seed[s]["loop_cpu_seconds_at"]["100"] for s in seeds
               if "100" in by_seed[s].get("loop_cpu_seconds_at", {})]
    name, params = method(label)
    row = {"strategy": name, "params": params, "seeds": seeds,
           "best_at": summarise(curves, [n for n in budgets if n <= curves.shape[1]], optimum),
           "loop_seconds": {"mean": round(float(loops.mean()), 3), "median": round(float(np.median(loops)), 3),
                            "to_100_mean": round(float(np.mean(at_100)), 3) if at_100 else None,
                            "cpu_mean": round(float(np.mean(cpu)), 3) if cpu else None,
                            "cpu_to_100_mean": round(float(np.mean(cpu_100)), 3) if cpu_100 else None},
           "curves": [steps(by_seed[s]["curve"]) for s in seeds]}
    if name == "optuna":
        row["per_search"] = {k: round(float(np.mean([by_seed[s][k] for s in seeds])), 1)
                             for k in ("study_trials", "repeats", "random_fills")}
    return row


def steps(curve: list[float]) -> list[list[float]]:
    """A best-so-far curve as [[trial, value], ...] where it changes, ending at its last trial: a few
    dozen numbers per search instead of one per trial."""
    out = [[i + 1, round(v, 4)] for i, v in enumerate(curve) if i == 0 or not v == curve[i - 1]]
    return out if out[-1][0] == len(curve) else [*out, [len(curve), round(curve[-1], 4)]]


def unsteps(points: list[list[float]]) -> list[float]:
    """The per-trial curve `steps` wrote."""
    curve: list[float] = []
    ends = [int(p[0]) for p in points[1:]] + [int(points[-1][0]) + 1]
    for (n, value), end in zip(points, ends, strict=True):
        curve += [float(value)] * (end - int(n))
    return curve


def long_only(args: argparse.Namespace) -> None:
    """The long rows alone, written into the JSON of an earlier run (e.g. after changing only them)."""
    payload = read_json(args.out)
    with tempfile.TemporaryDirectory() as tmp:
        table = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"))
        evaluator = table.build_evaluator(table.build_space())
        long = {label: long_row({seed: run(label, seed, args.long_trials, evaluator, Path(tmp))
                                 for seed in range(args.long_seeds)}, args.long_trials) for label in LONG}
    payload["long"] = {"trials": args.long_trials, "seeds": list(range(args.long_seeds)), "methods": long,
                       "command": " ".join(["python benchmarks/peers.py", *sys.argv[1:]]),
                       "load_average_at_end": [round(x, 2) for x in os.getloadavg()]}
    atomic_write_json(args.out, payload)
    for label, row in long.items():
        print(f"long {label}: {row['loop_cpu_seconds_at']} CPU s, per 100: {row['cpu_seconds_per_100']}")


def ratios(methods: dict[str, Any], key: str) -> dict[str, float]:
    """Each method's loop seconds to 100 trials over TPE's (`key`: wall or CPU)."""
    tpe = methods.get("optuna_tpe", {}).get("loop_seconds", {}).get(key)
    return {m: round(v["loop_seconds"][key] / tpe, 2) for m, v in methods.items()
            if tpe and v.get("loop_seconds", {}).get(key)}


def long_row(by_seed: dict[int, dict[str, Any]], trials: int) -> dict[str, Any]:
    """Mean loop seconds (wall, CPU) at 100..`trials`, and CPU seconds per 100 trials between the marks:
    flat per-100 cost is linear growth."""
    marks = sorted({int(n) for r in by_seed.values() for n in r["loop_cpu_seconds_at"]})
    wall = {str(n): round(float(np.mean([r["loop_seconds_at"][str(n)] for r in by_seed.values()])), 3) for n in marks}
    cpu = {str(n): round(float(np.mean([r["loop_cpu_seconds_at"][str(n)] for r in by_seed.values()])), 3)
           for n in marks}
    per_100 = {f"{a}-{b}": round((cpu[str(b)] - cpu[str(a)]) * 100 / (b - a), 3) for a, b in zip(marks, marks[1:])}
    return {"trials": trials, "loop_seconds_at": wall, "loop_cpu_seconds_at": cpu, "cpu_seconds_per_100": per_100,
            "best": round(float(np.mean([r["curve"][-1] for r in by_seed.values()])), 4)}


def _commit(root: Path) -> str | None:
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()

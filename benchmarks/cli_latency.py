"""CLI start-up latency benchmark -> JSON: how long the everyday `nas` commands take.

  python benchmarks/cli_latency.py --label before|after [--repeats 5] [--tree DIR] [--commands NAME...]
                                   [--out benchmarks/results/cli_latency.json]

Each command runs in a fresh interpreter (the installed `nas` entry point, a
private temp NASFLOW_HOME, a temp working directory), --repeats times; the
median wall time is recorded under the label and merged into the existing JSON
(so `before` and `after` sit side by side; a later run of some commands
replaces only those) and written atomically. --tree runs another checkout of
the code instead of this one (e.g. `git archive HEAD | tar -x -C DIR`): it goes
first on PYTHONPATH, ahead of the editable install. Commands that only parse,
print help or reject a config should not pay for torch or Prefect.

  python benchmarks/cli_latency.py --end-to-end [--before-tree /tmp/cli_before] [--repeats 3]

End-to-end rows, each for the code before (--before-tree, e.g. `git archive HEAD | tar -x -C
/tmp/cli_before`) and after (this checkout), in one run, the trees' repeats interleaved, so the
machine's load is shared: a
100-trial table search (a new NASFLOW_HOME's first command, then warm ones with a new seed each,
so no evaluation is cached), a refused command (a bad config key), a resume (50 trials, then the
same run dir to 100: the second command is timed); and, as the reference, an Optuna TPE process
doing the same 100-trial search on the same table. Each search row records its wall and CPU time
and the time to its first trial (history.jsonl's first line: the fixed cost), wall and the `nas`
process's CPU (first_trial_cpu_s: what a loaded machine stretches least). The load average is
sampled around every row. Written under "end_to_end" in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json, read_json  # noqa: E402

NAS = Path(sys.executable).parent / "nas"
VALID = "tests/data/blocks/residual.txt"
MODEL = "tests/data/models/cnn_kernel5.py"  # model source: checked in the sandbox, measured here
INVALID = "<tmp>/broken.txt"  # residual.txt without its first block's output edge
COMMANDS: dict[str, tuple[list[str], int]] = {  # name -> (argv after `nas`, expected exit code)
    "help": (["--help"], 0),
    "config_error": (["search", "strategy=nosuch"], 2),  # caught before Hydra composes
    "config_error_composed": (["search", "budget.trials=-1"], 2),  # composed by Hydra, rejected by SearchSpec
    "arch_validate_valid": (["arch", "validate", VALID], 0),
    "arch_validate_invalid": (["arch", "validate", INVALID], 1),
    "arch_validate_model": (["arch", "validate", MODEL], 0),
    "search_help": (["search", "--help"], 0),
}


def time_command(argv: list[str], expected: int, repeats: int, env: dict[str, str], tmp: Path, tree: Path) -> dict:
    real = [a.replace("<tmp>", str(tmp)) if a.startswith("<tmp>") else str(tree / a) if a in (VALID, MODEL) else a
            for a in argv]
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run([str(NAS), *real], env=env, cwd=tmp, capture_output=True, text=True)
        seconds.append(time.perf_counter() - start)
        if proc.returncode != expected:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise SystemExit(f"nas {' '.join(argv)}: exit {proc.returncode}, expected {expected}: {tail}")
    return {"median_s": round(statistics.median(seconds), 3), "runs_s": [round(s, 3) for s in seconds],
            "argv": ["nas", *argv], "exit": expected, "repeats": repeats,
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_avg_1m": round(os.getloadavg()[0], 2),  # a shared machine: context for the median
            "tree": "working tree" if tree == ROOT else str(tree)}


SEARCH = ["search", "space=nb201", "strategy=random", "evaluator=table", "budget.trials=100", "progress=false"]
OPTUNA = r"""
import sys, time
start = time.perf_counter()
import optuna
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell
from nas.spaces.nb201.table import default_table_path, load_table

optuna.logging.set_verbosity(optuna.logging.WARNING)
table = load_table(str(default_table_path()), "baseline_accuracy")

def objective(trial):
    cell = NB201Cell(tuple(trial.suggest_categorical(f"edge{i}", list(OPS)) for i in range(len(EDGES))))
    return table[cell.to_anb_tuple()]

study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=int(sys.argv[1])))
first = None
def note(study, trial):
    global first
    first = first or time.perf_counter() - start
study.optimize(objective, n_trials=100, callbacks=[note])
print(f"{study.best_value} {first}")
"""


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process so far (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_search(argv: list[str], env: dict[str, str], cwd: Path, run_dir: Path | None,
                 expected: int = 0) -> dict:
    """Wall seconds of `nas ARGV` and its CPU seconds (its processes', reaped), and with a run dir
    the seconds to its first trial line, wall and the `nas` process's CPU (a shared machine's
    load stretches wall time; CPU time much less)."""
    load = _load()
    cpu, forks = resource.getrusage(resource.RUSAGE_CHILDREN), _forks(env)
    start, start_epoch = time.perf_counter(), time.time()
    # `python -m nas.cli`: each tree's own way out (its __main__), whatever the venv's script is
    proc = subprocess.Popen([sys.executable, "-m", "nas.cli", *argv], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = first_cpu = None
    history = run_dir / "history.jsonl" if run_dir is not None else None
    before = history.stat().st_size if history is not None and history.exists() else 0
    while proc.poll() is None:
        if first is None and history is not None and history.exists() and history.stat().st_size > before:
            first, first_cpu = time.perf_counter() - start, _cpu_s(proc.pid)
        time.sleep(0.02)
    wall = time.perf_counter() - start
    out, err = proc.communicate()
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != expected:
        raise SystemExit(f"nas {' '.join(argv)}: exit {proc.returncode}, expected {expected}: {err.strip()[-400:]}")
    row = {"wall_s": round(wall, 3), "cpu_s": round(used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime, 3),
           "load_avg_1m": [load, _load()]}
    if first is not None:
        row["first_trial_s"] = round(first, 3)
    if first_cpu is not None:
        row["first_trial_cpu_s"] = round(first_cpu, 3)
    if run_dir is not None:
        row.update(phases(run_dir / "search.log", start_epoch, start_epoch + wall))
    row["warm"] = _forks(env) > forks  # run in a warm process's child: cpu_s is then the caller's alone
    return row


def _forks(env: dict[str, str]) -> int:
    """Commands the tree's warm process has forked (nas/cli/warm.py's log), 0 without one."""
    try:
        text = (Path(env["NASFLOW_HOME"]) / "warm.log").read_text()
    except OSError:
        return 0
    return sum(" pid " in line and ": nas " in line for line in text.splitlines())


def wait_warm(env: dict[str, str], tree: Path, seconds: float = 90.0) -> float | None:
    """Seconds until the warm process that the first command started serves (None: a tree without one)."""
    if not (tree / "nas" / "cli" / "warm.py").exists():
        return None
    start = time.perf_counter()
    log = Path(env["NASFLOW_HOME"]) / "warm.log"
    while "serving at" not in (log.read_text() if log.exists() else ""):
        if time.perf_counter() - start > seconds:
            raise SystemExit(f"no warm process served within {seconds:.0f} s ({log})")
        time.sleep(0.1)
    return round(time.perf_counter() - start, 3)


LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[nas\.(start|progress)\]\[INFO\] - (.*)$")


def phases(log: Path, start: float, end: float) -> dict[str, float]:
    """Where a search command's wall time went, from its search.log's lines (millisecond stamps):
    `to_run_dir_s` from the command's start to the flow body's "run dir:" line (imports, Hydra's
    compose, the checks, the flow run's creation), `trials_s` from there to the last trial's line,
    `after_last_trial_s` from it to the process's end (summary, report, artifacts, the flow run's
    end, the exit)."""
    try:
        text = log.read_text(encoding="utf-8")
    except OSError:
        return {}
    stamps: dict[str, float] = {}
    for line in text.splitlines():
        match = LOG_LINE.match(line)
        if match is None:
            continue
        at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as logging writes it
        if at < start - 0.002:  # an earlier command's lines (a resumed run dir)
            continue
        if match[3].startswith("run dir:"):
            stamps.setdefault("run_dir", at)
        elif match[3].startswith("trial "):
            stamps["last_trial"] = at
    if {"run_dir", "last_trial"} - stamps.keys():
        return {}
    return {"to_run_dir_s": round(stamps["run_dir"] - start, 3),
            "trials_s": round(stamps["last_trial"] - stamps["run_dir"], 3),
            "after_last_trial_s": round(end - stamps["last_trial"], 3)}


def end_to_end(before_tree: Path | None, repeats: int, out: Path) -> None:
    trees = {"after": ROOT} | ({"before": before_tree} if before_tree is not None else {})
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="nas-e2e-") as tmp:
        work = Path(tmp)
        envs: dict[str, dict[str, str]] = {}
        for label, tree in trees.items():
            env = {**{k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "NASFLOW_"))},
                   "NASFLOW_HOME": str(work / label / "home"), "OMP_NUM_THREADS": "1",
                   "NASFLOW_PREFECT_SERVER": "local"}
            if tree != ROOT:
                env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
            envs[label] = env
        rows: dict[str, dict[str, list]] = {label: {"search_100_first_command": [], "search_100": [], "refused": [],
                                                    "resume": []} for label in trees}
        # Interleaved, each repeat in turn for every tree (the order alternating): a shared machine's load
        # drifts over minutes, and the trees' rows then see the same drift.
        warm_ready: dict[str, float | None] = {}
        try:
            for label, tree in trees.items():
                run = work / label / "cold"
                rows[label]["search_100_first_command"].append(
                    timed_search([*SEARCH, "seed=100", f"hydra.run.dir={run}"], envs[label], work, run))
                warm_ready[label] = wait_warm(envs[label], tree)  # "the server warm": its warm process too
            for r in range(repeats):
                for label in list(trees)[::1 if r % 2 == 0 else -1]:
                    run = work / label / f"warm{r}"
                    rows[label]["search_100"].append(
                        timed_search([*SEARCH, f"seed={r + 1}", f"hydra.run.dir={run}"], envs[label], work, run))
                    rows[label]["refused"].append(
                        timed_search(["search", "budget.trialz=3"], envs[label], work, None, expected=2))
            for r in range(max(1, repeats - 1)):
                for label in list(trees)[::1 if r % 2 == 0 else -1]:
                    run = work / label / f"resume{r}"
                    half = [a if a != "budget.trials=100" else "budget.trials=50" for a in SEARCH]
                    timed_search([*half, f"seed={50 + r}", f"hydra.run.dir={run}"], envs[label], work, run)
                    rows[label]["resume"].append(
                        timed_search([*SEARCH, f"seed={50 + r}", f"hydra.run.dir={run}"], envs[label], work, run))
        finally:
            for label in trees:
                stop_local_server(work / label / "home")
        for label, tree in trees.items():
            results[label] = {"tree": "working tree" if tree == ROOT else str(tree),
                              "warm_ready_after_first_command_s": warm_ready.get(label),
                              "rows": {k: summarize(v) for k, v in rows[label].items()}}
            print(label, json.dumps({k: v["median_wall_s"] for k, v in results[label]["rows"].items()}))
        optuna_rows = []
        for r in range(repeats):
            load = _load()
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-c", OPTUNA, str(r)], cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            if proc.returncode != 0:
                raise SystemExit(f"optuna reference failed: {proc.stderr.strip()[-400:]}")
            best, first = proc.stdout.split()
            optuna_rows.append({"wall_s": round(time.perf_counter() - start, 3), "first_trial_s": round(float(first), 3),
                                "best": float(best), "load_avg_1m": [load, _load()]})
        results["optuna_tpe_reference"] = summarize(optuna_rows)
        print("optuna", results["optuna_tpe_reference"]["median_wall_s"])
    if "before" in results:
        results["after_over_before"] = {k: round(results["after"]["rows"][k]["median_wall_s"]
                                                 / results["before"]["rows"][k]["median_wall_s"], 3)
                                        for k in results["after"]["rows"]}
    results["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    results["when"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    results["note"] = ("a shared machine: compare ratios within this run; load_avg_1m is sampled before and after "
                       "each row. before = the tree at --before-tree, after = this tree, each with its own "
                       "NASFLOW_HOME and NASFLOW_PREFECT_SERVER=local (its first command starts the shared local "
                       "server, and in a tree with nas/cli/warm.py the warm process too; the warm rows reuse both, "
                       "after waiting for the warm process to serve: warm_ready_after_first_command_s). A run's "
                       "`warm` says it ran in a warm process's child; its cpu_s is then the caller's alone (the "
                       "child is not the benchmark's)")
    report = read_json(out) if out.exists() else {}
    report["end_to_end"] = results
    atomic_write_json(out, report)
    print(f"wrote {out}")


def summarize(rows: list[dict]) -> dict:
    out: dict = {"median_wall_s": round(statistics.median(r["wall_s"] for r in rows), 3), "runs": rows,
                 "warm_runs": sum(bool(r.get("warm")) for r in rows)}
    for key in ("cpu_s", "first_trial_s", "first_trial_cpu_s", "to_run_dir_s", "trials_s", "after_last_trial_s"):
        values = [r[key] for r in rows if key in r]
        if values:
            out[f"median_{key}"] = round(statistics.median(values), 3)
    return out


def stop_local_server(home: Path) -> None:
    """The shared local server a benchmark's NASFLOW_HOME started: stopped, not left to its idle limit."""
    import signal as signals

    state = home / "prefect" / "local-server.json"
    try:
        pid = int(json.loads(state.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        os.kill(pid, signals.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while state.exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def main() -> None:
    if "--end-to-end" in sys.argv:
        parser = argparse.ArgumentParser(description="end-to-end rows")
        parser.add_argument("--end-to-end", action="store_true")
        parser.add_argument("--before-tree", type=Path)
        parser.add_argument("--repeats", type=int, default=3)
        parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli_latency.json")
        args = parser.parse_args()
        end_to_end(args.before_tree.resolve() if args.before_tree else None, args.repeats, args.out)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", choices=("before", "after"), required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose code runs (default: this one)")
    parser.add_argument("--commands", nargs="+", choices=list(COMMANDS), default=list(COMMANDS))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli_latency.json")
    args = parser.parse_args()
    tree = args.tree.resolve()
    if not ((tree / "nas" / "cli").is_dir() or (tree / "nas" / "cli.py").is_file()):  # the layout before issue 18 too
        raise SystemExit(f"--tree {args.tree}: no nas/cli there")
    with tempfile.TemporaryDirectory(prefix="nas-cli-latency-") as tmp:
        work = Path(tmp)
        valid = (tree / VALID).read_text(encoding="utf-8")
        (work / "broken.txt").write_text(valid.replace("8->1\n", "", 1), encoding="utf-8")
        env = {**os.environ, "NASFLOW_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
        if tree != ROOT:
            env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
        results = {}
        for name in args.commands:
            argv, expected = COMMANDS[name]
            results[name] = time_command(argv, expected, args.repeats, env, work, tree)
            print(f"{name:24s} {results[name]['median_s']:6.2f} s  (nas {' '.join(argv)})")
    report = read_json(args.out) if args.out.exists() else {}
    section = report.setdefault(args.label, {})
    section["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
    section.setdefault("commands", {}).update(results)
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""Import-time benchmark -> JSON: what starting `nas`, importing the library and collecting the tests cost.

  python benchmarks/import_time.py --label before|after [--tree DIR] [--repeat 5] [--collect-repeat 3]
                                   [--modules nas.strategies nas.cli.main] [--quick]
                                   [--out benchmarks/results/import_time.json]

Everything runs in fresh interpreters of the tree's own `.venv` (its `nas`
console script and its `python`, whose editable install must point at that
tree), from a temp directory with a private NASFLOW_HOME: `nas --help`,
`python -c "import M"` for each of --modules, and `python -m pytest
--collect-only -q` in the tree (time and number of tests). Each is timed
--repeat times (collection --collect-repeat times): median, min, max. One more
run of each under `-X importtime` (collection: a plugin reading `sys.modules` as
it ends) says which heavy packages it pulls in and what they cost, since those
decide the start-up time. The tree's git commit and the load average at start and end sit
beside the numbers: the machine is shared, so a median means little without them.
The result is merged into --out under --label, and when both `before` and
`after` exist (both full or both --quick) a `ratio` section gives after / before
per measurement.
--quick (smoke runs) times everything once and collects one small test file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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

HEAVY = ("torch", "prefect", "lightning", "pytorch_lightning", "hydra", "qdrant_client", "timm", "matplotlib")
QUICK_COLLECT = "tests/test_benchmark_smoke.py"  # small, and in every tree since the benchmarks began
COLLECT = "pytest --collect-only"
# `-p` plugin for the collection probe: which heavy packages collecting the tests has loaded.
PROBE_PLUGIN = """\
import json, os, sys

def pytest_collection_finish(session):
    heavy = json.loads(os.environ["NAS_IMPORT_PROBE_HEAVY"])
    with open(os.environ["NAS_IMPORT_PROBE_OUT"], "w", encoding="utf-8") as f:
        json.dump({"loaded": [m for m in heavy if m in sys.modules], "modules_imported": len(sys.modules)}, f)
"""


def run_checked(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {tail}")
    return proc


def timed(argv: list[str], repeats: int, env: dict[str, str], cwd: Path) -> tuple[dict, subprocess.CompletedProcess]:
    seconds, proc = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        proc = run_checked(argv, env, cwd)
        seconds.append(time.perf_counter() - start)
    assert proc is not None
    return {"median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
            "max_s": round(max(seconds), 3), "runs_s": [round(s, 3) for s in seconds], "repeats": repeats}, proc


def import_profile(stderr: str) -> dict:
    """Heavy packages in an `-X importtime` log, with the cumulative ms of their first import."""
    cumulative: dict[str, float] = {}
    modules = 0
    for line in stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if not line.startswith("import time:") or len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        modules += 1
        name = parts[2].strip()
        if name in HEAVY:
            cumulative[name] = round(int(parts[1]) / 1000, 1)
    return {"loaded": [m for m in HEAVY if m in cumulative], "heavy_import_ms": cumulative,
            "modules_imported": modules}


def git_commit(tree: Path) -> dict:
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return {"commit": head.stdout.strip() or None, "dirty": bool(dirty.stdout.strip())}


def interpreter(tree: Path) -> Path:
    """The tree's own .venv; for this checkout without one (e.g. a Docker image), the running one."""
    venv = tree / ".venv" / "bin"
    return venv if (venv / "python").is_file() or tree != ROOT else Path(sys.executable).parent


def measure(tree: Path, modules: list[str], repeat: int, collect_repeat: int, collect: list[str],
            work: Path) -> dict:
    python, nas = interpreter(tree) / "python", interpreter(tree) / "nas"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PYTHON"))}
    env |= {"NASFLOW_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    where = run_checked([str(python), "-c", "import nas; print(nas.__file__)"], env, work).stdout.strip()
    if not Path(where).resolve().is_relative_to(tree):
        raise SystemExit(f"--tree {tree}: its .venv imports nas from {where}, not from the tree")
    results: dict[str, dict] = {}
    # name -> (timed argv, the same under -X importtime: the console script is a Python file)
    targets = {"nas --help": ([str(nas), "--help"], [str(nas), "--help"])}
    targets |= {f"import {m}": ([str(python), "-c", f"import {m}"], ["-c", f"import {m}"]) for m in modules}
    for name, (argv, probe_args) in targets.items():
        results[name], _ = timed(argv, repeat, env, work)
        results[name]["argv"] = [Path(argv[0]).name, *argv[1:]]
        probe = run_checked([str(python), "-X", "importtime", *probe_args], env, work)
        results[name] |= import_profile(probe.stderr)
        print(f"{name:32s} {results[name]['median_s']:7.2f} s  loads {', '.join(results[name]['loaded']) or '-'}")
    (work / "_nas_import_probe.py").write_text(PROBE_PLUGIN, encoding="utf-8")
    probe_out = work / "collect_probe.json"
    collect_env = env | {"PYTHONPATH": str(work), "NAS_IMPORT_PROBE_HEAVY": json.dumps(HEAVY),
                         "NAS_IMPORT_PROBE_OUT": str(probe_out)}
    # no cache provider: nothing is written into the measured tree
    argv = [str(python), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *collect]
    stats, proc = timed([*argv, "-p", "_nas_import_probe"], collect_repeat, collect_env, tree)
    count = re.search(r"(\d+) tests? collected", proc.stdout)
    if count is None:
        raise SystemExit(f"{' '.join(argv)}: no 'N tests collected' line in its output")
    results[COLLECT] = stats | {"argv": ["python", *argv[1:]], "tests": int(count.group(1))} | read_json(probe_out)
    print(f"{COLLECT:32s} {stats['median_s']:7.2f} s  {count.group(1)} tests, "
          f"loads {', '.join(results[COLLECT]['loaded']) or '-'}")
    return results


def ratios(report: dict) -> dict:
    before, after = report["before"]["targets"], report["after"]["targets"]
    out = {name: round(after[name]["median_s"] / before[name]["median_s"], 3)
           for name in before if name in after and before[name]["median_s"] > 0}
    if COLLECT in before and COLLECT in after:
        out["tests_collected"] = {"before": before[COLLECT]["tests"], "after": after[COLLECT]["tests"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", choices=("before", "after"), required=True)
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout with its own .venv (default: this one)")
    parser.add_argument("--modules", nargs="+", default=["nas.strategies", "nas.cli.main"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--collect-repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run each, collect only " + QUICK_COLLECT)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "import_time.json")
    args = parser.parse_args()
    tree = args.tree.resolve()
    for exe in ("python", "nas"):
        if not (interpreter(tree) / exe).is_file():
            raise SystemExit(f"--tree {args.tree}: no {interpreter(tree) / exe}")
    if args.repeat < 1 or args.collect_repeat < 1:
        raise SystemExit(f"--repeat {args.repeat} / --collect-repeat {args.collect_repeat}: must be >= 1")
    repeat, collect_repeat = (1, 1) if args.quick else (args.repeat, args.collect_repeat)
    load_start = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="nas-import-time-") as tmp:
        targets = measure(tree, args.modules, repeat, collect_repeat, [QUICK_COLLECT] if args.quick else [], Path(tmp))
    report = read_json(args.out) if args.out.exists() else {}
    report[args.label] = {
        "tree": "working tree" if tree == ROOT else str(tree), **git_commit(tree),
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "quick": args.quick,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "load_avg_start": load_start, "load_avg_end": [round(x, 2) for x in os.getloadavg()],  # 1, 5, 15 min
        "heavy_packages": list(HEAVY), "targets": targets}
    report.pop("ratio", None)
    if "before" in report and "after" in report and report["before"]["quick"] == report["after"]["quick"]:
        report["ratio"] = ratios(report)  # after / before median; < 1 is faster (a quick run compares only to one)
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

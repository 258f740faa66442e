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
"""

from __future__ import annotations

import argparse
import os
import platform
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


def main() -> None:
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

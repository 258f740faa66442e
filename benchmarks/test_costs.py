"""What slow tests cost before and after a change -> JSON: each pytest node id runs alone in a
fresh pytest process from a checkout of --before (a git ref) and from this tree, interleaved
(before, after, before, ...) so that a loaded machine's drift hits both alike; the wall time of
the whole process is recorded (collection included, the same for both); --together runs all the
node ids in one process instead (as a CI worker would, sharing session fixtures). With --server, also the
Prefect ephemeral server's start-up on a fresh home against one seeded with tests/conftest.py's
migrated database (what the CLI tests now get).

  python benchmarks/test_costs.py --before REF [--repeats 1] [--together] [--server 3] NODEID...
                                  [--out benchmarks/results/test_costs.json]
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

SERVER_START = """
import sys, time
from tasks.env import configure_prefect_env
configure_prefect_env()
from prefect.server.api.server import SubprocessASGIServer
began = time.perf_counter()
server = SubprocessASGIServer()
server.start()
print(time.perf_counter() - began)
server.stop()
"""


def checkout(ref: str, into: Path) -> Path:
    """`ref`'s tracked files under `into` (the tests import `nas` from there, via PYTHONPATH)."""
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_test(tree: Path, nodes: list[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1", NASFLOW_HOME=tempfile.mkdtemp(prefix="test-costs-"))
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                          *nodes], cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    return {"seconds": round(time.perf_counter() - began, 1), "passed": out.returncode == 0,
            "tail": out.stdout.strip().splitlines()[-1:] if out.returncode else []}


def server_start(seed: bool) -> float:
    """Seconds for one ephemeral server to answer, on a fresh home or a seeded one."""
    home = Path(tempfile.mkdtemp(prefix="test-costs-home-"))
    if seed:
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import seed_prefect_db

        seed_prefect_db(home / "prefect")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env.update(PYTHONPATH=str(ROOT), NASFLOW_HOME=str(home))
    out = subprocess.run([sys.executable, "-c", SERVER_START], env=env, capture_output=True, text=True,
                         check=True, timeout=600)
    return round(float(out.stdout.strip().splitlines()[-1]), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("nodes", nargs="*", help="pytest node ids, relative to the repository root")
    parser.add_argument("--before", required=True, help="git ref of the old tests")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--together", action="store_true", help="all node ids in one pytest process")
    parser.add_argument("--server", type=int, default=0, help="fresh/seeded server start-up pairs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "test_costs.json")
    args = parser.parse_args()

    before = checkout(args.before, Path(tempfile.mkdtemp(prefix="test-costs-before-")))
    tests: dict[str, dict[str, list]] = {}
    for _ in range(args.repeats):
        for node in [" ".join(args.nodes)] if args.together else args.nodes:
            for label, tree in (("before", before), ("after", ROOT)):
                result = run_test(tree, node.split(" "))
                print(f"{label:6} {result['seconds']:7.1f} s {'ok' if result['passed'] else 'FAILED'} {node}",
                      flush=True)
                tests.setdefault(node, {}).setdefault(label, []).append(result)
    server: dict[str, list[float]] = {"fresh": [], "seeded": []}
    for _ in range(args.server):
        for label in ("fresh", "seeded"):
            server[label].append(server_start(label == "seeded"))
            print(f"server {label}: {server[label][-1]} s", flush=True)

    def median(runs: list[dict]) -> float:
        return statistics.median(r["seconds"] for r in runs)

    old = read_json(args.out) if args.out.is_file() else {}
    atomic_write_json(args.out, {
        "what": "wall seconds of one pytest process per node id (before: --before's tests, after: this tree), "
                "and of a Prefect ephemeral server start-up on a fresh vs a seeded home",
        "before": args.before, "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 1),
                    "python": platform.python_version()},
        "tests": {**old.get("tests", {}), **{node: {**runs, "median_before_s": median(runs["before"]), "median_after_s": median(runs["after"])}
                  for node, runs in tests.items()}},
        "server_start_s": {**server, **{f"median_{k}": statistics.median(v) for k, v in server.items() if v}}
        if args.server else old.get("server_start_s", {}),
    })
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

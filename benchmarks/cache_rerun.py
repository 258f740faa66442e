"""Cost of orchestration and value of the task cache, through the real CLI.

For a 100-trial NB201 table search it times: the first run, an identical
re-run (served from Prefect's INPUTS cache), and the same search without
Prefect (`runner=local`). Per-trial orchestration overhead is the loop time
with Prefect minus the loop time without, over trials. A second scenario adds
a simulated 50 ms evaluation cost, where the cache's value shows.
Writes benchmarks/results/cache_rerun.json.

    python benchmarks/cache_rerun.py [--trials 100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json  # noqa: E402


def nas_search(args: list[str], env: dict[str, str], run_dir: Path) -> dict:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nas.cli.main", "search", *args, "progress=false",
                    f"hydra.run.dir={run_dir}"], env=env, cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process = time.perf_counter() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"process_seconds": round(process, 3), "loop_seconds": summary["wall_seconds"],
            "cache_hits": summary["cache_hits"], "best": summary["best"]["accuracy"]}


def scenario(trials: int, cost: float, tmp: Path, env: dict[str, str]) -> dict:
    args = ["space=nb201", "evaluator=table", "strategy=rea", f"budget.trials={trials}", "seed=0",
            f"evaluator.simulated_cost_seconds={cost}"]
    tag = f"c{cost}"
    first = nas_search(args, env, tmp / f"{tag}_first")
    rerun = nas_search(args, env, tmp / f"{tag}_rerun")
    local = nas_search([*args, "runner=local"], env, tmp / f"{tag}_local")
    assert first["best"] == rerun["best"] == local["best"], "runners disagree"
    return {
        "simulated_cost_seconds": cost, "first": first, "rerun": rerun, "local": local,
        "rerun_over_first_loop": round(rerun["loop_seconds"] / first["loop_seconds"], 4),
        "rerun_over_first_process": round(rerun["process_seconds"] / first["process_seconds"], 4),
        "orchestration_overhead_ms_per_trial": round(
            1000 * (first["loop_seconds"] - local["loop_seconds"]) / trials, 2),
        "replay_ms_per_trial": round(1000 * rerun["loop_seconds"] / trials, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cache_rerun.json")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["NASFLOW_HOME"] = str(Path(tmp) / "home")
        for cost in (0.0, 0.05):
            r = scenario(args.trials, cost, Path(tmp), env)
            results.append(r)
            print(f"cost {cost:.2f}s: first loop {r['first']['loop_seconds']:.2f}s, "
                  f"re-run loop {r['rerun']['loop_seconds']:.2f}s (ratio {r['rerun_over_first_loop']:.3f}), "
                  f"local loop {r['local']['loop_seconds']:.2f}s, overhead "
                  f"{r['orchestration_overhead_ms_per_trial']:.1f} ms/trial")
    atomic_write_json(args.out, {"benchmark": "cache_rerun", "trials": args.trials,
                                 "cpu_count": os.cpu_count(), "scenarios": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""What a worker killed mid-evaluation costs on a cluster executor (Dask, Ray).

For each engine, a local cluster of 2 CPU workers evaluates N NB201 cells from the table,
each with a simulated cost (a sleep standing for training), through the flow's executor
(`open_executor`, the `AsyncExecutor` path): once undisturbed, once with one worker
killed (SIGKILL) while it evaluates. It records the wall time of each, the extra time the
kill cost, and that every candidate came back exactly once with the table's accuracy.
The load average is recorded: on a busy machine the times are upper bounds.
Writes benchmarks/results/cluster_recovery.json (+ .md).

    python benchmarks/cluster_recovery.py            # N=8, 2 s per evaluation (~3 min on 2 idle cores)
    python benchmarks/cluster_recovery.py --quick    # N=4, 1 s: proves it works
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(engine: str, n: int, cost: float, kill: bool) -> dict[str, Any]:
    import numpy as np
    import psutil
    from prefect import flow

    from flows.placement import open_executor
    from flows.task_runners import build_task_runner, shared_api
    from nas.core.trial import Candidate
    from nas.search.spec import Component, SearchSpec

    spec = SearchSpec(Component("nb201"), Component("random"),
                      Component("table", {"simulated_cost_seconds": cost}), seed=0, trials=n)
    evaluator = spec.build_evaluator(spec.build_space())
    # Cells no other run of this process evaluated: none is served from the shared cache.
    rng, cells = np.random.default_rng([ord(engine[0]), kill, n]), {}
    while len(cells) < n:
        arch = spec.build_space().sample(rng)
        cells[arch.key()] = Candidate(arch)
    cands = list(cells.values())
    runner = {"name": engine, "n_workers": 2, "num_cpus": 2, "object_store_mb": 80, "max_retries": 2}

    def evaluating_pid() -> int | None:
        """A Ray worker running an evaluation (named after the task)."""
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if cmd and cmd[0].startswith("ray::evaluate"):
                return proc.pid
        return None

    def busy_dask_pid() -> int | None:
        from prefect.context import FlowRunContext

        client = FlowRunContext.get().task_runner.client  # type: ignore[union-attr]
        busy = [a for a, keys in client.processing().items() if keys]
        return client.run(os.getpid, workers=busy[:1])[busy[0]] if busy else None

    @flow(name=f"cluster-recovery-{engine}", persist_result=False, validate_parameters=False)
    def body() -> dict[str, Any]:
        executor = open_executor(runner, spec, evaluator, retries=0)
        start = time.perf_counter()
        for ticket, cand in enumerate(cands):
            executor.submit(ticket, cand)
        if kill:
            victim = None
            while victim is None:
                time.sleep(0.2)
                victim = busy_dask_pid() if engine == "dask" else evaluating_pid()
            os.kill(victim, 9)
        done = [executor.next_done() for _ in cands]
        wall = time.perf_counter() - start
        tickets = sorted(t for t, _ in done)
        correct = all(r.ok and r.accuracy == evaluator.table.score(cands[t].arch) for t, (r, _, _) in done)
        return {"wall_seconds": round(wall, 2), "all_back_once": tickets == list(range(n)), "correct": correct,
                "cache_hits": sum(cached for _, (_, cached, _) in done)}

    with shared_api(runner):
        return body.with_options(task_runner=build_task_runner(runner, gpus=[]))()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--engines", default="dask,ray")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cluster_recovery.json")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="nasflow-cluster-recovery-")  # a cache of its own, removed at the end
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    os.environ["NASFLOW_HOME"] = home
    from tasks.env import configure_prefect_env

    configure_prefect_env()
    from nas.io import atomic_write_json, atomic_write_text

    n, cost = (4, 1.0) if args.quick else (8, 2.0)
    out: dict[str, Any] = {"quick": args.quick, "candidates": n, "cost_seconds": cost, "workers": 2,
                           "load_avg_start": [round(x, 2) for x in os.getloadavg()], "engines": {}}
    for engine in args.engines.split(","):
        calm, killed = run(engine, n, cost, kill=False), run(engine, n, cost, kill=True)
        out["engines"][engine] = {"undisturbed": calm, "one_worker_killed": killed,
                                  "kill_cost_seconds": round(killed["wall_seconds"] - calm["wall_seconds"], 2)}
    out["load_avg_end"] = [round(x, 2) for x in os.getloadavg()]
    atomic_write_json(args.out, out)
    rows = [f"| {e} | {r['undisturbed']['wall_seconds']} | {r['one_worker_killed']['wall_seconds']} | "
            f"{r['kill_cost_seconds']} | {r['one_worker_killed']['all_back_once'] and r['one_worker_killed']['correct']} |"
            for e, r in out["engines"].items()]
    atomic_write_text(args.out.with_suffix(".md"), "\n".join([
        f"# Cluster recovery: {n} evaluations of {cost} s on 2 workers (load {out['load_avg_start'][0]})", "",
        "| engine | undisturbed (s) | one worker killed (s) | kill cost (s) | all back once, correct |",
        "| --- | --- | --- | --- | --- |", *rows, ""]))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()

"""What Prefect orchestration costs and what scale-out buys, through the real CLI.

1. Per-task overhead and the cached re-run: a 100-trial NB201 table search
   with Prefect (first run, identical re-run from the INPUTS cache) against
   `runner=local`, with no evaluation cost and with a simulated 50 ms one
   (the scenarios of benchmarks/cache_rerun.py).
2. Server-backed against ephemeral: the same search with PREFECT_API_URL
   pointing at a real `prefect server start` on a free loopback port, and
   with the ephemeral server each `nas search` starts for itself.
3. Dask: throughput of parallel cheap evaluations (a batch of candidates per
   step, each a simulated 0.25 s evaluation — a sleep, standing for an
   evaluation that waits on a GPU or a remote service) on a local Dask
   cluster of 1, 2 and 4 workers, against the thread runner. Each worker
   builds the evaluator once (the NB201 table loads in seconds), so the
   steady-state rate counts the batches after the first.
Writes benchmarks/results/orchestration.json (+ .md, and .png: Dask throughput).

    python benchmarks/orchestration.py            # ~5 min on 2 cores
    python benchmarks/orchestration.py --quick    # fewer trials: proves it works
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cache_rerun import nas_search, scenario  # noqa: E402

from nas.core.trial import TrialRecord, read_history  # noqa: E402
from nas.io import atomic_write_json, atomic_write_text  # noqa: E402

TABLE = ["space=nb201", "evaluator=table", "strategy=rea", "seed=0"]


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["NASFLOW_HOME"] = str(home)
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "300"
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    """A real `prefect server start` on loopback, in its own process group."""

    def __init__(self, home: Path) -> None:
        self.port = free_port()
        self.env = clean_env(home)
        (home / "prefect").mkdir(parents=True, exist_ok=True)  # Prefect's sqlite cannot create its folder
        self.env.update({"PREFECT_HOME": str(home / "prefect"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.log = home / "server.log"

    def __enter__(self) -> "PrefectServer":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=self.env, stdout=self.log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        start = time.perf_counter()
        while time.perf_counter() - start < 300:
            if self.proc.poll() is not None:
                tail = self.log.read_text().strip().splitlines()[-1:]
                raise RuntimeError(f"prefect server exited with {self.proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        self.startup_seconds = time.perf_counter() - start
                        return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("prefect server did not become healthy in 300 s")

    def __exit__(self, *exc) -> None:
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()


def server_vs_ephemeral(trials: int, tmp: Path) -> dict[str, Any]:
    args = [*TABLE, f"budget.trials={trials}"]
    ephemeral = nas_search(args, clean_env(tmp / "eph_home"), tmp / "eph_run")
    with PrefectServer(tmp / "srv_home") as server:
        env = clean_env(tmp / "srv_client_home")
        env["PREFECT_API_URL"] = server.url
        served = nas_search(args, env, tmp / "srv_run")
        startup = server.startup_seconds
    assert served["best"] == ephemeral["best"], "server-backed and ephemeral runs disagree"
    return {"trials": trials, "ephemeral": ephemeral, "server": served,
            "server_startup_seconds": round(startup, 2),
            "server_over_ephemeral_loop": round(served["loop_seconds"] / ephemeral["loop_seconds"], 3),
            "server_over_ephemeral_process": round(served["process_seconds"] / ephemeral["process_seconds"], 3)}


def dask_throughput(trials: int, batch: int, cost: float, workers: list[int], tmp: Path) -> dict[str, Any]:
    args = [*TABLE, f"budget.trials={trials}", f"budget.batch_size={batch}",
            f"evaluator.simulated_cost_seconds={cost}"]
    rows = []
    for runner, n in [("prefect", max(workers)), *[("dask", n) for n in workers]]:
        tag = f"{runner}{n}"
        extra = [f"runner.workers={n}"] if runner == "prefect" else ["runner=dask", f"runner.n_workers={n}"]
        r = nas_search([*args, *extra], clean_env(tmp / f"{tag}_home"), tmp / f"{tag}_run")
        r.update(runner=runner, workers=n, evals_per_second=round(trials / r["loop_seconds"], 3),
                 steady_evals_per_second=steady_rate(read_history(tmp / f"{tag}_run" / "history.jsonl"), batch))
        rows.append(r)
        print(f"  {runner} x{n}: {r['steady_evals_per_second']:.2f} evaluations/s after the first batch, "
              f"{r['evals_per_second']:.2f} overall (loop {r['loop_seconds']:.1f} s)", flush=True)
    one = next(r for r in rows if r["runner"] == "dask" and r["workers"] == 1)
    for r in rows:
        r["speedup_vs_one_dask_worker"] = round(r["steady_evals_per_second"] / one["steady_evals_per_second"], 3)
    assert len({r["best"] for r in rows}) == 1, "runners disagree on the best architecture"
    return {"trials": trials, "batch_size": batch, "simulated_cost_seconds": cost,
            "ideal_evals_per_second_per_worker": round(1 / cost, 3), "runs": rows}


def steady_rate(history: list[TrialRecord], batch: int) -> float:
    """Evaluations per second over the batches after the first (a record's wall
    time runs from its batch's submission to its result, so a batch takes its maximum)."""
    batches = [history[i:i + batch] for i in range(batch, len(history), batch)]
    return round(sum(map(len, batches)) / sum(max(r.wall_seconds for r in b) for b in batches), 3)


def plot(res: dict[str, Any], path: Path) -> None:
    """Evaluations per second by runner and workers, against the ideal (workers / cost)."""
    from nas.report import _pyplot, save_figure

    plt = _pyplot()
    runs = res["dask"]["runs"]
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [f"{'threads' if r['runner'] == 'prefect' else r['runner']}\n×{r['workers']}" for r in runs]
    ax.bar(labels, [r["steady_evals_per_second"] for r in runs], color="tab:blue", label="measured")
    ideal = [r["workers"] * res["dask"]["ideal_evals_per_second_per_worker"] for r in runs]
    ax.plot(labels, ideal, "k_", markersize=30, label="ideal (workers / cost)")
    ax.set_ylabel("evaluations / s (after the first batch)")
    ax.set_title(f"{res['dask']['simulated_cost_seconds']} s evaluations, batches of {res['dask']['batch_size']}")
    ax.legend(loc="upper right")
    save_figure(fig, path)


def markdown(res: dict[str, Any]) -> str:
    lines = ["| scenario | value |", "|---|---|"]
    for s in res["overhead_and_cache"]:
        c = s["simulated_cost_seconds"]
        lines += [f"| Prefect overhead per trial (cost {c} s) | {s['orchestration_overhead_ms_per_trial']} ms |",
                  f"| cached re-run / first run, loop (cost {c} s) | {s['rerun_over_first_loop']} |",
                  f"| cached re-run / first run, process (cost {c} s) | {s['rerun_over_first_process']} |"]
    sv = res["server_vs_ephemeral"]
    lines += [f"| server-backed / ephemeral, loop | {sv['server_over_ephemeral_loop']} |",
              f"| server-backed / ephemeral, process | {sv['server_over_ephemeral_process']} |",
              f"| prefect server start-up | {sv['server_startup_seconds']} s |"]
    for r in res["dask"]["runs"]:
        lines.append(f"| {'threads' if r['runner'] == 'prefect' else r['runner']} × {r['workers']} workers: evaluations/s after the first batch "
                     f"(speed-up vs 1 Dask worker) | {r['steady_evals_per_second']} "
                     f"({r['speedup_vs_one_dask_worker']}×) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer trials")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "orchestration.json")
    args = ap.parse_args()
    trials = 30 if args.quick else 100
    dask_trials = 16 if args.quick else 64
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        overhead = []
        for cost in (0.0, 0.05):
            s = scenario(trials, cost, tmp / f"cache{cost}", clean_env(tmp / f"cache{cost}_home"))
            overhead.append(s)
            print(f"cost {cost:.2f}s: overhead {s['orchestration_overhead_ms_per_trial']:.1f} ms/trial, "
                  f"re-run/first loop {s['rerun_over_first_loop']:.3f}", flush=True)
        server = server_vs_ephemeral(trials, tmp)
        print(f"server/ephemeral loop {server['server_over_ephemeral_loop']:.3f}, "
              f"process {server['server_over_ephemeral_process']:.3f}", flush=True)
        dask = dask_throughput(dask_trials, 8, 0.25, [1, 2, 4], tmp)
    res = {"benchmark": "orchestration", "cpu_count": os.cpu_count(), "quick": args.quick,
           "overhead_and_cache": overhead, "server_vs_ephemeral": server, "dask": dask,
           "command": " ".join(["python benchmarks/orchestration.py", *sys.argv[1:]]),
           "wall_seconds": round(time.perf_counter() - start, 1)}
    atomic_write_json(args.out, res)
    atomic_write_text(args.out.with_suffix(".md"), markdown(res))
    plot(res, args.out.with_suffix(".png"))
    print(f"wrote {args.out} (+ .md, .png)")


if __name__ == "__main__":
    main()

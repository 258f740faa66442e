"""Scale-out (issue 21): batch vs asynchronous (`budget.in_flight`) search on 1, 2, 4, 8 workers.

Throughput: REA on the NB201 table with evaluator=simulated (heavy-tailed lognormal training
times, deterministic per architecture), time-scaled so a simulated hour of training takes
`--median` real seconds at the median; worker utilisation (seconds of training slept / (workers x
search wall time)) is scale-free, trials/hour is in simulated time. Each engine (ENGINES: "local"
worker pool, local "dask" and "ray" clusters driven by a Prefect flow as `nas search runner=dask`
does) runs both modes; dask and ray run async once more at `--long-median`, where their per-task
overhead weighs less. "clock" replays the same searches on the simulated clock: no overhead, the ideal.

Quality: REA at equal trials, batch (batch_size=W) vs async (in_flight=W) on the simulated clock,
20 seeds, paired Wilcoxon signed-rank over seeds of the best table accuracy: async must not be worse.

    python benchmarks/scale_out.py            # 1,2,4,8 workers; 20 seeds x 150 trials: ~16 min on 2 loaded cores
    python benchmarks/scale_out.py --quick    # 1,2 workers; 3 seeds: proves it runs

Writes benchmarks/results/scale_out.json (+ .md table, .png)."""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import wilcoxon

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.core.trial import Candidate, read_history  # noqa: E402
from nas.evaluators.simulated import SimulatedClock, SimulatedEvaluator  # noqa: E402
from nas.io import atomic_write_json, atomic_write_text  # noqa: E402
from nas.pool import WorkerPool  # noqa: E402
from nas.search.loop import SearchLoop  # noqa: E402
from nas.search.slots import assign_slots  # noqa: E402
from nas.search.spec import Component, SearchSpec  # noqa: E402
from tasks.env import configure_prefect_env  # noqa: E402

HOUR = 3600.0  # simulated median training time (seconds)
SIGMA = 1.0    # lognormal spread of training times
REA = {"population_size": 20, "sample_size": 5}
Rows = list[dict[str, Any]]


def local_pool(spec: SearchSpec, workers: int, body: Callable[[Any], Rows]) -> Rows:
    pool = WorkerPool(spec.to_dict(), assign_slots([], workers=workers))
    try:
        return body(pool)
    finally:
        pool.close()


def clock(spec: SearchSpec, workers: int, body: Callable[[Any], Rows]) -> Rows:
    evaluator = spec.build_evaluator(spec.build_space())
    assert isinstance(evaluator, SimulatedEvaluator)
    return body(SimulatedClock(evaluator, workers))


def cluster(name: str) -> Callable[[SearchSpec, int, Callable[[Any], Rows]], Rows]:
    """A local Dask cluster (`workers` one-thread worker processes) or a local Ray (`workers`
    logical CPUs), driven as `nas search runner=dask|ray` does: a Prefect flow whose executor is
    `open_executor`'s. Every evaluation is run, never read from Prefect's cache (batch and async
    draw the same cells)."""

    def engine(spec: SearchSpec, workers: int, body: Callable[[Any], Rows]) -> Rows:
        from prefect import flow

        from flows.placement import open_executor
        from flows.task_runners import build_task_runner, shared_api

        runner = {"name": name, "n_workers": workers, "threads_per_worker": 1, "num_cpus": workers,
                  "object_store_mb": 80, "max_retries": 2}

        @flow(name=f"scale-out-{name}", persist_result=False, validate_parameters=False)
        def on_cluster() -> Rows:
            executor = open_executor(runner, spec, spec.build_evaluator(spec.build_space()), retries=0, cached=False)
            return body(executor)

        with shared_api(runner):
            rows: Rows = on_cluster.with_options(task_runner=build_task_runner(runner, gpus=[]))()
            return rows

    return engine


# name -> engine(spec, workers, body): opens an executor (AsyncExecutor and batch Executor) on
# `workers` workers, returns body(executor), and closes it.
ENGINES: dict[str, Callable[[SearchSpec, int, Callable[[Any], Rows]], Rows]] = {
    "local": local_pool, "clock": clock, "dask": cluster("dask"), "ray": cluster("ray")}


class Timed:
    """Wraps an executor and timestamps what the loop does with it (on the loop's clock), so
    utilisation can also be read over the steady state: until the last candidate was handed out,
    before the final drain where workers idle because the budget is spent. Busy time is the
    training each evaluation slept (`cost_seconds` x `scale`), not the dispatch around it."""

    def __init__(self, inner: Any, now: Callable[[], float], scale: float) -> None:
        self.inner, self.now, self.scale = inner, now, scale
        self.spans: dict[int, list[float]] = {}  # ticket -> [submitted, done, training seconds]
        self.batches: list[tuple[float, float, float]] = []  # (start, end, summed training seconds)

    def submit(self, ticket: int, candidate: Any) -> None:
        self.spans[ticket] = [self.now()]
        self.inner.submit(ticket, candidate)

    def next_done(self) -> Any:
        ticket, outcome = self.inner.next_done()
        self.spans[ticket] += [self.now(), outcome[0].cost_seconds * self.scale]
        return ticket, outcome

    def evaluate(self, candidates: list[Any]) -> Any:
        start = self.now()
        out = self.inner.evaluate(candidates)
        self.batches.append((start, self.now(), sum(r.cost_seconds for r, _, _ in out) * self.scale))
        return out

    def close(self) -> None:
        """The loop does not close executors; the engine closes the inner one."""

    def steady_utilisation(self, workers: int) -> float:
        if self.spans:  # each span counts its overlap with [t0, t1] times its training share
            spans = list(self.spans.values())
            t0, t1 = min(s for s, _, _ in spans), max(s for s, _, _ in spans)
            busy = sum(max(0.0, min(e, t1) - max(s, t0)) * min(1.0, d / (e - s)) for s, e, d in spans if e > s)
        else:  # batch: every batch before the last, each from its start to the next one's
            t0, t1 = self.batches[0][0], self.batches[-1][0]
            busy = sum(b for _, _, b in self.batches[:-1])
        return busy / (workers * (t1 - t0)) if t1 > t0 else 1.0


def spec_for(mode: str, workers: int, trials: int, seed: int, time_scale: float) -> SearchSpec:
    evaluator = Component("simulated", {"median_seconds": HOUR, "sigma": SIGMA, "time_scale": time_scale,
                                        "seed": seed})
    return SearchSpec(space=Component("nb201"), strategy=Component("rea", REA), evaluator=evaluator, seed=seed,
                      trials=trials, batch_size=workers if mode == "batch" else 1,
                      in_flight=workers if mode == "async" else 1)


def search(spec: SearchSpec, executor: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory() as tmp:
        summary = SearchLoop(spec, Path(tmp), executor, progress=False, runner="bench").run_search()
        return summary, [r.to_json() for r in read_history(Path(tmp) / "history.jsonl")]


def throughput(engine: str, workers_list: list[int], per_worker: int, median: float,
               modes: tuple[str, ...] = ("batch", "async")) -> Rows:
    time_scale = median / HOUR
    rows: Rows = []
    for workers in workers_list:
        trials = per_worker * workers
        rows += ENGINES[engine](spec_for("async", workers, trials, 0, time_scale), workers,
                                lambda executor, w=workers, t=trials: measure(engine, executor, w, t, median, modes))
    return rows


def measure(engine: str, executor: Any, workers: int, trials: int, median: float, modes: tuple[str, ...]) -> Rows:
    """Batch then async on one executor. First one candidate per worker, unmeasured, so worker
    start-up (imports, loading the NB201 table) counts against neither mode."""
    simulated, time_scale = isinstance(executor, SimulatedClock), median / HOUR
    spec = spec_for("async", workers, trials, 0, time_scale)
    space = spec.build_space()
    rng = np.random.default_rng(12345)
    executor.evaluate([Candidate(space.sample(rng)) for _ in range(workers)])
    rows = []
    for mode in modes:
        spec = spec_for(mode, workers, trials, 0, time_scale)
        scale = 1.0 if simulated else time_scale
        timed = Timed(executor, (lambda e=executor: e.now) if simulated else time.perf_counter, scale)
        start = timed.now()
        summary, history = search(spec, timed)
        wall = timed.now() - start
        busy = sum(r["cost_seconds"] for r in history) * scale
        rows.append({"engine": engine, "mode": mode, "workers": workers, "trials": summary["trials"],
                     "real_seconds_per_simulated_hour": median,
                     "wall_seconds": round(wall, 3), "busy_seconds": round(busy, 3),
                     "utilisation": round(busy / (workers * wall), 4),
                     "steady_utilisation": round(timed.steady_utilisation(workers), 4),
                     "trials_per_hour": round(summary["trials"] / (wall / scale) * HOUR, 3),
                     "best": summary["best"]["accuracy"]})
        print(f"{engine:6s} {mode:5s} x{workers}: utilisation {rows[-1]['utilisation']:.1%} "
              f"(steady {rows[-1]['steady_utilisation']:.1%}), "
              f"{rows[-1]['trials_per_hour']:.2f} trials/h (simulated), {wall:.1f}s", flush=True)
    return rows


def quality(seeds: int, trials: int, workers: int) -> dict[str, Any]:
    """Best accuracy after `trials`, batch vs async, same seed = same durations and same start."""
    best: dict[str, list[float]] = {"batch": [], "async": []}
    sim_hours: dict[str, list[float]] = {"batch": [], "async": []}
    for seed in range(seeds):
        for mode in best:
            spec = spec_for(mode, workers, trials, seed, 1.0)
            evaluator = spec.build_evaluator(spec.build_space())
            assert isinstance(evaluator, SimulatedEvaluator)
            executor = SimulatedClock(evaluator, workers)
            summary, _ = search(spec, executor)
            best[mode].append(summary["best"]["accuracy"])
            sim_hours[mode].append(executor.now / HOUR)
    x, y = np.array(best["async"]), np.array(best["batch"])
    diff = x - y
    test = wilcoxon(x, y, alternative="less") if np.any(diff != 0) else None  # H1: async worse
    p = None if test is None else float(test.pvalue)
    return {
        "strategy": "rea", "params": REA, "trials": trials, "workers": workers, "seeds": seeds,
        "best": {m: {"mean": round(float(np.mean(v)), 4), "std": round(float(np.std(v)), 4), "per_seed": v}
                 for m, v in best.items()},
        "simulated_hours": {m: round(float(np.mean(v)), 2) for m, v in sim_hours.items()},
        "async_minus_batch": {"mean_diff": round(float(diff.mean()), 4), "wins": int((diff > 0).sum()),
                              "ties": int((diff == 0).sum()), "losses": int((diff < 0).sum()),
                              "p_async_worse": None if p is None else round(p, 6)},
        "async_not_worse": p is None or p >= 0.05,
    }


def markdown(rows: list[dict[str, Any]], q: dict[str, Any], median: float) -> str:
    out = [f"Simulated training times: lognormal, median 1 h (sigma {SIGMA}), run at {median} s per simulated hour "
           "(s / h: where a row differs).", "",
           "| engine | mode | workers | s / h | trials | utilisation | steady state | trials / hour | wall (s) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['engine']} | {r['mode']} | {r['workers']} | {r['real_seconds_per_simulated_hour']} | "
                   f"{r['trials']} | {r['utilisation']:.1%} | {r['steady_utilisation']:.1%} | "
                   f"{r['trials_per_hour']:.2f} | {r['wall_seconds']:.1f} |")
    d = q["async_minus_batch"]
    out += ["", "Utilisation: training seconds slept / (workers x wall); steady state: until the last candidate was "
                "handed out (then workers idle as the budget drains). clock: simulated clock, no overhead "
                "(wall in simulated seconds). dask, ray: each evaluation is a Prefect task run (state reports to the "
                "run's API server), whose overhead is a larger share of short evaluations.", "", f"REA quality at {q['trials']} trials, {q['workers']} workers, {q['seeds']} seeds (simulated clock):",
            "", "| mode | best (mean ± std) | simulated hours |", "|---|---|---|"]
    for m in ("batch", "async"):
        out.append(f"| {m} | {q['best'][m]['mean']:.2f} ± {q['best'][m]['std']:.2f} | {q['simulated_hours'][m]} |")
    out += ["", f"async − batch: {d['mean_diff']:+.3f} (wins/ties/losses {d['wins']}/{d['ties']}/{d['losses']}), "
                f"Wilcoxon p(async worse) = {d['p_async_worse']}: "
                f"{'not worse' if q['async_not_worse'] else 'WORSE'}", ""]
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], q: dict[str, Any], median: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for engine in sorted({r["engine"] for r in rows}):
        for mode, style in (("batch", "--"), ("async", "-")):
            pts = [(r["workers"], r["utilisation"]) for r in rows if r["engine"] == engine and r["mode"] == mode
                   and r["real_seconds_per_simulated_hour"] == median]
            if pts:
                left.plot(*zip(*pts), style, marker="o", label=f"{engine} {mode}")
    left.axhline(0.95, color="grey", lw=0.8)
    left.set(xlabel="workers", ylabel="worker utilisation", ylim=(0, 1.05), xscale="log", xticks=[1, 2, 4, 8],
             xticklabels=["1", "2", "4", "8"], title="Utilisation")
    left.legend()
    b, a = q["best"]["batch"]["per_seed"], q["best"]["async"]["per_seed"]
    right.scatter(b, a)
    lo, hi = min(b + a), max(b + a)
    right.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    right.set(xlabel="batch best (%)", ylabel="async best (%)",
              title=f"REA at {q['trials']} trials, {q['workers']} workers, per seed")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1, 2 workers; 3 seeds x 40 trials")
    ap.add_argument("--median", type=float, default=1.0, help="real seconds per simulated hour")
    ap.add_argument("--per-worker", type=int, default=8, help="trials per worker in the throughput runs")
    ap.add_argument("--engines", default="local,dask,ray,clock")
    ap.add_argument("--long-median", type=float, default=4.0,
                    help="dask, ray: async at the most workers again, with evaluations this much longer")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale_out.json")
    args = ap.parse_args()
    workers = [1, 2] if args.quick else [1, 2, 4, 8]
    seeds, trials = (3, 40) if args.quick else (20, 150)
    median = 0.1 if args.quick else args.median
    per_worker = 4 if args.quick else args.per_worker
    if {"dask", "ray"} & set(args.engines.split(",")):  # Prefect's home and cache of its own, removed at the end
        home = tempfile.mkdtemp(prefix="nasflow-scale-out-")
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        os.environ["NASFLOW_HOME"] = home
        configure_prefect_env()
    logging.getLogger("nas.search.loop").setLevel(logging.ERROR)  # REA's small-budget note, per run
    start, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    engines = args.engines.split(",")
    rows = [row for engine in engines for row in throughput(engine, workers, per_worker, median)]
    rows += [row for engine in engines if engine in ("dask", "ray") and not args.quick
             for row in throughput(engine, [max(workers)], per_worker // 2, args.long_median, ("async",))]
    q = quality(seeds, trials, max(workers))
    payload = {"benchmark": "scale_out", "quick": args.quick,
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg_start": load_start,
                           "load_avg_end": [round(x, 2) for x in os.getloadavg()]},
               "per_worker_trials": per_worker, "median_real_seconds_per_simulated_hour": median,
               "sigma": SIGMA, "throughput": rows, "quality": q,
               "async_utilisation_goal": 0.95,
               "async_steady_utilisation_met": {f"{e} at {m} s/h": min(
                   r["steady_utilisation"] for r in rows if (r["engine"], r["mode"], r["real_seconds_per_simulated_hour"])
                   == (e, "async", m)) >= 0.95 for e, m in sorted({(r["engine"], r["real_seconds_per_simulated_hour"])
                                                                    for r in rows})},
               "seconds": round(time.perf_counter() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, payload)
    atomic_write_text(args.out.with_suffix(".md"), markdown(rows, q, median))
    plot(rows, q, median, args.out.with_suffix(".png"))
    print(f"wrote {args.out} (+ .md, .png)")


if __name__ == "__main__":
    main()

"""Scale-out (issue 21): batch vs asynchronous (`budget.in_flight`) search on 1, 2, 4, 8 workers.

Throughput: REA on the NB201 table with evaluator=simulated (heavy-tailed lognormal training
times, deterministic per architecture), time-scaled so a simulated hour of training takes
`--median` real seconds at the median; worker utilisation (evaluation seconds the workers report
/ (workers x search wall time)) is scale-free, trials/hour is in simulated time. Each engine
(ENGINES: name -> factory of an executor on n workers) runs both modes; the lead adds Dask/Ray rows
there. "clock" replays the same searches on the simulated clock: no overhead, the ideal.

Quality: REA at equal trials, batch (batch_size=W) vs async (in_flight=W) on the simulated clock,
20 seeds, paired Wilcoxon signed-rank over seeds of the best table accuracy: async must not be worse.

    python benchmarks/scale_out.py            # 1,2,4,8 workers; 20 seeds x 150 trials: a few minutes
    python benchmarks/scale_out.py --quick    # 1,2 workers; 3 seeds: proves it runs

Writes benchmarks/results/scale_out.json (+ .md table, .png)."""

from __future__ import annotations

import argparse
import logging
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

from nas.evaluators.simulated import SimulatedClock, SimulatedEvaluator  # noqa: E402
from nas.io import atomic_write_json, atomic_write_text  # noqa: E402
from nas.pool import WorkerPool  # noqa: E402
from nas.search.loop import SearchLoop  # noqa: E402
from nas.search.record import read_history  # noqa: E402
from nas.search.slots import assign_slots  # noqa: E402
from nas.search.spec import Component, SearchSpec  # noqa: E402

HOUR = 3600.0  # simulated median training time (seconds)
SIGMA = 1.0    # lognormal spread of training times
REA = {"population_size": 20, "sample_size": 5}


def local_pool(spec: SearchSpec, workers: int) -> WorkerPool:
    return WorkerPool(spec.to_dict(), assign_slots([], workers=workers))


def clock(spec: SearchSpec, workers: int) -> SimulatedClock:
    evaluator = spec.build_evaluator(spec.build_space())
    assert isinstance(evaluator, SimulatedEvaluator)
    return SimulatedClock(evaluator, workers)


# name -> factory(spec, workers) of an executor (AsyncExecutor and batch Executor) with close().
ENGINES: dict[str, Callable[[SearchSpec, int], Any]] = {"local": local_pool, "clock": clock}


class Timed:
    """Wraps an executor and timestamps what the loop does with it (on the loop's clock), so
    utilisation can also be read over the steady state: until the last candidate was handed out,
    before the final drain where workers idle because the budget is spent."""

    def __init__(self, inner: Any, now: Callable[[], float]) -> None:
        self.inner, self.now = inner, now
        self.spans: dict[int, list[float]] = {}  # ticket -> [submitted, done]
        self.batches: list[tuple[float, float, float]] = []  # (start, end, summed evaluation seconds)

    def submit(self, ticket: int, candidate: Any) -> None:
        self.spans[ticket] = [self.now()]
        self.inner.submit(ticket, candidate)

    def next_done(self) -> Any:
        ticket, outcome = self.inner.next_done()
        self.spans[ticket].append(self.now())
        return ticket, outcome

    def evaluate(self, candidates: list[Any]) -> Any:
        start = self.now()
        out = self.inner.evaluate(candidates)
        self.batches.append((start, self.now(), sum(wall for _, _, wall in out)))
        return out

    def close(self) -> None:
        """The loop does not close executors; `throughput` closes the inner one."""

    def steady_utilisation(self, workers: int) -> float:
        if self.spans:
            spans = list(self.spans.values())
            t0, t1 = min(s for s, _ in spans), max(s for s, _ in spans)
            busy = sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in spans)
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


def throughput(engine: str, workers_list: list[int], per_worker: int, median: float) -> list[dict[str, Any]]:
    time_scale = median / HOUR
    rows = []
    for workers in workers_list:
        trials = per_worker * workers
        executor = ENGINES[engine](spec_for("async", workers, trials, 0, time_scale), workers)
        try:
            for mode in ("batch", "async"):
                spec = spec_for(mode, workers, trials, 0, time_scale)
                if isinstance(executor, SimulatedClock):
                    executor = ENGINES[engine](spec, workers)  # a fresh clock: time starts at 0
                simulated = isinstance(executor, SimulatedClock)
                timed = Timed(executor, (lambda e=executor: e.now) if simulated else time.perf_counter)
                start = timed.now()
                summary, history = search(spec, timed)
                wall = timed.now() - start
                busy = sum(r["cost_seconds"] if simulated else r["wall_seconds"] for r in history)
                scale = 1.0 if simulated else time_scale
                rows.append({"engine": engine, "mode": mode, "workers": workers, "trials": summary["trials"],
                             "wall_seconds": round(wall, 3), "busy_seconds": round(busy, 3),
                             "utilisation": round(busy / (workers * wall), 4),
                             "steady_utilisation": round(timed.steady_utilisation(workers), 4),
                             "trials_per_hour": round(summary["trials"] / (wall / scale) * HOUR, 3),
                             "best": summary["best"]["accuracy"]})
                print(f"{engine:6s} {mode:5s} x{workers}: utilisation {rows[-1]['utilisation']:.1%} "
                      f"(steady {rows[-1]['steady_utilisation']:.1%}), "
                      f"{rows[-1]['trials_per_hour']:.2f} trials/h (simulated), {wall:.1f}s", flush=True)
        finally:
            executor.close()
    return rows


def quality(seeds: int, trials: int, workers: int) -> dict[str, Any]:
    """Best accuracy after `trials`, batch vs async, same seed = same durations and same start."""
    best: dict[str, list[float]] = {"batch": [], "async": []}
    sim_hours: dict[str, list[float]] = {"batch": [], "async": []}
    for seed in range(seeds):
        for mode in best:
            spec = spec_for(mode, workers, trials, seed, 1.0)
            executor = clock(spec, workers)
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
    out = [f"Simulated training times: lognormal, median 1 h (sigma {SIGMA}), run at {median} s per simulated hour.",
           "", "| engine | mode | workers | trials | utilisation | steady state | trials / hour | wall (s) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['engine']} | {r['mode']} | {r['workers']} | {r['trials']} | {r['utilisation']:.1%} | "
                   f"{r['steady_utilisation']:.1%} | {r['trials_per_hour']:.2f} | {r['wall_seconds']:.1f} |")
    d = q["async_minus_batch"]
    out += ["", "Utilisation: evaluation seconds / (workers x wall); steady state: until the last candidate was "
                "handed out (then workers idle as the budget drains). clock: simulated clock, no overhead "
                "(wall in simulated seconds).", "", f"REA quality at {q['trials']} trials, {q['workers']} workers, {q['seeds']} seeds (simulated clock):",
            "", "| mode | best (mean ± std) | simulated hours |", "|---|---|---|"]
    for m in ("batch", "async"):
        out.append(f"| {m} | {q['best'][m]['mean']:.2f} ± {q['best'][m]['std']:.2f} | {q['simulated_hours'][m]} |")
    out += ["", f"async − batch: {d['mean_diff']:+.3f} (wins/ties/losses {d['wins']}/{d['ties']}/{d['losses']}), "
                f"Wilcoxon p(async worse) = {d['p_async_worse']}: "
                f"{'not worse' if q['async_not_worse'] else 'WORSE'}", ""]
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], q: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for engine in sorted({r["engine"] for r in rows}):
        for mode, style in (("batch", "--"), ("async", "-")):
            pts = [(r["workers"], r["utilisation"]) for r in rows if r["engine"] == engine and r["mode"] == mode]
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
    ap.add_argument("--median", type=float, default=0.5, help="real seconds per simulated hour")
    ap.add_argument("--per-worker", type=int, default=16, help="trials per worker in the throughput runs")
    ap.add_argument("--engines", default="local,clock")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale_out.json")
    args = ap.parse_args()
    workers = [1, 2] if args.quick else [1, 2, 4, 8]
    seeds, trials = (3, 40) if args.quick else (20, 150)
    median = 0.1 if args.quick else args.median
    per_worker = 4 if args.quick else args.per_worker
    logging.getLogger("nas.search.loop").setLevel(logging.ERROR)  # REA's small-budget note, per run
    start = time.perf_counter()
    rows = [row for engine in args.engines.split(",") for row in throughput(engine, workers, per_worker, median)]
    q = quality(seeds, trials, max(workers))
    payload = {"benchmark": "scale_out", "quick": args.quick, "median_real_seconds_per_simulated_hour": median,
               "sigma": SIGMA, "throughput": rows, "quality": q,
               "async_utilisation_goal": 0.95,
               "async_steady_utilisation_met": {e: min(r["steady_utilisation"] for r in rows if r["engine"] == e and
                                                    r["mode"] == "async") >= 0.95 for e in {r["engine"] for r in rows}},
               "seconds": round(time.perf_counter() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, payload)
    atomic_write_text(args.out.with_suffix(".md"), markdown(rows, q, median))
    plot(rows, q, args.out.with_suffix(".png"))
    print(f"wrote {args.out} (+ .md, .png)")


if __name__ == "__main__":
    main()

"""Zero-cost proxies against the NB201 CIFAR-10 table (issue 22): Spearman and Kendall tau of each
proxy and of the vote (mean rank of synflow, jacob_cov, snip) against analog-nasbench's
baseline_accuracy over cells sampled with a seed, and the CPU seconds per architecture.

The table's CIFAR-10 is not available offline, so the proxies see Fashion-MNIST (resized to
32x32, grey as three equal channels) and, separately, random normal images: neither is the data the
table's networks trained on, and both are reported. Networks are NB201's skeleton at width C=16
with 10 classes, freshly initialised with the seed, by default with the table's 5 cells per stage
(~0.6 s per cell for all six proxies on one CPU thread; 1,000 cells in ~10 min with one process per
data source); `--cells-per-stage 1` for the cheaper, less faithful network (proxies_shallow.json).

    python benchmarks/proxies.py                          # 1,000 cells, both data sources, report
    python benchmarks/proxies.py --score random           # score one data source (resumable) ...
    python benchmarks/proxies.py --report                 # ... report what the score files hold
    python benchmarks/proxies.py --cells-per-stage 1 --out benchmarks/results/proxies_shallow.json  # shallow
    python benchmarks/proxies.py --report --compare-with benchmarks/results/proxies_shallow.json  # both
    python benchmarks/proxies.py --cells 20 --out /tmp/p.json   # quick: proves it runs

Scores go to benchmarks/results/proxies_scores_<data>.jsonl (one line per cell, appended, so an
interrupted run resumes); the report to benchmarks/results/proxies.json (+ .md table, .png scatter).
Run with OMP_NUM_THREADS=1: the seconds are one CPU thread's, on a shared 2-core machine."""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau, spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import append_jsonl, atomic_write_json, atomic_write_text, read_jsonl  # noqa: E402
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell  # noqa: E402
from nas.spaces.nb201.space import NB201Space  # noqa: E402

SOURCES = ("fashion_mnist", "random")
NAMES = ("synflow", "jacob_cov", "snip", "grad_norm", "naswot", "params")
TIMED_EVERY = 25  # every 25th cell of the sample also times each proxy alone
LITERATURE = {"vote": 0.82, "params": 0.69,
              "note": "Spearman on NB201 CIFAR-10 (Abdelfattah et al. 2021, real CIFAR-10 minibatches)"}


def sample_cells(n: int, seed: int) -> list[NB201Cell]:
    """`n` distinct cells drawn uniformly from all 15,625."""
    every = list(itertools.product(OPS, repeat=len(EDGES)))
    return [NB201Cell(every[i]) for i in np.random.default_rng(seed).choice(len(every), n, replace=False)]


def make_batch(source: str, size: int, seed: int) -> Any:
    from nas.proxies.batch import data_batch, random_batch

    if source == "random":
        return random_batch((3, 32, 32), 10, size, seed)
    from nas.data.sources import load_data

    return data_batch(load_data(source), size, seed, shape=(3, 32, 32))


def scored(path: Path, repair: bool) -> set[str]:
    """Cells in `path`; `repair` cuts a torn last line (a killed run's), only safe with no other writer."""
    return {row["cell"] for row in read_jsonl(path, repair=repair)} if path.exists() else set()


def score(source: str, cells: list[NB201Cell], batch_size: int, seed: int, cells_per_stage: int, path: Path,
          reverse: bool = False) -> None:
    """Append one line per cell not yet in `path`: each proxy's score, the seconds for all of them,
    and on every TIMED_EVERY-th cell each proxy's seconds alone (its score checked against the
    shared pass). A second process
    with `reverse` works from the other end; both re-read `path` every 10 cells and stop where they meet."""
    import torch

    from nas.proxies import score_network
    from nas.train.build import build_model

    torch.set_num_threads(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = make_batch(source, batch_size, seed)
    space = NB201Space()
    done = scored(path, repair=not reverse)
    from rich.progress import track

    position = {c.to_string(): i for i, c in enumerate(cells)}
    todo = [c for c in (reversed(cells) if reverse else cells) if c.to_string() not in done]
    for n, cell in enumerate(track(todo, description=f"proxies on {source}")):
        if n % 10 == 9:
            done = scored(path, repair=False)
        if cell.to_string() in done:
            continue
        start = time.perf_counter()
        net = build_model(space, cell, batch.shape, batch.num_classes, {"channels": 16, "cells_per_stage": cells_per_stage}, seed)
        row: dict[str, Any] = {"cell": cell.to_string(), "build_seconds": time.perf_counter() - start}
        row["scores"] = score_network(net, batch, NAMES, seed)  # all six at once, as a search scores them
        row["total_seconds"] = round(time.perf_counter() - start, 4)
        if position[cell.to_string()] % TIMED_EVERY == 0:  # each proxy alone: what each costs
            row["seconds"] = {}
            for name in NAMES:
                t = time.perf_counter()
                alone = score_network(net, batch, [name], seed)[name]
                row["seconds"][name] = round(time.perf_counter() - t, 4)
                if alone != row["scores"][name]:
                    raise SystemExit(f"{cell.to_string()}: {name} alone {alone} != {row['scores'][name]} with the others")
        append_jsonl(path, [row])


def correlations(scores: list[float], truth: list[float]) -> dict[str, float]:
    rho, tau = spearmanr(scores, truth).statistic, kendalltau(scores, truth).statistic
    return {"spearman": round(float(rho), 4), "kendall": round(float(tau), 4)}


def scored_rows(path: Path, wanted: list[str], source: str) -> list[dict[str, Any]]:
    rows = {r["cell"]: r for r in read_jsonl(path)} if path.exists() else {}  # duplicates are equal
    missing = [c for c in wanted if c not in rows]
    if missing:
        raise SystemExit(f"{path}: {len(missing)} of {len(wanted)} cells not scored yet (run --score {source})")
    return [rows[c] for c in wanted]


def correlation_table(rows: list[dict[str, Any]], truth: list[float]) -> dict[str, dict[str, float]]:
    from nas.proxies import VOTE, mean_rank

    columns = {n: [r["scores"][n] for r in rows] for n in NAMES}
    columns["vote"] = mean_rank({n: columns[n] for n in VOTE})
    return {n: correlations(v, truth) for n, v in columns.items()}


def report(cells: list[NB201Cell], paths: dict[str, Path], out: Path, batch_size: int, seed: int,
           cells_per_stage: int, compare: Path | None = None, machine: str = "") -> dict[str, Any]:
    """`compare`: another run's report path; its scores of the same cells are correlated too;
    `machine`: what else ran while the scores were timed."""
    from nas.proxies import VOTE

    table = NB201Space().benchmark(None, "baseline_accuracy", 10, 32)
    wanted = [c.to_string() for c in cells]
    truth = [table.score(c) for c in cells]
    results: dict[str, Any] = {}
    for source, path in paths.items():
        ordered = scored_rows(path, wanted, source)
        totals = [r["total_seconds"] for r in ordered]
        timed = [r for r in ordered if r.get("seconds")]
        results[source] = {
            "correlation": correlation_table(ordered, truth),
            "seconds_per_arch": {"mean": round(statistics.fmean(totals), 4),
                                 "median": round(statistics.median(totals), 4), "max": round(max(totals), 4),
                                 "per_proxy_mean": {n: round(statistics.fmean(r["seconds"][n] for r in timed), 4)
                                                    for n in NAMES},
                                 "per_proxy_cells": len(timed),
                                 "build_mean": round(statistics.fmean(r["build_seconds"] for r in ordered), 4)},
        }
        if compare is not None:
            other = scored_rows(compare.parent / f"{compare.stem}_scores_{source}.jsonl", wanted, source)
            results[source]["same_cells_in"] = {"run": compare.name, "correlation": correlation_table(other, truth)}
    payload = {
        "benchmark": "zero-cost proxies vs analog-nasbench NB201 CIFAR-10 baseline_accuracy",
        "cells": len(cells), "sample_seed": seed, "batch_size": batch_size, 
        "network": f"NB201 skeleton C=16, {cells_per_stage} cell(s) per stage (the table's: 5), 10 classes, 32x32x3",
        "data_note": ("the table's CIFAR-10 is not available offline: the proxies saw Fashion-MNIST (train split, "
                      "resized 28->32, grey as 3 channels) or random normal images, never CIFAR-10"),
        "cpu": f"one thread per scoring process (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}), "
               f"{os.cpu_count()} cores; {machine}",
        "vote": list(VOTE), "literature": LITERATURE, "results": results,
    }
    atomic_write_json(out, payload)
    atomic_write_text(out.with_suffix(".md"), markdown(payload))
    plot(cells, paths, table, out.with_suffix(".png"))
    return payload


def markdown(payload: dict[str, Any]) -> str:
    sources = list(payload["results"])
    head = " | ".join(f"{s} Spearman | {s} Kendall" for s in sources)
    rows = [f"Zero-cost proxies vs NB201 CIFAR-10 (analog-nasbench), {payload['cells']} cells, batch "
            f"{payload['batch_size']}, network: {payload['network']}. {payload['data_note']}.", "",
            f"| proxy | {head} |", "|---|" + "---|" * (2 * len(sources))]
    for name in [*NAMES, "vote"]:
        cells = " | ".join(f"{payload['results'][s]['correlation'][name]['spearman']:.3f} | "
                           f"{payload['results'][s]['correlation'][name]['kendall']:.3f}" for s in sources)
        rows.append(f"| {name} | {cells} |")
    compared = [s for s in sources if "same_cells_in" in payload["results"][s]]
    if compared:
        run = payload["results"][compared[0]]["same_cells_in"]["run"]
        rows += ["", f"The same cells in {run}:", "", f"| proxy | {' | '.join(f'{s} Spearman' for s in compared)} |",
                 "|---|" + "---|" * len(compared)]
        for name in [*NAMES, "vote"]:
            rows.append(f"| {name} | " + " | ".join(
                f"{payload['results'][s]['same_cells_in']['correlation'][name]['spearman']:.3f}" for s in compared) + " |")
    rows += ["", "| data | s / arch (all 6 proxies, mean) | median | max | each alone (mean) |", "|---|---|---|---|---|"]
    for s in sources:
        t = payload["results"][s]["seconds_per_arch"]
        alone = ", ".join(f"{n} {v:.2f}" for n, v in t["per_proxy_mean"].items())
        rows.append(f"| {s} | {t['mean']:.2f} | {t['median']:.2f} | {t['max']:.2f} | {alone} |")
    rows += ["", f"Literature (real CIFAR-10 batches): vote {LITERATURE['vote']}, params {LITERATURE['params']}. "
             f"CPU: {payload['cpu']}.", ""]
    return "\n".join(rows)


def plot(cells: list[NB201Cell], paths: dict[str, Path], table: Any, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nas.proxies import VOTE, mean_rank

    wanted = [c.to_string() for c in cells]
    truth = [table.score(c) for c in cells]
    fig, axes = plt.subplots(1, len(paths), figsize=(5 * len(paths), 4), squeeze=False)
    for ax, (source, path) in zip(axes[0], paths.items()):
        rows = {r["cell"]: r for r in read_jsonl(path, repair=True)}
        vote = mean_rank({n: [rows[c]["scores"][n] for c in wanted] for n in VOTE})
        ax.scatter(vote, truth, s=4, alpha=0.5)
        ax.set(xlabel="vote (mean rank of synflow, jacob_cov, snip)", ylabel="CIFAR-10 accuracy (%, table)",
               title=f"proxies on {source} (Spearman {spearmanr(vote, truth).statistic:.3f})")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--limit", type=int, help="only the first N of the --cells sample (a subset of the same cells)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--cells-per-stage", type=int, default=5)
    ap.add_argument("--score", choices=SOURCES, help="only score this data source (resumable), no report")
    ap.add_argument("--report", action="store_true", help="only report the score files")
    ap.add_argument("--compare-with", type=Path, help="another run's JSON: correlate its scores of the same cells too")
    ap.add_argument("--machine", default="nothing else said to be running",
                    help="for the report: how the machine was shared while scoring (the seconds depend on it)")
    ap.add_argument("--reverse", action="store_true", help="with --score: from the last cell (a second process)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "proxies.json")
    args = ap.parse_args()
    cells = sample_cells(args.cells, args.seed)[:args.limit]
    paths = {s: args.out.parent / f"{args.out.stem}_scores_{s}.jsonl" for s in SOURCES}
    for source in ([args.score] if args.score else [] if args.report else SOURCES):
        score(source, cells, args.batch_size, args.seed, args.cells_per_stage, paths[source], args.reverse)
    if not args.score:
        payload = report(cells, paths, args.out, args.batch_size, args.seed, args.cells_per_stage, args.compare_with,
                         args.machine)
        print(markdown(payload))


if __name__ == "__main__":
    main()

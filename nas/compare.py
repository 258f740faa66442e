"""Aggregate many runs (e.g. a Hydra multirun): per strategy and space, mean ±
std of best accuracy at chosen trial counts, and curves with ±1 std bands."""

from __future__ import annotations

import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from nas.errors import NasError
from nas.io import atomic_write_json, atomic_write_text, read_json, read_jsonl
from nas.report import _pyplot, save_figure
from nas.search.loop import best_so_far


def find_runs(paths: list[Path]) -> list[Path]:
    runs = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise NasError(f"compare: {p} does not exist")
        runs += [s.parent for s in sorted(p.rglob("summary.json"))]
    if not runs:
        raise NasError(f"compare: no summary.json found under {', '.join(map(str, paths))}")
    return sorted(set(runs))


def load_curves(runs: list[Path]) -> dict[str, list[dict[str, Any]]]:
    """Group label ('strategy @ space/evaluator') → [{seed, curve, run}]."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        summary = read_json(run / "summary.json")
        curve = best_so_far(read_jsonl(run / "history.jsonl"))
        label = f"{summary['strategy']} @ {summary['space']}/{summary['evaluator']}"
        groups[label].append({"seed": summary["seed"], "curve": curve, "run": str(run)})
    return dict(groups)


def aggregate(groups: dict[str, list[dict[str, Any]]], at: list[int]) -> dict[str, Any]:
    out = {}
    for label, runs in sorted(groups.items()):
        row = {"runs": len(runs), "seeds": sorted(r["seed"] for r in runs), "at": {}}
        for n in at:
            vals = [r["curve"][n - 1] for r in runs if len(r["curve"]) >= n and r["curve"][n - 1] is not None]
            row["at"][str(n)] = None if not vals else {
                "mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else 0.0,
                "n": len(vals),
            }
        out[label] = row
    return out


def compare(paths: list[Path], out_dir: Path, at: list[int]) -> dict[str, Any]:
    if not at or any(n <= 0 for n in at):
        raise NasError(f"compare: trial counts must be positive integers, got {at}")
    groups = load_curves(find_runs(paths))
    table = aggregate(groups, at)
    out_dir = Path(out_dir)
    atomic_write_json(out_dir / "compare.json", {"at": at, "groups": table})
    atomic_write_text(out_dir / "compare.md", render_table(table, at))
    plot_curves(groups, out_dir / "compare.png")
    return table


def render_table(table: dict[str, Any], at: list[int]) -> str:
    head = "| strategy @ space/evaluator | runs | " + " | ".join(f"best @ {n}" for n in at) + " |"
    lines = [head, "| --- | --- | " + " | ".join("---" for _ in at) + " |"]
    for label, row in table.items():
        cells = []
        for n in at:
            s = row["at"][str(n)]
            cells.append("-" if s is None else f"{s['mean']:.2f} ± {s['std']:.2f} (n={s['n']})")
        lines.append(f"| {label} | {row['runs']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(groups: dict[str, list[dict[str, Any]]], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in sorted(groups.items()):
        length = min(len(r["curve"]) for r in runs)
        mat = np.array([[np.nan if v is None else v for v in r["curve"][:length]] for r in runs], dtype=float)
        xs = np.arange(1, length + 1)
        with warnings.catch_warnings():  # columns where every run has only failures
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(mat, axis=0)
            std = np.nanstd(mat, axis=0)
        ax.plot(xs, mean, label=f"{label} (n={len(runs)})")
        ax.fill_between(xs, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("trials")
    ax.set_ylabel("best accuracy so far (%)")
    ax.set_title("best-so-far accuracy, mean ± std over seeds")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)

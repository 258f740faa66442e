"""Human-facing outputs of a run: a best-so-far plot and a markdown report."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from nas.io import atomic_write_bytes, atomic_write_text


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())


def write_run_report(run_dir: Path, history: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    from nas.search.loop import best_so_far

    plt = _pyplot()
    curve = best_so_far(history)
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [i + 1 for i, v in enumerate(curve) if v is not None]
    ax.plot(xs, [v for v in curve if v is not None], drawstyle="steps-post", label=summary["strategy"])
    ok = [(r["trial"] + 1, r["accuracy"]) for r in history if r.get("accuracy") is not None]
    if ok:
        ax.scatter(*zip(*ok), s=6, alpha=0.3, color="gray", label="evaluated")
    ax.set_xlabel("trials")
    ax.set_ylabel("best accuracy so far (%)")
    ax.set_title(f"{summary['strategy']} on {summary['space']} ({summary['evaluator']}), seed {summary['seed']}")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    save_figure(fig, Path(run_dir) / "best_so_far.png")
    atomic_write_text(Path(run_dir) / "report.md", render_markdown(history, summary))


def render_markdown(history: list[dict[str, Any]], summary: dict[str, Any], top: int = 10) -> str:
    best = summary.get("best") or {}
    lines = [
        f"# Search report: {summary['strategy']} on {summary['space']}",
        "",
        "| field | value |", "| --- | --- |",
        f"| evaluator | {summary['evaluator']} |",
        f"| seed | {summary['seed']} |",
        f"| trials | {summary['trials']} (failed {summary['failed']}, cache hits {summary['cache_hits']}) |",
        f"| best accuracy | {_fmt(best.get('accuracy'))} |",
        f"| best encoding | `{best.get('encoding', '-')}` |",
        f"| wall seconds | {summary['wall_seconds']:.2f} |",
    ]
    for n, acc in summary.get("best_at", {}).items():
        lines.append(f"| best at {n} trials | {_fmt(acc)} |")
    ranked = sorted((r for r in history if r.get("accuracy") is not None),
                    key=lambda r: r["accuracy"], reverse=True)[:top]
    lines += ["", f"## Top {len(ranked)} architectures", "",
              "| rank | trial | accuracy | params | FLOPs | encoding |",
              "| --- | --- | --- | --- | --- | --- |"]
    for i, r in enumerate(ranked, 1):
        lines.append(f"| {i} | {r['trial']} | {_fmt(r['accuracy'])} | {_fmt_int(r.get('params'))} | "
                     f"{_fmt_int(r.get('flops'))} | `{r['encoding']}` |")
    lines += ["", "![best so far](best_so_far.png)", ""]
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _fmt_int(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"

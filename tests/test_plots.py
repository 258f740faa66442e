"""The run's plots read as the report does: best_so_far.png's x axis gives the trial numbers
of report.md, and pareto.png puts params and FLOPs on a log axis whose labels stay apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from nas.core.trial import read_history
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import Component, SearchSpec


@pytest.fixture
def figures(monkeypatch):
    """The figures the report code saves, kept open instead of written."""
    saved: dict[str, object] = {}

    def keep(fig, path: Path) -> None:
        saved[Path(path).name] = fig

    monkeypatch.setattr("nas.report.save_figure", keep)
    monkeypatch.setattr("nas.compare.save_figure", keep)
    return saved


def test_best_so_far_x_axis_gives_the_reports_trial_numbers(tmp_path, figures):
    from nas.report import write_run_report

    spec = SearchSpec(space=Component("nb201", {"channels": 4, "cells_per_stage": 1}),
                      strategy=Component("random"), evaluator=Component("table"), seed=1, trials=6)
    space = spec.build_space()
    summary = SearchLoop(spec, tmp_path, LocalExecutor(spec.build_evaluator(space), None),
                         progress=False).run_search()
    write_run_report(tmp_path, summary)
    history = read_history(tmp_path / "history.jsonl")
    ax = figures["best_so_far.png"].axes[0]
    assert list(ax.lines[0].get_xdata()) == [r.trial for r in history]  # the first trial is 0, as in the report
    best = summary["best"]
    line = ax.lines[0]
    assert line.get_ydata()[list(line.get_xdata()).index(best["trial"])] == best["accuracy"]
    assert f"| 1 | {best['trial']} |" in (tmp_path / "report.md").read_text()  # rank 1 row: the same number


def test_pareto_plot_puts_params_and_flops_on_a_log_axis_with_labels_apart(figures, tmp_path):
    from nas.compare import plot_pareto

    sizes = [3e4, 1.2e5, 8e5, 2.5e6, 9e6, 4e7]
    points = [{"params": s, "flops": 40 * s, "accuracy": 80 + i} for i, s in enumerate(sizes)]
    groups = {"rea": [{"points": points}]}
    pareto = {m: {"groups": {"rea": {"front": points}}} for m in ("params", "flops")}
    plot_pareto(groups, pareto, tmp_path / "pareto.png")
    fig = figures["pareto.png"]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax, metric in zip(fig.axes, ("params", "flops")):
        assert ax.get_xscale() == "log" and ax.get_xlabel() == f"{metric} (log scale)"
        lo, hi = ax.get_xlim()
        boxes = sorted((label.get_window_extent(renderer) for label in ax.get_xticklabels()
                        if label.get_text() and lo <= label.get_position()[0] <= hi), key=lambda b: b.x0)
        assert len(boxes) >= 3
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:]))  # no label runs into the next

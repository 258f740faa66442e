"""What a search shows in the Prefect UI: its report (markdown), its top trials (table)
and a progress bar updated after every batch, so results are read where the run is
watched, not only in its run dir. Keys are `<flow run name>-report|top-trials|progress`:
the UI's Artifacts page then keeps the latest of each search configuration."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from nas.report import render_markdown
from nas.search.record import TrialRecord, best_record, evaluated, read_history
from tasks.progress import prefect_key

PLOT_LINE = "![best so far](best_so_far.png)"  # nas/report.py's relative link, dead in the UI
TOP = 10


def artifact_key(name: str, kind: str) -> str:
    return prefect_key(f"{name}-{kind}")


@dataclass
class SearchArtifacts:
    """One search's artifacts; `name` is its flow run's, `trials` its budget."""

    name: str
    trials: int
    trust: bool = False  # evaluator.trust_self_reported: which trials count for best
    progress_id: UUID | None = None

    def start(self) -> None:
        self.progress_id = create_progress_artifact(
            0.0, key=artifact_key(self.name, "progress"), description=f"{self.name}: 0/{self.trials} trials")

    def on_batch(self, history: list[TrialRecord]) -> None:
        assert self.progress_id is not None, "start() first"
        best = best_record(history, self.trust)
        best_text = "none yet" if best is None else f"{best.accuracy:.2f}%"
        done = len(evaluated(history))
        update_progress_artifact(self.progress_id, min(100.0, 100.0 * done / self.trials),
                                 description=f"{self.name}: {done}/{self.trials} trials, best {best_text}")

    def finish(self, run_dir: Path, summary: dict[str, Any]) -> None:
        """After the loop wrote history.jsonl and report.md; the search is over, so progress is 100
        even when a strategy ran out of candidates before its budget."""
        history = read_history(run_dir / "history.jsonl")
        create_markdown_artifact(report_markdown(run_dir, history, summary), key=artifact_key(self.name, "report"),
                                 description=f"{self.name}: search report ({run_dir})")
        create_table_artifact(top_trials(history, self.trust), key=artifact_key(self.name, "top-trials"),
                              description=f"{self.name}: top {TOP} trials by accuracy")
        if self.progress_id is not None:
            ended = f", {summary['exhausted']}" if summary.get("exhausted") else ""
            update_progress_artifact(self.progress_id, 100.0,
                                     description=f"{self.name}: done, {summary['trials']}/{self.trials} trials{ended}")


def report_markdown(run_dir: Path, history: list[TrialRecord], summary: dict[str, Any]) -> str:
    """report.md with the run dir's files named by absolute path: the UI cannot show local images."""
    run_dir = run_dir.resolve()
    files = ", ".join(f"[{n}]({(run_dir / n).as_uri()})" for n in ("report.md", "history.jsonl", "summary.json"))
    where = "\n".join([f"Run dir: `{run_dir}`", "",
                       f"Plot: [best_so_far.png]({(run_dir / 'best_so_far.png').as_uri()}) (`{run_dir / 'best_so_far.png'}`)",
                       "", f"Files: {files}"])
    return render_markdown(history, summary).replace(PLOT_LINE, where)


def top_trials(history: list[TrialRecord], trust: bool) -> list[dict[str, Any]]:
    """The best TOP trials, one row each: key, accuracy, cost, then each metric as a column
    (the union over the rows, so every row has the same columns)."""
    ranked = sorted((r for r in history if r.counts_for_best(trust)), key=lambda r: r.accuracy or 0.0, reverse=True)[:TOP]
    metrics = sorted({k for r in ranked for k, v in r.metrics.items() if not isinstance(v, dict)})
    rows = []
    for i, r in enumerate(ranked, 1):
        row = {"rank": i, "trial": r.trial, "key": r.key, "accuracy": r.accuracy,
               "params": r.params, "flops": r.flops, "cost_seconds": r.cost_seconds, "cached": r.cached}
        rows.append(row | {m: r.metrics.get(m) for m in metrics if m not in row})
    return rows

"""What a search shows in the Prefect UI: its report (markdown), its top trials (table)
and a progress bar updated after a batch (at most once a second: each update is an API call,
and a table search's batches take milliseconds), so results are read where the run is
watched, not only in its run dir. Keys are `<flow run name>-report|top-trials|progress`:
the UI's Artifacts page then keeps the latest of each search configuration."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect.artifacts import (
    MarkdownArtifact,
    ProgressArtifact,
    TableArtifact,
    aupdate_progress_artifact,
    update_progress_artifact,
)
from prefect.client.orchestration import get_client
from prefect.utilities.asyncutils import run_coro_as_sync

from nas.core.trial import TrialRecord, best_record, evaluated, read_history
from nas.report import code_span, render_markdown
from nas.terminal import clipped, printable
from tasks.progress import prefect_key

PLOT_LINE = "![best so far](best_so_far.png)"  # nas/report.py's relative link, dead in the UI
TOP = 10
PROGRESS_EVERY_S = 1.0  # the least time between two progress updates of a running search


def artifact_key(name: str, kind: str) -> str:
    return prefect_key(f"{name}-{kind}")


@dataclass
class SearchArtifacts:
    """One search's artifacts, on the flow run that runs it (a deployment's run runs the search
    itself, flows/search.py: the run a user lands on holds them); `name` is its flow run's,
    `trials` its budget."""

    name: str
    trials: int
    trust: bool = False  # evaluator.trust_self_reported: which trials count for best
    progress_id: UUID | None = None
    clock: Callable[[], float] = time.monotonic
    updated: float = -math.inf  # when on_batch last updated the bar (`clock`'s time)

    def start(self) -> None:
        self.progress_id = ProgressArtifact(progress=0.0, key=artifact_key(self.name, "progress"),
                                            description=f"{self.name}: 0/{self.trials} trials").create().id

    def _progress(self, value: float, description: str) -> None:
        assert self.progress_id is not None, "start() first"
        update_progress_artifact(self.progress_id, value, description=description)

    def on_batch(self, history: list[TrialRecord]) -> None:
        assert self.progress_id is not None, "start() first"
        if self.clock() - self.updated < PROGRESS_EVERY_S:  # `finish` says where it ended anyway
            return
        self.updated = self.clock()
        best = best_record(history, self.trust)
        best_text = "none yet" if best is None else f"{best.accuracy:.2f}%"
        done = len(evaluated(history))
        self._progress(min(100.0, 100.0 * done / self.trials),
                       f"{self.name}: {done}/{self.trials} trials, best {best_text}")

    def finish(self, run_dir: Path, summary: dict[str, Any]) -> None:
        """After the loop wrote history.jsonl; the search is over, so progress is 100 even when a
        strategy ran out of candidates before its budget."""
        assert self.progress_id is not None, "start() first"
        history = read_history(run_dir / "history.jsonl")
        report = MarkdownArtifact(markdown=report_markdown(run_dir, history, summary),
                                  key=artifact_key(self.name, "report"),
                                  description=f"{self.name}: search report ({run_dir})")
        table = TableArtifact(table=top_trials(history, self.trust), key=artifact_key(self.name, "top-trials"),
                              description=f"{self.name}: top {TOP} trials by accuracy")
        ended = f", {printable(str(summary['exhausted']))}" if summary.get("exhausted") else ""
        run_coro_as_sync(self._publish(report, table, f"{self.name}: done, {summary['trials']}/{self.trials} "
                                                      f"trials{ended}"))

    async def _publish(self, report: MarkdownArtifact, table: TableArtifact, progress: str) -> None:
        """The report, the top trials and the bar at 100 sent at once, on one client: three API round
        trips in the time of one (one after the other they were most of a table search's last half second)."""
        assert self.progress_id is not None
        async with get_client() as client:
            await asyncio.gather(report.acreate(client), table.acreate(client),
                                 aupdate_progress_artifact(self.progress_id, 100.0, description=progress, client=client))


def report_markdown(run_dir: Path, history: list[TrialRecord], summary: dict[str, Any]) -> str:
    """report.md with the run dir's files named by absolute path: the UI cannot show local images."""
    run_dir = run_dir.resolve()
    files = ", ".join(f"[{n}]({(run_dir / n).as_uri()})" for n in ("report.md", "history.jsonl", "summary.json"))
    where = "\n".join([f"Run dir: `{run_dir}`", "",
                       f"Plot: [best_so_far.png]({(run_dir / 'best_so_far.png').as_uri()}) (`{run_dir / 'best_so_far.png'}`)",
                       "", f"Files: {files}"])
    return render_markdown(history, summary).replace(PLOT_LINE, where)


def top_trials(history: list[TrialRecord], trust: bool) -> list[dict[str, Any]]:
    """The best TOP trials, one row each, as read: accuracy to 2 decimals, params and FLOPs in
    K/M/G, the encoding, cost, then each metric as a column (the union over the rows, so every
    row has the same columns). The exact numbers are in the run dir's history.jsonl."""
    ranked = sorted((r for r in history if r.counts_for_best(trust)), key=lambda r: r.accuracy or 0.0, reverse=True)[:TOP]
    metrics = sorted({k for r in ranked for k, v in r.metrics.items() if not isinstance(v, dict)})
    rows = []
    for i, r in enumerate(ranked, 1):
        row = {"rank": i, "trial": r.trial, "accuracy": _fixed(r.accuracy), "params": si(r.params),
               "flops": si(r.flops), "encoding": encoding_text(r.encoding), "key": r.key,
               "cost_seconds": _fixed(r.cost_seconds), "cached": r.cached}
        rows.append(row | {m: _cell(r.metrics.get(m)) for m in metrics if m not in row})
    return rows


ENCODING_CHARS = 120  # a table cell, not a page: the full encoding is in history.jsonl


def encoding_text(encoding: Any) -> str:
    if isinstance(encoding, str):
        text = encoding
    else:
        text = json.dumps(encoding, separators=(",", ":"), default=str)
    # a model's source (an LLM wrote it) on one line, controls as text, and no markdown: the UI renders
    # each string cell as markdown, where an NB201 cell's `~0|+|...~1` was struck through
    return code_span(clipped(printable(text), ENCODING_CHARS))


def si(value: float | None) -> str | None:
    """1234567 -> '1.23M': params and FLOPs as read (K, M, G, T; below 1000 as is)."""
    if value is None:
        return None
    for factor, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= factor:
            return f"{value / factor:.2f}{unit}"
    return f"{value:g}"


def _fixed(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}"


def _cell(value: Any) -> Any:
    """A metric as a table cell; a string (a proxy's reason, a model's error) escaped (`nas.terminal`)
    in a code span, as the encoding is."""
    return f"{value:.4g}" if isinstance(value, float) else code_span(printable(value)) if isinstance(value, str) \
        else value

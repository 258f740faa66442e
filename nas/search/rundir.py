"""The files of one search: history.jsonl (append-only), state.json (resume
point, atomically replaced after each batch), summary.json and the report.

Crash safety: history lines are appended before the state is replaced, so on
resume any lines past the state's `history_lines` belong to a batch the
strategy never saw; they are cut and that batch is asked again (identically,
since the RNG state is restored; evaluation then hits the task cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nas.errors import RunDirError
from nas.io import append_jsonl, atomic_write_json, read_json, read_jsonl, rewrite_jsonl

STATE_VERSION = 1


@dataclass
class Resume:
    history: list[dict[str, Any]]
    strategy_state: dict[str, Any]
    elapsed_seconds: float


class RunDir:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.history_path = self.path / "history.jsonl"
        self.state_path = self.path / "state.json"
        self.summary_path = self.path / "summary.json"

    def prepare(self, identity: str) -> Resume | None:
        """Create the directory, or return what a previous run left to resume."""
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.state_path.exists():
            if self.history_path.exists() and self.history_path.stat().st_size:
                # Killed before its first state save: nothing reliable to resume.
                self.history_path.unlink()
            return None
        try:
            state = read_json(self.state_path)
        except RunDirError as err:
            # Written by atomic replace, so never torn by a crash: the file was damaged afterwards.
            raise RunDirError(f"{err}; delete it to restart this search from scratch, "
                              "or use a new hydra.run.dir") from None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise RunDirError(f"{self.state_path}: unknown state format; use a new hydra.run.dir")
        if state.get("identity") != identity:
            raise RunDirError(
                f"{self.path} holds a different search (config differs in space, strategy, "
                "evaluator, seed or batch size); use a new hydra.run.dir"
            )
        try:
            keep = int(state["history_lines"])
            strategy_state = dict(state["strategy"])
            elapsed = float(state.get("elapsed_seconds", 0.0))
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"{self.state_path}: malformed resume state ({type(err).__name__}: {err})") from None
        try:
            history = read_jsonl(self.history_path, repair=True)  # a torn last line is cut
        except RunDirError as err:
            raise RunDirError(f"{err}; restore the file or use a new hydra.run.dir "
                              "(only a torn last line is repaired)") from None
        if len(history) < keep:
            raise RunDirError(
                f"{self.history_path}: has {len(history)} lines but state.json records {keep}"
            )
        if len(history) > keep:
            history = history[:keep]
            rewrite_jsonl(self.history_path, history)
        return Resume(history, strategy_state, elapsed)

    def append(self, records: list[dict[str, Any]]) -> None:
        append_jsonl(self.history_path, records)

    def save_state(self, identity: str, history_lines: int, strategy_state: dict[str, Any],
                   elapsed_seconds: float) -> None:
        atomic_write_json(self.state_path, {
            "version": STATE_VERSION, "identity": identity, "history_lines": history_lines,
            "strategy": strategy_state, "elapsed_seconds": elapsed_seconds,
        })

    def save_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.summary_path, summary)

"""Where replies are kept: a cross-run reply cache (one JSON file per call key),
the run's transcript (`llm/transcripts.jsonl`), and the replay book built from a
transcript. Keys never include credentials, and neither do records."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from nas.core.arch import stable_hash
from nas.errors import ConfigError
from nas.io import KeyedFiles, append_jsonl, read_jsonl

TRANSCRIPT = Path("llm") / "transcripts.jsonl"
log = logging.getLogger("nas.llm")


def call_key(model: str, messages: list[dict[str, str]], params: dict[str, Any], template: str,
             attempt: int) -> str:
    return stable_hash({"model": model, "messages": messages, "params": params, "template": template,
                        "attempt": attempt}, length=32)


class ReplyCache(KeyedFiles):
    """Successful replies by key, shared by all runs (so a re-run costs no calls)."""

    def get(self, key: str) -> dict[str, Any] | None:
        record, problem = self.read(key)
        if problem is None:
            if not isinstance(record, dict) or record.get("key") != key:
                return None
            problem = _reply_problem(record)
            if problem is None:
                return record
        # Derived data: the call runs again and its reply replaces the file.
        log.warning("corrupt LLM cache file %s (%s); asking the model again", self.path(key), problem)
        return None

    def put(self, record: dict[str, Any]) -> None:
        self.write(record["key"], record)


def _reply_problem(record: dict[str, Any]) -> str | None:
    """What makes a cached record unusable as a reply (the file is writable by others), or None."""
    if not isinstance(record.get("reply"), str) or not isinstance(record.get("finish_reason"), str):
        return "no reply text"
    counts = [record.get("prompt_tokens"), record.get("completion_tokens")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return "bad token counts"
    latency = record.get("latency_s")
    if not isinstance(latency, (int, float)) or isinstance(latency, bool):
        return "bad latency"
    return None


class Transcript:
    """Append-only record of every call of a run, in call order, across resumes."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / TRANSCRIPT
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        # A run killed mid-append leaves a torn last line; cut it, or the next
        # append would glue onto it and corrupt the transcript for replay.
        self.previous: list[dict[str, Any]] = read_jsonl(self.path, repair=True)  # calls before a resume

    def append(self, record: dict[str, Any]) -> None:
        with self._lock:
            append_jsonl(self.path, [record])


class ReplayBook:
    """Replies of a recorded run by key; replaying needs no endpoint at all."""

    def __init__(self, source: str | Path) -> None:
        path = Path(source).expanduser()
        if path.is_dir():
            path = path / TRANSCRIPT
        if not path.is_file():
            raise ConfigError(f"llm.replay_from: {path} does not exist (give a run dir with llm/transcripts.jsonl)")
        self.path = path
        self.records: dict[str, dict[str, Any]] = {}
        self.settings: dict[str, dict[str, Any]] = {}  # role -> recorded model, temperature, max_tokens
        for record in read_jsonl(path, repair=False):
            key = record.get("key")
            if not isinstance(key, str):
                continue
            # A key can repeat (same call asked again); a success wins over a recorded failure.
            if key not in self.records or (self.records[key].get("error") and not record.get("error")):
                self.records[key] = record
            params = record.get("params") or {}
            self.settings.setdefault(str(record.get("role")), {
                "model": record.get("model"), "model_id": record.get("model_id") or record.get("model"),
                "temperature": params.get("temperature"),
                "max_tokens": params.get("max_tokens"), "context": record.get("context"),
                "structured_mode": record.get("structured_mode", "none")})

    def get(self, key: str) -> dict[str, Any] | None:
        return self.records.get(key)

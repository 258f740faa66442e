"""One scrubber for everything nasflow writes or sends: API keys and tokens
become `***` in run files, caches, Prefect records, log lines and LLM replies.

A secret can reach data from anywhere (a model that read the environment, a
reply that echoes the key, an error message), so it is removed where data is
written, not where it is produced. The scrubber knows the configured key (the
LLM client registers it), every `*_API_KEY` / `*_TOKEN` environment value
present at start, and the `sk-...` shape of API keys; all of it is one
compiled regex."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nas.terminal import printable

MASK = "***"
MIN_ENV_SECRET = 8  # shorter *_TOKEN values are flags and counts, not credentials
MIN_SECRET = 4      # a configured key shorter than this would mask ordinary words
ENV_SUFFIXES = ("_API_KEY", "_TOKEN")
KEYLIKE = r"\bsk-[A-Za-z0-9_\-*]{6,}"


class Scrubber:
    """Known secret values plus the key-like pattern, as one regex rebuilt on register."""

    def __init__(self) -> None:
        self._secrets: set[str] = set()
        self._lock = threading.Lock()
        self._pattern = re.compile(KEYLIKE)

    def register(self, value: str | None, *, min_len: int = MIN_SECRET) -> None:
        if not value or len(value) < min_len or value in self._secrets:
            return
        with self._lock:
            self._secrets.add(value)
            # Longest first: a key that contains another is masked whole.
            alternatives = [re.escape(s) for s in sorted(self._secrets, key=len, reverse=True)]
            self._pattern = re.compile("|".join([*alternatives, KEYLIKE]))

    def register_env(self, environ: Mapping[str, str]) -> None:
        for name, value in environ.items():
            if name.upper().endswith(ENV_SUFFIXES):
                self.register(value, min_len=MIN_ENV_SECRET)

    def scrub(self, text: str) -> str:
        return self._pattern.sub(MASK, text)

    def scrub_data(self, obj: Any) -> Any:
        """A copy of JSON-like data with every string (keys too) scrubbed; scrubbing
        before encoding keeps the JSON valid and catches secrets JSON would escape."""
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, Mapping):
            return {self.scrub(k) if isinstance(k, str) else k: self.scrub_data(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple, set)):
            return [self.scrub_data(v) for v in obj]
        if isinstance(obj, Path):
            return self.scrub(str(obj))
        return obj


SCRUBBER = Scrubber()
SCRUBBER.register_env(os.environ)
register = SCRUBBER.register
scrub = SCRUBBER.scrub
scrub_data = SCRUBBER.scrub_data


class ScrubFilter(logging.Filter):
    """Masks secrets in a record's message, traceback and stack, and escapes their control
    characters (a model's or an LLM's text in a log line must not rewrite the console:
    `nas.terminal`); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # bad %-args: logging reports those itself when it formats
            return True
        # a tab as spaces, not `\x09` (Hydra's sweep lines start with one); the other controls escaped
        record.msg, record.args = printable(scrub(message).expandtabs(4), lines=True), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = printable(scrub(record.exc_text), lines=True)
        if record.stack_info:
            record.stack_info = printable(scrub(record.stack_info), lines=True)
        return True


def install_log_scrubbing() -> None:
    """Pass every log record through `ScrubFilter` as it is created, so each
    handler sees scrubbed text: Hydra's `search.log`, the console and Prefect's
    handlers, including those configured after this call (Prefect replaces the
    root handlers when it is imported)."""
    SCRUBBER.register_env(os.environ)
    previous = logging.getLogRecordFactory()
    if getattr(previous, "scrubs", False):
        return
    scrub_filter = ScrubFilter()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        scrub_filter.filter(record)
        return record

    factory.scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)

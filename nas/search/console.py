"""The search's progress bar on the console, and the log lines printed above it.

A log handler writes to the stream it was given when logging was configured (Hydra's
console handler: stderr), so while a bar is drawn its lines land in the bar's own line,
which the next refresh overwrites. `logs_above` points those handlers at the bar's
console for as long as it is live: rich prints each line above the bar. The columns
fit 80: the bar and the LLM status give way, never the count, best or elapsed time.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.text import Text


def search_columns(label: str, total: int, width: int) -> list[ProgressColumn]:
    """LABEL ━━━━ 3/100 best 93.04 0:00:12 LLM-status in `width` columns: the count, best and
    elapsed time at their full width, the LLM status cut with an ellipsis to what is left."""
    widths = [min(len(Text.from_markup(label)), 24), 12, 2 * len(str(total)) + 1, len("best 100.00"), len("0:00:00")]
    left = max(width - sum(widths) - len(widths) - 1, 1)  # a space between columns, one spare at the end

    def cut(width: int, no_wrap: bool = True) -> Column:
        return Column(no_wrap=no_wrap, overflow="ellipsis", min_width=width, max_width=width)

    return [TextColumn(label, table_column=cut(widths[0])), BarColumn(bar_width=widths[1]),
            MofNCompleteColumn(table_column=cut(widths[2])),
            TextColumn("best {task.fields[best]}", table_column=cut(widths[3])),
            TimeElapsedColumn(table_column=cut(widths[4])),
            TextColumn("{task.fields[llm]}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=left))]


def search_progress(label: str, total: int, console: Console | None = None) -> Progress:
    """The search's bar on stderr (stdout carries only the result lines)."""
    console = console or Console(file=sys.stderr)
    return Progress(*search_columns(label, total, console.width), console=console, transient=False)


class _ConsoleStream:
    """A handler's stream that prints through the live display's console."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def write(self, text: str) -> int:
        self.console.print(text.rstrip("\n"), markup=False, highlight=False, emoji=False, soft_wrap=True)
        return len(text)

    def flush(self) -> None:
        pass


@contextmanager
def logs_above(progress: Progress) -> Iterator[None]:
    """While `progress` is live, the console handlers (a StreamHandler on stdout or stderr, not a
    file) of every logger print above its bar; their streams are put back at the end."""
    streams: list[TextIO | Any] = [sys.__stdout__, sys.__stderr__]
    for std in (sys.stdout, sys.stderr):  # inside the live display: rich's proxies of the streams before
        streams += [std, getattr(std, "rich_proxied_file", None)]
    loggers = [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                      if isinstance(lg, logging.Logger))]
    moved: list[tuple[logging.StreamHandler, Any]] = []
    stream = _ConsoleStream(progress.console)
    for logger in loggers:
        for handler in logger.handlers:
            if (type(handler) is logging.StreamHandler and any(handler.stream is s for s in streams)
                    and all(handler is not h for h, _ in moved)):
                moved.append((handler, handler.setStream(stream)))  # type: ignore[arg-type]
    try:
        yield
    finally:
        for handler, old in moved:
            handler.setStream(old)

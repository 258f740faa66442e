"""What a command shows during a slow step that has no trial or epoch to count (a sweep's
jobs being checked, Prefect's temporary server starting, the embedding model loading):
silence during long work is a bug. Like `nas search`'s bar, it goes to stderr, so stdout
keeps only results."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PLAIN_AFTER_S = 2.0  # off a terminal, a counted step says what it does once it has taken this long


@contextmanager
def status(text: str, total: int | None = None, *, show: bool = True,
           tty: bool | None = None) -> Iterator[Callable[[], None]]:
    """On a terminal, a transient rich line (with `total`: a bar that the yielded `advance`
    moves). Otherwise `text` once as a plain line, so logs and CI say what is going on: at once
    without `total`, else at the first `advance` after PLAIN_AFTER_S (a sweep whose first job
    is bad still stops with its one error line). `show=False` (a caller run without progress,
    e.g. progress=false or a worker) shows nothing, so callers need no `if show else nullcontext()`."""
    if not show:
        yield lambda: None
        return
    if not (sys.stderr.isatty() if tty is None else tty):
        start, said = time.monotonic(), total is None
        if said:
            print(f"{text} ...", file=sys.stderr, flush=True)

        def advance() -> None:
            nonlocal said
            if not said and time.monotonic() - start >= PLAIN_AFTER_S:
                print(f"{text} ...", file=sys.stderr, flush=True)
                said = True

        yield advance
        return
    from rich.console import Console  # lazy: loads rich (start-up time)

    # lazy: loads rich (start-up time)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False)]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=Console(file=sys.stderr, force_terminal=True),
                  transient=True) as bar:
        task = bar.add_task(text, total=total)
        yield lambda: bar.advance(task)

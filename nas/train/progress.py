"""Per-epoch progress of a candidate's training, and the two places it is shown.

Why: one candidate trains for minutes to hours (NB201: 200 epochs), and
silence during long work is a bug.  Both engines call `on_epoch` once per
finished epoch, when they read the epoch's loss anyway (no extra device
synchronisation).  `nas train` draws it (`EpochDisplay`); inside a Prefect
task or flow run it becomes one progress artifact per candidate's training
(tasks/progress.py), which the UI shows live.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable

from nas.core.registry import Registry


@dataclass(frozen=True)
class EpochProgress:
    label: str  # which candidate (and seed)
    epoch: int  # epochs finished, from 1
    epochs: int  # the recipe's
    loss: float  # the epoch's mean training loss
    elapsed: float  # seconds since this candidate's first epoch began
    terminated: str | None = None  # early termination: no epochs follow

    @property
    def eta(self) -> float:
        """Seconds left at the pace so far (0 when this was the last epoch)."""
        if self.terminated or self.epoch >= self.epochs:
            return 0.0
        return self.elapsed / self.epoch * (self.epochs - self.epoch)

    def summary(self) -> str:
        state = f"stopped: {self.terminated}" if self.terminated else f"ETA {clock(self.eta)}"
        return f"epoch {self.epoch}/{self.epochs}, loss {self.loss:.4f}, {clock(self.elapsed)}, {state}"


OnEpoch = Callable[[EpochProgress], None]


def clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def combine(*hooks: OnEpoch | None) -> OnEpoch | None:
    """One hook calling each given one (None when none is given)."""
    live = [h for h in hooks if h is not None]
    if len(live) <= 1:
        return live[0] if live else None

    def each(p: EpochProgress) -> None:
        for hook in live:
            hook(p)

    return each


class EpochDisplay:
    """`nas train`'s display on stderr: `title`, then a rich progress bar per candidate on a
    terminal (the title pulsing until the first epoch), otherwise one short line per epoch
    (logs and CI stay readable)."""

    def __init__(self, title: str, tty: bool | None = None) -> None:
        self.title = title
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        self.waiting: Any = None

    def __enter__(self) -> "EpochDisplay":
        if self.tty:
            from rich.console import Console  # lazy: loads rich (start-up time)
            from rich.progress import BarColumn, Progress, TextColumn  # lazy: loads rich (start-up time)

            self.bar = Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(),
                                TextColumn("{task.fields[state]}"),
                                console=Console(stderr=True), transient=False)
            self.bar.__enter__()
            self.waiting = self.bar.add_task(self.title, total=None, state="")
        else:
            print(self.title, file=sys.stderr, flush=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, p: EpochProgress) -> None:
        if self.bar is None:
            print(f"{p.label}: {p.summary()}", file=sys.stderr, flush=True)
            return
        if self.waiting is not None:
            self.bar.remove_task(self.waiting)
            self.waiting = None
        if p.label not in self.tasks:
            self.tasks[p.label] = self.bar.add_task(p.label, total=p.epochs, state="")
        rest = f"stopped: {p.terminated}" if p.terminated else f"ETA {clock(p.eta)}"
        self.bar.update(self.tasks[p.label], completed=p.epoch,
                        state=f"epoch {p.epoch}/{p.epochs}  loss {p.loss:.4f}  {rest}")


# Who shows a training's progress while it runs inside an orchestrator's run, by entry point:
# the library never imports Prefect (tasks/progress.py registers it).
REPORTERS: Registry[Any] = Registry("progress reporter", "nasflow.reporters")


def prefect_progress() -> OnEpoch | None:
    """A fresh artifact reporter when running inside a Prefect run, else None (Prefect not
    imported means not in one: nothing is loaded for it)."""
    if "prefect" not in sys.modules:
        return None
    reporter = REPORTERS.get("prefect")
    return reporter() if reporter.active() else None

"""Per-epoch progress of a candidate's training, and the two places it is shown.

Why: one candidate trains for minutes to hours (NB201: 200 epochs), and
silence during long work is a bug.  Both engines call `on_epoch` once per
finished epoch, when they read the epoch's loss anyway (no extra device
synchronisation).  `nas train` draws it (`EpochDisplay`); inside a Prefect
task or flow run it becomes one progress artifact per candidate's training
(`PrefectProgress`), which the UI shows live.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable
from uuid import UUID

log = logging.getLogger(__name__)


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
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

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


def prefect_key(text: str) -> str:
    """`text` as a Prefect artifact key: lowercase letters, digits and dashes only (`ofa_mbv3` -> `ofa-mbv3`)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def artifact_key(label: str) -> str:
    """The key of the progress artifact naming the training."""
    return "train-" + prefect_key(label)[:80]


class PrefectProgress:
    """One Prefect progress artifact per candidate's training (keyed by its label), created at
    its first epoch and updated at most once a second and at its last; outside a Prefect run,
    or when the API refuses, nothing (one logged line), since progress must never fail a training."""

    def __init__(self, min_interval: float = 1.0) -> None:
        self.min_interval = min_interval
        self.ids: dict[str, UUID] = {}
        self.last: dict[str, float] = {}
        self.broken = False

    @staticmethod
    def active() -> bool:
        """In a Prefect task or flow run? (Prefect not imported means not in one, cheaply.)"""
        if "prefect" not in sys.modules:
            return False
        from prefect.context import FlowRunContext, TaskRunContext

        return TaskRunContext.get() is not None or FlowRunContext.get() is not None

    def __call__(self, p: EpochProgress) -> None:
        final = p.terminated is not None or p.epoch >= p.epochs
        now = time.monotonic()
        if self.broken or (p.label in self.ids and not final and now - self.last[p.label] < self.min_interval):
            return
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        progress, text = round(100.0 * p.epoch / p.epochs, 2), f"{p.label}: {p.summary()}"
        try:
            if p.label in self.ids:
                update_progress_artifact(self.ids[p.label], progress, description=text)
            else:
                self.ids[p.label] = create_progress_artifact(progress, key=artifact_key(p.label), description=text)
        except Exception as exc:  # noqa: BLE001 - a progress report must never fail the training
            self.broken = True
            log.warning("training progress artifacts disabled: %s: %s", type(exc).__name__, exc)
        self.last[p.label] = now


def prefect_progress() -> PrefectProgress | None:
    """A fresh artifact reporter when running inside a Prefect run, else None."""
    return PrefectProgress() if PrefectProgress.active() else None

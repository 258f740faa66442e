"""Training progress in the Prefect UI: one progress artifact per candidate's training,
found by `nas.train.progress.prefect_progress` through its reporter table."""

from __future__ import annotations

import logging
import re
import sys
import time
from uuid import UUID

from nas.lazy import LazyImport
from nas.train.progress import REPORTERS, EpochProgress

# Prefect, for a run inside a flow only (a plain run never loads it)
prefect_context = LazyImport("prefect.context")
artifacts = LazyImport("prefect.artifacts")

log = logging.getLogger(__name__)


def prefect_key(text: str) -> str:
    """`text` as a Prefect artifact key: lowercase letters, digits and dashes only (`ofa_mbv3` -> `ofa-mbv3`)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def artifact_key(label: str) -> str:
    """The key of the progress artifact naming the training."""
    return "train-" + prefect_key(label)[:80]


@REPORTERS.register("prefect")
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

        context = prefect_context
        return context.TaskRunContext.get() is not None or context.FlowRunContext.get() is not None

    def __call__(self, p: EpochProgress) -> None:
        final = p.terminated is not None or p.epoch >= p.epochs
        now = time.monotonic()
        if self.broken or (p.label in self.ids and not final and now - self.last[p.label] < self.min_interval):
            return

        progress, text = round(100.0 * p.epoch / p.epochs, 2), f"{p.label}: {p.summary()}"
        try:
            if p.label in self.ids:
                artifacts.update_progress_artifact(self.ids[p.label], progress, description=text)
            else:
                self.ids[p.label] = artifacts.create_progress_artifact(progress, key=artifact_key(p.label),
                                                                       description=text)
        except Exception as exc:  # noqa: BLE001 - a progress report must never fail the training
            self.broken = True
            log.warning("training progress artifacts disabled: %s: %s", type(exc).__name__, exc)
        self.last[p.label] = now

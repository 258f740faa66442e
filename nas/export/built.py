"""What rebuilding a trial produces, whichever branch (trusted or sandboxed) built it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from nas.core.trial import SELF_REPORTED


@dataclass
class Built:
    """The network (None when built in the sandbox), its input shape, source text and
    what it is, and where the weights came from (the manifest's `weights` entry)."""

    net: nn.Module | None
    shape: tuple[int, ...]
    source: str
    source_kind: str
    weights: dict[str, Any]
    num_classes: int


def training_seed(ev: Any, spec: Any) -> int:
    """The seed a retraining uses: the evaluator's first (the one the search trained under), else the run's."""
    return ev.seeds[0] if ev.seeds else spec.seed


def note_retraining(weights: dict[str, Any], result: Any, ev: Any, say: Callable[[str], None],
                    self_reported: bool = False) -> None:
    """Record a retraining's outcome (a `TrainResult` under `ev`'s recipe) in the manifest's weights entry;
    `self_reported`: the model trained inside the sandbox and its own code reported these numbers."""

    say(f"retrained: valid {result.valid_accuracy:.2f}%, test {result.test_accuracy:.2f}% "
        f"({result.epochs} epochs, {result.wall_seconds:.1f} s)" + (f", {SELF_REPORTED}" if self_reported else ""))
    weights.update(origin="retrained", recipe=ev.recipe.to_dict(), engine=ev.engine.to_dict(),
                   valid_accuracy=result.valid_accuracy, test_accuracy=result.test_accuracy,
                   loss_curve=result.loss_curve)
    if self_reported:
        weights.update(self_reported=True, note=f"the model could not be exported as a graph, so it retrained "
                                                f"inside the sandbox: its accuracies, loss curve, params and "
                                                f"FLOPs are {SELF_REPORTED}")

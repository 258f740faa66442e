"""What rebuilding a trial produces, whichever branch (trusted or sandboxed) built it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn


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


def note_retraining(weights: dict[str, Any], result: Any, ev: Any, say: Callable[[str], None]) -> None:
    """Record a retraining's outcome (a `TrainResult` under `ev`'s recipe) in the manifest's weights entry."""
    say(f"retrained: valid {result.valid_accuracy:.2f}%, test {result.test_accuracy:.2f}% "
        f"({result.epochs} epochs, {result.wall_seconds:.1f} s)")
    weights.update(origin="retrained", recipe=ev.recipe.to_dict(), engine=ev.engine.to_dict(),
                   valid_accuracy=result.valid_accuracy, test_accuracy=result.test_accuracy,
                   loss_curve=result.loss_curve)

"""Stop candidates that are clearly failing, and say why.

NADER reports that 19.2 % of its designs never converge and that it shows in
the first epochs' loss; training them for 200 epochs wastes most of a
search's budget.  Two rules, thresholds from the recipe: a non-finite loss
stops at once; a loss that has not dropped by `min_loss_drop` of the first
epoch's value by epoch `patience_epochs` stops there.
"""

from __future__ import annotations

import math

import pytorch_lightning as pl

from nas.train.module import Classifier
from nas.train.recipe import Recipe


def failing(losses: list[float], recipe: Recipe) -> str | None:
    """The epoch-level rule, shared by both training paths: why to stop now, or None."""
    if recipe.stop_on_nan and losses and not math.isfinite(losses[-1]):
        return f"non-finite loss at epoch {len(losses)}"
    if len(losses) != recipe.patience_epochs or len(losses) < 2:
        return None
    first, last = losses[0], losses[-1]
    if not last <= first * (1 - recipe.min_loss_drop):
        return (f"loss not improving: {last:.4f} at epoch {len(losses)} vs {first:.4f} at epoch 1 "
                f"(needs a {recipe.min_loss_drop:.0%} drop)")
    return None


class FailingRunStop(pl.Callback):
    def on_train_batch_end(self, trainer: pl.Trainer, module: Classifier, outputs, batch, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if not module.recipe.stop_on_nan or loss is None:
            return
        bad = not math.isfinite(float(loss))
        if trainer.world_size > 1:  # every rank must stop together
            bad = trainer.strategy.reduce_boolean_decision(bad, all=False)
        if bad:
            module.stopped = f"non-finite loss at epoch {trainer.current_epoch + 1}, batch {batch_idx + 1}"
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Classifier) -> None:
        module.finish_epoch()
        reason = None if module.stopped else failing(module.epoch_losses, module.recipe)
        if reason:
            module.stopped = reason
            trainer.should_stop = True

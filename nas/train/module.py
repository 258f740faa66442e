"""The LightningModule: any nn.Module classifier trained with a `Recipe`."""

from __future__ import annotations

import math

import pytorch_lightning as pl
import torch
from torch import nn

from nas.train.optim import sgd_cosine
from nas.train.recipe import Recipe


class Classifier(pl.LightningModule):
    def __init__(self, model: nn.Module, recipe: Recipe):
        super().__init__()
        self.model = model
        self.recipe = recipe
        self.loss = nn.CrossEntropyLoss()
        self.epoch_losses: list[float] = []  # mean training loss per epoch (the loss curve)
        self._sum = 0.0
        self._count = 0
        self.stopped: str | None = None  # why training was terminated early, if it was

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch, batch_idx: int):
        x, y = batch
        loss = self.loss(self(x), y)
        value = float(loss.detach())
        self._sum += value * len(y)
        self._count += len(y)
        return loss

    def finish_epoch(self) -> None:
        """Close the epoch's loss average; idempotent, because callbacks' epoch-end
        hooks run before the module's and early termination needs the value.
        Under DDP the average is over all ranks, so every rank takes the same
        early-termination decision (one rank stopping alone would hang the rest)."""
        if self._count and self.trainer.world_size > 1:
            total = self.trainer.strategy.reduce(torch.tensor([self._sum, float(self._count)],
                                                              device=self.device), reduce_op="sum")
            self._sum, self._count = float(total[0]), int(total[1])
        if self._count:
            mean = self._sum / self._count
            self.epoch_losses.append(mean if math.isfinite(mean) else float("nan"))
            self._sum, self._count = 0.0, 0

    def on_train_epoch_end(self) -> None:
        self.finish_epoch()

    def _accuracy(self, batch, name: str) -> None:
        x, y = batch
        logits = self(x)
        sync = self.trainer.world_size > 1
        self.log(f"{name}_acc", (logits.argmax(1) == y).float().mean(), on_epoch=True, prog_bar=False,
                 batch_size=len(y), sync_dist=sync)
        self.log(f"{name}_loss", self.loss(logits, y), on_epoch=True, batch_size=len(y), sync_dist=sync)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._accuracy(batch, "valid")

    def test_step(self, batch, batch_idx: int) -> None:
        self._accuracy(batch, "test")

    def configure_optimizers(self):
        opt, sched = sgd_cosine(self.recipe, self.parameters(), int(self.trainer.estimated_stepping_batches))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

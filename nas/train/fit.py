"""Train one model with a recipe and report what a search needs to know."""

from __future__ import annotations

import logging
import time
import warnings

import pytorch_lightning as pl
from torch import nn

from nas.data.module import ImageDataModule
from nas.data.sources import ImageData
from nas.measure import count_flops, count_params
from nas.train.early_stop import FailingRunStop
from nas.train.engine import Engine
from nas.train.module import Classifier
from nas.train.progress import EpochProgress, OnEpoch
from nas.train.recipe import Recipe
from nas.train.result import TrainResult

__all__ = ["TrainResult", "train"]


def _quiet() -> None:
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")


class EpochReport(pl.Callback):
    """`on_epoch` after each epoch, on rank 0; after FailingRunStop in the callback list, so
    the epoch's loss and any termination are known."""

    def __init__(self, on_epoch: OnEpoch, label: str) -> None:
        self.on_epoch, self.label, self.start = on_epoch, label, 0.0

    def on_train_start(self, trainer: pl.Trainer, module: Classifier) -> None:
        self.start = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, module: Classifier) -> None:
        module.finish_epoch()
        if trainer.is_global_zero and module.epoch_losses:
            self.on_epoch(EpochProgress(self.label, len(module.epoch_losses), module.recipe.epochs,
                                        module.epoch_losses[-1], time.perf_counter() - self.start, module.stopped))


def train(model: nn.Module, data: ImageData, recipe: Recipe, seed: int, engine: Engine = Engine(),
          on_epoch: OnEpoch | None = None, label: str = "candidate 1") -> TrainResult:
    """Fit on train, pick nothing on valid (fixed epochs, as NB201), report valid and test accuracy;
    `on_epoch` hears of each finished epoch.

    With `engine.devices > 1` Lightning trains with DDP, relaunching this
    process's command line once per extra rank: call it from a process whose
    command line does exactly this training (`nas.train.worker`)."""
    _quiet()
    start = time.perf_counter()
    pl.seed_everything(seed, workers=True, verbose=False)
    c, h, w = data.shape
    params, flops = count_params(model), count_flops(model, (1, c, h, w))
    dm = ImageDataModule(data, recipe.batch_size, recipe.flip, recipe.crop, recipe.train_subset,
                         recipe.valid_subset, recipe.test_subset, seed)
    module = Classifier(model, recipe)
    trainer = pl.Trainer(
        max_epochs=recipe.epochs, accelerator=engine.accelerator, devices=engine.devices,
        strategy="ddp" if engine.devices > 1 else "auto", deterministic=True,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[FailingRunStop(), *([EpochReport(on_epoch, label)] if on_epoch else [])],
        check_val_every_n_epoch=recipe.epochs,
    )
    device_start = time.perf_counter()
    trainer.fit(module, datamodule=dm)
    valid = test = None  # terminated early: nothing measured
    if not module.stopped:
        valid = round(100 * float(trainer.validate(module, datamodule=dm, verbose=False)[0]["valid_acc"]), 4)
        test = round(100 * float(trainer.test(module, datamodule=dm, verbose=False)[0]["test_acc"]), 4)
    device_seconds = time.perf_counter() - device_start
    return TrainResult(
        valid_accuracy=valid, test_accuracy=test, loss_curve=module.epoch_losses,
        epochs=len(module.epoch_losses), terminated=module.stopped,
        wall_seconds=round(time.perf_counter() - start, 3), device_seconds=round(device_seconds, 3),
        params=params, flops=flops, device=str(trainer.strategy.root_device), world_size=trainer.world_size,
    )

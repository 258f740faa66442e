"""One entry point for training, whichever engine: what evaluators and the sandbox call."""

from __future__ import annotations

from torch import nn

from nas.data.sources import ImageData
from nas.train.engine import Engine
from nas.train.progress import OnEpoch
from nas.train.recipe import Recipe
from nas.train.result import TrainResult


def train_many(models: list[nn.Module], data: ImageData, recipe: Recipe, seed: int, engine: Engine,
               on_epoch: OnEpoch | None = None, labels: list[str] | None = None) -> list[TrainResult]:
    """Train each model (the fast engine trains `engine.concurrent` of them together),
    reporting each finished epoch to `on_epoch` under the model's label."""
    labels = labels or [f"candidate {i + 1}" for i in range(len(models))]
    if engine.kind == "fast":
        from nas.train.fast import train_fast  # lazy: loads pytorch_lightning (start-up time)

        return train_fast(models, data, recipe, seed, engine, on_epoch, labels)
    from nas.train.fit import train  # lazy: loads pytorch_lightning (start-up time)

    return [train(m, data, recipe, seed, engine, on_epoch, label) for m, label in zip(models, labels)]


def train_one(model: nn.Module, data: ImageData, recipe: Recipe, seed: int, engine: Engine,
              on_epoch: OnEpoch | None = None, label: str = "candidate 1") -> TrainResult:
    return train_many([model], data, recipe, seed, engine, on_epoch, [label])[0]

"""One entry point for training, whichever engine: what evaluators and the sandbox call."""

from __future__ import annotations

from torch import nn

from nas.data.sources import ImageData
from nas.train.engine import Engine
from nas.train.recipe import Recipe
from nas.train.result import TrainResult


def train_many(models: list[nn.Module], data: ImageData, recipe: Recipe, seed: int,
               engine: Engine) -> list[TrainResult]:
    """Train each model (the fast engine trains `engine.concurrent` of them together)."""
    if engine.kind == "fast":
        from nas.train.fast import train_fast

        return train_fast(models, data, recipe, seed, engine)
    from nas.train.fit import train

    return [train(m, data, recipe, seed, engine) for m in models]


def train_one(model: nn.Module, data: ImageData, recipe: Recipe, seed: int, engine: Engine) -> TrainResult:
    return train_many([model], data, recipe, seed, engine)[0]

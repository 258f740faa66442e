"""Evaluate by training: the candidate is built, trained with a recipe and scored.

The objective is validation accuracy (test accuracy is recorded, never used
to choose).  Results depend on the seed, the data and the recipe, all of
which enter the cache key; early-terminated candidates are recorded as
failures with the reason, so strategies skip them and the cache keeps them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

from nas.arch.base import Architecture, stable_hash
from nas.data.sources import SOURCES, ImageData
from nas.errors import ConfigError, EvaluationError
from nas.evaluators.base import EVALUATORS, EvalResult, Evaluator
from nas.spaces.base import SearchSpace
from nas.train.recipe import Recipe


@lru_cache(maxsize=2)
def load_data(name: str, root: str | None = None, split_file: str | None = None) -> ImageData:
    """One load per process and dataset, however many evaluators (or Prefect tasks) ask."""
    return SOURCES[name](root=root, split_file=split_file)


@EVALUATORS.register("train")
class TrainEvaluator(Evaluator):
    spaces = ("nb201",)
    uses_seed = True

    def __init__(self, space: SearchSpace, data: dict[str, Any], recipe: dict[str, Any], channels: int = 16,
                 cells_per_stage: int = 5, accelerator: str = "cpu") -> None:
        super().__init__(space)
        if not isinstance(data, dict) or data.get("name") not in SOURCES:
            got = data.get("name") if isinstance(data, dict) else data
            raise ConfigError(f"data: unknown dataset '{got}' (valid: {', '.join(SOURCES)})")
        if not isinstance(recipe, dict):
            raise ConfigError(f"recipe must be a mapping of recipe settings, got {recipe!r}")
        self.data_cfg = dict(data)
        unknown = sorted(set(self.data_cfg) - {"name", "root", "split_file"})
        if unknown:
            raise ConfigError(f"data: unknown key '{unknown[0]}' (valid: name, root, split_file)")
        self.recipe = Recipe.from_dict(recipe)
        self.channels, self.cells_per_stage, self.accelerator = channels, cells_per_stage, accelerator
        self.data = load_data(**self.data_cfg)  # a missing dataset fails here, before any trial

    def fingerprint(self) -> str:
        # Data is identified by its config (name, root, split file); loading it here would cost seconds.
        return stable_hash("train", self.data_cfg, self.recipe.to_dict(), self.channels, self.cells_per_stage)

    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        from nas.train.fit import train  # Lightning loads only when something trains

        data = self.data
        seed = 0 if seed is None else seed
        torch.manual_seed(seed)  # the initial weights are part of what the seed fixes
        try:
            net = arch.to_module(channels=self.channels, cells_per_stage=self.cells_per_stage,
                                 num_classes=data.num_classes, in_channels=data.shape[0])
        except (ValueError, RuntimeError) as exc:
            raise EvaluationError(f"{arch}: cannot build the network ({exc})") from None
        r = train(net, data, self.recipe, seed, self.accelerator)
        metrics = {"valid_accuracy": r.valid_accuracy, "test_accuracy": r.test_accuracy,
                   "epochs": float(r.epochs), "device_seconds": r.device_seconds}
        if r.loss_curve:
            metrics["final_train_loss"] = r.loss_curve[-1]
        result = EvalResult(accuracy=r.valid_accuracy, metrics=metrics, params=r.params, flops=r.flops,
                            cost_seconds=r.wall_seconds, curve=r.loss_curve)
        if r.terminated:
            result.accuracy, result.error = None, f"terminated early: {r.terminated}"
        return result

"""Simulated training cost: the NB201 table's scores, returned after a heavy-tailed sleep
(lognormal, or Pareto), as real training durations are; to measure how runners keep
workers busy (benchmarks/scale_out.py) without training. The duration is drawn from the
architecture's key and `seed`, so a candidate takes the same time in every run."""

from __future__ import annotations

import time
import zlib

import numpy as np

from nas.core.arch import Architecture
from nas.core.space import SearchSpace
from nas.errors import ConfigError
from nas.evaluators.base import EVALUATORS, EvalResult
from nas.evaluators.table import TableEvaluator

DISTRIBUTIONS = ("lognormal", "pareto")


@EVALUATORS.register("simulated")
class SimulatedEvaluator(TableEvaluator):
    def __init__(self, space: SearchSpace, path: str | None = None, metric: str = "baseline_accuracy",
                 num_classes: int = 10, resolution: int = 32, distribution: str = "lognormal",
                 median_seconds: float = 1.0, sigma: float = 1.0, pareto_alpha: float = 1.5,
                 time_scale: float = 1.0, seed: int = 0) -> None:
        super().__init__(space, path, metric, num_classes, resolution)
        if distribution not in DISTRIBUTIONS:
            raise ConfigError(f"evaluator.distribution: expected one of {', '.join(DISTRIBUTIONS)}, "
                              f"got {distribution!r}")
        for name, value in (("median_seconds", median_seconds), ("sigma", sigma),
                            ("pareto_alpha", pareto_alpha), ("time_scale", time_scale)):
            if not value > 0:
                raise ConfigError(f"evaluator.{name}: expected a number > 0, got {value!r}")
        self.distribution, self.median_seconds, self.sigma = distribution, median_seconds, sigma
        self.pareto_alpha, self.time_scale, self.seed = pareto_alpha, time_scale, seed

    def duration(self, arch: Architecture) -> float:
        """Simulated training seconds of `arch` (before `time_scale`): same key, same duration."""
        rng = np.random.default_rng([self.seed, zlib.crc32(arch.key().encode())])
        if self.distribution == "lognormal":
            return float(self.median_seconds * np.exp(self.sigma * rng.standard_normal()))
        # Pareto with scale x_m chosen so its median is median_seconds: x_m * 2^(1/alpha).
        x_m = self.median_seconds / 2 ** (1 / self.pareto_alpha)
        return float(x_m * (1 + rng.pareto(self.pareto_alpha)))

    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        simulated = self.duration(arch)
        time.sleep(simulated * self.time_scale)
        result = super().evaluate(arch, seed)
        result.cost_seconds = simulated
        result.metrics["simulated_seconds"] = round(simulated, 6)
        return result

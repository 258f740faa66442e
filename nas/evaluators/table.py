"""Tabular evaluator: a space's benchmark table (NB201's analog-nasbench CIFAR-10 results)
looked up, not trained. It scores any space that has a table (`SearchSpace.tabular`), asked
of the space, not its name; params and FLOPs are the table's costs at its settings."""

from __future__ import annotations

import time

from nas.core.arch import Architecture
from nas.core.space import SearchSpace
from nas.core.trial import EvalResult
from nas.errors import ConfigError
from nas.evaluators.base import EVALUATORS, Evaluator


@EVALUATORS.register("table")
class TableEvaluator(Evaluator):
    @classmethod
    def accepts(cls, space: type[SearchSpace]) -> bool:
        return space.tabular

    def __init__(self, space: SearchSpace, path: str | None = None,
                 metric: str = "baseline_accuracy", num_classes: int = 10,
                 resolution: int = 32, simulated_cost_seconds: float = 0.0) -> None:
        super().__init__(space)
        if isinstance(simulated_cost_seconds, bool) or not simulated_cost_seconds >= 0:
            raise ConfigError(f"evaluator.simulated_cost_seconds must be >= 0, got {simulated_cost_seconds!r}")
        self.metric = metric
        self.num_classes = num_classes
        self.resolution = resolution
        self.simulated_cost_seconds = simulated_cost_seconds
        self.table = space.benchmark(path, metric, num_classes, resolution)

    def fingerprint(self) -> str:
        return f"{self.table.fingerprint()}:{self.num_classes}:{self.resolution}"

    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        start = time.perf_counter()
        accuracy = self.table.score(arch)
        cost = self.table.cost(arch)
        if self.simulated_cost_seconds > 0:
            # Emulates a training cost, to measure caching/resume/orchestration.
            time.sleep(self.simulated_cost_seconds)
        return EvalResult(accuracy=accuracy, metrics={self.metric: accuracy}, params=cost.params,
                          flops=cost.flops, cost_seconds=time.perf_counter() - start)

"""Simulated training cost: the NB201 table's scores, returned after a heavy-tailed sleep
(lognormal, or Pareto), as real training durations are; to measure how runners keep
workers busy (benchmarks/scale_out.py) without training. The duration is drawn from the
architecture's key and `seed`, so a candidate takes the same time in every run.
`SimulatedClock` runs it on simulated time instead: same order of completions, no waiting."""

from __future__ import annotations

import heapq
import time
import zlib
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from nas.core.arch import Architecture
from nas.core.space import SearchSpace
from nas.core.trial import EvalResult
from nas.errors import ConfigError
from nas.evaluators.base import EVALUATORS
from nas.evaluators.table import TableEvaluator

if TYPE_CHECKING:
    from nas.core.trial import Candidate

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

    def fingerprint(self) -> str:
        """The table's, plus what sets the durations (`time_scale` only changes the wait)."""
        return (f"simulated:{super().fingerprint()}:{self.distribution}:{self.median_seconds}:{self.sigma}:"
                f"{self.pareto_alpha}:{self.seed}")

    def duration(self, arch: Architecture) -> float:
        """Simulated training seconds of `arch` (before `time_scale`): same key, same duration."""
        rng = np.random.default_rng([self.seed, zlib.crc32(arch.key().encode())])
        if self.distribution == "lognormal":
            return float(self.median_seconds * np.exp(self.sigma * rng.standard_normal()))
        # Pareto with scale x_m chosen so its median is median_seconds: x_m * 2^(1/alpha).
        x_m = self.median_seconds / 2 ** (1 / self.pareto_alpha)
        return float(x_m * (1 + rng.pareto(self.pareto_alpha)))

    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        time.sleep(self.duration(arch) * self.time_scale)
        return self.score(arch)

    def score(self, arch: Architecture) -> EvalResult:
        """The result without the wait; `cost_seconds` is the simulated duration."""
        simulated = self.duration(arch)
        result = super().evaluate(arch)
        result.cost_seconds = simulated
        result.metrics["simulated_seconds"] = round(simulated, 6)
        return result


class SimulatedClock:
    """An `AsyncExecutor` (and batch `Executor`) on simulated time, in this process: `workers`
    evaluations run at once and finish in the order their simulated durations say, without
    sleeping; `now` is the simulated time and `busy` the summed evaluation time (utilisation =
    busy / (workers * now)). Lets a benchmark replay many asynchronous searches in seconds."""

    def __init__(self, evaluator: SimulatedEvaluator, workers: int) -> None:
        self.evaluator, self.workers = evaluator, workers
        self.now = self.busy = 0.0
        self._queue: deque[tuple[int, Candidate]] = deque()
        self._events: list[tuple[float, int, int, EvalResult, float]] = []  # (finish, order, ticket, result, dur)
        self._order = 0

    def submit(self, ticket: int, candidate: Candidate) -> None:
        self._queue.append((ticket, candidate))
        self._start()

    def next_done(self) -> tuple[int, tuple[EvalResult, bool, float]]:
        finish, _, ticket, result, duration = heapq.heappop(self._events)
        self.now = finish
        self._start()
        return ticket, (result, False, duration)

    def evaluate(self, candidates: list[Candidate]) -> list[tuple[EvalResult, bool, float]]:
        for i, cand in enumerate(candidates):
            self.submit(i, cand)
        done = dict(self.next_done() for _ in candidates)
        return [done[i] for i in range(len(candidates))]

    def close(self) -> None:
        self._queue.clear()
        self._events.clear()

    def _start(self) -> None:
        while self._queue and len(self._events) < self.workers:
            ticket, cand = self._queue.popleft()
            duration = self.evaluator.duration(cand.arch)
            self.busy += duration
            self._order += 1
            heapq.heappush(self._events, (self.now + duration, self._order, ticket,
                                          self.evaluator.score(cand.arch), duration))

"""Predictor-guided local search (BANANAS, White et al. 2021): after a random start, each
step mutates the best architectures found so far into a pool of unseen neighbours, scores
the pool with an ensemble predictor fitted on every evaluated candidate, and proposes the
neighbours with the highest expected improvement. The predictor is refitted at each ask
from the history (not stored: `restore` rebuilds the data, the RNG makes the fit identical)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nas.core.space import CategoricalSpace, SearchSpace
from nas.errors import ConfigError, EncodingError, RunDirError
from nas.search.predictor import EnsemblePredictor, PredictorSettings, expected_improvement
from nas.search.record import TrialRecord
from nas.strategies.base import STRATEGIES, Candidate, Deduplicating, Strategy, Trial


@STRATEGIES.register("bananas")
class Bananas(Deduplicating, Strategy):
    asynchronous = True

    def __init__(self, space: SearchSpace, seed: int, n_init: int = 10, pool: int = 100, parents: int = 10,
                 members: int = 5, epochs: int = 300, max_attempts: int = 100) -> None:
        super().__init__(space, seed)
        if not isinstance(space, CategoricalSpace):
            raise ConfigError(f"strategy 'bananas' needs a categorical space (its predictor reads decisions), "
                              f"not '{space.name}'")
        for name, value in (("n_init", n_init), ("pool", pool), ("parents", parents)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"strategy 'bananas': {name} must be an integer >= 1, got {value!r}")
        self.cat: CategoricalSpace = space
        self.n_init, self.pool, self.parents, self.max_attempts = n_init, pool, parents, max_attempts
        self.settings = PredictorSettings(members=members, epochs=epochs)
        self.data: list[tuple[Any, float]] = []  # (encoding, accuracy) of every evaluated candidate
        self._init_seen()

    @classmethod
    def random_start(cls, params: dict[str, Any]) -> int:
        return int(params.get("n_init", 10))

    def ask(self, n: int) -> list[Candidate]:
        if len(self.data) < self.n_init:
            return [self._random() for _ in range(n)]
        neighbours = self._neighbours()
        if not neighbours:
            return [self._random() for _ in range(n)]
        predictor = EnsemblePredictor.fitted(self.cat, [e for e, _ in self.data], [a for _, a in self.data],
                                             self.settings, self.rng)
        mean, std = predictor.predict_archs(self.cat, [a for a, _ in neighbours])
        score = expected_improvement(mean, std, max(a for _, a in self.data))
        out = []
        for i in np.argsort(-score, kind="stable")[:n]:
            arch, parent = neighbours[int(i)]
            self.seen.add(arch)
            out.append(Candidate(arch, {"origin": "predicted", "parent": parent,
                                        "predicted": round(float(mean[i]), 4), "ei": round(float(score[i]), 6)}))
        while len(out) < n:  # fewer neighbours than asked for: fill at random
            out.append(self._random())
        return out

    def _neighbours(self) -> list[tuple[Any, str]]:
        """Up to `pool` unseen, feasible mutations of the `parents` best architectures."""
        best = sorted(self.data, key=lambda d: -d[1])[: self.parents]
        parents = [self.space.decode(e) for e, _ in best]
        out: list[tuple[Any, str]] = []
        keys: set[str] = set()
        for attempt in range(self.pool * self.max_attempts // 10):
            if len(out) >= self.pool:
                break
            parent = parents[attempt % len(parents)]
            child = self.space.mutate(parent, self.rng)
            if child in self.seen or child.key() in keys or not self.feasible(child):
                continue
            keys.add(child.key())
            out.append((child, parent.key()))
        return out

    def _random(self) -> Candidate:
        arch = self._fresh(lambda: self.space.sample(self.rng), self.max_attempts * 10)
        if arch is None:
            raise self._none_fresh("bananas", self.max_attempts * 10)
        self.seen.add(arch)
        return Candidate(arch, {"origin": "random"})

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            self.seen.add(t.candidate.arch)
            if t.record.ok and t.record.accuracy is not None:
                self.data.append((t.candidate.arch.encode(), float(t.record.accuracy)))

    def restore(self, history: list[TrialRecord]) -> None:
        super().restore(history)
        self.data = []
        for r in history:
            if r.ok and r.accuracy is not None:
                try:
                    self.space.decode(r.encoding)
                except EncodingError as err:
                    raise RunDirError(f"trial {r.trial}: {err}") from None
                self.data.append((r.encoding, float(r.accuracy)))

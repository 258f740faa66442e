"""Predictor-guided local search (BANANAS, White et al. 2021): after a random start, each
step mutates the best architectures found so far into a pool of unseen neighbours, scores
the pool with an ensemble predictor fitted on every evaluated candidate, and proposes the
neighbours with the highest expected improvement. The predictor is kept across asks and
only adds each new trial to its fit (`EnsemblePredictor.fit_on`: from scratch on the first
`n_init`, then a warm-started step block per trial); after a restart it replays the same
fits from the history, so a resumed search proposes what the uninterrupted one would."""

from __future__ import annotations

from typing import Any

import numpy as np

from nas.core.space import CategoricalSpace, SearchSpace
from nas.core.trial import Candidate, Trial, TrialRecord
from nas.errors import ConfigError, EncodingError, RunDirError
from nas.strategies.base import STRATEGIES, Deduplicating, Strategy
from nas.strategies.predictor import EnsemblePredictor, PredictorSettings, expected_improvement


@STRATEGIES.register("bananas")
class Bananas(Deduplicating, Strategy):
    asynchronous = True
    CACHE = 20_000  # cells kept before the cache starts over (a few tens of MB of features at most)

    def __init__(self, space: SearchSpace, seed: int, n_init: int = 10, pool: int = 100, parents: int = 10,
                 members: int = 5, epochs: int = 300, steps: int = 10, batch: int = 32,
                 max_attempts: int = 100) -> None:
        super().__init__(space, seed)
        if not isinstance(space, CategoricalSpace):
            raise ConfigError(f"strategy 'bananas' needs a categorical space (its predictor reads decisions), "
                              f"not '{space.name}'")
        for name, value in (("n_init", n_init), ("pool", pool), ("parents", parents)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"strategy 'bananas': {name} must be an integer >= 1, got {value!r}")
        self.cat: CategoricalSpace = space
        self.seed = seed
        self.n_init, self.pool, self.parents, self.max_attempts = n_init, pool, parents, max_attempts
        self.settings = PredictorSettings(members=members, epochs=epochs, steps=steps, batch=batch)
        self.predictor = EnsemblePredictor(self.settings)
        self.history: list[TrialRecord] = []  # every evaluated candidate with an accuracy, as told
        self.sizes = np.array([len(d.choices) for d in self.cat.decisions()])
        # decision indices -> (architecture, key, features): the best cells' neighbours recur from ask to ask
        self.cells: dict[tuple[int, ...], tuple[Any, str, np.ndarray]] = {}
        self._init_seen()
        self.known: set[tuple[int, ...]] = set()  # cells found in `seen` (which only grows until a restore)

    @classmethod
    def random_start(cls, params: dict[str, Any]) -> int:
        return int(params.get("n_init", 10))

    def ask(self, n: int) -> list[Candidate]:
        if len(self.history) < max(2, self.n_init):
            return [self._random() for _ in range(n)]
        neighbours = self._neighbours()
        if not neighbours:
            return [self._random() for _ in range(n)]
        self.predictor.fit_on(self.cat, self.history, self.seed, start=self.n_init)
        mean, std = self.predictor.predict(np.stack([f for _, _, f in neighbours]))
        score = expected_improvement(mean, std, max(float(r.accuracy or 0.0) for r in self.history))
        out = []
        for i in np.argsort(-score, kind="stable")[:n]:
            arch, parent, _ = neighbours[int(i)]
            self.seen.add(arch)
            out.append(Candidate(arch, {"origin": "predicted", "parent": parent,
                                        "predicted": round(float(mean[i]), 4), "ei": round(float(score[i]), 6)}))
        while len(out) < n:  # fewer neighbours than asked for: fill at random
            out.append(self._random())
        return out

    def _neighbours(self) -> list[tuple[Any, str, np.ndarray]]:
        """Up to `pool` unseen, feasible mutations of the `parents` best architectures, with the
        parent's key and the features. Drawn `pool` at a time as index arrays (one decision
        changed to another of its choices, as `CategoricalSpace.mutate`), so a round is a few
        numpy calls and one dictionary look-up per child, not a decode and an encoding."""
        best = sorted(self.history, key=lambda r: -float(r.accuracy or 0.0))[: self.parents]
        parents = [self.space.decode(r.encoding) for r in best]
        keys = [p.key() for p in parents]
        indices = np.array([self.cat.to_indices(p) for p in parents])
        mutable = np.flatnonzero(self.sizes > 1)
        out: list[tuple[Any, str, np.ndarray]] = []
        if not len(mutable):
            return out
        taken: set[str] = set()
        for start in range(0, self.pool * self.max_attempts // 10, self.pool):
            which = np.arange(start, start + self.pool) % len(parents)
            decision = mutable[self.rng.integers(len(mutable), size=self.pool)]
            size = self.sizes[decision]
            children = indices[which]
            rows = np.arange(self.pool)
            children[rows, decision] = (children[rows, decision] + 1 + self.rng.integers(0, size - 1)) % size
            for child, parent in zip(map(tuple, children.tolist()), which.tolist()):
                if child in self.known:
                    continue
                arch, key, features = self._cell(child)
                if key in self.seen and arch in self.seen:
                    self.known.add(child)
                    continue
                if key in taken or not self.feasible(arch):
                    continue
                taken.add(key)
                out.append((arch, keys[parent], features))
                if len(out) >= self.pool:
                    return out
        return out

    def _cell(self, indices: tuple[int, ...]) -> tuple[Any, str, np.ndarray]:
        hit = self.cells.get(indices)
        if hit is None:
            if len(self.cells) >= self.CACHE:
                self.cells.clear()
            arch = self.cat.from_indices(list(indices))
            hit = self.cells[indices] = (arch, arch.key(), np.asarray(self.cat.features(arch), dtype=float))
        return hit

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
                self.history.append(t.record)

    def state_dict(self) -> dict[str, Any]:
        """The predictor's seed with the RNG: a resumed search replays the same fits."""
        return {**super().state_dict(), "predictor_seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        seed = state.get("predictor_seed", self.seed)  # a run dir from before the seed was kept: the spec's
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise RunDirError(f"strategy 'bananas' state: predictor_seed must be an integer, got {seed!r}")
        self.seed = seed

    def restore(self, history: list[TrialRecord]) -> None:
        super().restore(history)
        self.known = set()
        self.history = []
        for r in history:
            if r.ok and r.accuracy is not None:
                try:
                    self.space.decode(r.encoding)
                except EncodingError as err:
                    raise RunDirError(f"trial {r.trial}: {err}") from None
                self.history.append(r)

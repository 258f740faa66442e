"""Regularised evolution (Real et al., 2019): tournament selection over an
age-ordered population; each child mutates one decision of the tournament
winner and replaces the oldest member."""

from __future__ import annotations

from collections import deque
from typing import Any

from nas.core.space import SearchSpace
from nas.core.trial import Candidate, SearchExhausted, Trial
from nas.errors import ConfigError, RunDirError
from nas.strategies.base import STRATEGIES, Deduplicating, Strategy

POPULATION_SIZE = 20


@STRATEGIES.register("rea")
class RegularizedEvolution(Deduplicating, Strategy):
    asynchronous = True

    def __init__(self, space: SearchSpace, seed: int, population_size: int = POPULATION_SIZE,
                 sample_size: int = 5, unique: bool = True, max_attempts: int = 100) -> None:
        super().__init__(space, seed)
        if population_size < 1 or sample_size < 1:
            raise ConfigError(
                f"strategy 'rea': population_size and sample_size must be >= 1, "
                f"got {population_size} and {sample_size}"
            )
        self.population_size = population_size
        self.sample_size = sample_size
        self.unique = unique
        self.max_attempts = max_attempts
        self.population: deque[tuple[Any, str, float]] = deque()  # (encoding, key, accuracy), oldest first
        self.pending_init = 0
        self._init_seen()

    @classmethod
    def random_start(cls, params: dict[str, Any]) -> int:
        return int(params.get("population_size", POPULATION_SIZE))  # children only once it is full

    def ask(self, n: int) -> list[Candidate]:
        out = []
        for _ in range(n):
            if len(self.population) + self.pending_init < self.population_size or not self.population:
                cand = self._random()
                self.pending_init += 1
            else:
                cand = self._child()
            if self.unique:
                self.seen.add(cand.arch)
            out.append(cand)
        return out

    def _random(self) -> Candidate:
        arch = self._unique(lambda: self.space.sample(self.rng))
        return Candidate(arch, {"origin": "init"})

    def _child(self) -> Candidate:
        idx = self.rng.integers(len(self.population), size=self.sample_size)  # with replacement, as in Real et al.
        enc, parent_key, _ = max((self.population[int(i)] for i in idx), key=lambda m: m[2])
        parent = self.space.decode(enc)
        arch = self._draw(lambda: self.space.mutate(parent, self.rng), self.max_attempts)
        if arch is None:  # neighbourhood exhausted: restart from a fresh random point
            return Candidate(self._unique(lambda: self.space.sample(self.rng)), {"origin": "random"})
        return Candidate(arch, {"origin": "mutation", "parent": parent_key})

    def _unique(self, make):
        arch = self._draw(make, self.max_attempts * 10)
        if arch is None:
            if not self.unique:
                raise SearchExhausted(f"rea: none of {self.max_attempts * 10} sampled architectures meets the "
                                      "constraint; loosen constraint.flops/constraint.params")
            raise self._none_fresh("rea", self.max_attempts * 10)
        return arch

    def _draw(self, make, attempts: int):
        """The first `make()` that meets the constraint (and is unseen, with `unique`); None if none
        does: `unique: false` allows repeats, never a candidate over the constraint."""
        if self.unique:
            return self._fresh(make, attempts)
        return next((arch for arch in (make() for _ in range(attempts)) if self.feasible(arch)), None)

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            if t.candidate.info.get("origin") == "init":
                self.pending_init = max(0, self.pending_init - 1)
            self.seen.add(t.candidate.arch)
            if not t.record.ok or t.record.accuracy is None:
                continue
            self.population.append((t.candidate.arch.encode(), t.candidate.arch.key(), t.record.accuracy))
            while len(self.population) > self.population_size:
                self.population.popleft()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "population": [list(m) for m in self.population],
                "pending_init": self.pending_init}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            self.population = deque((enc, key, float(acc)) for enc, key, acc in state["population"])
            self.pending_init = int(state["pending_init"])
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"strategy 'rea' state: malformed population ({err})") from None

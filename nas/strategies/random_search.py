"""Random search: uniform samples, optionally without repeats."""

from __future__ import annotations

from nas.core.space import SearchSpace
from nas.core.trial import Candidate, SearchExhausted, Trial
from nas.strategies.base import STRATEGIES, Deduplicating, Strategy


@STRATEGIES.register("random")
class RandomSearch(Deduplicating, Strategy):
    asynchronous = True

    def __init__(self, space: SearchSpace, seed: int, unique: bool = True,
                 max_attempts: int = 1000) -> None:
        super().__init__(space, seed)
        self.unique = unique
        self.max_attempts = max_attempts
        self._init_seen()

    def ask(self, n: int) -> list[Candidate]:
        out: list[Candidate] = []
        for _ in range(n):
            if self.unique:
                arch = self._fresh(lambda: self.space.sample(self.rng), self.max_attempts)
                if arch is None:
                    if out:
                        break
                    raise self._none_fresh("random", self.max_attempts)
                self.seen.add(arch)
            else:  # repeats allowed, never a candidate over the constraint
                arch = next((a for a in (self.space.sample(self.rng) for _ in range(self.max_attempts))
                             if self.feasible(a)), None)
                if arch is None:
                    if out:
                        break
                    raise SearchExhausted(f"random: none of {self.max_attempts} sampled architectures meets the "
                                          "constraint; loosen constraint.flops/constraint.params")
            out.append(Candidate(arch, {"origin": "random"}))
        return out

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            self.seen.add(t.candidate.arch)

"""Random search: uniform samples, optionally without repeats."""

from __future__ import annotations

from typing import Any

from nas.errors import RunDirError
from nas.core.space import SearchSpace
from nas.strategies.base import STRATEGIES, Candidate, SearchExhausted, Strategy, Trial, VisitedMixin


@STRATEGIES.register("random")
class RandomSearch(VisitedMixin, Strategy):
    def __init__(self, space: SearchSpace, seed: int, unique: bool = True,
                 max_attempts: int = 1000) -> None:
        super().__init__(space, seed)
        self.unique = unique
        self.max_attempts = max_attempts
        self._init_visited()

    def ask(self, n: int) -> list[Candidate]:
        out = []
        for _ in range(n):
            if self.unique:
                arch = self._fresh(lambda: self.space.sample(self.rng), self.max_attempts)
                if arch is None:
                    if out:
                        break
                    raise SearchExhausted(f"random: no unvisited architecture in {self.max_attempts} samples")
                self.visited.add(arch.key())
            else:
                arch = self.space.sample(self.rng)
            out.append(Candidate(arch, {"origin": "random"}))
        return out

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            self.visited.add(t.candidate.arch.key())

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "visited": sorted(self.visited)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            self.visited = set(state.get("visited", []))
        except TypeError as err:
            raise RunDirError(f"strategy 'random' state: malformed visited set ({err})") from None

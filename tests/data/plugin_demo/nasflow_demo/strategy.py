"""`ordered`: walks a categorical space's architectures in value order, every `stride`-th one,
so that a run's trials are predictable from outside (the plugin test checks them)."""

from __future__ import annotations

import itertools

from nas.core.space import SearchSpace
from nas.core.trial import Candidate, Trial
from nas.strategies.base import STRATEGIES, Strategy


@STRATEGIES.register("ordered")
class Ordered(Strategy):
    def __init__(self, space: SearchSpace, seed: int, stride: int = 1) -> None:
        super().__init__(space, seed)
        self.stride = stride
        self.asked = 0

    def ask(self, n: int) -> list[Candidate]:
        decisions = [d.choices for d in self.space.decisions()]
        picks = itertools.islice(itertools.product(*decisions), self.asked * self.stride, None, self.stride)
        out = [Candidate(self.space.from_values(list(v)), {"origin": "ordered"}) for v in itertools.islice(picks, n)]
        self.asked += len(out)
        return out

    def tell(self, trials: list[Trial]) -> None:
        pass

    def state_dict(self) -> dict:
        return {**super().state_dict(), "asked": self.asked}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.asked = state["asked"]

"""NAS-Bench-201: 5 ops on each of 6 edges, 15,625 cells."""

from __future__ import annotations

from typing import Any

import numpy as np

from nas.arch.nb201 import EDGES, OPS, NB201Cell
from nas.spaces.base import SPACES, SearchSpace


@SPACES.register("nb201")
class NB201Space(SearchSpace):
    def __init__(self, channels: int = 16, cells_per_stage: int = 5) -> None:
        self.channels = channels
        self.cells_per_stage = cells_per_stage

    def sample(self, rng: np.random.Generator) -> NB201Cell:
        return NB201Cell(tuple(OPS[i] for i in rng.integers(0, len(OPS), size=len(EDGES))))

    def mutate(self, arch: NB201Cell, rng: np.random.Generator) -> NB201Cell:
        edge = int(rng.integers(len(EDGES)))
        choices = [op for op in OPS if op != arch.ops[edge]]
        ops = list(arch.ops)
        ops[edge] = choices[int(rng.integers(len(choices)))]
        return NB201Cell(tuple(ops))

    def decode(self, encoding: Any) -> NB201Cell:
        return NB201Cell.decode(encoding)

    def size(self) -> int:
        return len(OPS) ** len(EDGES)

"""The screening scorers' base and registry (`nas.search.screen` screens with them): here, below both
the search and the packages that register a scorer (`nas.proxies.screen`), so that neither imports the other."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from nas.core.arch import Architecture
from nas.core.registry import Registry
from nas.core.space import SearchSpace
from nas.core.trial import TrialRecord


class Scorer(ABC):
    """Higher is better. `score` sees the run's history so far (learned scorers fit on it)
    and a seed fixed by the run's seed and the history's length."""

    name: ClassVar[str]

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    @abstractmethod
    def score(self, archs: list[Architecture], history: list[TrialRecord], seed: int) -> list[float]:
        """One finite score per architecture, in their order."""


SCORERS: Registry[Scorer] = Registry("scorer", "nasflow.scorers")

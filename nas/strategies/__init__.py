"""Search strategies as ask/tell objects with `state_dict()` for resume."""

from nas.strategies.base import STRATEGIES, Candidate, Strategy, Trial
from nas.strategies import collm, evolution, fairnad, nader, random_search, rea, reinforce  # noqa: F401  (registers)

__all__ = ["STRATEGIES", "Candidate", "Strategy", "Trial"]

"""Search strategies as ask/tell objects with `state_dict()` for resume."""

from nas.strategies.base import STRATEGIES, Candidate, Strategy, Trial  # modules imported on first use

__all__ = ["STRATEGIES", "Candidate", "Strategy", "Trial"]

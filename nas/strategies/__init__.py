"""Search strategies as ask/tell objects with `state_dict()` for resume (the trial types they
ask and are told, `Candidate` and `Trial`, are in `nas.core.trial`)."""

from nas.strategies.base import STRATEGIES, Strategy  # modules imported on first use

__all__ = ["STRATEGIES", "Strategy"]

"""Evaluators turn an architecture into metrics (tabular, supernet, training); the result
record, `EvalResult`, is in `nas.core.trial`."""

from nas.evaluators.base import EVALUATORS, Evaluator  # modules imported on first use

__all__ = ["EVALUATORS", "Evaluator"]

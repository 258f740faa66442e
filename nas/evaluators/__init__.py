"""Evaluators turn an architecture into metrics (tabular, supernet, training)."""

from nas.evaluators.base import EVALUATORS, EvalResult, Evaluator  # modules imported on first use

__all__ = ["EVALUATORS", "EvalResult", "Evaluator"]

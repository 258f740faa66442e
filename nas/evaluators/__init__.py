"""Evaluators turn an architecture into metrics (tabular, supernet, training)."""

from nas.evaluators.base import EVALUATORS, EvalResult, Evaluator
from nas.evaluators import supernet, table, train  # noqa: F401  (registers)

__all__ = ["EVALUATORS", "EvalResult", "Evaluator"]

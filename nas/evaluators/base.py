"""Evaluator API: what turns an architecture into an `EvalResult` (nas.core.trial)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from nas.core.arch import Architecture
from nas.core.registry import Registry
from nas.core.space import SPACES, SearchSpace
from nas.core.trial import EvalResult
from nas.errors import NasError

if TYPE_CHECKING:
    from torch import nn


class Evaluator(ABC):
    name: str  # set by the registry
    uses_seed: bool = False  # whether results depend on the seed (an instance may say, from its settings)
    # Whether it scores by training the network with its own data, recipe, engine and seeds
    # (which export repeats to rebuild the weights it keeps none of).
    trains: ClassVar[bool] = False

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    @classmethod
    @abstractmethod
    def accepts(cls, space: type[SearchSpace]) -> bool:
        """Whether it scores `space`'s architectures, asked of the space's capabilities (what it
        builds, whether it has a supernet), not of its name: a new space needs no evaluator edit."""

    @classmethod
    def spaces(cls) -> list[str]:
        """The registered spaces it scores (for error messages: imports every space module)."""

        return [n for n in SPACES.names() if cls.accepts(SPACES.get(n))]

    @classmethod
    def space_settings(cls, space: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Settings of `space` that this evaluator's configuration `params` fixes (the supernet
        evaluator's checkpoint fixes OFA's width): a space setting left null in the config takes
        them (`nas.search.spec.build_space`). Empty by default."""
        return {}

    @abstractmethod
    def fingerprint(self) -> str:
        """Identity of everything that determines results (data, recipe);
        part of cache keys so a changed table or recipe never hits old entries."""

    @abstractmethod
    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        """Evaluate one architecture; raise `EvaluationError` for deterministic
        failures (they are recorded, cached and not retried)."""

    def weights(self, arch: Architecture) -> nn.Module | None:
        """The trained network for `arch` when this evaluator holds one (a supernet's subnet with
        its inherited weights), else None: training evaluators keep no weights (export retrains,
        see `trains`), a table has none."""
        return None

    def provenance(self, arch: Architecture) -> dict[str, Any]:
        """Where `weights(arch)`'s weights come from (a checkpoint's path and sha256, the settings
        that shaped them), for export's manifest, so it records their origin without knowing which
        evaluator gave them. Raises a one-line `NasError` when the stored weights changed since they
        were made. Empty when the evaluator holds no weights."""
        return {}

    def prepare(self, show: bool) -> None:
        """Work done once before the first trial (e.g. proxy's reference sample): called before
        the search's bar starts, so a status line (`show`) says what it is instead of a still 0/N."""

    @property
    def batched(self) -> bool:
        """Whether `evaluate_batch` is faster than one `evaluate` per candidate."""
        return False

    def evaluate_batch(self, archs: list[Architecture], seed: int | None = None) -> list[EvalResult]:
        """Evaluate several candidates together; deterministic failures become failure results."""
        return [evaluate_safely(self, arch, seed) for arch in archs]


def evaluate_safely(evaluator: Evaluator, arch: Architecture, seed: int | None) -> EvalResult:
    """Deterministic failures become failure results; nothing is raised."""
    start = time.perf_counter()
    try:
        return evaluator.evaluate(arch, seed)
    except NasError as err:
        return EvalResult.failure(str(err), time.perf_counter() - start)


EVALUATORS: Registry[Evaluator] = Registry("evaluator", "nasflow.evaluators")

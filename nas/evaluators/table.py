"""Tabular evaluator: NB201 CIFAR-10 test accuracy of all 15,625 cells from
the `analog-nasbench` package, read without importing that package (its
loader needs `pkg_resources`, which current setuptools no longer ships).

The table is NB201's benchmark, so this evaluator takes the NB201 space (by
type); params and FLOPs are the space's cost model at the table's settings."""

from __future__ import annotations

import hashlib
import importlib.util
import pickle
import time
from functools import lru_cache
from pathlib import Path

from nas.core.space import SearchSpace
from nas.errors import ConfigError, EvaluationError, MissingDependencyError
from nas.evaluators.base import EVALUATORS, EvalResult, Evaluator
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell
from nas.spaces.nb201.space import NB201Space

INSTALL_HINT = "pip install analog-nasbench==0.1.3"
SCALAR_METRICS = ("baseline_accuracy", "ptq_accuracy", "qat_accuracy", "noisy_accuracy",
                  "analog_accuracy")


class _Record:
    """Stand-in for analognasbench's pickled classes: keeps their attributes."""

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


class _TableUnpickler(pickle.Unpickler):
    """Only the two record classes may be constructed; anything else is refused."""

    def find_class(self, module: str, name: str):
        if module == "analognasbench.data" and name in ("Architecture", "DriftMeasurement"):
            return _Record
        raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")


def default_table_path() -> Path:
    spec = importlib.util.find_spec("analognasbench")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"table evaluator needs the analog-nasbench package: {INSTALL_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data.anb"


@lru_cache(maxsize=4)
def load_table(path: str, metric: str) -> dict[tuple[int, ...], float]:
    """Map analog-nasbench 6-tuple → metric value (percent)."""
    p = Path(path)
    if not p.is_file():
        raise MissingDependencyError(f"NB201 table not found at {p}: {INSTALL_HINT}")
    try:
        with open(p, "rb") as fh:
            raw = _TableUnpickler(fh).load()
        table = {tuple(k): float(getattr(v, metric)) for k, v in raw.items()}
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, OverflowError, MemoryError) as err:
        raise MissingDependencyError(
            f"NB201 table {p} is unreadable ({type(err).__name__}: {err}); reinstall: {INSTALL_HINT}"
        ) from None
    if len(table) != len(OPS) ** len(EDGES):
        raise MissingDependencyError(
            f"NB201 table {p} has {len(table)} cells, expected {len(OPS) ** len(EDGES)}"
        )
    return table


@EVALUATORS.register("table")
class TableEvaluator(Evaluator):
    @classmethod
    def accepts(cls, space: type[SearchSpace]) -> bool:
        return space is NB201Space  # the table holds this network's cells: a subclass may change it

    def __init__(self, space: NB201Space, path: str | None = None,
                 metric: str = "baseline_accuracy", num_classes: int = 10,
                 resolution: int = 32, simulated_cost_seconds: float = 0.0) -> None:
        super().__init__(space)
        if metric not in SCALAR_METRICS:
            raise ConfigError(
                f"evaluator 'table': unknown metric '{metric}' (valid: {', '.join(SCALAR_METRICS)})"
            )
        self.path = Path(path).expanduser().resolve() if path else default_table_path()
        self.metric = metric
        self.num_classes = num_classes
        self.resolution = resolution
        self.simulated_cost_seconds = simulated_cost_seconds
        self.table = load_table(str(self.path), metric)
        self.space: NB201Space = space
        space.cost_at(NB201Cell(("none",) * len(EDGES)), num_classes, resolution)  # measures the cost model now

    def fingerprint(self) -> str:
        return f"{_file_sha256(str(self.path))[:16]}:{self.metric}:{self.num_classes}:{self.resolution}"

    def evaluate(self, arch: NB201Cell, seed: int | None = None) -> EvalResult:
        if not isinstance(arch, NB201Cell):
            raise EvaluationError(f"table evaluator takes NB201 cells, got {type(arch).__name__}")
        start = time.perf_counter()
        try:
            accuracy = self.table[arch.to_anb_tuple()]
        except KeyError:
            raise EvaluationError(f"cell {arch.to_string()} is not in the table") from None
        cost = self.space.cost_at(arch, self.num_classes, self.resolution)
        if self.simulated_cost_seconds > 0:
            # Emulates a training cost, to measure caching/resume/orchestration.
            time.sleep(self.simulated_cost_seconds)
        return EvalResult(accuracy=accuracy, metrics={self.metric: accuracy}, params=cost.params,
                          flops=cost.flops, cost_seconds=time.perf_counter() - start)


@lru_cache(maxsize=8)
def _file_sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

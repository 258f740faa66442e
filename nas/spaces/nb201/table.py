"""NB201's benchmark table: CIFAR-10 results of all 15,625 cells from the `analog-nasbench`
package, read without importing that package (its loader needs `pkg_resources`, which current
setuptools no longer ships). The space offers it (`NB201Space.benchmark`), so evaluator=table
scores any space with a table without naming this one."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import logging
import os
import pickle
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nas.core.space import Cost
from nas.errors import ConfigError, EvaluationError, MissingDependencyError
from nas.home import home
from nas.io import atomic_write_bytes
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell

if TYPE_CHECKING:
    from nas.spaces.nb201.space import NB201Space

log = logging.getLogger(__name__)
INSTALL_HINT = "pip install analog-nasbench==0.1.3"
DERIVED_FORMAT = 1  # the layout of a table's derived file (`derived_table_key`): a new one is written when it changes
SCALAR_METRICS = ("baseline_accuracy", "ptq_accuracy", "qat_accuracy", "noisy_accuracy",
                  "analog_accuracy")


class _Record:
    """Stand-in for analognasbench's pickled classes: keeps their attributes. No `__setstate__`:
    the unpickler then fills `__dict__` itself, in C (a third faster on the table's 140,625 records)."""


class _TableUnpickler(pickle.Unpickler):
    """Only the two record classes may be constructed; anything else is refused."""

    def find_class(self, module: str, name: str) -> type:
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


def _stamp(path: str) -> tuple[int, int]:
    """(mtime_ns, size) of `path`, part of the caches' keys: a table replaced in place (a long-lived
    `nas serve` worker, a test) is read again instead of answering from the old one."""
    try:
        st = os.stat(path)
    except OSError:
        return 0, -1
    return st.st_mtime_ns, st.st_size


def load_table(path: str, metric: str) -> dict[tuple[int, ...], float]:
    """Map analog-nasbench 6-tuple → metric value (percent)."""
    return _load_table(path, metric, *_stamp(path))


def derived_dir() -> Path:
    """Where derived tables live: a folder of their own under NASFLOW_HOME (its `cache/` is Prefect's
    result store, whose every file is read as a result record)."""
    return home() / "tables" / "nb201"


@lru_cache(maxsize=4)
def _load_table(path: str, metric: str, mtime_ns: int, size: int) -> dict[tuple[int, ...], float]:
    """The table from its derived file when one was written for these bytes and metric (a 13 ms
    read instead of the pickle's 230), else from the pickle, writing the derived file for next time."""
    p = Path(path)
    if not p.is_file():
        raise MissingDependencyError(f"NB201 table not found at {p}: {INSTALL_HINT}")
    derived = derived_dir() / f"{derived_table_key(_sha256(path, mtime_ns, size), metric)}.npz"
    table = _read_derived(derived)
    if table is None:
        table = _unpickle(p, metric)
        _write_derived(derived, table)
    return table


def derived_table_key(sha256: str, metric: str) -> str:
    """A derived file's name: the table file's bytes (their sha256), the metric and the layout."""
    return f"{sha256[:32]}-{metric}-v{DERIVED_FORMAT}"


def _read_derived(path: Path) -> dict[tuple[int, ...], float] | None:
    """The derived file's table when it holds one whole (every cell once, each op an index), else
    None: the table is then read from the pickle."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            keys, values = npz["keys"], npz["values"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
        if not isinstance(err, FileNotFoundError):
            log.debug("NB201 derived table %s unreadable (%s): reading the table itself", path, err)
        return None
    cells = len(OPS) ** len(EDGES)
    if keys.shape != (cells, len(EDGES)) or keys.dtype != np.uint8 or values.shape != (cells,) \
            or values.dtype != np.float64 or int(keys.max()) >= len(OPS):
        log.debug("NB201 derived table %s is not a whole table: reading the table itself", path)
        return None
    table = dict(zip(map(tuple, keys.tolist()), values.tolist()))
    return table if len(table) == cells else None


def _write_derived(path: Path, table: dict[tuple[int, ...], float]) -> None:
    if any(len(k) != len(EDGES) or not all(0 <= op < len(OPS) for op in k) for k in table):
        return  # not cells of op indices: nothing `_read_derived` would take back
    buf = io.BytesIO()
    np.savez(buf, keys=np.array(list(table), dtype=np.uint8), values=np.array(list(table.values()), dtype=np.float64))
    try:
        atomic_write_bytes(path, buf.getvalue(), sync=False)  # derived: a lost one is derived again
    except OSError as err:  # a read-only or full home: the pickle is read every time
        log.debug("NB201 derived table not written: %s", err)


def _unpickle(p: Path, metric: str) -> dict[tuple[int, ...], float]:
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


@dataclass(frozen=True)
class NB201Table:
    """The table's `metric` for every cell (a `nas.core.space.Benchmark`), priced by the space's cost
    model for `num_classes` classes at `resolution`² inputs."""

    space: NB201Space
    path: Path
    metric: str
    scores: dict[tuple[int, ...], float]
    num_classes: int
    resolution: int

    @classmethod
    def load(cls, space: NB201Space, path: str | None, metric: str, num_classes: int,
             resolution: int) -> NB201Table:
        if metric not in SCALAR_METRICS:
            raise ConfigError(
                f"evaluator 'table': unknown metric '{metric}' (valid: {', '.join(SCALAR_METRICS)})"
            )
        where = Path(path).expanduser().resolve() if path else default_table_path()
        table = cls(space, where, metric, load_table(str(where), metric), num_classes, resolution)
        table.cost(NB201Cell(("none",) * len(EDGES)))  # measures the cost model now
        return table

    def score(self, arch: NB201Cell) -> float:
        if not isinstance(arch, NB201Cell):
            raise EvaluationError(f"table evaluator takes NB201 cells, got {type(arch).__name__}")
        try:
            return self.scores[arch.to_anb_tuple()]
        except KeyError:
            raise EvaluationError(f"cell {arch.to_string()} is not in the table") from None

    def cost(self, arch: NB201Cell) -> Cost:
        return self.space.cost_at(arch, self.num_classes, self.resolution)

    def fingerprint(self) -> str:
        return f"{_file_sha256(str(self.path))[:16]}:{self.metric}"


def _file_sha256(path: str) -> str:
    return _sha256(path, *_stamp(path))


@lru_cache(maxsize=8)
def _sha256(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()

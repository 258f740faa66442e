"""Pareto tools for FairNAD's stage II ("Pareto-aware mutation").

Top-k parent sampling overlooks compact models that are accurate for their
size, so stage II picks parents with NSGA-II (Deb et al. 2002): fast
non-dominated sorting, then crowding distance to break the last front. Each
parent then gets an upscaling idea while any hardware budget is under-used
(below 0.9·τ, paper Table 5) and a hyper-parameter idea otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Points = np.ndarray | Sequence[Sequence[float]]


@dataclass(frozen=True)
class Objective:
    """One axis of the trade-off; `maximize` says which direction is better."""

    name: str
    maximize: bool


# FairNAD's objectives: accuracy against the two hardware budgets it searches under.
FAIRNAD_OBJECTIVES = (
    Objective("accuracy", maximize=True),
    Objective("params", maximize=False),
    Objective("flops", maximize=False),
)


def _finite(points: Points, m: int) -> np.ndarray:
    """Points as a finite (n, m) float array; a NaN or inf would make every
    comparison false and silently put the row on the Pareto front."""
    arr = np.asarray(points, dtype=float)
    if arr.size == 0:
        return np.empty((0, m))
    if arr.ndim != 2 or arr.shape[1] != m:
        raise ValueError(f"points must have shape (n, {m}) to match maximize, got {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr).all(axis=1))
    if bad.size:
        raise ValueError(f"row {bad[0]} has a non-finite value: {arr[bad[0]].tolist()}")
    return arr


def _as_minimisation(points: Points, maximize: Sequence[bool]) -> np.ndarray:
    """Maximised columns negated, so one comparison rule serves all objectives."""
    arr = _finite(points, len(maximize))
    return np.where(np.asarray(maximize, dtype=bool), -arr, arr)


def dominates(a: Sequence[float], b: Sequence[float], maximize: Sequence[bool]) -> bool:
    """True if `a` is no worse than `b` in every objective and better in one."""
    if len(a) != len(b):
        raise ValueError(f"a and b have different lengths ({len(a)} and {len(b)})")
    pa, pb = _as_minimisation([a, b], maximize)
    return bool(np.all(pa <= pb) and np.any(pa < pb))


def non_dominated_sort(points: Points, maximize: Sequence[bool]) -> list[list[int]]:
    """Fronts of row indices, front 0 the Pareto front (each ascending).

    Deb's fast non-dominated sort, vectorised: one n×n domination matrix,
    then each front is the rows no longer dominated once earlier fronts are
    removed. Identical rows never dominate each other and share a front.
    """
    p = _as_minimisation(points, maximize)
    n = len(p)
    no_worse = np.ones((n, n), dtype=bool)
    better = np.zeros((n, n), dtype=bool)
    for col in p.T:  # dom[i, j]: row i dominates row j
        no_worse &= col[:, None] <= col[None, :]
        better |= col[:, None] < col[None, :]
    dom = no_worse & better
    dominated_by = dom.sum(axis=0)
    assigned = np.zeros(n, dtype=bool)
    fronts: list[list[int]] = []
    while not assigned.all():
        front = np.flatnonzero((dominated_by == 0) & ~assigned)
        assigned[front] = True
        dominated_by -= dom[front].sum(axis=0)
        fronts.append(front.tolist())
    return fronts


def crowding_distance(points: Points, front: list[int]) -> dict[int, float]:
    """NSGA-II crowding distance of each index in `front`, within that front.

    Per objective, the points at its minimum or maximum are boundaries (inf,
    so the extremes of the trade-off are kept); every other point adds the gap
    between its sorted neighbours divided by the objective's range in the
    front. An objective with zero range has no boundary and adds 0. Direction
    does not matter here, so no `maximize` is needed. Fronts of one or two
    points are all boundary.
    """
    if len(front) <= 2:
        return {i: math.inf for i in front}
    p = _finite(points, np.shape(points)[-1])[front]
    dist = np.zeros(len(front))
    for col in p.T:
        lo, hi = col.min(), col.max()
        if hi == lo:
            continue
        order = np.argsort(col, kind="stable")  # ties keep front order
        gaps = (col[order[2:]] - col[order[:-2]]) / (hi - lo)
        dist[order[1:-1]] += gaps
        dist[(col == lo) | (col == hi)] = math.inf
    return {i: float(d) for i, d in zip(front, dist)}


def nsga2_select(points: Points, maximize: Sequence[bool], k: int) -> list[int]:
    """The k indices NSGA-II keeps, in the order it ranks them: whole fronts
    first, then the front that does not fit by descending crowding distance
    (ties by index), which favours spread along the trade-off."""
    fronts = non_dominated_sort(points, maximize)
    n = sum(map(len, fronts))
    if not 0 <= k <= n:
        raise ValueError(f"k must be between 0 and the number of points ({n}), got {k}")
    chosen: list[int] = []
    for front in fronts:
        if len(chosen) + len(front) <= k:
            chosen.extend(front)
            continue
        dist = crowding_distance(points, front)
        chosen.extend(sorted(front, key=lambda i: (-dist[i], i))[: k - len(chosen)])
        break
    return chosen


def _check_budget(params: float, flops: float, max_params: float, max_flops: float) -> None:
    for name, limit in (("max_params", max_params), ("max_flops", max_flops)):
        if not (math.isfinite(limit) and limit > 0):
            raise ValueError(f"{name} must be a positive finite number, got {limit}")
    for name, value in (("params", params), ("flops", flops)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a non-negative finite number, got {value}")


def budget_usage(params: float, flops: float, max_params: float, max_flops: float) -> dict[str, float]:
    """Fraction of each hardware budget a model uses (1.0 = at the limit τ)."""
    _check_budget(params, flops, max_params, max_flops)
    return {"params": params / max_params, "flops": flops / max_flops}


def underused(params: float, flops: float, max_params: float, max_flops: float, ratio: float = 0.9) -> bool:
    """True if any budget is below ratio·τ: FairNAD then picks an upscaling
    idea (wider/deeper) instead of a hyper-parameter adjustment."""
    if not (math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"ratio must be a positive finite number, got {ratio}")
    return any(u < ratio for u in budget_usage(params, flops, max_params, max_flops).values())

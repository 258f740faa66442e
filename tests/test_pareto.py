"""NSGA-II pieces of FairNAD's Pareto-aware mutation: hand-checked examples,
then properties over random point sets (small integers, so ties and
duplicates are common)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nas.search.pareto import (
    FAIRNAD_OBJECTIVES,
    budget_usage,
    crowding_distance,
    dominates,
    non_dominated_sort,
    nsga2_select,
    underused,
)

MIN2 = [False, False]
ACC_PARAMS = [True, False]
FAIRNAD = [o.maximize for o in FAIRNAD_OBJECTIVES]  # accuracy ↑, params ↓, flops ↓


# -- dominates ---------------------------------------------------------------

def test_dominates_respects_direction():
    assert dominates([1, 1], [2, 2], MIN2)
    assert not dominates([2, 2], [1, 1], MIN2)
    assert dominates([0.9, 1e6], [0.8, 1e6], ACC_PARAMS)  # more accurate, same size
    assert not dominates([0.9, 2e6], [0.8, 1e6], ACC_PARAMS)  # trade-off
    assert not dominates([1, 2], [1, 2], MIN2)  # equal points do not dominate


def test_dominates_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="different lengths"):
        dominates([1, 2], [1, 2, 3], [False, False, False])


# -- non_dominated_sort ------------------------------------------------------

def test_sort_2d_minimise():
    # (1,4) (2,2) (4,1) trade off; (3,3) is dominated by (2,2); (4,4) by all of them.
    points = [[4, 4], [1, 4], [3, 3], [2, 2], [4, 1]]
    assert non_dominated_sort(points, MIN2) == [[1, 3, 4], [2], [0]]


def test_sort_2d_accuracy_vs_params():
    points = [
        [0.90, 2.0e6],  # 0: most accurate
        [0.85, 1.0e6],  # 1: compact, still good
        [0.80, 1.5e6],  # 2: dominated by 1
        [0.70, 0.5e6],  # 3: smallest
        [0.80, 2.0e6],  # 4: dominated by 0, 1 and 2
    ]
    assert non_dominated_sort(points, ACC_PARAMS) == [[0, 1, 3], [2], [4]]


def test_sort_3d_fairnad_objectives():
    points = [
        [0.90, 1.4e6, 0.19e9],  # 0: best accuracy
        [0.88, 0.8e6, 0.20e9],  # 1: fewest params among the accurate ones
        [0.88, 1.0e6, 0.10e9],  # 2: fewest FLOPs among the accurate ones
        [0.87, 1.0e6, 0.15e9],  # 3: dominated by 2 (less accurate, more FLOPs)
        [0.85, 1.4e6, 0.19e9],  # 4: dominated by 0 and 3
        [0.60, 0.3e6, 0.05e9],  # 5: tiny
    ]
    assert non_dominated_sort(points, FAIRNAD) == [[0, 1, 2, 5], [3], [4]]


def test_sort_keeps_duplicates_in_one_front():
    points = np.array([[1.0, 1.0], [0.0, 2.0], [1.0, 1.0], [2.0, 2.0], [2.0, 2.0]])
    assert non_dominated_sort(points, MIN2) == [[0, 1, 2], [3, 4]]


def test_sort_empty_input():
    assert non_dominated_sort([], MIN2) == []
    assert non_dominated_sort(np.empty((0, 3)), FAIRNAD) == []


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_sort_rejects_non_finite_rows_by_number(bad):
    with pytest.raises(ValueError, match=r"^row 2 has a non-finite value"):
        non_dominated_sort([[1, 2], [3, 4], [bad, 0]], MIN2)


def test_sort_rejects_wrong_width():
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        non_dominated_sort([[1, 2], [3, 4]], FAIRNAD)


# -- crowding_distance -------------------------------------------------------

def test_crowding_hand_checked():
    # One front on the line x + y = 4; x and y both span 4.
    points = [[0, 4], [1, 3], [3, 1], [4, 0], [9, 9]]
    d = crowding_distance(points, [0, 1, 2, 3])
    assert d[0] == d[3] == math.inf
    assert d[1] == pytest.approx(2 * (3 - 0) / 4)  # neighbours 0 and 3 in both objectives
    assert d[2] == pytest.approx(2 * (4 - 1) / 4)
    assert set(d) == {0, 1, 2, 3}


def test_crowding_zero_range_objective_adds_nothing():
    points = [[0, 5], [1, 5], [3, 5], [4, 5]]
    d = crowding_distance(points, [0, 1, 2, 3])
    assert d == {0: math.inf, 1: pytest.approx(3 / 4), 2: pytest.approx(3 / 4), 3: math.inf}


def test_crowding_small_and_degenerate_fronts():
    assert crowding_distance([[1, 2]], []) == {}
    assert crowding_distance([[1, 2], [2, 1]], [0, 1]) == {0: math.inf, 1: math.inf}
    # All identical: no objective has a range, so nothing is a boundary.
    assert crowding_distance([[1, 1]] * 3, [0, 1, 2]) == {0: 0.0, 1: 0.0, 2: 0.0}


# -- nsga2_select ------------------------------------------------------------

def test_select_whole_fronts_then_most_isolated():
    points = [
        [0, 5], [5, 0],  # front 0
        [1, 11], [2, 10.5], [10.5, 2], [11, 1], [6, 6],  # front 1
    ]
    assert non_dominated_sort(points, MIN2) == [[0, 1], [2, 3, 4, 5, 6]]
    # Front 1's crowding: 2 and 5 boundaries, 6 → 2 × 8.5/10, 3 and 4 → 2 × 5/10.
    assert crowding_distance(points, [2, 3, 4, 5, 6]) == pytest.approx(
        {2: math.inf, 3: 1.0, 4: 1.0, 5: math.inf, 6: 1.7})
    # Front 0, then front 1's boundaries (2, 5), its most isolated point (6), then 3 before 4.
    assert nsga2_select(points, MIN2, 5) == [0, 1, 2, 5, 6]
    assert nsga2_select(points, MIN2, 6) == [0, 1, 2, 5, 6, 3]
    assert nsga2_select(points, MIN2, 2) == [0, 1]
    assert nsga2_select(points, MIN2, 0) == []


def test_select_breaks_crowding_ties_by_index():
    points = [[0, 0], [1, 3], [2, 2], [3, 1], [4, 0]]  # front 1 is [1..4], evenly spaced
    # Boundaries 1 and 4 are inf, 2 and 3 tie → 2 first.
    assert nsga2_select(points, MIN2, 4) == [0, 1, 4, 2]


def test_select_rejects_k_out_of_range():
    with pytest.raises(ValueError, match="between 0 and the number of points"):
        nsga2_select([[1, 2], [2, 1]], MIN2, 3)
    with pytest.raises(ValueError, match="between 0 and the number of points"):
        nsga2_select([[1, 2]], MIN2, -1)


# -- budget helpers ----------------------------------------------------------

def test_budget_usage_fractions():
    assert budget_usage(0.75e6, 0.1e9, 1.5e6, 0.2e9) == {"params": 0.5, "flops": 0.5}


@pytest.mark.parametrize(
    ("params", "flops", "expected"),
    [
        (1.0e6, 0.19e9, True),   # params at 67 % of τ → upscale
        (1.45e6, 0.1e9, True),   # FLOPs at 50 % of τ → upscale
        (1.4e6, 0.19e9, False),  # both ≥ 90 % → hyper-parameter adjustment
        (1.35e6, 0.18e9, False), # exactly 0.9·τ is not under-used
        (1.5e6, 0.2e9, False),
    ],
)
def test_underused_switches_at_90_percent(params, flops, expected):
    assert underused(params, flops, 1.5e6, 0.2e9) is expected


def test_underused_custom_ratio():
    assert underused(1.0e6, 0.2e9, 1.5e6, 0.2e9, ratio=0.7)
    assert not underused(1.0e6, 0.2e9, 1.5e6, 0.2e9, ratio=0.5)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((1e6, 1e8, 0, 2e8), "max_params"),
        ((1e6, 1e8, 1.5e6, -1), "max_flops"),
        ((1e6, 1e8, math.nan, 2e8), "max_params"),
        ((-1, 1e8, 1.5e6, 2e8), "params"),
        ((1e6, math.inf, 1.5e6, 2e8), "flops"),
    ],
)
def test_budget_helpers_validate(args, name):
    for fn in (budget_usage, underused):
        with pytest.raises(ValueError, match=rf"^{name} must be") as err:
            fn(*args)
        assert "\n" not in str(err.value)


def test_underused_validates_ratio():
    with pytest.raises(ValueError, match="^ratio must be"):
        underused(1e6, 1e8, 1.5e6, 2e8, ratio=0)


# -- properties --------------------------------------------------------------

@st.composite
def point_sets(draw, min_size=0):
    m = draw(st.integers(1, 3))
    maximize = draw(st.lists(st.booleans(), min_size=m, max_size=m))
    rows = draw(st.lists(st.lists(st.integers(0, 4), min_size=m, max_size=m), min_size=min_size, max_size=25))
    return rows, maximize


PROPS = settings(max_examples=100, deadline=None)


@PROPS
@given(point_sets())
def test_prop_fronts_partition_and_order(data):
    rows, maximize = data
    fronts = non_dominated_sort(rows, maximize)
    flat = [i for f in fronts for i in f]
    assert sorted(flat) == list(range(len(rows)))  # each point in exactly one front
    assert all(f and f == sorted(f) for f in fronts)
    for i, front in enumerate(fronts):
        later = [q for f in fronts[i:] for q in f]
        for p in front:  # nothing in front i is dominated from front ≥ i ...
            assert not any(dominates(rows[q], rows[p], maximize) for q in later)
            if i:  # ... and something in front i-1 dominates it (fronts are tight)
                assert any(dominates(rows[q], rows[p], maximize) for q in fronts[i - 1])


@PROPS
@given(point_sets(min_size=1))
def test_prop_front0_mutually_non_dominated(data):
    rows, maximize = data
    front0 = non_dominated_sort(rows, maximize)[0]
    assert not any(dominates(rows[a], rows[b], maximize) for a in front0 for b in front0)


@PROPS
@given(point_sets(), st.randoms(use_true_random=False))
def test_prop_sort_independent_of_row_order(data, rnd):
    rows, maximize = data
    perm = list(range(len(rows)))
    rnd.shuffle(perm)
    fronts = non_dominated_sort([rows[p] for p in perm], maximize)
    assert [sorted(perm[i] for i in f) for f in fronts] == non_dominated_sort(rows, maximize)


@PROPS
@given(point_sets(min_size=1), st.data())
def test_prop_nsga2_select(data, draw):
    rows, maximize = data
    k = draw.draw(st.integers(0, len(rows)))
    chosen = nsga2_select(rows, maximize, k)
    assert len(chosen) == len(set(chosen)) == k
    assert all(0 <= i < len(rows) for i in chosen)
    fronts = non_dominated_sort(rows, maximize)
    if k >= len(fronts[0]):
        assert set(fronts[0]) <= set(chosen)
    # Whole fronts until one does not fit; from that one, the most crowded are left out.
    taken = set(chosen)
    cut = next((f for f in fronts if not set(f) <= taken), None)
    if cut is not None:
        earlier = {i for f in fronts[: fronts.index(cut)] for i in f}
        assert earlier <= taken <= earlier | set(cut)
        d = crowding_distance(rows, cut)
        assert min((d[i] for i in cut if i in taken), default=math.inf) >= max(d[i] for i in cut if i not in taken)


@PROPS
@given(point_sets(min_size=1))
def test_prop_crowding_boundaries_inf(data):
    rows, maximize = data
    arr = np.asarray(rows, dtype=float)
    for front in non_dominated_sort(rows, maximize):
        d = crowding_distance(rows, front)
        assert set(d) == set(front)
        assert all(v >= 0 for v in d.values())
        if len(front) <= 2:
            assert all(v == math.inf for v in d.values())
            continue
        for col in arr[front].T:
            if col.min() == col.max():
                continue
            for i, v in zip(front, col):
                if v in (col.min(), col.max()):
                    assert d[i] == math.inf


def test_a_model_with_no_params_or_flops_uses_none_of_the_budget():
    """Zero is a cost (a parameter-free cell), not an error: only negative or non-finite values are refused."""
    assert budget_usage(0, 0, 2e5, 1e7) == {"params": 0.0, "flops": 0.0}
    assert underused(0.0, 1e7, 2e5, 1e7)
    with pytest.raises(ValueError, match="params must be a non-negative finite number"):
        budget_usage(-1, 0, 2e5, 1e7)

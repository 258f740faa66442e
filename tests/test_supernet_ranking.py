"""benchmarks/supernet_ranking.py: the subnets it draws span the cost range, its bootstrap CI, and
its tiny mode end to end (so the script cannot rot; the full run is what the committed JSON holds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import supernet_ranking as bench  # noqa: E402

from conftest import space_preset  # noqa: E402
from nas.spaces import SPACES  # noqa: E402


def test_subnets_are_drawn_one_per_flops_bin_across_the_whole_range():
    """A plain random draw bunches around the median cost; one per quantile bin reaches both ends."""
    params = space_preset("spos_small")
    space = SPACES.create(params.pop("name"), params)
    pool_rng = np.random.default_rng(0)
    pool = sorted(space.cost(space.sample(pool_rng)).flops for _ in range(4000))
    picked = sorted(space.cost(a).flops for a in bench.pick_subnets(space, 10, seed=0))
    assert len(set(picked)) == 10
    assert picked[0] <= pool[len(pool) // 10] and picked[-1] >= pool[-len(pool) // 10]
    deciles = np.searchsorted(pool, picked) * 10 // len(pool)
    assert len(set(deciles.tolist())) >= 9  # about one per decile, not all near the middle


def test_the_bootstrap_ci_brackets_the_kendall_tau_and_narrows_with_agreement():
    rng = np.random.default_rng(1)
    truth = list(range(30))
    noisy = [t + rng.normal(0, 8) for t in truth]
    tau = bench.correlations(noisy, truth)["kendall"]
    low, high = bench.kendall_ci(noisy, truth, 500, seed=0)
    assert low < tau < high and high - low > 0.1
    assert bench.kendall_ci(truth, truth, 200, seed=0) == [1.0, 1.0]
    assert bench.correlations([1.0] * 5, [1, 2, 3, 4, 5]) == {"spearman": None, "kendall": None}


@pytest.mark.parametrize(("low", "tau", "flops_tau", "goals"), [
    (0.01, 0.3, 0.2, (True, True)),
    (0.0, 0.3, 0.3, (False, False)),  # at the boundary: a low end of 0 is not above it, a tie is not better
    (-0.2, 0.1, -0.1, (False, True)),
    (None, None, 0.1, (False, False)),  # constant scores: no tau
    (0.1, 0.4, None, (True, False)),
])
def test_space_goals_at_their_boundaries(low, tau, flops_tau, goals):
    space = {"kendall_ci": [low, 0.9], "kendall": tau, "flops_baseline": {"kendall": flops_tau}}
    assert tuple(bench.space_goals(space).values()) == goals
    assert list(bench.space_goals(space)) == ["kendall_low_above_zero", "above_flops"]


def test_tiny_run_writes_every_key_the_issue_asks_for(tmp_path):
    out = tmp_path / "ranking.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "supernet_ranking.py"), "--tiny",
                           "--work", str(tmp_path / "work"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    nb = report["nb201"]
    for scorer in ("supernet", "combined", "supernet_loss", "combined_loss", "vote", "params"):
        assert set(nb[scorer]) >= {"spearman", "kendall"}
    assert set(nb["goals_by_loss"]) == set(nb["goals"])
    assert nb["cells"] == bench.TINY.nb201_cells and nb["training"]["train_cpu_seconds"] > 0
    assert [v["variant"] for v in nb["variants"]][-1] == bench.TINY.nb201_final.name
    for name in bench.SPACES:
        row = report[name]
        assert len(row["kendall_ci"]) == 2 and row["subnets"] == bench.TINY.subnets == len(row["standalone"])
        assert len(row["variants"]) == len(bench.TINY.space_variants[name])
        assert len(row["flops_baseline"]["kendall_ci"]) == 2 and "kendall" in row["flops_baseline"]
        assert set(row["goals"]) == {"kendall_low_above_zero", "above_flops"}
        assert set(row["variants"][0]["by_loss"]) == {"spearman", "kendall", "kendall_ci"}
        assert row["supernet_cpu_seconds"] == bench.TINY.space_cpu_seconds  # not a full variant's budget
    assert report["tiny"] and report["cpu_seconds"]["total"] > 0 and report["load"]["nb201"]["cores"]
    assert out.with_suffix(".md").read_text().startswith("# Supernet ranking")
    assert out.with_suffix(".png").stat().st_size > 0
    trained = {p: p.stat().st_mtime_ns for p in (tmp_path / "work" / "supernets").glob("*/supernet.pt")}
    again = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "supernet_ranking.py"), "--tiny",
                            "--work", str(tmp_path / "work"), "--out", str(out), "--only", "nb201"],
                           cwd=ROOT, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in trained} == trained  # reused from --work, nothing retrained

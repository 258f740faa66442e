"""`nas compare` as a statistics report: paired Wilcoxon tests against a
baseline, Holm correction, Pareto fronts, the markdown/JSON report, the CLI
and the `+experiment=ablation` multirun preset."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT, run_nas
from nas import config
from nas.cli import main as cli
from nas.compare import compare, find_runs, load_curves, paired_tests
from nas.core.trial import TrialRecord, best_so_far, read_history
from nas.errors import ConfigError
from nas.io import atomic_write_json, read_json

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_run(root: Path, strategy: str, seed: int, accs: list[float | None], *, params=None, flops=None,
             space: str = "nb201", evaluator: str = "table") -> Path:
    """A run dir with just what compare reads; `None` accuracy is a failed trial."""
    run = root / f"{strategy}_{space}_s{seed}"
    run.mkdir(parents=True)
    recs = [TrialRecord(i, f"k{i}", f"e{i}", acc, error=None if acc is not None else "boom",
                        params=None if params is None else params[i], flops=None if flops is None else flops[i])
            for i, acc in enumerate(accs)]
    (run / "history.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in recs))
    atomic_write_json(run / "summary.json", {"strategy": strategy, "space": space,
                                             "evaluator": evaluator, "seed": seed})
    return run


def exact_wilcoxon_p(diffs: list[float]) -> float:
    """Two-sided exact signed-rank p by enumerating all 2^n sign flips (distinct, non-zero |d|)."""
    ranks = {abs(d): r for r, d in enumerate(sorted(diffs, key=abs), 1)}
    n = len(diffs)
    t_obs = sum(ranks[abs(d)] for d in diffs if d > 0)
    mean = n * (n + 1) / 4
    hits = sum(abs(sum(r for r, s in zip(range(1, n + 1), signs) if s) - mean) >= abs(t_obs - mean)
               for signs in itertools.product((0, 1), repeat=n))
    return hits / 2 ** n


DIFFS = [1.5, -0.5, 2.0, 3.0, -1.0, 4.0]


@pytest.fixture
def paired_root(tmp_path) -> Path:
    """Baseline 'random' and 'rea' over 6 seeds; rea − random at trial 1 is DIFFS, and at
    trial 2 every rea run gains +1 on its own first trial while random stays."""
    root = tmp_path / "runs"
    for seed, d in enumerate(DIFFS):
        base = 80.0 + 2 * seed
        make_run(root, "random", seed, [base, base - 5])
        make_run(root, "rea", seed, [base + d, base + d + 1])
    return root


def test_wilcoxon_matches_exact_enumeration(paired_root, tmp_path):
    report = compare([paired_root], tmp_path / "out", [1, 2], baseline="random")
    t = report["tests"]["rea @ nb201/table"]
    assert t["baseline"] == "random @ nb201/table" and t["seeds"] == list(range(6)) and t["note"] is None
    c1 = t["at"]["1"]
    assert exact_wilcoxon_p(DIFFS) == pytest.approx(10 / 64)  # the enumeration itself: T- = 1 + 2
    assert c1["p_value"] == pytest.approx(exact_wilcoxon_p(DIFFS), abs=1e-12)
    assert c1["pairs"] == 6 and c1["median_diff"] == pytest.approx(np.median(DIFFS))
    assert (c1["better"], c1["worse"], c1["tied"]) == (4, 2, 0)
    c2 = t["at"]["2"]  # differences DIFFS + 1: [2.5, 0.5, 3, 4, 0, 5] -> one zero, dropped by the test
    assert (c2["better"], c2["worse"], c2["tied"]) == (5, 0, 1)
    assert c2["p_value"] == pytest.approx(2 / 2 ** 5)
    # Holm over the two p-values of the report
    small, large = sorted([c1["p_value"], c2["p_value"]])
    assert sorted([c1["p_holm"], c2["p_holm"]]) == pytest.approx([2 * small, max(2 * small, large)])


def test_too_few_pairs_all_zero_and_no_common_seeds(tmp_path):
    root = tmp_path / "runs"
    for seed in range(6):
        make_run(root, "random", seed, [90.0 + seed])
        make_run(root, "same", seed, [90.0 + seed])  # identical to the baseline
    for seed in range(4):
        make_run(root, "few", seed, [91.0 + seed])
    for seed in (10, 11):
        make_run(root, "apart", seed, [99.0])
    report = compare([root], tmp_path / "out", [1, 5], baseline="random")
    tests = report["tests"]
    few = tests["few @ nb201/table"]["at"]
    assert few["1"]["p_value"] is None and few["1"]["reason"] == "too few pairs (4 < 5)"
    assert few["1"]["pairs"] == 4 and few["1"]["median_diff"] == pytest.approx(1.0)
    assert few["5"]["pairs"] == 0 and few["5"]["median_diff"] is None  # runs shorter than 5 trials
    same = tests["same @ nb201/table"]["at"]["1"]
    assert same["p_value"] is None and same["reason"] == "all differences are zero" and same["tied"] == 6
    apart = tests["apart @ nb201/table"]
    assert apart["at"] == {} and apart["note"] == "no seeds in common with random @ nb201/table"
    assert all(c["p_holm"] is None for t in tests.values() for c in t["at"].values())
    md = (tmp_path / "out" / "compare.md").read_text()
    assert "- apart @ nb201/table: no seeds in common with random @ nb201/table" in md
    assert "| same @ nb201/table | random @ nb201/table | 1 | 6 | +0.00 | 0/0/6 | all differences are zero | - |" in md


def test_baseline_per_space_and_by_label(tmp_path):
    root = tmp_path / "runs"
    for seed in range(5):
        for space in ("nb201", "other"):
            make_run(root, "random", seed, [80.0 + seed], space=space)
            make_run(root, "rea", seed, [81.0 + seed * 1.5], space=space)
    groups = load_curves(find_runs([root]), allow_mixed=True)  # two spaces: refused unless asked
    by_name = paired_tests(groups, "random", [1])
    assert by_name["rea @ other/table"]["baseline"] == "random @ other/table"
    assert by_name["rea @ nb201/table"]["baseline"] == "random @ nb201/table"
    assert by_name["rea @ nb201/table"]["at"]["1"]["p_value"] == pytest.approx(2 / 32)
    by_label = paired_tests(groups, "random @ nb201/table", [1])
    assert by_label["rea @ other/table"] == {"baseline": None, "note": "no baseline group on other/table",
                                             "at": {}}
    assert "random @ other/table" in by_label  # another group now, tested against nothing


def test_duplicate_seeds_are_left_out(tmp_path):
    root = tmp_path / "runs"
    for seed in range(6):
        make_run(root, "random", seed, [80.0])
        make_run(root, "rea", seed, [81.0])
    make_run(root / "again", "rea", 0, [70.0])
    t = compare([root], tmp_path / "out", [1], baseline="random")["tests"]["rea @ nb201/table"]
    assert t["note"] == "seeds with several runs left out: [0]" and t["seeds"] == [1, 2, 3, 4, 5]
    assert t["at"]["1"]["pairs"] == 5 and t["at"]["1"]["better"] == 5


def test_unknown_baseline_is_one_line_error_and_writes_nothing(paired_root, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"^compare: --baseline 'nope' matches no group "
                                          r"\(groups: random @ nb201/table; rea @ nb201/table\)$"):
        compare([paired_root], tmp_path / "out", [1], baseline="nope")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", str(paired_root), "--baseline", "nope", "--out", str(tmp_path / "out")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("nas: error: compare: --baseline 'nope' matches no group")


def brute_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(accuracy, size) points no other point dominates, one per distinct point, by size."""
    def dominated(p):
        return any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in points)
    return sorted({p for p in points if not dominated(p)}, key=lambda p: p[1])


def test_pareto_front_matches_brute_force(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "runs"
    pts = []
    for seed in range(3):
        accs = [float(a) for a in rng.integers(60, 95, size=40)]
        params = [int(p) for p in rng.integers(1, 30, size=40) * 1000]
        accs[5] = None  # a failed trial, never on a front
        make_run(root, "random", seed, accs, params=params)
        pts += [(a, p) for a, p in zip(accs, params) if a is not None]
    make_run(root, "nosize", 0, [99.0])  # no params: no points, not in the front table
    report = compare([root], tmp_path / "out", [10])
    entry = report["pareto"]["params"]
    assert list(entry["groups"]) == ["random @ nb201/table"]
    g = entry["groups"]["random @ nb201/table"]
    assert g["trials"] == len(pts) == 117
    assert [(p["accuracy"], p["params"]) for p in g["front"]] == brute_front(pts)
    assert {"trial", "key", "encoding", "seed", "run"} <= set(g["front"][0])
    assert report["pareto"]["flops"] == {"groups": {}, "note": "no successful trial has flops"}
    out = tmp_path / "out"
    assert (out / "pareto.png").read_bytes()[:8] == PNG_MAGIC
    md = (out / "compare.md").read_text()
    assert "- flops: no successful trial has flops" in md and "![Pareto fronts](pareto.png)" in md
    front = g["front"]
    assert (f"| random @ nb201/table | params | 117 | {len(front)} | {front[-1]['accuracy']:.2f}% at "
            f"{front[-1]['params'] / 1e3:.3g}k | {front[0]['accuracy']:.2f}% at ") in md


def test_report_files_without_sizes_or_baseline(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "random", 0, [50.0, None, 70.0])
    report = compare([root], tmp_path / "out", [1, 3], band="iqr")
    out = tmp_path / "out"
    assert read_json(out / "compare.json") == report
    assert report["tests"] is None and report["baseline"] is None and report["band"] == "iqr"
    assert report["figures"] == {"curves": "compare.png", "pareto": None}
    assert not (out / "pareto.png").exists() and (out / "compare.png").read_bytes()[:8] == PNG_MAGIC
    md = (out / "compare.md").read_text()
    assert "## Paired tests" not in md and "![Pareto fronts]" not in md
    assert "- params: no successful trial has params" in md
    assert "| random @ nb201/table | 1 | 50.00 ± 0.00 (n=1) | 70.00 ± 0.00 (n=1) |" in md
    assert "interquartile range" in md
    assert [p.name for p in out.iterdir() if p.name.endswith(".tmp")] == []
    with pytest.raises(ConfigError, match="unknown band 'max'"):
        compare([root], out, [1], band="max")


# --- the ablation preset -------------------------------------------------------------------------

def test_experiment_overrides_are_checked_in_one_line(capsys):
    cli.check_group_overrides(["-m", "+experiment=ablation", "seed=0,1"])
    for args, msg in ((["+experiment=nope"], "unknown experiment 'nope' (valid: ablation"),
                      (["experiment=ablation"], "write +experiment=ablation")):
        with pytest.raises(SystemExit):
            cli.check_group_overrides(args)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err


def test_ablation_preset_composes():
    cfg = config.compose_config(["+experiment=ablation"])
    assert (cfg["space"]["name"], cfg["evaluator"]["name"], cfg["runner"]["name"]) == ("nb201", "table", "local")
    sweep = yaml.safe_load((ROOT / "conf" / "experiment" / "ablation.yaml").read_text())["hydra"]["sweeper"]
    strategies = sweep["params"]["strategy"].split(",")
    assert strategies == ["random", "rea", "reinforce", "evolution"]
    assert set(strategies) <= set(config.available("strategy"))


@pytest.mark.slow
def test_multirun_ablation_then_compare_via_cli(nas_env, tmp_path):
    sweep = tmp_path / "multi"
    res = run_nas(["search", "-m", "+experiment=ablation", "strategy=random,rea", "seed=0,1,2,3,4",
                   "budget.trials=25", f"hydra.sweep.dir={sweep}"], nas_env)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = sorted(p.parent for p in sweep.rglob("summary.json"))
    assert len(runs) == 10
    res = run_nas(["compare", str(sweep), "--baseline", "random", "--at", "10", "25"], nas_env)
    assert res.returncode == 0, res.stderr[-2000:]
    report = read_json(sweep / "compare.json")
    assert set(report["groups"]) == {"random @ nb201/table", "rea @ nb201/table"}
    curves = {}
    for run in runs:
        s = read_json(run / "summary.json")
        assert (s["space"], s["evaluator"], s["runner"], s["trials"]) == ("nb201", "table", "local", 25)
        curves[s["strategy"], s["seed"]] = best_so_far(read_history(run / "history.jsonl"))
    from scipy.stats import wilcoxon
    for n in (10, 25):
        diffs = [curves["rea", s][n - 1] - curves["random", s][n - 1] for s in range(5)]
        cell = report["tests"]["rea @ nb201/table"]["at"][str(n)]
        assert cell["pairs"] == 5 and cell["median_diff"] == pytest.approx(float(np.median(diffs)))
        if any(diffs):
            assert cell["p_value"] == pytest.approx(float(wilcoxon(diffs).pvalue))
        else:
            assert cell["reason"] == "all differences are zero"
    for name in ("compare.md", "compare.png", "pareto.png"):
        assert (sweep / name).exists()
    assert "## Paired tests against the baseline" in res.stdout
    assert res.stdout.rstrip().splitlines()[-1].startswith("wrote ")

"""`nas compare` stays honest: it refuses runs that do not share an axis, warns on
duplicate seeds and on trial counts past a run's end, keeps strategy settings apart,
picks `--at` from the runs' lengths, draws the NB201 table's optimum and random search's expectation, and
flags rea/evolution budgets that never leave the random initial population."""

from __future__ import annotations

import itertools
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from nas.cli import main as cli
from nas.compare import compare, curve_styles, expected_best, find_runs, load_curves, plot_curves, table_reference
from nas.core.constraint import Constraint
from nas.core.trial import TrialRecord
from nas.errors import ConfigError
from nas.evaluators.table import TableEvaluator
from nas.io import atomic_write_json
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import Component, SearchSpec
from nas.spaces.nb201.space import NB201Space
from nas.spaces.nb201.table import default_table_path, load_table
from nas.strategies.base import random_only_note

TRAIN = {"data": {"name": "digits", "root": None}, "channels": 16, "recipe": {"epochs": 2}}


def make_run(root: Path, strategy: str, seed: int, accs: list[float], *, trials: int | None = None,
             space: str = "nb201", evaluator: str = "table", evaluator_params: dict | None = None,
             strategy_params: dict | None = None, constraint: dict | None = None, in_flight: int = 1) -> Path:
    """A run dir with what compare reads; summary.json's spec is a real SearchSpec's."""
    spec = SearchSpec(Component(space), Component(strategy, strategy_params or {}),
                      Component(evaluator, evaluator_params or {}), seed=seed,
                      trials=trials or len(accs), constraint=Constraint(**(constraint or {})), in_flight=in_flight)
    run = root / f"{strategy}_s{seed}"
    run.mkdir(parents=True)
    (run / "history.jsonl").write_text("".join(
        json.dumps(TrialRecord(i, f"k{i}", f"e{i}", a).to_json()) + "\n" for i, a in enumerate(accs)))
    atomic_write_json(run / "summary.json", {"strategy": strategy, "space": space, "evaluator": evaluator,
                                             "seed": seed, "spec": spec.to_dict()})
    return run


# --- incompatible runs -------------------------------------------------------------------------

MIXED = [  # (what the second run changes, the field named, its value there, the first run's)
    ({"evaluator": "train", "evaluator_params": {**TRAIN, "data": {"name": "cifar10"}}}, "dataset", "cifar10",
     "digits"),
    ({"evaluator": "train", "evaluator_params": {**TRAIN, "recipe": {"epochs": 5}}}, "evaluator.recipe.epochs",
     "5", "2"),
    ({"evaluator_params": {"metric": "ptq_accuracy"}}, "evaluator.metric", "ptq_accuracy", "baseline_accuracy"),
    ({"space": "other"}, "space", "other", "nb201"),
    ({"trials": 40}, "budget.trials", "40", "20"),
    ({"constraint": {"flops": 3e7}}, "constraint.flops", "30000000.0", "null"),
]


@pytest.mark.parametrize("change, field, theirs, mine", MIXED, ids=[m[1] for m in MIXED])
def test_incompatible_runs_are_refused_in_one_line(tmp_path, change, field, theirs, mine):
    root = tmp_path / "runs"
    base = {"evaluator": "train", "evaluator_params": TRAIN} if change.get("evaluator") == "train" else {}
    base.setdefault("evaluator_params", {"metric": "baseline_accuracy"} if "evaluator_params" in change else {})
    mine_run = make_run(root / "a", "random", 0, [80.0] * 20, **base)
    theirs_run = make_run(root / "b", "rea", 0, [81.0] * 20, **{**base, **change})
    message = (f"compare: {mine_run} has {field}={mine} but {theirs_run} has {field}={theirs}: refusing to put them "
               f"on one axis (pass --allow-mixed to compare them anyway, one group per setting)")
    with pytest.raises(ConfigError) as info:
        compare([root], tmp_path / "out", [5])
    assert str(info.value) == message
    assert not (tmp_path / "out").exists()
    # asked for: one group per setting, labelled by what differs beyond space and evaluator
    groups = load_curves(find_runs([root]), allow_mixed=True)
    shown = "" if field == "space" else f" [{field}={theirs}]"
    assert f"rea @ {change.get('space', 'nb201')}/{change.get('evaluator', 'table')}{shown}" in groups


def test_mixed_settings_split_groups_and_the_cli_says_one_line(tmp_path, capsys):
    root = tmp_path / "runs"
    for seed in range(2):
        make_run(root / "short", "rea", seed, [80.0 + seed] * 10, trials=10)
        make_run(root / "long", "rea", seed, [70.0 + seed] * 30, trials=30,
                 evaluator_params={"simulated_cost_seconds": 0.5})  # changes no result: not a difference
    report = compare([root], tmp_path / "out", [10], allow_mixed=True)
    assert set(report["groups"]) == {"rea @ nb201/table [budget.trials=10]", "rea @ nb201/table [budget.trials=30]"}
    assert report["groups"]["rea @ nb201/table [budget.trials=10]"]["at"]["10"]["mean"] == pytest.approx(80.5)
    assert report["groups"]["rea @ nb201/table [budget.trials=30]"]["at"]["10"]["mean"] == pytest.approx(70.5)
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", str(root), "--out", str(tmp_path / "cli")])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has budget.trials=30 but" in err and "--allow-mixed" in err
    cli.main(["compare", str(root), "--allow-mixed", "--at", "10", "--out", str(tmp_path / "cli")])
    assert "rea @ nb201/table [budget.trials=30]" in capsys.readouterr().out


# --- duplicate seeds, --at ---------------------------------------------------------------------

def test_duplicate_seeds_warn_once_per_group(tmp_path, capsys):
    root = tmp_path / "runs"
    for seed in range(3):
        make_run(root / "first", "rea", seed, [80.0 + seed] * 8, strategy_params={"population_size": 4})
        make_run(root / "first", "random", seed, [80.0] * 8)
    again = make_run(root / "again", "rea", 1, [81.0] * 8, strategy_params={"population_size": 4})
    report = compare([root], tmp_path / "out", [8])
    expected = (f"rea @ nb201/table: duplicate seeds 1 (2 runs), e.g. {again} and {root / 'first' / 'rea_s1'}: "
                "each run counts in the mean and std, so these seeds weigh more")
    assert report["warnings"] == [expected]
    assert report["groups"]["rea @ nb201/table"]["at"]["8"]["n"] == 4
    assert f"- {expected}" in (tmp_path / "out" / "compare.md").read_text()
    cli.main(["compare", str(root), "--at", "8", "--out", str(tmp_path / "cli")])
    assert capsys.readouterr().err == f"nas: warning: compare: {expected}\n"


def test_strategy_settings_split_groups_and_name_the_differing_key(tmp_path):
    root = tmp_path / "runs"
    for size in (10, 20):
        for seed in range(2):
            make_run(root / f"pop{size}", "rea", seed, [70.0 + size + seed] * 8,
                     strategy_params={"population_size": size, "sample_size": 3})
    make_run(root / "random", "random", 0, [60.0] * 8)
    report = compare([root], tmp_path / "out", [8])
    assert report["warnings"] == []
    assert report["groups"]["rea[population_size=10] @ nb201/table"]["at"]["8"]["mean"] == pytest.approx(80.5)
    assert report["groups"]["rea[population_size=20] @ nb201/table"]["at"]["8"]["mean"] == pytest.approx(90.5)
    assert set(report["groups"]) == {"rea[population_size=10] @ nb201/table",
                                     "rea[population_size=20] @ nb201/table", "random @ nb201/table"}
    # identical strategy settings still make one group, labelled by the strategy alone
    groups = load_curves(find_runs([root / "pop10", root / "random"]))
    assert {label: len(runs) for label, runs in groups.items()} == {"rea @ nb201/table": 2,
                                                                    "random @ nb201/table": 1}


def test_asynchronous_and_batch_runs_of_one_strategy_are_their_own_groups(tmp_path):
    """budget.in_flight changes what the strategy has learnt before each ask: another setting."""
    root = tmp_path / "runs"
    for k in (1, 4):
        make_run(root / f"k{k}", "rea", 0, [70.0 + k] * 8, in_flight=k)
    assert set(load_curves(find_runs([root]))) == {"rea[budget.in_flight=1] @ nb201/table",
                                                   "rea[budget.in_flight=4] @ nb201/table"}


def test_at_defaults_to_quartiles_of_the_shortest_run(tmp_path, capsys):
    root = tmp_path / "runs"
    for seed in range(2):
        make_run(root, "random", seed, [60.0 + i for i in range(20)])
    cli.main(["compare", str(root), "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert out.err == ""  # nothing asked beyond the runs, nothing to warn about
    report = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert report["at"] == [5, 10, 15, 20] and report["warnings"] == []
    assert "| random @ nb201/table | 2 | 64.00 ± 0.00 (n=2) | 69.00 ± 0.00 (n=2) | 74.00 ± 0.00 (n=2) | " \
           "79.00 ± 0.00 (n=2) |" in out.out
    # a run cut short (search exhausted) sets the default; asking past it is one warning line
    make_run(root, "rea", 0, [50.0] * 7, trials=20)
    report = compare([root], tmp_path / "out", None)
    assert report["at"] == [2, 4, 5, 7]
    report = compare([root], tmp_path / "out", [7, 10, 20])
    assert report["warnings"] == ["--at 10 20: beyond the length of 1 of 3 runs (shortest: 7 trials); those runs "
                                  "are left out of these cells ('-' where none is left)"]
    assert report["groups"]["rea @ nb201/table"]["at"]["10"] is None


# --- reference lines and styles ----------------------------------------------------------------

def test_expected_best_matches_enumeration():
    values = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    got = expected_best(values, 20)
    assert len(got) == len(values)  # no more distinct draws than values
    for n, e in enumerate(got, 1):
        subsets = list(itertools.combinations(values, n))
        assert e == pytest.approx(sum(max(s) for s in subsets) / len(subsets), abs=1e-12)


def test_table_runs_get_optimum_and_random_expectation(tmp_path):
    root = tmp_path / "runs"
    for seed in range(2):
        make_run(root, "random", seed, [85.0, 90.0, 91.0])
        make_run(root, "rea", seed, [85.0, 90.0, 91.0], strategy_params={"population_size": 2})  # as random
    report = compare([root], tmp_path / "out", [1, 3])
    table = np.array(list(load_table(str(default_table_path()), "baseline_accuracy").values()))
    ref = report["reference"]
    assert ref["optimum"] == pytest.approx(94.0664) and ref["source"] == "NB201 table"
    assert ref["random_expected"][0] == pytest.approx(float(table.mean()))  # one draw: the table's mean
    assert np.all(np.diff(ref["random_expected"]) > 0) and len(ref["random_expected"]) == 3
    md = (tmp_path / "out" / "compare.md").read_text()
    assert (f"| random search, expected (NB201 table) | - | {ref['random_expected'][0]:.2f} | "
            f"{ref['random_expected'][2]:.2f} |") in md
    assert "Optimum of the NB201 table: 94.07." in md
    groups = load_curves(find_runs([root]))
    legend = plot_curves(groups, tmp_path / "c.png", reference=ref)
    assert legend == ["random @ nb201/table (n=2)", "rea @ nb201/table (n=2)",
                      "random search, expected (NB201 table)", "optimum 94.07"]
    # no distribution is known for trained evaluators, nor under a constraint
    fields = [r["fields"] for g in groups.values() for r in g]
    assert table_reference([{**f, "constraint.flops": 3e7} for f in fields], 3) == (None, None)
    assert table_reference([{**f, "evaluator": "train"} for f in fields], 3) == (None, None)


def test_overlapping_groups_differ_in_line_style_and_marker():
    styles = curve_styles([f"g{i}" for i in range(28)])
    assert len({(s["linestyle"], s["marker"]) for s in styles.values()}) == 28
    assert len({s["color"] for s in styles.values()}) == 10


# --- random search in disguise -----------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["rea", "evolution"])
def test_budget_inside_the_random_start_warns_and_is_noted(tmp_path, caplog, strategy):
    evaluator = TableEvaluator(NB201Space())
    root = tmp_path / "runs"
    for seed, trials in ((0, 4), (1, 5)):
        spec = SearchSpec(Component("nb201"), Component(strategy, {"population_size": 4}), Component("table"),
                          seed=seed, trials=trials)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="nas.search.loop"):
            SearchLoop(spec, root / f"s{seed}", LocalExecutor(evaluator, None), progress=False).run_search()
        notes = [r.getMessage() for r in caplog.records if "random search in disguise" in r.getMessage()]
        assert notes == ([f"strategy '{strategy}': budget.trials=4 <= population_size=4, so every trial comes from "
                          "its random initial population: random search in disguise (raise budget.trials or lower "
                          "strategy.population_size)"] if trials == 4 else [])
    report = compare([root], tmp_path / "out", [4], allow_mixed=True)
    label = f"{strategy} @ nb201/table [budget.trials=4]"
    assert report["notes"] == {label: random_only_note(strategy, {"population_size": 4}, 4)}
    md = (tmp_path / "out" / "compare.md").read_text()
    assert re.search(rf"^\| {re.escape(label)} † \| 1 \|", md, re.M)
    assert f"- † {label}: strategy '{strategy}': budget.trials=4" in md


def test_random_only_note_follows_the_population_default():
    assert random_only_note("rea", {}, 20) is not None and random_only_note("rea", {}, 21) is None
    assert random_only_note("evolution", {"population_size": 50}, 49) is not None
    assert random_only_note("random", {}, 1) is None and random_only_note("gone", {}, 1) is None


def test_summary_that_is_not_an_object_is_one_line(tmp_path, capsys):
    run = tmp_path / "x4"
    run.mkdir()
    (run / "summary.json").write_text("[]")
    with pytest.raises(SystemExit) as info:
        cli.main(["compare", str(run)])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"nas: error: {run / 'summary.json'}: expected a JSON object, found list ([])\n"


def test_ambiguous_baseline_is_refused_naming_the_groups(tmp_path):
    root = tmp_path / "runs"
    for seed in range(2):
        make_run(root / "short", "rea", seed, [80.0] * 10, trials=10)
        make_run(root / "long", "rea", seed, [70.0] * 30, trials=30)
        make_run(root / "other", "random", seed, [75.0] * 10, trials=10)
    with pytest.raises(ConfigError) as info:
        compare([root], tmp_path / "out", [10], baseline="rea", allow_mixed=True)
    assert "--baseline 'rea' is ambiguous" in str(info.value)
    assert "rea @ nb201/table [budget.trials=10]; rea @ nb201/table [budget.trials=30]" in str(info.value)
    report = compare([root], tmp_path / "out", [10], baseline="rea @ nb201/table [budget.trials=10]",
                     allow_mixed=True)
    assert report["tests"]["random @ nb201/table [budget.trials=10]"]["baseline"] == \
        "rea @ nb201/table [budget.trials=10]"


def test_compare_without_pareto_data_removes_a_stale_pareto_png(tmp_path):
    root = tmp_path / "runs"
    make_run(root, "rea", 0, [80.0] * 10)  # no params or FLOPs: no front
    out = tmp_path / "out"
    out.mkdir()
    (out / "pareto.png").write_bytes(b"an earlier compare's")
    report = compare([root], out, [10])
    assert report["figures"]["pareto"] is None and not (out / "pareto.png").exists()

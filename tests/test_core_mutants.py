"""Small checks of nas/core and nas/search that a mutation run (benchmarks/mutation.py) found untested."""

from __future__ import annotations

import os

import numpy as np
import pytest

from nas.spaces import SPACES


def test_the_default_exported_source_defaults_to_three_channel_32px_inputs():
    space = SPACES.create("spos", {})
    arch = space.sample(np.random.default_rng(0))
    text = space.source(arch, 10)
    assert "def Network(num_classes=10, in_channels=3, input_size=32):" in text


def test_a_released_run_dir_lock_names_no_holder(tmp_path):
    """The lock file stays (unlinking it would race a waiter) but is emptied: no stale pid in it."""
    from nas.search.rundir import RunDir

    run = RunDir(tmp_path)
    with run.lock():
        assert run.lock_path.read_text() == f"{os.getpid()}\n"
    assert run.lock_path.exists() and run.lock_path.read_bytes() == b""


def test_an_unknown_parameter_error_lists_the_accepted_ones():
    from nas.errors import ConfigError
    from nas.strategies import STRATEGIES

    with pytest.raises(ConfigError) as info:
        STRATEGIES.create("rea", {"bogus": 1}, space=SPACES.create("nb201", {}), seed=0)
    assert str(info.value) == ("strategy 'rea': unknown parameter 'bogus' "
                               "(accepted: max_attempts, population_size, sample_size, unique)")


def test_train_evaluator_refuses_the_supernet_spaces_whose_networks_are_fixed_to_their_input():
    """`trainable` is off unless a space says so: a supernet space's subnets train as its supernet."""
    from nas.evaluators import EVALUATORS

    train = EVALUATORS.get("train")
    assert train.accepts(SPACES.get("nb201"))
    for name in ("spos", "ofa_mbv3", "autoformer"):
        assert not SPACES.get(name).trainable and not train.accepts(SPACES.get(name)), name


def test_best_so_far_leaves_out_self_reported_numbers_unless_told_to_trust_them():
    from nas.core.trial import TrialRecord, best_so_far

    history = [TrialRecord(trial=0, key="a", encoding="a", accuracy=60.0),
               TrialRecord(trial=1, key="b", encoding="b", accuracy=99.0, metrics={"self_reported": True}),
               TrialRecord(trial=2, key="c", encoding="c", accuracy=70.0)]
    assert best_so_far(history) == [60.0, 60.0, 70.0]
    assert best_so_far(history, trust=True) == [60.0, 99.0, 99.0]


def test_the_bar_s_count_column_is_as_wide_as_its_largest_count_so_best_follows_it():
    from test_console import bar_lines

    for total in (100, 1000):
        line = bar_lines(80, total=total)[-1]
        assert f"3/{total} best 93.04" in line, line


def test_a_batched_evaluator_gets_a_batch_of_two_in_one_call():
    """A batch of two is a batch (evaluator=train trains it on one GPU at once), not two evaluations."""
    from nas.core.trial import Candidate
    from nas.evaluators.table import TableEvaluator
    from nas.search.loop import LocalExecutor

    class BatchedTable(TableEvaluator):
        batches: list[int] = []

        @property
        def batched(self) -> bool:
            return True

        def evaluate_batch(self, archs, seed=None):
            self.batches.append(len(archs))
            return super().evaluate_batch(archs, seed)

    space = SPACES.create("nb201", {})
    evaluator = BatchedTable(space)
    archs = [space.sample(np.random.default_rng(seed)) for seed in (0, 1)]
    outcomes = LocalExecutor(evaluator, None).evaluate([Candidate(a) for a in archs])
    assert evaluator.batches == [2]
    assert [r.accuracy for r, _, _ in outcomes] == [evaluator.evaluate(a).accuracy for a in archs]


def test_the_screening_predictor_by_default_is_the_ensemble_bananas_fits():
    """`screen.params: {}` documents the predictor's own defaults (5 members of 32 units, 300 epochs)."""
    from nas.search.screen import SCORERS
    from nas.strategies.predictor import PredictorSettings

    scorer = SCORERS.create("predictor", {}, space=SPACES.create("nb201", {}))
    assert scorer.settings == PredictorSettings()

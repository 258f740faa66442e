"""The learned predictor (nas/strategies/predictor.py), NB201's path encoding and the
predictor-guided strategy (bananas) on the NB201 table."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from nas.core.trial import Candidate, Trial, TrialRecord
from nas.errors import ConfigError
from nas.evaluators.table import TableEvaluator
from nas.spaces import SPACES
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import path_encoding
from nas.strategies import STRATEGIES
from nas.strategies.predictor import EnsemblePredictor, PredictorSettings, _Stacked, expected_improvement

NB201 = SPACES.create("nb201", {})
TABLE = TableEvaluator(NB201)
BEST = NB201Cell.from_string("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_1x1~1|"
                             "nor_conv_3x3~2|")


def sample(n: int, seed: int) -> list[TrialRecord]:
    """`n` random cells' table trials (a few may repeat: the predictor takes them as rows)."""
    rng = np.random.default_rng(seed)
    cells = [NB201.sample(rng) for _ in range(n)]
    return [Trial.of(i, Candidate(c), TABLE.evaluate(c)).record for i, c in enumerate(cells)]


def test_path_encoding_counts_the_paths_that_carry_data():
    assert sum(path_encoding(NB201Cell(("none",) * 6))) == 0
    assert sum(path_encoding(BEST)) == 4  # 0->3, 0->1->3, 0->2->3, 0->1->2->3
    cut = NB201Cell(BEST.ops[:3] + ("none",) + BEST.ops[4:])  # no direct input->output edge
    assert sum(path_encoding(cut)) == 3
    assert len(NB201.features(BEST)) == 6 * 5 + 4 + 16 + 64


def test_predictor_ranks_unseen_cells_and_is_deterministic():
    history = sample(200, seed=0)
    unseen = [NB201.decode(r.encoding) for r in history[150:]]
    fitted = []
    for start in (None, None, 20):  # from scratch on all 150 twice; then warm-started row by row after 20
        p = EnsemblePredictor(PredictorSettings(members=3, epochs=200)).fit_on(NB201, history[:150], 7, start)
        fitted.append(p.predict_archs(NB201, unseen))
    np.testing.assert_array_equal(fitted[0][0], fitted[1][0])
    for mean, std in (fitted[0], fitted[2]):
        assert spearmanr(mean, [r.accuracy for r in history[150:]]).statistic > 0.6
        assert (std >= 0).all() and std.mean() > 0  # members disagree somewhere: an uncertainty


def test_a_kept_predictor_adds_only_the_new_trials_and_equals_a_replay(monkeypatch):
    """What makes bananas' loop linear and its resume exact: a predictor kept across asks pays
    `steps` Adam steps per new trial (not a refit), and a fresh one on the whole history (a
    resumed search) replays the same fits bit for bit; a history that is no extension starts over."""
    settings = PredictorSettings(members=2, epochs=40, steps=3, batch=8)
    history = sample(30, seed=1)
    calls = []
    monkeypatch.setattr(_Stacked, "step", lambda self, *a, _step=_Stacked.step: (calls.append(1), _step(self, *a)))
    def added(row: int, start: int = 10) -> int:  # steps for a row after the first fit: epochs/2, epochs/3, ...
        return max(3, math.ceil(40 / (row - start + 2)))

    kept = EnsemblePredictor(settings)
    for n in range(10, 31):
        calls.clear()
        kept.fit_on(NB201, history[:n], 5, start=10)
        assert len(calls) == (40 if n == 10 else added(n - 1))
    assert added(29) == 3  # later rows: `steps` each, so the cost per trial stops growing
    cells = [NB201.sample(np.random.default_rng(2)) for _ in range(20)]
    replay = EnsemblePredictor(settings).fit_on(NB201, history, 5, start=10)
    for a, b in zip(kept.predict_archs(NB201, cells), replay.predict_archs(NB201, cells)):
        np.testing.assert_array_equal(a, b)
    calls.clear()
    kept.fit_on(NB201, history[1:], 5, start=10)  # not an extension of what it was fitted on
    assert len(calls) == 40 + sum(added(j) for j in range(10, len(history) - 1))
    failed = dataclasses.replace(history[0], accuracy=None, error="boom")  # trials without an accuracy: no rows
    with pytest.raises(ValueError, match="needs >= 2 trials with an accuracy, got 1"):
        EnsemblePredictor(settings).fit_on(NB201, [failed, history[1]], 5)


def test_expected_improvement_prefers_higher_means_and_more_uncertainty():
    ei = expected_improvement(np.array([90.0, 91.0, 90.0, 92.0]), np.array([1.0, 1.0, 3.0, 0.0]), 91.0)
    assert ei[1] > ei[0] and ei[2] > ei[0]
    assert ei[3] == pytest.approx(1.0)  # no uncertainty: the plain gain


def test_bananas_proposals_beat_its_random_start():
    strategy = STRATEGIES.create("bananas", {"n_init": 10, "pool": 50, "epochs": 100}, space=NB201, seed=0)
    origins: dict[str, list[float]] = {"random": [], "predicted": []}
    for i in range(8):
        cands = strategy.ask(5)
        trials = [Trial.of(5 * i + j, c, TABLE.evaluate(c.arch), False, 0.0) for j, c in enumerate(cands)]
        strategy.tell(trials)
        for t in trials:
            origins[t.candidate.info["origin"]].append(t.record.accuracy)
    assert len(origins["random"]) == 10 and len(origins["predicted"]) == 30
    assert np.mean(origins["predicted"]) > np.mean(origins["random"]) + 5


@pytest.mark.parametrize("params, message", [
    ({"n_init": 0}, "strategy 'bananas': n_init must be an integer >= 1, got 0"),
    ({"members": 0}, "predictor.members must be an integer >= 1, got 0"),
])
def test_bad_settings_are_one_line(params, message):
    with pytest.raises(ConfigError, match=message):
        STRATEGIES.create("bananas", params, space=NB201, seed=0)


def test_every_layer_of_a_fresh_ensemble_is_he_initialised_so_its_members_disagree():
    net = _Stacked(5, [40, 32, 32, 1], np.random.default_rng(0))
    for w, fan_in in zip(net.params[:net.n_layers], (40, 32, 32)):
        assert w.std() == pytest.approx(math.sqrt(2.0 / fan_in), rel=0.3)
    out, _ = net.forward(np.random.default_rng(1).normal(size=(8, 40)))
    assert out.shape == (5, 8) and np.all(out.std(axis=0) > 0)  # a spread before any training


def test_a_warm_fit_of_batch_one_steps_on_the_new_row_alone():
    """Each warm step's batch holds the new row first, then a sample of the earlier ones: at
    `batch` 1, only the new row, for every member."""
    history = sample(6, seed=2)
    predictor = EnsemblePredictor(PredictorSettings(members=2, epochs=20, steps=3, batch=1)).fit_on(NB201, history[:3], 0)
    stepped = []
    net_step = predictor.net.step
    predictor.net.step = lambda x, y, s: (stepped.append(x.copy()), net_step(x, y, s))
    predictor.fit_on(NB201, history, 0, start=3)
    assert len(predictor.rows) == 6 and stepped
    new = [predictor.x[j] for j in (3, 4, 5)]
    for x in stepped:
        assert x.shape[:2] == (2, 1) and any(np.array_equal(x[m, 0], row) for row in new for m in (0, 1))
        assert np.array_equal(x[0, 0], x[1, 0])


def test_predictions_are_in_the_accuracies_units_and_scale():
    """The net learns standardised targets; its predictions come back as accuracies (the mean added,
    the spread multiplied back): on the rows it fitted, near their accuracies."""
    history = [r for r in sample(40, seed=1) if r.accuracy is not None]
    p = EnsemblePredictor(PredictorSettings(members=3, epochs=300)).fit_on(NB201, history, 7)
    mean, std = p.predict_archs(NB201, [NB201.decode(r.encoding) for r in history])
    accuracies = np.array([r.accuracy for r in history])
    assert p.y_mean == pytest.approx(accuracies.mean()) and p.y_std == pytest.approx(accuracies.std())
    assert abs(mean.mean() - accuracies.mean()) < 0.25 * accuracies.std()
    assert np.corrcoef(mean, accuracies)[0, 1] > 0.9 and (std >= 0).all()

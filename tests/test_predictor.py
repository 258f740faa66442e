"""The learned predictor (nas/search/predictor.py), NB201's path encoding and the
predictor-guided strategy (bananas) on the NB201 table."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from nas.errors import ConfigError
from nas.evaluators.table import TableEvaluator
from nas.search.predictor import EnsemblePredictor, PredictorSettings, expected_improvement
from nas.spaces import SPACES
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import path_encoding
from nas.strategies import STRATEGIES, Trial

NB201 = SPACES.create("nb201", {})
TABLE = TableEvaluator(NB201)
BEST = NB201Cell.from_string("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_1x1~1|"
                             "nor_conv_3x3~2|")


def sample(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cells = [NB201.sample(rng) for _ in range(n)]
    return (np.array([NB201.features(c) for c in cells]),
            np.array([TABLE.evaluate(c).accuracy for c in cells]))


def test_path_encoding_counts_the_paths_that_carry_data():
    assert sum(path_encoding(NB201Cell(("none",) * 6))) == 0
    assert sum(path_encoding(BEST)) == 4  # 0->3, 0->1->3, 0->2->3, 0->1->2->3
    cut = NB201Cell(BEST.ops[:3] + ("none",) + BEST.ops[4:])  # no direct input->output edge
    assert sum(path_encoding(cut)) == 3
    assert len(NB201.features(BEST)) == 6 * 5 + 4 + 16 + 64


def test_predictor_ranks_unseen_cells_and_is_deterministic():
    x, y = sample(200, seed=0)
    fitted = []
    for _ in range(2):
        p = EnsemblePredictor(PredictorSettings(members=3, epochs=200))
        p.fit(x[:150], y[:150], np.random.default_rng(7))
        fitted.append(p.predict(x[150:]))
    np.testing.assert_array_equal(fitted[0][0], fitted[1][0])
    mean, std = fitted[0]
    assert spearmanr(mean, y[150:]).statistic > 0.6
    assert (std >= 0).all() and std.mean() > 0  # members disagree somewhere: an uncertainty


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

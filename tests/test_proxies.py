"""Zero-cost proxies (nas.proxies) on tiny networks with known orderings, their vote, the proxy
evaluator through the search API, and the proxy metrics of evaluator=train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from nas.errors import ConfigError
from nas.evaluators import EVALUATORS
from nas.proxies import PROXIES, VOTE, mean_rank, score_arch, score_network, vote_scores
from nas.proxies.base import LOWEST
from nas.proxies.batch import data_batch, random_batch
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import Component, SearchSpec, build_evaluator
from nas.spaces import SPACES
from nas.spaces.nb201.arch import OPS, NB201Cell
from nas.spaces.nb201.space import NB201Space

TINY = NB201Space(channels=4, cells_per_stage=1)
DIGITS = {"name": "digits", "root": None, "split_file": None}
SMALL = {"data": DIGITS, "batch_size": 8, "reference": 3, "channels": 4, "cells_per_stage": 1}


def uniform(op: str) -> NB201Cell:
    return NB201Cell((op,) * 6)


@pytest.fixture(scope="module")
def batch():
    return random_batch((3, 8, 8), 10, 8, seed=0)


@pytest.fixture(scope="module")
def uniform_scores(batch) -> dict[str, dict[str, float]]:
    return {op: score_arch(TINY, uniform(op), batch, PROXIES.names(), seed=0) for op in OPS}


def conv_net(width: int, depth: int) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Conv2d(width, width, 3, padding=1), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10))


def test_registry_lists_the_six_proxies_and_refuses_others_in_one_line():
    assert PROXIES.names() == ["grad_norm", "jacob_cov", "naswot", "params", "snip", "synflow"]
    with pytest.raises(ConfigError, match=r"^unknown proxy 'synflw' \(valid: grad_norm, .*synflow\)$"):
        PROXIES.get("synflw")


@pytest.mark.parametrize("name", ["synflow", "snip", "grad_norm", "jacob_cov", "naswot"])
def test_the_all_none_cell_scores_lowest(uniform_scores, name):
    """A cell of `none` edges passes nothing: no gradient, no Jacobian, no ReLU pattern."""
    none = uniform_scores["none"][name]
    assert none in (0.0, LOWEST)
    assert all(none < uniform_scores[op][name] for op in OPS if op != "none")


def test_params_and_synflow_order_the_convolutions(uniform_scores):
    synflow, params = ({op: uniform_scores[op][n] for op in OPS} for n in ("synflow", "params"))
    assert synflow["nor_conv_3x3"] > synflow["nor_conv_1x1"] > synflow["skip_connect"] > synflow["none"]
    assert params["nor_conv_3x3"] > params["nor_conv_1x1"] > params["skip_connect"] == params["none"]


@pytest.mark.parametrize("name", ["synflow", "params", "naswot"])
def test_wider_and_deeper_networks_score_higher(batch, name):
    s = {(w, d): score_network(conv_net(w, d), batch, [name], seed=0)[name] for w in (4, 16) for d in (1, 3)}
    assert s[16, 1] > s[4, 1] and s[16, 3] > s[4, 3]  # wider
    assert s[4, 3] > s[4, 1] and s[16, 3] > s[16, 1]  # deeper


def test_deterministic_with_a_seed_and_the_seed_matters(batch):
    cell = NB201Cell.from_string("|nor_conv_3x3~0|+|skip_connect~0|nor_conv_1x1~1|+|avg_pool_3x3~0|none~1|nor_conv_3x3~2|")
    first = score_arch(TINY, cell, batch, PROXIES.names(), seed=3)
    assert score_arch(TINY, cell, batch, PROXIES.names(), seed=3) == first
    other = score_arch(TINY, cell, batch, PROXIES.names(), seed=4)
    assert other["synflow"] != first["synflow"] and other["params"] == first["params"]


def test_scoring_leaves_the_network_and_the_random_state_as_they_were(batch):
    net = conv_net(4, 2)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    state = torch.random.get_rng_state()
    score_network(net, batch, PROXIES.names(), seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_proxies_scored_together_score_as_each_alone(batch):
    """Sharing one copy (and one backward pass for snip and grad_norm) changes no score, with
    batch norm and dropout in the network."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Dropout(0.3),
                        nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    names = PROXIES.names()
    together = score_network(net, batch, names, seed=5)
    assert together == {n: score_network(net, batch, [n], seed=5)[n] for n in names}
    assert together == score_network(net, batch, list(reversed(names)), seed=5)


def test_gradient_proxies_share_one_backward_pass(batch):
    net = conv_net(4, 2)
    forwards: list[int] = []
    net.register_forward_hook(lambda *_: forwards.append(1))  # copied with the network, list shared
    score_network(net, batch, ["snip", "grad_norm"], seed=0)
    assert len(forwards) == 1
    score_network(net, batch, ["snip", "grad_norm", "synflow"], seed=0)
    assert len(forwards) == 3  # synflow's own pass on its own copy


def test_mean_rank_averages_ranks_and_ties():
    assert mean_rank({"a": [1.0, 2.0, 3.0], "b": [30.0, 20.0, 10.0]}) == [2.0, 2.0, 2.0]
    assert mean_rank({"a": [5.0, 5.0, 9.0], "b": [0.0, 1.0, 2.0]}) == [1.25, 1.75, 3.0]


def test_vote_over_a_handful_of_cells_is_the_mean_rank_of_its_members(batch, uniform_scores):
    votes = vote_scores(TINY, [uniform(op) for op in OPS], batch, seed=0)
    assert votes == mean_rank({n: [uniform_scores[op][n] for op in OPS] for n in VOTE})
    assert min(votes) == votes[OPS.index("none")] and max(votes) == votes[OPS.index("nor_conv_3x3")]


def test_data_batch_is_seeded_normalised_and_resized():
    from nas.data.sources import load_data

    digits = load_data("digits")
    a = data_batch(digits, 16, seed=1, shape=(3, 32, 32))
    assert a.shape == (3, 32, 32) and a.labels.shape == (16,) and a.source == "digits"
    assert torch.equal(a.images, data_batch(digits, 16, seed=1, shape=(3, 32, 32)).images)
    assert not torch.equal(a.labels, data_batch(digits, 16, seed=2).labels)
    assert torch.equal(a.images[:, 0], a.images[:, 2])  # grey as three equal channels
    assert random_batch((1, 8, 8), 3, 4, seed=0).labels.max() < 3


@pytest.fixture(scope="module")
def proxy_evaluator():
    return EVALUATORS.create("proxy", dict(SMALL), space=TINY)


def test_proxy_evaluator_scores_a_percentile_of_the_vote(proxy_evaluator):
    best, none = (proxy_evaluator.evaluate(uniform(op)) for op in ("nor_conv_3x3", "none"))
    assert none.accuracy == 0.0 and best.accuracy > 50.0 and best.ok
    assert set(best.metrics) == {"proxy_synflow", "proxy_jacob_cov", "proxy_snip", "vote_percentile"}
    assert best.metrics["vote_percentile"] == best.accuracy and best.params and best.params > none.params
    assert proxy_evaluator.evaluate(uniform("nor_conv_3x3")).to_dict() | {"cost_seconds": 0} == \
        best.to_dict() | {"cost_seconds": 0}


def test_proxy_reference_is_scored_once_with_a_status_line_and_kept(monkeypatch, tmp_path, capsys):
    """`nas search evaluator=proxy` sat at 0/N for ~50 s scoring the reference sample: it is
    now scored before the bar, says so, and is kept for the workers, tasks and later runs."""
    import nas.status
    from nas.evaluators.proxy import ProxyEvaluator

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path))
    monkeypatch.setattr(nas.status, "PLAIN_AFTER_S", 0.0)
    first = EVALUATORS.create("proxy", dict(SMALL), space=TINY)
    first.prepare(show=True)
    assert capsys.readouterr().err == \
        "scoring evaluator=proxy's reference sample of 3 cells (once per settings) ...\n"
    monkeypatch.setattr(ProxyEvaluator, "_scores", lambda *args: pytest.fail("the reference was scored again"))
    second = EVALUATORS.create("proxy", dict(SMALL), space=TINY)
    second.prepare(show=True)
    assert capsys.readouterr().err == ""
    assert {n: list(v) for n, v in second.reference_scores().items()} == \
        {n: list(v) for n, v in first.reference_scores().items()}

    class Convs(NB201Space):  # the same evaluator settings over other cells: their own reference
        def sample(self, rng):
            return uniform("nor_conv_3x3")

    monkeypatch.undo()
    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path))
    other = EVALUATORS.create("proxy", dict(SMALL), space=Convs(channels=4, cells_per_stage=1))
    assert {n: list(v) for n, v in other.reference_scores().items()} != \
        {n: list(v) for n, v in first.reference_scores().items()}
    assert len(list(tmp_path.glob("proxy_reference/*.json"))) == 2


def test_proxy_evaluator_runs_a_search_through_the_api(tmp_path: Path, proxy_evaluator):
    spec = SearchSpec(space=Component("nb201", {"channels": 4, "cells_per_stage": 1}),
                      strategy=Component("random"), evaluator=Component("proxy", dict(SMALL)), seed=0, trials=3)
    SearchLoop(spec, tmp_path, LocalExecutor(proxy_evaluator, None), progress=False).run_search()
    lines = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(0.0 <= r["accuracy"] == r["metrics"]["vote_percentile"] <= 100.0 for r in lines)


@pytest.mark.parametrize("params, error", [
    ({"proxies": ["synflow", "bogus"]}, r"^unknown proxy 'bogus' \(valid: grad_norm, "),
    ({"proxies": []}, r"^evaluator.proxies must be a non-empty list of proxy names, got \[\]$"),
    ({"chanels": 4}, r"^evaluator 'proxy': unknown parameter 'chanels' \(accepted: batch_size, cells_per_stage, channels, "),
    ({"reference": 0}, r"^evaluator.reference must be an integer >= 1, got 0$"),
    ({"data": {"name": "mnist"}}, r"^data: unknown dataset 'mnist' \(valid: "),
])
def test_proxy_evaluator_bad_config_is_one_line(params, error):
    with pytest.raises(ConfigError, match=error):
        EVALUATORS.create("proxy", {"data": DIGITS, **params}, space=TINY)


def test_untrusted_source_is_refused_by_the_proxy_evaluator():
    with pytest.raises(ConfigError, match=r"^evaluator 'proxy' does not support space 'source' \(supports: nb201\)$"):
        build_evaluator(Component("proxy", {"data": DIGITS}), SPACES.create("source", {}))


def test_trained_candidates_carry_their_proxies():
    from nas.evaluators.train import TrainEvaluator

    recipe = {"epochs": 1, "batch_size": 64, "train_subset": 128, "valid_subset": 64, "test_subset": 64}
    ev = TrainEvaluator(TINY, {"name": "digits"}, recipe, channels=4, cells_per_stage=1)
    result = ev.evaluate(uniform("nor_conv_3x3"), seed=0)
    assert {"proxy_synflow", "proxy_jacob_cov", "proxy_snip"} <= set(result.metrics) and result.ok
    off = TrainEvaluator(TINY, {"name": "digits"}, recipe, channels=4, cells_per_stage=1, proxies=[])
    plain = off.evaluate(uniform("nor_conv_3x3"), seed=0)
    assert not any(k.startswith("proxy_") for k in plain.metrics)
    assert result.accuracy == plain.accuracy and result.curve == plain.curve  # training untouched


def test_model_source_gets_its_proxies_from_the_exported_graph():
    """Untrusted source is never built here: its proxies are computed on the graph the sandbox exports."""
    from nas.evaluators.train import TrainEvaluator
    from nas.spaces.source.arch import SourceArch
    from nas.spaces.source.space import SourceSpace
    from test_train_eval import SOURCE  # a one-conv digits classifier

    recipe = {"epochs": 1, "batch_size": 64, "train_subset": 128, "valid_subset": 64, "test_subset": 64}
    ev = TrainEvaluator(SourceSpace(), {"name": "digits"}, recipe, sandbox={"wall_s": 300})
    result = ev.evaluate(SourceArch(SOURCE), seed=0)
    assert result.ok and "self_reported" not in result.metrics
    assert {"proxy_synflow", "proxy_jacob_cov", "proxy_snip"} <= set(result.metrics)
    assert result.metrics["proxy_synflow"] > 0 and result.metrics["proxy_snip"] > 0


def test_proxy_scorer_screens_from_the_first_batch_keeping_the_best_vote(tmp_path):
    from nas.core.trial import read_history
    from nas.search.screen import ScreenSettings

    settings = ScreenSettings(factor=3, scorer="proxy", min_history=0,
                              params={"channels": 4, "cells_per_stage": 1, "batch_size": 8})
    spec = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"),
                      trials=4, batch_size=2, screen=settings)
    summary = SearchLoop(spec, tmp_path, LocalExecutor(spec.build_evaluator(spec.build_space()), None),
                         progress=False).run_search()
    history = read_history(tmp_path / "history.jsonl")
    assert summary["trials"] == 4 and summary["screened"] == 8 and len(history) == 12
    for start in range(0, 12, 6):  # each batch: 6 asked, the 2 with the best vote evaluated
        batch = history[start:start + 6]
        kept = [r.score for r in batch if not r.screened]
        dropped = [r.score for r in batch if r.screened]
        assert len(kept) == 2 and min(kept) >= max(dropped)  # type: ignore[type-var]
        assert all(r.accuracy is not None for r in batch if not r.screened)


@pytest.mark.parametrize("space, params, message", [
    ("source", {}, "screen.scorer=proxy builds networks in this process: space 'source' is untrusted"),
    ("nb201", {"data": "mnist9"}, "screen.params.data: unknown dataset 'mnist9'"),
    ("nb201", {"width": 3},
     "screen.params: unknown parameter 'width' (accepted: batch_size, cells_per_stage, channels, data, num_classes, "
     "shape)"),
])
def test_proxy_scorer_bad_settings_are_one_line(space, params, message):
    from nas.search.screen import SCORERS

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        SCORERS.create("proxy", params, space=SPACES.create(space, {}))
    assert "\n" not in str(err.value)

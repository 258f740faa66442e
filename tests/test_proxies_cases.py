"""The proxies case by case (issue 52, the library mutation run): each proxy's exact value on a
network small enough to work out by hand, the minibatches value by value, and the proxy
screening scorer's settings at and either side of each limit."""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest
import torch
from torch import nn

from nas.data.sources import ImageData, Split
from nas.errors import ConfigError
from nas.proxies import PROXIES, score_arch, score_network
from nas.proxies.base import LOWEST, Batch
from nas.proxies.batch import data_batch, random_batch
from nas.proxies.gradients import loss_gradients, weight_tensors
from nas.proxies.scores import JacobCov, Naswot, _finite
from nas.proxies.screen import ProxyScorer
from nas.proxies.vote import vote_scores
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import NB201Space

TINY = {"channels": 4, "cells_per_stage": 1}


def batch_of(*rows: list[float], num_classes: int = 2) -> Batch:
    """Images (N, 1, 1, len(row)), one per row, labels 0, 1, 0, ..."""
    images = torch.tensor(rows, dtype=torch.float32).view(len(rows), 1, 1, -1)
    return Batch(images, torch.arange(len(rows)) % num_classes, num_classes, "test")


def linear(*weights: list[list[float]], bias: bool = False) -> nn.Sequential:
    """Flatten, then one bias-free (or zero-bias) linear layer per weight matrix, set as given."""
    layers: list[nn.Module] = [nn.Flatten()]
    for w in weights:
        layer = nn.Linear(len(w[0]), len(w), bias=bias)
        with torch.no_grad():
            layer.weight.copy_(torch.tensor(w))
            if bias:
                layer.bias.fill_(-0.25)
        layers.append(layer)
    return nn.Sequential(*layers)


class Square(nn.Module):
    """out = sum x^2 per image: the input Jacobian of image i is 2 x_i."""

    def forward(self, x):
        return (x ** 2).sum(dim=(1, 2, 3))


@pytest.mark.parametrize("value, finite", [(1.5, 1.5), (-2.0, -2.0), (0.0, 0.0), (math.inf, LOWEST),
                                           (-math.inf, LOWEST), (math.nan, LOWEST)])
def test_a_score_that_is_not_finite_is_the_lowest(value, finite):
    assert _finite(value) == finite


def test_only_synflow_rewrites_weights():
    assert [n for n in PROXIES.names() if PROXIES.get(n).mutates_weights] == ["synflow"]


def test_synflow_sums_w_times_its_gradient_on_one_all_ones_input_with_weights_made_positive():
    # made positive: W = [[0.5, 1.5], [2, 0.25]], biases 0.25, V = [3, 0.5]; on ones, h = W 1 + 0.25 = [2.25, 2.5]
    # and R = V h + 0.25: dR/dW_ki = V_k, dR/dV_k = h_k; biases (one dimension) do not count
    net = linear([[0.5, -1.5], [2.0, 0.25]], [[-3.0, 0.5]], bias=True)
    got = score_network(net, batch_of([9.0, 9.0], [7.0, 7.0]), ["synflow"], seed=0)["synflow"]
    assert got == pytest.approx((0.5 + 1.5) * 3 + (2.0 + 0.25) * 0.5 + 3 * 2.25 + 0.5 * 2.5, rel=1e-12)


def test_snip_and_grad_norm_of_given_gradients():
    snip, grad_norm = PROXIES.get("snip")(), PROXIES.get("grad_norm")()
    gradients = [(torch.tensor([[1.5, -2.0]]), torch.tensor([[0.5, 0.25]])), (torch.tensor([[3.0]]), torch.tensor([[-4.0]]))]
    assert snip.from_gradients(gradients) == 0.75 + 0.5 + 12.0
    assert grad_norm.from_gradients(gradients) == pytest.approx(math.hypot(0.5, 0.25) + 4.0, rel=1e-6)
    infinite = [(torch.tensor([[math.inf]]), torch.tensor([[1.0]]))]
    assert snip.from_gradients(infinite) == LOWEST and grad_norm.from_gradients([(infinite[0][1], infinite[0][0])]) == LOWEST


def test_loss_gradients_are_the_reached_weights_fresh_gradients_only():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 3), nn.Linear(3, 2))
    unused = nn.Linear(2, 2)
    net.add_module("unused", unused)  # never called in forward: no gradient
    net.forward = lambda x: net[2](net[1](net[0](x)))  # type: ignore[method-assign]
    for p in net.parameters():
        p.grad = torch.ones_like(p)  # a previous pass's gradients: dropped, not added to
    batch = batch_of([1.0, -1.0], [0.5, 2.0])
    got = loss_gradients(net, batch)
    assert [p is q for (p, _), q in zip(got, (net[1].weight, net[2].weight))] == [True, True] and len(got) == 2
    fresh = nn.Sequential(nn.Flatten(), nn.Linear(2, 3), nn.Linear(3, 2))
    fresh.load_state_dict({k: v for k, v in net.state_dict().items() if not k.startswith("unused")})
    torch.nn.functional.cross_entropy(fresh(batch.images), batch.labels).backward()
    assert torch.equal(got[0][1], fresh[1].weight.grad) and torch.equal(got[1][1], fresh[2].weight.grad)
    assert net.training
    assert [tuple(p.shape) for p in weight_tensors(net)] == [(3, 2), (2, 3), (2, 2)]


def test_jacob_cov_of_uncorrelated_and_of_correlated_jacobians():
    k = JacobCov.K
    # Jacobians 2x: [0.1, -0.1, 0.1, -0.1] and [0.1, 0.1, -0.1, -0.1] are uncorrelated: eigenvalues 1, 1
    small = batch_of([0.1, -0.1, 0.1, -0.1], [0.1, 0.1, -0.1, -0.1])
    assert JacobCov().score(Square(), small) == pytest.approx(-2 * (math.log(1 + k) + 1 / (1 + k)), rel=1e-12)
    # proportional Jacobians: correlation 1 everywhere, eigenvalues 0 and 2
    same = batch_of([1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0])
    expected = -(math.log(k) + 1 / k + math.log(2 + k) + 1 / (2 + k))
    assert JacobCov().score(Square(), same) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("rows", [([0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]), ([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0])])
def test_jacob_cov_of_a_constant_jacobian_row_is_the_lowest(rows):
    assert JacobCov().score(Square(), batch_of(*rows)) == LOWEST


def test_naswot_is_the_log_determinant_of_the_codes_agreements():
    # codes 1010 and 1100 agree in 2 of 4 places: K = [[4, 2], [2, 4]], log det = log 12
    batch = batch_of([1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0])
    assert Naswot().score(nn.Sequential(nn.ReLU()), batch) == pytest.approx(math.log(12), rel=1e-12)
    # two ReLUs add their agreements: K = [[8, 4], [4, 8]], log det = log 48
    assert Naswot().score(nn.Sequential(nn.ReLU(), nn.ReLU()), batch) == pytest.approx(math.log(48), rel=1e-12)
    # equal codes: singular
    assert Naswot().score(nn.Sequential(nn.ReLU()), batch_of([1.0, -1.0], [2.0, -3.0])) == LOWEST


def test_naswot_without_a_relu_that_runs_is_the_lowest():
    batch = batch_of([1.0, -1.0], [0.5, 2.0])
    assert Naswot().score(nn.Sequential(nn.Flatten()), batch) == LOWEST
    net = nn.Sequential(nn.Flatten())
    net.add_module("idle", nn.ReLU())
    net.forward = lambda x: x  # type: ignore[method-assign]
    assert Naswot().score(net, batch) == LOWEST
    assert not net._forward_hooks and not net.idle._forward_hooks  # its hooks are removed


def test_params_counts_the_trainable_parameters_only():
    net = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 5))
    net[1].weight.requires_grad_(False)
    assert PROXIES.get("params")().score(net, batch_of([1.0])) == 8.0 + 5.0


def test_scoring_with_sizing_options_builds_the_network_they_size():
    batch = random_batch((3, 8, 8), 10, 4, seed=0)
    cell = NB201Cell(("nor_conv_3x3",) * 6)
    small = score_arch(NB201Space(), cell, batch, ["params"], 0, TINY)["params"]
    assert small == score_arch(NB201Space(**TINY), cell, batch, ["params"], 0)["params"]
    assert small < score_arch(NB201Space(), cell, batch, ["params"], 0)["params"]


# ---------------------------------------------------------------- minibatches

def fake_data(values: list[int], channels: int = 1, size: tuple[int, int] = (1, 2), mean=(0.0,), std=(1.0,)):
    """Image i: every pixel `values[i]`, or (a single value list of lists) the given pixels."""
    images = torch.tensor(values, dtype=torch.uint8).view(len(values), 1, 1, 1).expand(-1, channels, *size)
    split = Split(images.contiguous(), torch.arange(len(values)))
    return ImageData("fake", split, split, split, 7, mean * channels, std * channels, 0)


@pytest.mark.parametrize("size, ok", [(0, False), (1, True), (4, True), (5, False)])
def test_a_data_batch_takes_one_to_all_training_images(size, ok):
    data = fake_data([0, 51, 102, 153])
    if ok:
        assert len(data_batch(data, size, seed=0).images) == size
    else:
        with pytest.raises(ValueError, match=r"^batch size must be 1\.\.4, got "):
            data_batch(data, size, seed=0)


def test_a_data_batch_draws_distinct_images_normalised_with_their_labels():
    data = fake_data([0, 51, 102, 153, 204, 255], mean=(0.2,), std=(0.5,))
    got = data_batch(data, 6, seed=0)
    index = sorted(got.labels.tolist())
    assert index == [0, 1, 2, 3, 4, 5]  # without replacement
    assert got.labels.tolist() == np.random.default_rng(0).choice(6, 6, replace=False).tolist()
    expected = torch.tensor([[(v / 255 - 0.2) / 0.5] * 2 for v in (0, 51, 102, 153, 204, 255)])
    assert torch.allclose(got.images.view(6, 2), expected[got.labels], atol=1e-6)
    assert (got.num_classes, got.source, got.shape) == (7, "fake", (1, 1, 2))
    assert data_batch(data, 3, seed=1).labels.tolist() == np.random.default_rng(1).choice(6, 3, replace=False).tolist()


def test_a_data_batch_is_resized_bilinearly_without_aligning_corners():
    data = ImageData("fake", *(Split(torch.tensor([[[[0, 255]]]], dtype=torch.uint8), torch.tensor([0])),) * 3,
                     2, (0.0,), (1.0,), 0)
    got = data_batch(data, 1, seed=0, shape=(1, 1, 4))
    assert got.images.flatten().tolist() == [0.0, 0.25, 0.75, 1.0]
    assert data_batch(data, 1, seed=0, shape=(1, 1, 2)).images.flatten().tolist() == [0.0, 1.0]
    grey = data_batch(data, 1, seed=0, shape=(3, 2, 2))
    assert grey.shape == (3, 2, 2) and all(torch.equal(grey.images[0, c], grey.images[0, 0]) for c in (1, 2))
    assert data_batch(data, 1, seed=0).shape == (1, 1, 2)  # no shape: as the data is
    rgb = fake_data([10, 20], channels=3, size=(2, 2), mean=(0.0,), std=(1.0,))  # three channels, two rows
    assert data_batch(rgb, 2, seed=0, shape=(3, 4, 4)).shape == (3, 4, 4)
    tall = fake_data([10, 20], size=(3, 2))  # grey, three rows: made three channels all the same
    got = data_batch(tall, 2, seed=0, shape=(3, 3, 2))
    assert got.shape == (3, 3, 2) and torch.equal(got.images[:, 1], got.images[:, 0])


def test_random_batches_are_seeded_normal_images_with_every_label():
    got = random_batch((1, 2, 3), 3, 64, seed=5)
    gen = torch.Generator().manual_seed(5)
    assert torch.equal(got.images, torch.randn((64, 1, 2, 3), generator=gen))
    assert torch.equal(got.labels, torch.randint(0, 3, (64,), generator=gen))
    assert set(got.labels.tolist()) == {0, 1, 2} and (got.num_classes, got.source, got.shape) == (3, "random", (1, 2, 3))


def test_a_batch_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        random_batch((1, 2, 2), 2, 2, seed=0).source = "x"  # type: ignore[misc]


# ---------------------------------------------------------------- the screening scorer

def test_the_proxy_scorer_s_defaults_are_a_random_batch_of_32_at_32x32():
    scorer = ProxyScorer(NB201Space())
    assert (scorer.data, scorer.batch_size, scorer.shape, scorer.num_classes, scorer.options) == (
        "random", 32, (3, 32, 32), 10, None)
    expected = random_batch((3, 32, 32), 10, 32, 0)
    assert torch.equal(scorer.batch.images, expected.images) and torch.equal(scorer.batch.labels, expected.labels)


def test_the_proxy_scorer_s_batch_of_a_dataset_is_its_seed_0_draw():
    from nas.data.sources import load_data

    scorer = ProxyScorer(NB201Space(), data="digits", batch_size=4, shape=[1, 8, 6], **TINY)
    assert scorer.shape == (1, 8, 6) and scorer.options == TINY
    expected = data_batch(load_data("digits"), 4, 0, (1, 8, 6))
    assert torch.equal(scorer.batch.images, expected.images) and torch.equal(scorer.batch.labels, expected.labels)


def test_the_proxy_scorer_votes_over_two_or_more_and_scores_fewer_zero():
    scorer = ProxyScorer(NB201Space(), batch_size=4, shape=(3, 8, 8), **TINY)
    cells = [NB201Cell(("nor_conv_3x3",) * 6), NB201Cell(("none",) * 6), NB201Cell(("skip_connect",) * 6)]
    assert scorer.score(cells[:1], [], seed=3) == [0.0] and scorer.score([], [], seed=3) == []
    assert scorer.score(cells[:2], [], seed=3) == [2.0, 1.0]
    rng = np.random.default_rng(3)
    cells = [NB201Space().sample(rng) for _ in range(5)]
    got = scorer.score(cells, [], seed=3)  # the run's seed does not matter: the vote's is 0
    assert got == vote_scores(NB201Space(), cells, scorer.batch, 0, TINY) != vote_scores(
        NB201Space(), cells, scorer.batch, 1, TINY)
    assert got == pytest.approx([2.0, 10 / 3, 5.0, 4 / 3, 10 / 3])


@pytest.mark.parametrize("trainable, trusted, open_ended, problem", [
    (True, False, False, "is untrusted"), (False, True, False, "is not a sampled, trainable space"),
    (True, True, True, "is not a sampled, trainable space"), (False, False, True, "is untrusted")])
def test_the_proxy_scorer_refuses_a_space_it_cannot_build_networks_of(trainable, trusted, open_ended, problem):
    space = types.SimpleNamespace(name="s", trainable=trainable, trusted=trusted, open_ended=open_ended)
    with pytest.raises(ConfigError, match=f"space 's' {problem}; use screen.scorer=predictor$"):
        ProxyScorer(space)  # type: ignore[arg-type]


@pytest.mark.parametrize("params, problem", [
    ({"data": "digits"}, None), ({"data": "mnist9"}, "unknown dataset 'mnist9'"),
    ({"batch_size": 2}, None), ({"batch_size": 1}, "batch_size must be an integer >= 2, got 1"),
    ({"batch_size": True}, "got True"), ({"batch_size": 4.0}, "got 4.0"),
    ({"shape": (1, 1, 1)}, None), ({"shape": [3, 16, 16]}, None),
    ({"shape": (3, 32)}, "shape must be [channels, height, width], got (3, 32)"),
    ({"shape": (3, 32, 32, 1)}, "got (3, 32, 32, 1)"), ({"shape": (0, 32, 32)}, "got (0, 32, 32)"),
    ({"shape": (3, 32, -1)}, "got (3, 32, -1)"), ({"shape": (3.0, 32, 32)}, "got (3.0, 32, 32)"),
])
def test_the_proxy_scorer_s_settings_at_and_beyond_their_limits(params, problem):
    if problem is None:
        assert ProxyScorer(NB201Space(), **params)
    else:
        with pytest.raises(ConfigError) as err:
            ProxyScorer(NB201Space(), **params)
        assert problem in str(err.value)

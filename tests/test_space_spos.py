"""SPOS ShuffleNetV2: encoding, space contract, cost table and supernet (small preset)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import space_preset
from nas.errors import ConfigError, EncodingError
from nas.measure import count_flops, count_params
from nas.spaces import SPACES
from nas.spaces.spos.arch import CHOICE_NAMES, SPOSArch
from nas.spaces.spos.space import SPOSSpace
from supernets.base import SUPERNETS
from supernets.spos import SPOSSupernet


def preset(name: str) -> SPOSSpace:
    params = space_preset(name)
    return SPACES.create(params.pop("name"), params)


@pytest.fixture(scope="module")
def small() -> SPOSSpace:
    return preset("spos_small")


@pytest.fixture(scope="module")
def supernet(small: SPOSSpace) -> SPOSSupernet:
    torch.manual_seed(0)
    return SUPERNETS.create("spos", {}, space=small, num_classes=small.num_classes)


def random_archs(space: SPOSSpace, n: int, seed: int = 0) -> list[SPOSArch]:
    rng = np.random.default_rng(seed)
    return [space.sample(rng) for _ in range(n)]


# --- encoding ------------------------------------------------------------------

def test_round_trip_ints_and_names():
    space = SPACES.create("spos", {})
    for arch in random_archs(space, 5):
        data = json.loads(json.dumps(arch.encode()))
        assert data == list(arch.choices) and space.decode(data) == arch
        assert space.decode([CHOICE_NAMES[c] for c in data]) == arch
        assert arch.canonical() == "".join(map(str, data)) and space.decode(data).key() == arch.key()


BAD = [
    ("0" * 20, "spos: encoding must be a list of 20 block choices, got str"),
    ({"block": 1}, "spos: encoding must be a list of 20 block choices, got dict"),
    ([0] * 19, "spos: expected 20 block choices, got 19"),
    ([0] * 7 + [5] + [0] * 12,
     "spos: block 7 = 5 is not a choice 0-3 (shuffle3x3, shuffle5x5, shuffle7x7, xception)"),
    ([0] * 19 + ["conv3x3"], "spos: block 19 = 'conv3x3' is not a choice 0-3"),
    ([True] + [0] * 19, "spos: block 0 = True is not a choice"),
    ([0, 1.0] + [0] * 18, "spos: block 1 = 1.0 is not a choice"),
    ([-1] + [0] * 19, "spos: block 0 = -1 is not a choice"),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_encodings_fail_in_one_line(data, message):
    with pytest.raises(EncodingError) as info:
        SPACES.create("spos", {}).decode(data)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize(("params", "message"), [
    ({"stage_channels": [16, 32, 64]}, "4 stage_repeats but 3 stage_channels"),
    ({"stage_channels": [16, 32, 64, 128]}, "stage 0 has 16 channels"),
    ({"stage_channels": [64, 160, 321, 640]}, "stage 2 has 321 channels"),
    ({"stage_repeats": [4, 0, 8, 4]}, "stage_repeats must be a non-empty list of positive ints"),
    ({"stem_stride": 4}, "stem_stride must be 1 or 2"),
])
def test_bad_skeletons_fail_in_one_line(params, message):
    with pytest.raises(ConfigError, match=message):
        SPACES.create("spos", params)


# --- space ---------------------------------------------------------------------

def test_decisions_and_size():
    space = SPACES.create("spos", {})
    decisions = space.decisions()
    assert [d.name for d in decisions] == [f"block[{i}]" for i in range(20)]
    assert all(d.choices == (0, 1, 2, 3) for d in decisions)
    assert space.size() == 4 ** 20
    assert SPACES.create("spos", {"stage_repeats": [1, 2], "stage_channels": [32, 64]}).size() == 4 ** 3


def test_mutate_changes_exactly_one_block():
    space, rng = SPACES.create("spos", {}), np.random.default_rng(1)
    for arch in random_archs(space, 20):
        child = space.mutate(arch, rng)
        assert sum(a != b for a, b in zip(arch.choices, child.choices)) == 1


def test_describe_states_size_costs_and_encoding(small):
    text = small.describe()
    assert "1,099,511,627,776" in text and "JSON list of 20 ints" in text and "Xception" in text
    assert "M FLOPs" in text and "32px" in text


# --- cost and supernet (small preset) ----------------------------------------------------

def test_cost_table_equals_direct_fvcore_count(small, supernet):
    for arch in random_archs(small, 2, seed=2) + [supernet.largest(), supernet.smallest()]:
        net = supernet.extract(arch)
        direct = (count_params(net), count_flops(net, (1, 3, small.resolution, small.resolution)))
        assert (small.cost(arch).params, small.cost(arch).flops) == direct


def test_largest_and_smallest_bound_the_flops(small, supernet):
    flops = [small.cost(a).flops for a in random_archs(small, 50, seed=3)]
    assert small.cost(supernet.smallest()).flops <= min(flops)
    assert small.cost(supernet.largest()).flops >= max(flops)


def test_extracted_subnet_matches_supernet_in_eval_mode(small, supernet):
    torch.manual_seed(1)
    archs = random_archs(small, 3, seed=5)
    supernet.train()
    with torch.no_grad():  # move the BN running statistics away from their init
        for arch in archs:
            supernet.set_active(arch)
            supernet(torch.randn(8, 3, small.resolution, small.resolution))
    supernet.eval()
    x = torch.randn(2, 3, small.resolution, small.resolution)
    with torch.no_grad():
        for arch in archs:
            supernet.set_active(arch)
            sub = supernet.extract(arch).eval()
            assert count_params(sub) < count_params(supernet) / 3
            assert torch.allclose(sub(x), supernet(x), atol=1e-5)


def test_supernet_rejects_other_architectures(supernet):
    with pytest.raises(EncodingError, match="expected an SPOS architecture with 20 blocks"):
        supernet.set_active(SPOSArch((0,) * 19))


def test_sandwich_training_learns_the_largest_path_on_digits(tmp_path):
    """Issue 41: under the sandwich rule the largest path (trained at every step) learns in 24 steps."""
    from supernets.train import SupernetSettings, train_supernet

    settings = SupernetSettings(epochs=3, batch_size=64, train_subset=512, val_subset=200, recal_batches=2,
                                sampling="sandwich")
    trained = train_supernet(space_preset("spos_small"), {}, {"name": "digits", "root": None, "split_file": None},
                             settings, seed=0, out_dir=tmp_path, progress=False)
    assert trained.steps == 24 and trained.val_accuracy_largest > 30, trained


def test_a_default_training_step_trains_every_unit_of_every_block(small):
    """Issue 48: mixed paths stayed at chance while the sandwich rule trained the extremes at every
    step and the other units seldom (supernets/spos.py). The default's first step (drop-path: every
    choice averaged) must give every unit of every block a gradient; a sandwich or uniform step
    leaves units out."""
    from supernets.train import Mixed, SubnetSampler

    torch.manual_seed(0)
    net = SUPERNETS.create("spos", {}, space=small, num_classes=small.num_classes)
    sampler = SubnetSampler.for_supernet(net, SPOSSupernet.default_sampling, n_random=2, total_steps=10, seed=0)
    x = torch.randn(2, 3, small.resolution, small.resolution)
    for path in sampler.draw(0):
        net.set_mixed(path.values) if isinstance(path, Mixed) else net.set_active(path)
        net(x).sum().backward()
    untrained = [(b, c) for b, units in enumerate(net.blocks) for c, unit in enumerate(units)
                 if any(p.grad is None for p in unit.parameters())]
    assert not untrained, untrained

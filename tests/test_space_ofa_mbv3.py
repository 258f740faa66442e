"""OFA MobileNetV3: encoding, canonical form, space, cost and the `ofa` supernet wrapper."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from conftest import space_preset
from nas.errors import ConfigError, EncodingError
from nas.spaces import SPACES
from nas.spaces.ofa_mbv3.arch import OFAMbv3Arch
from nas.spaces.ofa_mbv3.space import OFAMbv3Space
from supernets.base import SUPERNETS
from supernets.ofa_mbv3 import OFAMbv3Supernet

# In the format of CoLLM-NAS's MobileNet-space table (values ours).
PAPER = {"r": [208], "d": [3, 3, 3, 3, 4],
         "ks": [5, 7, 3, 3, 7, 3, 5, 5, 5, 7, 7, 3, 7, 5, 7, 3, 7, 7, 5, 3],
         "e": [4, 6, 3, 3, 6, 4, 4, 3, 6, 6, 4, 4, 6, 6, 3, 6, 6, 6, 4, 4]}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Batch-1/2 CPU ops on shared cores: OpenMP's second thread costs far more than it gives."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def preset(name: str) -> OFAMbv3Space:
    params = space_preset(name)
    return SPACES.create(params.pop("name"), params)


@pytest.fixture(scope="module")
def space() -> OFAMbv3Space:
    return preset("ofa_mbv3")


@pytest.fixture(scope="module")
def small() -> OFAMbv3Space:
    return preset("ofa_mbv3_small")


@pytest.fixture(scope="module")
def supernet(small: OFAMbv3Space) -> OFAMbv3Supernet:
    torch.manual_seed(0)
    sup = SUPERNETS.get("ofa_mbv3")(small, num_classes=10)
    rng = np.random.default_rng(1)
    with torch.no_grad():  # give BatchNorm non-trivial running statistics before comparing in eval mode
        for _ in range(3):
            a = small.sample(rng)
            sup.set_active(a)
            sup(torch.randn(8, 3, a.r, a.r))
    return sup


def with_changes(encoding: dict, **changes: dict[int, int]) -> dict:
    out = {k: list(v) for k, v in encoding.items()}
    for key, by_index in changes.items():
        for i, v in by_index.items():
            out[key][i] = v
    return out


# --- encoding ------------------------------------------------------------------

def test_decisions_are_r_d_ks_e_small_to_large(space):
    names = [d.name for d in space.decisions()]
    assert names == ["r", *(f"d[{i}]" for i in range(5)), *(f"ks[{j}]" for j in range(20)),
                     *(f"e[{j}]" for j in range(20))]
    assert [d.choices for d in space.decisions()[:7]] == [(160, 176, 192, 208, 224), *[(2, 3, 4)] * 5, (3, 5, 7)]
    assert space.decisions()[-1].choices == (3, 4, 6)


def test_paper_encoding_round_trips(space):
    arch = space.decode(PAPER)
    assert arch.encode() == PAPER
    assert space.decode({**PAPER, "r": 208}) == arch  # r as a bare int
    assert space.decode(json.loads(json.dumps(arch.encode()))) == arch
    assert arch.canonical().startswith("r208|k5e4,k7e6,k3e3|k7e6,k3e4,k5e4|")


def test_random_samples_round_trip(space):
    rng = np.random.default_rng(0)
    for _ in range(50):
        arch = space.sample(rng)
        assert OFAMbv3Arch.decode(arch.encode()).encode() == arch.encode()
        assert space.from_values(space.to_values(arch)) == arch
        assert space.from_indices(space.to_indices(arch)).key() == arch.key()


def test_depth_activates_the_first_blocks_of_each_stage(space):
    arch = space.decode(with_changes(PAPER, d={0: 2, 1: 3, 2: 4, 3: 3, 4: 2}))
    assert arch.active_blocks() == [0, 1, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 16, 17]


def test_canonical_ignores_inactive_blocks(space):
    arch = space.decode(PAPER)  # d = 3,3,3,3,4: blocks 3, 7, 11, 15 are inactive
    twin = space.decode(with_changes(PAPER, ks={3: 7, 15: 5}, e={7: 6, 11: 3}))
    assert twin == arch and twin.key() == arch.key() and twin.encode() != arch.encode()
    assert space.decode(with_changes(PAPER, ks={2: 7})) != arch  # block 2 is active
    assert space.decode(with_changes(PAPER, d={0: 4})) != arch


@pytest.mark.parametrize("encoding, message", [
    ([208], "ofa_mbv3: encoding must be a dict with keys r, d, ks, e, got list"),
    ({k: v for k, v in PAPER.items() if k != "e"}, "ofa_mbv3: encoding is missing key 'e' (needs r, d, ks, e)"),
    ({**PAPER, "w": [1]}, "ofa_mbv3: unknown key 'w' (valid: r, d, ks, e)"),
    ({**PAPER, "r": [208, 224]}, "ofa_mbv3: r must be an int or a 1-element list, got 2 values"),
    ({**PAPER, "r": [200]}, "ofa_mbv3: r = 200 is not one of 160, 176, 192, 208, 224"),
    ({**PAPER, "r": "208"}, "ofa_mbv3: r = '208' is not an int"),
    ({**PAPER, "d": [3, 3, 3, 3]}, "ofa_mbv3: d must have 5 values, got 4"),
    ({**PAPER, "d": 3}, "ofa_mbv3: d must be a list of ints, got int"),
    (with_changes(PAPER, d={1: 5}), "ofa_mbv3: d[1] = 5 is not in 1..4"),
    (with_changes(PAPER, d={1: 1}), "ofa_mbv3: d[1] = 1 is not one of 2, 3, 4"),
    (with_changes(PAPER, ks={7: 9}), "ofa_mbv3: ks[7] = 9 is not one of 3, 5, 7"),
    (with_changes(PAPER, e={19: 5}), "ofa_mbv3: e[19] = 5 is not one of 3, 4, 6"),
    (with_changes(PAPER, e={4: True}), "ofa_mbv3: e[4] = True is not an int"),
    (with_changes(PAPER, ks={0: 3.0}), "ofa_mbv3: ks[0] = 3.0 is not an int"),
    ({**PAPER, "ks": PAPER["ks"][:19]}, "ofa_mbv3: ks must have 20 values, got 19"),
    ({**PAPER, "e": PAPER["e"][:15]}, "ofa_mbv3: e must have 20 values, got 15"),
])
def test_bad_encodings_name_the_bad_part(space, encoding, message):
    with pytest.raises(EncodingError) as err:
        space.decode(encoding)
    assert str(err.value) == message


def test_structure_errors_without_a_space():
    with pytest.raises(EncodingError, match=r"^ofa_mbv3: ks must have a multiple of 5 values, got 19$"):
        OFAMbv3Arch(208, (2,) * 5, (3,) * 19, (3,) * 19)
    with pytest.raises(EncodingError, match=r"^ofa_mbv3: e must have 20 values like ks, got 15$"):
        OFAMbv3Arch(208, (2,) * 5, (3,) * 20, (3,) * 15)
    with pytest.raises(EncodingError, match=r"^ofa_mbv3: d\[4\] = 4 is not in 1..3$"):
        OFAMbv3Arch.decode({**PAPER, "ks": PAPER["ks"][:15], "e": PAPER["e"][:15]})


def test_space_rejects_an_arch_of_another_shape(space):
    with pytest.raises(EncodingError, match=r"^ofa_mbv3: ks and e must have 20 values, got 15$"):
        space.validate(OFAMbv3Arch(208, (2,) * 5, (3,) * 15, (3,) * 15))


def test_from_values_checks_the_count(space):
    with pytest.raises(EncodingError, match=r"^ofa_mbv3: expected 46 values .* got 3$"):
        space.from_values([208, 2, 2])


def test_mutate_changes_the_network_in_one_decision(space):
    rng = np.random.default_rng(2)
    for _ in range(50):
        parent = space.sample(rng)
        child = space.mutate(parent, rng)
        assert child != parent
        assert sum(a != b for a, b in zip(space.to_values(parent), space.to_values(child))) == 1


# --- space ---------------------------------------------------------------------

def test_size_counts_distinct_networks(space):
    assert space.size() == 5 * (9 ** 2 + 9 ** 3 + 9 ** 4) ** 5
    tiny = OFAMbv3Space(resolutions=[32], depths=[1, 2], kernel_sizes=[3], expand_ratios=[3, 4])
    forms = {tiny.from_values(list(v)).canonical()
             for v in itertools.product(*(d.choices for d in tiny.decisions()))}
    assert tiny.size() == len(forms) == (2 + 4) ** 5


@pytest.mark.parametrize("params, message", [
    ({"kernel_sizes": [3, 4]}, "space 'ofa_mbv3': kernel_sizes must be odd, got [3, 4]"),
    ({"depths": []}, "space 'ofa_mbv3': depths must be a non-empty list of distinct positive ints, got []"),
    ({"expand_ratios": [3, 3]}, "space 'ofa_mbv3': expand_ratios must be a non-empty list of distinct "
                                "positive ints, got [3, 3]"),
    ({"width_mult": "wide"}, "space 'ofa_mbv3': parameter 'width_mult' must be float, got 'wide'"),
])
def test_bad_space_settings(params, message):
    with pytest.raises(ConfigError) as err:
        SPACES.create("ofa_mbv3", params)
    assert str(err.value) == message


def test_describe_states_the_encoding_and_active_rule(space):
    text = space.describe()
    assert '"ks": [20 kernel sizes]' in text and "first d[i] blocks" in text and "160, 176, 192, 208, 224" in text
    assert "\n" not in text


def test_cost_grows_with_the_network_and_ignores_inactive_blocks(small):
    largest = small.from_values([d.choices[-1] for d in small.decisions()])
    smallest = small.from_values([d.choices[0] for d in small.decisions()])
    assert small.cost(largest).flops > small.cost(smallest).flops
    assert small.cost(largest).params > small.cost(smallest).params
    assert small.cost(small.decode(with_changes(largest.encode(), e={19: 3}))).flops < small.cost(largest).flops
    shallow = with_changes(largest.encode(), d={4: 2})
    assert small.cost(small.decode(with_changes(shallow, e={19: 3}))) == small.cost(small.decode(shallow))


# --- supernet ------------------------------------------------------------------

def test_supernet_protocol(small, supernet):
    assert supernet.name == "ofa_mbv3" and supernet.default_sampling == "sandwich"
    assert supernet.phases == (("ks",), ("d",), ("e",))
    assert supernet.config() == {"num_classes": 10, "in_channels": 3, "dropout_rate": 0.1}
    assert supernet.largest().encode() == {"r": [32], "d": [4] * 5, "ks": [7] * 20, "e": [6] * 20}
    assert supernet.input_size(small.decode(PAPER | {"r": [24]})) == 24
    with pytest.raises(ConfigError, match="in_channels must be 3"):
        OFAMbv3Supernet(small, 10, in_channels=1)
    with pytest.raises(EncodingError, match=r"^ofa_mbv3: r = 208 is not one of 24, 28, 32$"):
        supernet.set_active(OFAMbv3Space().decode(PAPER))  # legal in the ImageNet space only


def test_extracted_subnet_matches_the_supernet(small, supernet):
    rng = np.random.default_rng(5)
    supernet.eval()
    archs = [supernet.largest(), supernet.smallest(), *(small.sample(rng) for _ in range(4))]
    with torch.no_grad():
        for arch in archs:
            x = torch.randn(2, 3, arch.r, arch.r)
            supernet.set_active(arch)
            y1 = supernet(x)
            supernet.extract(small.sample(rng))  # extracting another subnet leaves `arch` active
            assert torch.equal(supernet(x), y1)
            sub = supernet.extract(arch).eval()
            assert torch.allclose(y1, sub(x), atol=1e-5)

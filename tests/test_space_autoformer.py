"""AutoFormer: the architecture encoding, the space's decisions and costs, and
the weight-entangled supernet against the subnets it extracts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import space_preset
from nas.errors import ConfigError, EncodingError
from nas.measure import count_flops, count_params
from nas.spaces import SPACES
from nas.spaces.autoformer.arch import AutoFormerArch
from nas.spaces.autoformer.space import AutoFormerSpace
from supernets.autoformer import AutoFormerSupernet
from supernets.base import SUPERNETS


def preset(name: str) -> AutoFormerSpace:
    params = space_preset(name)
    return SPACES.create(params.pop("name"), params)


@pytest.fixture(scope="module")
def tiny() -> AutoFormerSpace:
    return preset("autoformer")


@pytest.fixture(scope="module")
def small() -> AutoFormerSpace:
    return preset("autoformer_small")


@pytest.fixture(scope="module")
def supernet(small: AutoFormerSpace) -> AutoFormerSupernet:
    torch.manual_seed(0)
    return SUPERNETS.get("autoformer")(small, num_classes=10, in_channels=1).eval()


def tiny_arch(depth: int = 13) -> AutoFormerArch:
    return AutoFormerArch(depth, 216, tuple([3, 4] * 7)[:depth], tuple([3.0, 3.5, 4.0] * 5)[:depth])


# --- encoding -----------------------------------------------------------------

def test_encoding_round_trips(tiny):
    rng = np.random.default_rng(0)
    for arch in [tiny_arch(), *(tiny.sample(rng) for _ in range(20))]:
        enc = arch.encode()
        assert set(enc) == {"depth", "embed_dim", "heads", "mlp_ratio"}
        assert tiny.decode(enc) == arch and tiny.decode(enc).key() == arch.key()
        assert tiny.from_values(tiny.to_values(arch)) == arch
        assert tiny.from_indices(tiny.to_indices(arch)) == arch


def test_canonical_is_stable_text():
    a = AutoFormerArch(12, 192, (3,) * 12, (4,) * 12)  # integer ratios read as floats
    assert a.canonical() == "depth=12 embed=192 heads=" + ",".join(["3"] * 12) + " mlp=" + ",".join(["4.0"] * 12)
    assert a == AutoFormerArch.decode({"depth": 12, "embed_dim": 192, "heads": [3] * 12, "mlp_ratio": [4.0] * 12})


GOOD = tiny_arch().encode()


@pytest.mark.parametrize("change, message", [
    ({"heads": [3] * 12}, "autoformer: heads has 12 values but depth is 13"),
    ({"mlp_ratio": [3.0] * 14}, "autoformer: mlp_ratio has 14 values but depth is 13"),
    ({"mlp_ratio": [3.0] * 4 + [5.0] + [3.0] * 8}, "autoformer: mlp_ratio[4] = 5.0 is not one of 3.0, 3.5, 4.0"),
    ({"heads": [3] * 12 + [6]}, "autoformer: heads[12] = 6 is not one of 3, 4"),
    ({"heads": [3] * 12 + ["3"]}, "autoformer: heads[12] = '3' is not a positive integer"),
    ({"depth": 11, "heads": [3] * 11, "mlp_ratio": [3.0] * 11}, "autoformer: depth = 11 is not one of 12, 13, 14"),
    ({"depth": "13"}, "autoformer: depth must be a positive integer, got '13'"),
    ({"embed_dim": 200}, "autoformer: embed_dim = 200 is not one of 192, 216, 240"),
    ({"heads": "3,4"}, "autoformer: heads must be a list, got str"),
    ({"extra": 1}, "autoformer: unknown field 'extra' (valid: depth, embed_dim, heads, mlp_ratio)"),
    ({"embed_dim": None}, "autoformer: embed_dim must be a positive integer, got None"),
])
def test_bad_encodings_give_one_line_errors(tiny, change, message):
    with pytest.raises(EncodingError) as err:
        tiny.decode({**GOOD, **change})
    assert str(err.value) == message


def test_non_object_and_missing_fields(tiny):
    with pytest.raises(EncodingError, match="must be an object"):
        tiny.decode([13, 216])
    with pytest.raises(EncodingError, match="lacks 'mlp_ratio'"):
        tiny.decode({k: v for k, v in GOOD.items() if k != "mlp_ratio"})


def test_bad_space_settings_are_config_errors():
    with pytest.raises(ConfigError, match="heads must be a non-empty list"):
        AutoFormerSpace(heads=[])
    with pytest.raises(ConfigError, match="not a multiple of patch_size"):
        AutoFormerSpace(image_size=30, patch_size=4)


# --- decisions ----------------------------------------------------------------

def test_decisions_cover_the_deepest_net(tiny):
    names = [d.name for d in tiny.decisions()]
    assert names[:3] == ["depth", "embed_dim", "heads[0]"]
    assert names[-1] == "mlp_ratio[13]" and len(names) == 2 + 2 * 14
    assert tiny.decisions()[-1].choices == (3.0, 3.5, 4.0)


def test_inactive_layers_do_not_change_the_key(tiny):
    values = tiny.to_values(tiny_arch(12))
    assert values[2 + 12:2 + 14] == [3, 3] and values[-2:] == [3.0, 3.0]  # padded with the first choice
    values[2 + 13], values[-1] = 4, 4.0  # layer 13 is beyond depth 12
    assert tiny.from_values(values).key() == tiny_arch(12).key()
    with pytest.raises(EncodingError, match=r"heads\[13\] = 5 is not one of 3, 4"):
        tiny.from_values([*values[:2 + 13], 5, *values[2 + 14:]])


def test_mutate_changes_the_network(tiny):
    rng = np.random.default_rng(1)
    arch = tiny.sample(rng)
    for _ in range(50):
        child = tiny.mutate(arch, rng)
        assert child != arch and child.key() != arch.key()
        tiny.validate(child)
        arch = child


def test_size_counts_distinct_networks(tiny, small):
    assert tiny.size() == 3 * (6 ** 12 + 6 ** 13 + 6 ** 14)
    everything = {small.from_indices([int(i) for i in idx]).key()
                  for idx in np.ndindex(*(len(d.choices) for d in small.decisions()))}
    assert small.size() == len(everything) == 2 * (9 ** 3 + 9 ** 4)


# --- costs --------------------------------------------------------------------

def test_cost_formula_matches_fvcore_at_tiny_scale(tiny):
    arch = tiny_arch()
    net = tiny.build(arch, num_classes=1000)
    assert tiny.cost(arch).params == count_params(net) == 7_148_872  # worked by hand
    assert tiny.cost(arch).flops == count_flops(net, (1, 3, 224, 224))


def test_cost_orders_largest_above_smallest(tiny):
    big, little = (tiny.from_values([d.choices[i] for d in tiny.decisions()]) for i in (-1, 0))
    assert tiny.cost(big).params > tiny.cost(tiny_arch()).params > tiny.cost(little).params
    assert tiny.cost(big).flops > tiny.cost(tiny_arch()).flops > tiny.cost(little).flops


def test_describe_names_the_choices(tiny):
    text = tiny.describe()
    for part in ("depth in {12, 13, 14}", "embed_dim", "{192, 216, 240}", "{3.0, 3.5, 4.0}", '"heads"'):
        assert part in text


# --- supernet -----------------------------------------------------------------

def test_extracted_subnets_match_the_supernet(small, supernet):
    rng = np.random.default_rng(4)
    x = torch.randn(2, 1, 28, 28)
    archs = [supernet.smallest(), supernet.largest(), *(small.sample(rng) for _ in range(6))]
    with torch.no_grad():
        for arch in archs:
            supernet.set_active(arch)
            sub = supernet.extract(arch).eval()
            assert len(sub.blocks) == arch.depth and isinstance(sub.blocks[0].qkv, torch.nn.Linear)
            assert torch.allclose(sub(x), supernet(x), atol=1e-5), arch


def test_weights_are_entangled(small, supernet):
    arch = AutoFormerArch(3, 48, (2, 3, 4), (2.0, 3.0, 4.0))
    sub = supernet.extract(arch)
    for i, heads in enumerate(arch.heads):
        full = supernet.net.blocks[i].qkv.weight
        assert torch.equal(sub.blocks[i].qkv.weight, full[:3 * heads * 16, :48])
        assert sub.blocks[i].fc1.weight.shape == (int(arch.mlp_ratio[i] * 48), 48)
    assert torch.equal(sub.norm.weight, supernet.net.norm.weight[:48])
    assert torch.equal(sub.pos_embed, supernet.net.pos_embed[..., :48])
    sub.blocks[0].qkv.weight.data.zero_()  # a copy: training the subnet leaves the supernet alone
    assert supernet.net.blocks[0].qkv.weight.abs().sum() > 0


def test_set_active_rejects_archs_outside_the_space(supernet):
    with pytest.raises(EncodingError, match="embed_dim = 50 is not one of 48, 64"):
        supernet.set_active(AutoFormerArch(3, 50, (2, 2, 2), (2.0, 2.0, 2.0)))


def test_wrong_image_size_is_a_one_line_error(supernet):
    with pytest.raises(ConfigError, match="takes 28x28 images, got 8x8"):
        supernet(torch.randn(2, 1, 8, 8))


# --- the variant AutoFormer released (pool, qkv_layout, relative_position, super_embed_dim) ---

RELEASED = {"pool": "mean", "qkv_layout": "interleaved", "relative_position": True, "max_relative_position": 3}


@pytest.fixture(scope="module")
def released_small(small: AutoFormerSpace) -> AutoFormerSpace:
    """The CPU miniature as AutoFormer's released supernets are built: stored 72 wide for choices up to 64."""
    return AutoFormerSpace(**{**small.params(), **RELEASED, "super_embed_dim": 72})


def test_cost_formula_matches_fvcore_for_the_released_variant():
    space = preset("autoformer_t")
    arch = tiny_arch()
    net = space.build(arch, num_classes=1000)
    assert space.cost(arch).params == count_params(net)
    assert space.cost(arch).flops == count_flops(net, (1, 3, 224, 224))
    plain = preset("autoformer").cost(arch)
    # four 30x64 tables per layer; two 197x197 products per attention unit per layer; the norm of every token
    assert space.cost(arch).params - plain.params == 13 * 4 * 30 * 64
    assert space.cost(arch).flops - plain.flops == 2 * 197 * 197 * sum(h * 64 for h in arch.heads) + 5 * 196 * 216


def test_released_variant_subnets_match_the_supernet(released_small):
    torch.manual_seed(0)
    net = SUPERNETS.get("autoformer")(released_small, num_classes=released_small.num_classes).eval()
    assert net.net.pos_embed.shape == (1, 50, 72) and net.net.blocks[0].fc1.weight.shape == (288, 72)
    rng = np.random.default_rng(5)
    x = torch.randn(2, 3, 28, 28)
    with torch.no_grad():
        for arch in [net.smallest(), net.largest(), *(released_small.sample(rng) for _ in range(4))]:
            net.set_active(arch)
            sub = net.extract(arch).eval()
            assert sub.pos_embed.shape[-1] == arch.embed_dim and sub.blocks[0].rel_k is not None
            assert torch.allclose(sub(x), net(x), atol=1e-5), arch
            assert count_params(sub) == released_small.cost(arch).params


def test_qkv_layouts_are_permutations_of_the_same_network(small):
    """A plain subnet's qkv weight and bias re-laid from head-major to interleaved gives the same outputs:
    the layout changes where a unit's q, k and v sit, not what the network computes."""
    arch = AutoFormerArch(3, 48, (2, 3, 4), (2.0, 3.0, 4.0))
    torch.manual_seed(1)
    heads = small.build(arch, num_classes=10, in_channels=1).eval()
    inter = AutoFormerSpace(**{**small.params(), "qkv_layout": "interleaved"}).build(arch, 10, 1).eval()
    state = heads.state_dict()
    for i, h in enumerate(arch.heads):
        w, b = state[f"blocks.{i}.qkv.weight"], state[f"blocks.{i}.qkv.bias"]
        n = h * small.head_dim  # head-major (head, part, dim) -> interleaved rows (unit, part), bias (part, unit)
        state[f"blocks.{i}.qkv.weight"] = w.view(h, 3, -1, 48).permute(0, 2, 1, 3).reshape(3 * n, 48)
        state[f"blocks.{i}.qkv.bias"] = b.view(h, 3, -1).permute(1, 0, 2).reshape(3 * n)
    inter.load_state_dict(state)
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.allclose(inter(x), heads(x), atol=1e-5)


def test_old_checkpoints_space_settings_still_equal_the_preset(tiny):
    """A checkpoint written before these settings holds none of them: its space is the plain one."""
    old = {k: v for k, v in tiny.params().items() if k not in {*RELEASED, "super_embed_dim"}}
    assert SPACES.create("autoformer", old).params() == tiny.params()
    assert tiny.params()["super_embed_dim"] == 240 and tiny.params()["pool"] == "cls"


@pytest.mark.parametrize("change, message", [
    ({"pool": "max"}, "pool must be one of cls, mean, got 'max'"),
    ({"qkv_layout": "qkv"}, "qkv_layout must be one of heads, interleaved, got 'qkv'"),
    ({"relative_position": "yes"}, "relative_position must be true or false, got 'yes'"),
    ({"max_relative_position": 0}, "max_relative_position must be a positive integer, got 0"),
    ({"super_embed_dim": 200}, "super_embed_dim must be null or an integer >= the largest embed_dim 240, got 200"),
])
def test_bad_variant_settings_are_one_line_config_errors(change, message):
    with pytest.raises(ConfigError) as err:
        AutoFormerSpace(**change)
    assert str(err.value) == f"space 'autoformer': {message}"


def test_describe_says_how_the_released_variant_classifies():
    text = preset("autoformer_t").describe()
    assert "relative position" in text and "mean of the patch tokens" in text
    assert "class token." in preset("autoformer").describe()

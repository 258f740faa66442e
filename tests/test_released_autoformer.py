"""AutoFormer's released supernets (microsoft/Cream AutoFormer/): files written here in the release's
format load into the autoformer_t/_s/_b spaces with every tensor used, a subnet computed the way
their code computes it from the file's tensors equals our supernet's and our extracted subnet's
output (what proves the mapping table), and a file of another scale or with a tensor missing or
extra stops in one line naming that tensor.

The file's names and shapes are built from their module structure (`Vision_TransformerSuper` with
qkv_bias, change_qkv, relative_position, abs_pos, pre_norm: how `supernet_train.py` builds it) at
the SUPERNET sizes of experiments/subnet/AutoFormer-{T,S,B}.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import space_preset
from nas.errors import ConfigError
from nas.evaluators import EVALUATORS
from nas.spaces import SPACES
from nas.spaces.autoformer.arch import AutoFormerArch
from nas.spaces.autoformer.space import AutoFormerSpace
from supernets.base import SUPERNETS, Supernet
from supernets.checkpoints import load_checkpoint
from supernets.released import convert
from support.imagefolder import write_folder
from support.released import MAX_DISTANCE, official_shapes, official_tensors, save_release

# The released subnets (experiments/subnet/AutoFormer-T.yaml, -S.yaml RETRAIN): their published
# parameter counts are 5.8M and 22.9M.
AUTOFORMER_T = AutoFormerArch(13, 192, (3,) * 10 + (4, 3, 3),
                              (3.5, 3.5, 3.0, 3.5, 3.0, 3.0, 4.0, 4.0, 3.5, 4.0, 3.5, 4.0, 3.5))
AUTOFORMER_S = AutoFormerArch(13, 384, (6, 6, 5, 7, 5, 5, 5, 6, 6, 7, 7, 6, 7),
                              (3.0, 3.5, 3.0, 3.5, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 3.5, 4.0))


def space(scale: str, **changes) -> AutoFormerSpace:
    params = {**space_preset(scale), **changes}
    made = SPACES.create(params.pop("name"), params)
    assert isinstance(made, AutoFormerSpace)
    return made


def load(path: Path, scale: str) -> tuple[Supernet, dict]:
    """The file read and converted as the supernet evaluator does (`load_checkpoint`: weights_only
    with the formats' allowed types; `convert`), into the scale's supernet, strictly."""
    _, record = load_checkpoint(path, "autoformer")
    assert record["space"] == "autoformer" and "format" in record
    run_space = space(scale)
    net = SUPERNETS.create("autoformer", dict(record["supernet"]), space=run_space)
    state = convert(record["format"], record["state_dict"], net, run_space.params(), str(path))
    missing, unexpected = net.load_state_dict(state, strict=True)
    assert missing == [] and unexpected == []
    return net.eval(), record


def error_line(path: Path, scale: str) -> str:
    """The one line the supernet evaluator stops with, before any data is read."""
    with pytest.raises(ConfigError) as err:
        EVALUATORS.create("supernet", {"checkpoint": str(path)}, space=space(scale))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"supernet checkpoint {path}")
    return text


# --- loading --------------------------------------------------------------------

@pytest.mark.parametrize("scale", ["autoformer_t", "autoformer_s", "autoformer_b"])
def test_a_released_file_loads_with_every_tensor_in_place(tmp_path, scale):
    tensors = official_tensors(scale)
    net, record = load(save_release(tmp_path / "supernet.pth", tensors), scale)
    run_space = space(scale)
    assert {k: run_space.params()[k] for k in record["space_params"]} == record["space_params"]
    assert record["supernet"] == {"num_classes": 1000, "in_channels": 3}
    ours = net.state_dict()
    assert len(ours) == len(tensors)  # one of ours per tensor of theirs, none made up
    # their names onto ours, the values unchanged (the mapping moves no element)
    assert torch.equal(ours["net.blocks.5.qkv.bias"], tensors["blocks.5.attn.qkv.bias"])
    assert torch.equal(ours["net.blocks.2.rel_v.cols"], tensors["blocks.2.attn.rel_pos_embed_v.embeddings_table_h"])
    assert torch.equal(ours["net.blocks.0.norm2.weight"], tensors["blocks.0.ffn_layer_norm.weight"])
    assert torch.equal(ours["net.patch_embed.weight"], tensors["patch_embed_super.proj.weight"])


def test_a_bare_state_dict_and_a_data_parallel_one_load_too(tmp_path):
    tensors = official_tensors("autoformer_t")
    torch.save(tensors, tmp_path / "bare.pth")
    torch.save({"model": {f"module.{k}": v for k, v in tensors.items()}}, tmp_path / "ddp.pth")
    for name in ("bare.pth", "ddp.pth"):
        net, _ = load(tmp_path / name, "autoformer_t")
        assert torch.equal(net.state_dict()["net.head.weight"], tensors["head.weight"])


# --- outputs: the mapping table's proof ------------------------------------------

def official_position(tables: tuple[torch.Tensor, torch.Tensor], tokens: int, width: int) -> torch.Tensor:
    """RelativePosition2D_super: row (v) and column (h) distances of the patches on their grid, clipped,
    shifted to 1.., index 0 for the class token's row and column; tables sliced to `width`."""
    side = int((tokens - 1) ** 0.5)
    cell = torch.arange(tokens - 1)
    lookups = []
    for table, coord in zip(tables, (cell // side, cell % side)):
        distance = (coord[None, :] - coord[:, None]).clamp(-MAX_DISTANCE, MAX_DISTANCE) + MAX_DISTANCE + 1
        index = torch.zeros(tokens, tokens, dtype=torch.long)
        index[1:, 1:] = distance
        lookups.append(table[:, :width][index])
    return lookups[0] + lookups[1]


def official_forward(t: dict[str, torch.Tensor], arch: AutoFormerArch, x: torch.Tensor) -> torch.Tensor:
    """A subnet of `Vision_TransformerSuper` after `set_sample_config`, in eval mode, from the file's
    tensors with their slicing: Linear `weight[:out, :in]`, qkv_super's rows `[c:3*qk:3]` for q, k, v
    and `bias[:3*qk]`, qk = heads*64 with scale (qk // heads)**-0.5, relative position added to the
    scores and the output, the final norm then the mean of the patch tokens (--gp)."""
    e = arch.embed_dim
    x = F.conv2d(x, t["patch_embed_super.proj.weight"][:e], t["patch_embed_super.proj.bias"][:e], stride=16)
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([t["cls_token"][..., :e].expand(len(x), -1, -1), x], dim=1) + t["pos_embed"][..., :e]
    b, n, _ = x.shape
    for i, (heads, ratio) in enumerate(zip(arch.heads, arch.mlp_ratio)):
        layer, qk, hidden = f"blocks.{i}.", heads * 64, int(e * ratio)

        def linear(name: str, y: torch.Tensor, out: int) -> torch.Tensor:
            return F.linear(y, t[name + ".weight"][:out, :y.shape[-1]], t[name + ".bias"][:out])

        def norm(name: str, y: torch.Tensor) -> torch.Tensor:
            return F.layer_norm(y, (e,), t[name + ".weight"][:e], t[name + ".bias"][:e])

        y = norm(layer + "attn_layer_norm", x)
        w = t[layer + "attn.qkv.weight"][:, :e]
        w = torch.cat([w[c:3 * qk:3] for c in range(3)])
        q, k, v = F.linear(y, w, t[layer + "attn.qkv.bias"][:3 * qk]).reshape(b, n, 3, heads, -1).permute(2, 0, 3, 1, 4)
        scale = (qk // heads) ** -0.5
        rel = {s: official_position((t[f"{layer}attn.rel_pos_embed_{s}.embeddings_table_v"],
                                     t[f"{layer}attn.rel_pos_embed_{s}.embeddings_table_h"]), n, qk // heads)
               for s in ("k", "v")}
        scores = (q @ k.transpose(-2, -1)) * scale + torch.einsum("bhid,ijd->bhij", q, rel["k"]) * scale
        attn = scores.softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, -1)
        out = out + torch.einsum("bhij,ijd->bihd", attn, rel["v"]).reshape(b, n, -1)
        x = x + linear(layer + "attn.proj", out, e)
        y = F.gelu(linear(layer + "fc1", norm(layer + "ffn_layer_norm", x), hidden))
        x = x + linear(layer + "fc2", y, e)
    x = F.layer_norm(x, (e,), t["norm.weight"][:e], t["norm.bias"][:e])
    return F.linear(x[:, 1:].mean(dim=1), t["head.weight"][:, :e], t["head.bias"])


@pytest.fixture(scope="module")
def tiny_release(tmp_path_factory) -> tuple[dict[str, torch.Tensor], Supernet]:
    tensors = official_tensors("autoformer_t", seed=1)
    net, _ = load(save_release(tmp_path_factory.mktemp("release") / "supernet-tiny.pth", tensors), "autoformer_t")
    return tensors, net


@pytest.mark.parametrize("arch", [
    AUTOFORMER_T,  # the released subnet: a layer of 4 heads among 3s, ratios 3.0 to 4.0
    AutoFormerArch(14, 240, (4, 3) * 7, (4.0, 3.0, 3.5) * 4 + (4.0, 4.0)),  # widest: qk 256 is the whole qkv
    AutoFormerArch(12, 216, (3, 4, 4) * 4, (3.0,) * 12),
], ids=["autoformer-t", "widest", "depth12"])
def test_a_subnet_computes_what_autoformer_computes_from_the_file(tiny_release, arch):
    tensors, net = tiny_release
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = official_forward(tensors, arch, x)
        net.set_active(arch)
        got = net(x)
        sub = net.extract(arch).eval()
        standalone = sub(x)
    assert want.abs().mean() > 0.1 and want.std(dim=0).mean() > 0.1  # the inputs move the outputs
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(standalone, want, atol=1e-5, rtol=1e-5)
    assert sum(p.numel() for p in sub.parameters()) == space("autoformer_t").cost(arch).params


def test_the_released_subnets_have_their_published_sizes():
    """AutoFormer's model zoo: AutoFormer-T 5.8M, -S 22.9M, -B 53.7M parameters (their count
    includes the relative position tables)."""
    base = AutoFormerArch(14, 576, (9, 9, 9, 9, 9, 10, 9, 9, 10, 9, 10, 9, 9, 10),
                          (3.5, 3.5, 4.0, 3.5, 4.0, 3.5, 3.5, 3.0, 4.0, 4.0, 3.0, 4.0, 3.0, 3.5))
    for scale, arch, published in (("autoformer_t", AUTOFORMER_T, 5.8), ("autoformer_s", AUTOFORMER_S, 22.9),
                                   ("autoformer_b", base, 53.7)):
        assert abs(space(scale).cost(arch).params / 1e6 - published) < 0.1, scale


# --- mismatches: one line naming the tensor ----------------------------------------

def test_a_small_file_for_the_tiny_space_names_the_first_tensor(tmp_path):
    text = error_line(save_release(tmp_path / "supernet-small.pth", official_tensors("autoformer_s")), "autoformer_t")
    assert "tensor 'pos_embed' has shape [1, 197, 448]" in text
    assert "super_embed_dim is 448, the run's space's 256" in text


def test_a_missing_tensor_is_named_as_the_file_names_it(tmp_path):
    tensors = official_tensors("autoformer_t")
    del tensors["blocks.3.attn.rel_pos_embed_v.embeddings_table_h"]
    text = error_line(save_release(tmp_path / "supernet.pth", tensors), "autoformer_t")
    assert "lacks tensor 'blocks.3.attn.rel_pos_embed_v.embeddings_table_h'" in text


def test_an_extra_layer_is_named(tmp_path):
    tensors = official_shapes(256, 4, 15, 4.0)  # one layer deeper than Tiny's 14
    path = save_release(tmp_path / "deeper.pth", {k: torch.zeros(s) for k, s in tensors.items()})
    assert "tensor 'blocks.14.attn.qkv.weight' has no place" in error_line(path, "autoformer_t")


def test_a_file_without_relative_position_says_so(tmp_path):
    shapes = official_shapes(256, 4, 14, 4.0, relative=False)
    text = error_line(save_release(tmp_path / "norel.pth", {k: torch.zeros(s) for k, s in shapes.items()}),
                      "autoformer_t")
    assert "lacks tensor 'blocks.0.attn.rel_pos_embed_k.embeddings_table_v'" in text
    assert "relative_position is False, the run's space's True" in text


def test_the_plain_vit_space_is_told_what_the_release_needs(tmp_path):
    """space=autoformer (class token, head-major qkv, no relative position, 240 wide) is not the release's."""
    text = error_line(save_release(tmp_path / "supernet-tiny.pth", official_tensors("autoformer_t")), "autoformer")
    assert "tensor 'pos_embed' has shape [1, 197, 256]" in text
    for hint in ("pool is 'mean', the run's space's 'cls'", "qkv_layout is 'interleaved'", "relative_position is True"):
        assert hint in text


def test_the_supernet_evaluator_scores_with_a_released_file(tmp_path):
    """evaluator=supernet evaluator.checkpoint=FILE data=imagenet: a 10-class release (so the folder
    is small) scores a subnet at its own cost, with the weights that compute AutoFormer's output."""
    tensors = official_tensors("autoformer_t", seed=3, classes=10)
    path = save_release(tmp_path / "supernet-tiny.pth", tensors)
    root = write_folder(tmp_path / "imagenet", 10, train=1, val=1, size=(8, 8))
    ev = EVALUATORS.create("supernet", {"checkpoint": str(path), "data": {"name": "imagenet", "root": str(root)},
                                        "recal_batches": 0, "val_subset": 4, "batch_size": 4, "device": "cpu"},
                           space=space("autoformer_t", num_classes=10))
    result = ev.evaluate(AUTOFORMER_T)
    assert 0 <= result.accuracy <= 100
    cost = space("autoformer_t", num_classes=10).cost(AUTOFORMER_T)
    assert (result.params, result.flops) == (cost.params, cost.flops)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(ev.weights(AUTOFORMER_T).eval()(x), official_forward(tensors, AUTOFORMER_T, x),
                                   atol=1e-5, rtol=1e-5)

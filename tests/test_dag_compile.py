"""Compile, cost and export: every block file (ours, and NADER's when present).

For each file the torch module must run forward and backward, and its
parameter count and fvcore FLOPs must equal the pure-Python totals that the
width search relies on; the exported source must build the same network.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from nas.measure import count_flops, count_params
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.compile import BlockModule, block_source
from nas.spaces.nader.dag.macro import BlockSet, Skeleton, plan, search_width
from nas.spaces.nader.dag.shapes import Position, analyse
from nas.spaces.nader.network import build_network, network_source
from nas.spaces.nader.space import BlockSpace

HERE = Path(__file__).resolve().parent
OURS = sorted((HERE / "data" / "blocks").glob("*.txt"))
NADER = HERE.parents[1] / "shared" / "data" / "nader"
SHARED = sorted(p for d in ("blocks", "blocks-cifar", "darts") for p in (NADER / d).glob("*.txt"))
# ResNeXt-style block_5 needs C % 128 == 0: at no such width does it fit the NB201 budget.
TOO_BIG = {"block_5.txt"}


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.name}" for p in paths]


def _import(source: str, tmp_path: Path, name: str):
    """Import our own exported source (generated from validated tokens, not LLM text)."""
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _roundtrip(path: Path, tmp_path: Path, skeleton: Skeleton) -> None:
    blocks = BlockSet.from_text(path.read_text(), str(path))
    width = search_width(blocks, skeleton).width
    p = plan(blocks, skeleton, width)
    assert p.params <= 1.5e6
    net = build_network(p)
    size = skeleton.input_size
    x = torch.randn(2, 3, size, size)
    out = net(x)
    assert out.shape == (2, skeleton.num_classes)
    out.logsumexp(1).mean().backward()
    assert all(q.grad is not None for q in net.parameters() if q.requires_grad)
    assert count_params(net) == p.params
    assert count_flops(net, (1, 3, size, size)) == p.flops

    exported = _import(network_source(p), tmp_path, "exported_" + path.stem.replace("-", "_"))
    twin = exported.Network(num_classes=skeleton.num_classes)
    assert count_params(twin) == p.params
    twin.load_state_dict(net.state_dict())
    net.eval(), twin.eval()
    torch.testing.assert_close(twin(x), net(x))


@pytest.mark.parametrize("path", OURS, ids=_ids(OURS))
def test_our_blocks_compile_cost_and_export(path, tmp_path):
    _roundtrip(path, tmp_path, Skeleton.nb201())


def test_imagenet16_skeleton(tmp_path):
    _roundtrip(HERE / "data" / "blocks" / "residual.txt", tmp_path, Skeleton.nb201(input_size=16, num_classes=120))


@pytest.mark.slow
@pytest.mark.parametrize("path", SHARED, ids=_ids(SHARED))
def test_every_nader_block_compiles(path, tmp_path):
    if path.name in TOO_BIG:
        blocks = BlockSet.from_text(path.read_text(), str(path))
        p = plan(blocks, Skeleton.nb201(), 128)  # valid at a width it allows, just over budget
        assert count_params(build_network(p)) == p.params
        return
    _roundtrip(path, tmp_path, Skeleton.nb201())


def test_nader_data_present_or_skipped():
    if not SHARED:
        pytest.skip(f"NADER block files not found under {NADER}")
    assert len(SHARED) == 22


def test_block_module_frees_intermediates_but_keeps_skips():
    blocks = BlockSet.from_text((HERE / "data" / "blocks" / "shuffle_se.txt").read_text())
    a = analyse(blocks.base, Position(64, 64, 8, 8))
    m = BlockModule(a)
    x = torch.randn(2, 64, 8, 8)
    assert m(x).shape == (2, 64, 8, 8)
    # reshape(B, ...) is evaluated with the batch size seen at run time
    assert m(torch.randn(5, 64, 8, 8)).shape == (5, 64, 8, 8)


def test_block_source_is_parametrised_by_block_variables():
    blocks = BlockSet.from_text((HERE / "data" / "blocks" / "shuffle_se.txt").read_text())
    src = block_source(analyse(blocks.base, Position(64, 64, 8, 8)))
    assert "def __init__(self, C, dim, H, W):" in src
    assert "nn.Conv2d(C, C // 2, 1, groups=2, padding=0)" in src
    assert "x5 = x4.reshape(B, 2, C // 4, H, W)" in src
    assert "torch.cat([x17, x18], dim=1)" in src


def test_space_build_uses_width_search():
    arch = BlockArch.from_text((HERE / "data" / "blocks" / "residual.txt").read_text())
    net = BlockSpace().build(arch, num_classes=10)
    assert count_params(net) == arch.plan().params <= 1.5e6
    assert arch.plan().width == 24  # the widest multiple of 8 within the budget (exact: 25)


def test_seen_index_confirms_hits_by_canonical_form():
    from nas.core.arch import SeenIndex
    from nas.spaces.nader.dag.canon import relabel

    arch = BlockArch.from_text((HERE / "data" / "blocks" / "residual.txt").read_text())
    seen = SeenIndex()
    assert seen.add(arch) and len(seen) == 1
    b = arch.blocks
    renumbered = BlockArch(BlockSet(relabel(b.base, {i: f"n{i}" for i in b.base.nodes}), b.stem, b.downsample))
    assert renumbered in seen and not seen.add(renumbered)

    class Colliding(BlockArch):  # same key, different graph: must not count as seen
        def key(self) -> str:
            return arch.key()

    other = Colliding.from_text((HERE / "data" / "blocks" / "shuffle_se.txt").read_text())
    assert other not in seen and seen.add(other) and len(seen) == 2


def test_seen_index_labels_where_each_entry_was_seen():
    from nas.core.arch import SeenIndex

    arch = BlockArch.from_text((HERE / "data" / "blocks" / "residual.txt").read_text())
    other = BlockArch.from_text((HERE / "data" / "blocks" / "shuffle_se.txt").read_text())
    seen = SeenIndex()
    assert seen.add(arch, "node 1") and not seen.add(arch, "node 5")  # the first place seen is kept
    assert seen.where(arch) == seen.where(arch.key()) == "node 1" and seen.where(other) is None
    assert seen.add_key(other.key(), "model 2") and not seen.add_key(other.key(), "model 3")
    assert other.key() in seen and seen.where(other.key()) == "model 2" and len(seen) == 2  # matched by key
    assert seen.add(other) and other in seen and seen.where(other) is None  # an exact entry, unlabelled

"""NB201 supernet: every subnet runs single-path, and extraction copies it exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nas.errors import EncodingError
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell
from nas.spaces.nb201.network import NB201Network
from nas.spaces.nb201.space import NB201Space
from supernets.base import SUPERNETS
from supernets.nb201 import NB201Supernet


@pytest.fixture(scope="module")
def supernet() -> NB201Supernet:
    torch.manual_seed(0)
    net = SUPERNETS.create("nb201", {"num_classes": 7}, space=NB201Space(channels=4, cells_per_stage=2))
    # Non-trivial BN statistics, so eval mode differs from train mode.
    net.train()
    with torch.no_grad():
        for arch in (net.largest(), NB201Cell(("nor_conv_1x1",) * len(EDGES))):
            net.set_active(arch)
            net(torch.randn(8, 3, 12, 12))
    return net.eval()


def test_registered_for_the_nb201_space(supernet):
    assert SUPERNETS.get("nb201") is NB201Supernet and supernet.default_sampling == "fair"
    assert supernet.largest().ops == ("nor_conv_3x3",) * 6 and supernet.smallest().ops == ("skip_connect",) * 6
    assert supernet.input_size(supernet.largest()) is None
    assert supernet.config() == {"num_classes": 7, "in_channels": 3}


def test_every_op_of_every_edge_is_held_once(supernet):
    cells = [c for c in supernet.net.cells if hasattr(c, "edges")]
    assert len(cells) == 6 and all(set(e.ops) == set(OPS) for c in cells for e in c.edges)
    # The largest subnet's weights plus the 1x1 convs: only conv ops have parameters.
    largest = supernet.extract(supernet.largest())
    conv1x1 = sum(p.numel() for c in cells for e in c.edges for p in e.ops["nor_conv_1x1"].parameters())
    assert sum(p.numel() for p in supernet.parameters()) == sum(p.numel() for p in largest.parameters()) + conv1x1


def test_random_subnets_extract_to_equal_standalone_networks(supernet):
    rng = np.random.default_rng(1)
    x = torch.randn(3, 3, 12, 12)
    archs = [supernet.largest(), supernet.smallest(), *(supernet.space.sample(rng) for _ in range(8))]
    outputs = set()
    for arch in archs:
        supernet.set_active(arch)
        with torch.no_grad():
            y = supernet(x)
            sub = supernet.extract(arch)
            assert isinstance(sub, NB201Network)
            sub.eval()
            assert torch.allclose(sub(x), y, atol=1e-5), arch
        assert y.shape == (3, 7)
        outputs.add(round(float(y.sum()), 4))
    assert len(outputs) > 1  # set_active really switches the path


def test_extracted_network_owns_its_weights(supernet):
    arch = supernet.largest()
    sub = supernet.extract(arch)
    with torch.no_grad():
        next(sub.parameters()).add_(1.0)
    assert not torch.equal(next(sub.parameters()), next(supernet.parameters()))


def test_other_representations_are_refused(supernet):
    with pytest.raises(EncodingError, match="NB201 cells"):
        supernet.set_active("not a cell")  # type: ignore[arg-type]

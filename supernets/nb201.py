"""NB201 supernet: NAS-Bench-201's network with all five ops on every cell edge.

Single paths (as SPOS and NB201's weight-sharing baselines): `set_active` picks
one op per edge, the same cell everywhere, as NB201 repeats one genotype. Trained by default
with FairNAS's strict fairness (five cells per step that use each op of each edge once:
benchmarks/supernet_ranking.py measures it against uniform single paths).
The skeleton (stem, reduction blocks, head) is `nas.spaces.nb201.network`'s own, so
`extract` is the space's `build` with the chosen ops' weights copied in.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from torch import nn

from nas.errors import EncodingError
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell
from nas.spaces.nb201.network import CellModule, NB201Network, make_op
from nas.spaces.nb201.space import NB201Space
from supernets.base import SUPERNETS, Supernet

# `cells.{layer}.edges.{edge}.` in a standalone network is `...edges.{edge}.ops.{op}.` here.
_EDGE_KEY = re.compile(r"^cells\.(\d+)\.edges\.(\d+)\.(.+)$")


class MixedEdge(nn.Module):
    """Every op of an edge; `active` routes the forward pass through one of them, or the mean of several."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.ops = nn.ModuleDict({op: make_op(op, channels) for op in OPS})
        self.active: tuple[str, ...] = (OPS[0],)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.active) == 1:
            return self.ops[self.active[0]](x)
        return sum(self.ops[op](x) for op in self.active) / len(self.active)


class MixedCell(nn.Module):
    """An NB201 cell over mixed edges; its forward is the standalone cell's."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.edges = nn.ModuleList(MixedEdge(channels) for _ in EDGES)

    forward = CellModule.forward


@SUPERNETS.register("nb201")
class NB201Supernet(Supernet[NB201Cell, NB201Space]):
    default_sampling = "fair"
    mixes = True

    def __init__(self, space: NB201Space, num_classes: int, in_channels: int = 3) -> None:
        super().__init__(space, num_classes, in_channels)
        self.net = NB201Network(("none",) * len(EDGES), channels=space.channels,
                                cells_per_stage=space.cells_per_stage, num_classes=num_classes,
                                in_channels=in_channels)
        for i, layer in enumerate(self.net.cells):  # stage s holds layers s*(N+1) .. s*(N+1)+N-1
            if isinstance(layer, CellModule):
                self.net.cells[i] = MixedCell(space.channels << (i // (space.cells_per_stage + 1)))
        self.set_active(self.largest())

    def _check(self, arch: NB201Cell) -> NB201Cell:
        if not isinstance(arch, NB201Cell):
            raise EncodingError(f"NB201 supernet takes NB201 cells, got {type(arch).__name__}")
        return arch

    def set_active(self, arch: NB201Cell) -> None:
        self.set_mixed([(op,) for op in self._check(arch).ops])

    def set_mixed(self, values: Sequence[Sequence[str]]) -> None:
        if len(values) != len(EDGES) or not all(values) or any(op not in OPS for ops in values for op in ops):
            raise ValueError(f"nb201 supernet: set_mixed takes a non-empty list of ops for each of {len(EDGES)} edges")
        for layer in self.net.cells:
            if isinstance(layer, MixedCell):
                for edge, ops in zip(layer.edges, values):
                    edge.active = tuple(ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def extract(self, arch: NB201Cell) -> NB201Network:
        ops = self._check(arch).ops
        sub = self.space.build(arch, self.num_classes, self.in_channels)
        shared = self.net.state_dict()

        def source(key: str) -> str:
            m = _EDGE_KEY.match(key)
            return f"cells.{m[1]}.edges.{m[2]}.ops.{ops[int(m[2])]}.{m[3]}" if m else key

        sub.load_state_dict({k: shared[source(k)] for k in sub.state_dict()})  # copies the tensors
        return sub

    def largest(self) -> NB201Cell:
        return NB201Cell(("nor_conv_3x3",) * len(EDGES))

    def smallest(self) -> NB201Cell:
        """All skip: no cell parameters yet still a network (all-none cells output zeros)."""
        return NB201Cell(("skip_connect",) * len(EDGES))

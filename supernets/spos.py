"""The SPOS ShuffleNetV2 supernet (Guo et al. 2020): four candidate units per choice block,
each with its own weights (SPOS shares weights between subnets, never between a block's
choices); `extract` copies a path out.

Why SPOS's own uniform single paths failed here (issues 41, 48) is no code defect (the
split/shuffle, per-unit BatchNorm, extraction and recalibration match SPOS) but how the units
co-adapt: at initialisation a block's four units map their input to unrelated features, so a path
that mixes choices in all 20 blocks scrambles the features 20 times, differently every step, and
the head learns nothing from them; a fixed path, or one mixing a single block, learns at once. So
training defaults to path dropout (`supernet.sampling=droppath`, Bender et al. 2018): early steps
run the mean of every unit of each block, which all learn together, and the share of units kept
falls until single paths take over for the rest of training (`supernet.warmup`).
benchmarks/supernet_ranking.py measures how its scores rank subnets against stand-alone training;
SPOS's `supernet.sampling=uniform` is still available."""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from nas.spaces.spos.arch import SPOSArch
from nas.spaces.spos.network import KERNELS, ChoiceUnit, head, stem
from nas.spaces.spos.space import SPOSSpace
from supernets.base import SUPERNETS, Supernet


@SUPERNETS.register("spos")
class SPOSSupernet(Supernet[SPOSArch, SPOSSpace]):
    default_sampling = "droppath"  # why: the module docstring
    mixes = True

    def __init__(self, space: SPOSSpace, num_classes: int, in_channels: int = 3) -> None:
        super().__init__(space, num_classes, in_channels)
        self.stem = stem(space, in_channels)
        self.blocks = nn.ModuleList(
            nn.ModuleList(ChoiceUnit(shape, c) for c in range(len(KERNELS) + 1)) for shape in space.blocks()
        )
        self.head = head(space, num_classes)
        self.active: tuple[tuple[int, ...], ...] | None = None  # per block, the units whose outputs are averaged

    def set_active(self, arch: SPOSArch) -> None:
        self.active = tuple((c,) for c in self.space.to_values(arch))

    def set_mixed(self, values: Sequence[Sequence[int]]) -> None:
        if len(values) != len(self.blocks) or not all(values):
            raise ValueError(f"spos supernet: set_mixed takes a non-empty choice list for each of {len(self.blocks)} blocks")
        self.active = tuple(tuple(v) for v in values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.active is None:
            raise RuntimeError("spos supernet: call set_active(arch) before forward")
        x = self.stem(x)
        for units, choices in zip(self.blocks, self.active):
            x = units[choices[0]](x) if len(choices) == 1 else sum(units[c](x) for c in choices) / len(choices)
        return self.head(x)

    def extract(self, arch: SPOSArch) -> nn.Sequential:
        """`subnet`'s layout with copies of the chosen units' weights."""
        path = [(f"block{i}", copy.deepcopy(units[c]))
                for i, (units, c) in enumerate(zip(self.blocks, self.space.to_values(arch)))]
        return nn.Sequential(OrderedDict([("stem", copy.deepcopy(self.stem)), *path,
                                          ("head", copy.deepcopy(self.head))]))

    def largest(self) -> SPOSArch:
        """The subnet with the most FLOPs. Choices are not ordered by size: whether 7x7 or Xception
        costs more depends on the block's width and stride (Xception wins in wide stride-1 blocks)."""
        return self.space.most_flops()

    def smallest(self) -> SPOSArch:
        return self.space.fewest_flops()

"""The SPOS ShuffleNetV2 supernet (Guo et al. 2020): four candidate units per choice block,
each with its own weights (SPOS shares weights between subnets, never between a block's
choices); `extract` copies a path out.

Training defaults to sandwich sampling, not SPOS's uniform single path (issue 41): on
Fashion-MNIST uniform training stayed at chance for 1000 steps (lr 0.005-0.1, Adam, clipping alike)
where one fixed path learnt in 20. With the largest and smallest paths in every step those two
learn, but paths that mix choices across blocks still score near chance after 120 steps: on CPU
budgets this supernet ranks only its extremes.
`supernet.sampling=uniform` restores SPOS."""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from torch import nn

from nas.spaces.spos.arch import SPOSArch
from nas.spaces.spos.network import KERNELS, ChoiceUnit, head, stem
from nas.spaces.spos.space import SPOSSpace
from supernets.base import SUPERNETS, Supernet


@SUPERNETS.register("spos")
class SPOSSupernet(Supernet[SPOSArch, SPOSSpace]):
    default_sampling = "sandwich"  # why: the module docstring

    def __init__(self, space: SPOSSpace, num_classes: int, in_channels: int = 3) -> None:
        super().__init__(space, num_classes, in_channels)
        self.stem = stem(space, in_channels)
        self.blocks = nn.ModuleList(
            nn.ModuleList(ChoiceUnit(shape, c) for c in range(len(KERNELS) + 1)) for shape in space.blocks()
        )
        self.head = head(space, num_classes)
        self.active: tuple[int, ...] | None = None

    def set_active(self, arch: SPOSArch) -> None:
        self.active = tuple(self.space.to_values(arch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.active is None:
            raise RuntimeError("spos supernet: call set_active(arch) before forward")
        x = self.stem(x)
        for units, choice in zip(self.blocks, self.active):
            x = units[choice](x)
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

"""The SPOS ShuffleNetV2 supernet (Guo et al. 2020): four candidate units per choice block,
each with its own weights (SPOS shares weights between subnets, never between a block's
choices); training samples one path uniformly, and `extract` copies a path out."""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
from torch import nn

from nas.spaces.spos.arch import SPOSArch
from nas.measure import count_flops, count_params
from nas.core.space import Cost
from nas.spaces.spos.space import BlockShape, SPOSSpace
from nas.supernets.base import SUPERNETS, Supernet

KERNELS = (3, 5, 7)  # choices 0-2; choice 3 is the Xception-style unit


def _pw(cin: int, cout: int) -> list[nn.Module]:
    """Pointwise conv + BN + ReLU."""
    return [nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def _dw(channels: int, kernel: int, stride: int = 1) -> list[nn.Module]:
    """Depthwise conv + BN, linear as in ShuffleNetV2."""
    return [nn.Conv2d(channels, channels, kernel, stride, kernel // 2, groups=channels, bias=False),
            nn.BatchNorm2d(channels)]


class ChoiceUnit(nn.Module):
    """One SPOS candidate. Stride 1: the channels are split (even/odd, which is the previous
    unit's channel shuffle), one half passes through and the other goes through the main branch.
    Stride 2: both branches see the whole input and downsample; their outputs are concatenated."""

    def __init__(self, shape: BlockShape, choice: int) -> None:
        super().__init__()
        stride = shape.stride
        cin = shape.in_channels if stride == 2 else shape.out_channels // 2
        cout, mid = shape.out_channels - cin, shape.out_channels // 2
        kernel = KERNELS[choice] if choice < len(KERNELS) else 3
        if choice < len(KERNELS):
            main = [*_pw(cin, mid), *_dw(mid, kernel, stride), *_pw(mid, cout)]
        else:  # Xception-style: three depthwise-separable 3x3 convs
            main = [*_dw(cin, 3, stride), *_pw(cin, mid),
                    *_dw(mid, 3), *_pw(mid, mid),
                    *_dw(mid, 3), *_pw(mid, cout)]
        self.main = nn.Sequential(*main)
        self.proj = nn.Sequential(*_dw(cin, kernel, 2), *_pw(cin, cin)) if stride == 2 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.proj is None:
            return torch.cat((x[:, 0::2], self.main(x[:, 1::2])), 1)
        return torch.cat((self.proj(x), self.main(x)), 1)


def stem(space: SPOSSpace, in_channels: int) -> nn.Sequential:
    """SPOS has no max-pool (unlike ShuffleNetV2): stem stride 2 and four stride-2 stages make 224 → 7."""
    return nn.Sequential(nn.Conv2d(in_channels, space.stem_channels, 3, space.stem_stride, 1, bias=False),
                         nn.BatchNorm2d(space.stem_channels), nn.ReLU(inplace=True))


def head(space: SPOSSpace, num_classes: int) -> nn.Sequential:
    return nn.Sequential(*_pw(space.stage_channels[-1], space.last_channels),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1),
                         nn.Linear(space.last_channels, num_classes, bias=False))


@SUPERNETS.register("spos")
class SPOSSupernet(Supernet[SPOSArch, SPOSSpace]):
    default_sampling = "uniform"

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


def subnet(space: SPOSSpace, arch: SPOSArch, num_classes: int, in_channels: int = 3) -> nn.Sequential:
    """The standalone network of `arch`, freshly initialised: stem, one unit per block, head."""
    choices = zip(space.blocks(), space.to_values(arch))
    path = [(f"block{i}", ChoiceUnit(shape, c)) for i, (shape, c) in enumerate(choices)]
    return nn.Sequential(OrderedDict([("stem", stem(space, in_channels)), *path, ("head", head(space, num_classes))]))


def measure_costs(space: SPOSSpace) -> tuple[Cost, tuple[tuple[Cost, ...], ...]]:
    """fvcore counts of the stem + head and of every unit at its input shape (see `cost_table`);
    blocks of equal shape (most of a stage) are measured once."""
    net = SPOSSupernet(space, space.num_classes)
    x = torch.zeros(1, 3, space.resolution, space.resolution)
    base = Cost(count_params(net.stem), count_flops(net.stem, tuple(x.shape)))
    measured: dict[tuple, tuple[Cost, ...]] = {}
    per_block = []
    with torch.no_grad():
        x = net.stem.eval()(x)
        for shape, units in zip(space.blocks(), net.blocks):
            key = (shape, tuple(x.shape))
            if key not in measured:
                measured[key] = tuple(Cost(count_params(u), count_flops(u, key[1])) for u in units)
            per_block.append(measured[key])
            x = units[0].eval()(x)
    head_cost = Cost(count_params(net.head), count_flops(net.head, tuple(x.shape)))
    return Cost(base.params + head_cost.params, base.flops + head_cost.flops), tuple(per_block)

"""SPOS ShuffleNetV2 building blocks (Guo et al. 2020): the four candidate units of a choice
block, the stem and head, a subnet's standalone network and the per-unit cost table. The
weight-sharing supernet (`supernets/spos.py`) is built from these."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import torch
from torch import nn

from nas.core.space import Cost
from nas.measure import count_flops, count_params
from nas.spaces.spos.arch import SPOSArch

if TYPE_CHECKING:  # annotations only: the space imports this module (lazily, for torch)
    from nas.spaces.spos.space import BlockShape, SPOSSpace

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


def subnet(space: SPOSSpace, arch: SPOSArch, num_classes: int, in_channels: int = 3) -> nn.Sequential:
    """The standalone network of `arch`, freshly initialised: stem, one unit per block, head."""
    choices = zip(space.blocks(), space.to_values(arch))
    path = [(f"block{i}", ChoiceUnit(shape, c)) for i, (shape, c) in enumerate(choices)]
    return nn.Sequential(OrderedDict([("stem", stem(space, in_channels)), *path, ("head", head(space, num_classes))]))


def measure_costs(space: SPOSSpace) -> tuple[Cost, tuple[tuple[Cost, ...], ...]]:
    """fvcore counts of the stem + head and of every unit at its input shape (see `cost_table`);
    blocks of equal shape (most of a stage) are measured once."""
    first, last = stem(space, 3), head(space, space.num_classes)
    x = torch.zeros(1, 3, space.resolution, space.resolution)
    base = Cost(count_params(first), count_flops(first, tuple(x.shape)))
    measured: dict[tuple, tuple[Cost, ...]] = {}
    per_block = []
    with torch.no_grad():
        x = first.eval()(x)
        for shape in space.blocks():
            key = (shape, tuple(x.shape))
            units = [ChoiceUnit(shape, c) for c in range(len(KERNELS) + 1)]
            if key not in measured:
                measured[key] = tuple(Cost(count_params(u), count_flops(u, key[1])) for u in units)
            per_block.append(measured[key])
            x = units[0].eval()(x)
    head_cost = Cost(count_params(last), count_flops(last, tuple(x.shape)))
    return Cost(base.params + head_cost.params, base.flops + head_cost.flops), tuple(per_block)

"""NAS-Bench-201's macro network: stem → 3 stages of N cells with ResNet
reduction blocks between (widths C, 2C, 4C) → BN-ReLU → global pool → linear.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from nas.spaces.nb201.arch import EDGES


class ReLUConvBN(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1) -> None:
        super().__init__(
            nn.ReLU(inplace=False),
            nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(c_out),
        )


class Zero(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul(0.0)


def make_op(name: str, channels: int) -> nn.Module:
    if name == "none":
        return Zero()
    if name == "skip_connect":
        return nn.Identity()
    if name == "nor_conv_1x1":
        return ReLUConvBN(channels, channels, 1)
    if name == "nor_conv_3x3":
        return ReLUConvBN(channels, channels, 3)
    if name == "avg_pool_3x3":
        return nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
    raise ValueError(f"unknown NB201 op '{name}'")


class CellModule(nn.Module):
    """One cell of the network: the module of an `NB201Cell` (the architecture) at one width."""

    def __init__(self, ops: Sequence[str], channels: int) -> None:
        super().__init__()
        self.edges = nn.ModuleList(make_op(op, channels) for op in ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nodes = [x]
        for node in (1, 2, 3):
            nodes.append(sum(
                self.edges[i](nodes[src]) for i, (src, dst) in enumerate(EDGES) if dst == node
            ))
        return nodes[3]


class ResNetReduction(nn.Module):
    """NB201's reduction block: two ReLU-Conv-BN (first strided) + pooled 1×1 shortcut."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv_a = ReLUConvBN(c_in, c_out, 3, stride=2)
        self.conv_b = ReLUConvBN(c_out, c_out, 3)
        self.shortcut = nn.Sequential(
            nn.AvgPool2d(2, stride=2, padding=0), nn.Conv2d(c_in, c_out, 1, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_b(self.conv_a(x)) + self.shortcut(x)


class NB201Network(nn.Module):
    def __init__(self, ops: Sequence[str], *, channels: int = 16, cells_per_stage: int = 5,
                 num_classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels)
        )
        layers: list[nn.Module] = []
        c = channels
        for stage in range(3):
            if stage > 0:
                layers.append(ResNetReduction(c, c * 2))
                c *= 2
            layers.extend(CellModule(ops, c) for _ in range(cells_per_stage))
        self.cells = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.cells(self.stem(x)))
        return self.classifier(self.pool(x).flatten(1))

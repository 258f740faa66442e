"""The parent with attributes renamed and comments added: same architecture (changed False)."""

import torch
from torch import nn


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.first = ConvBlock(3, 16)  # stem
        self.stage1 = ConvBlock(16, 32, stride=2)
        self.stage2 = ConvBlock(32, 64, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        x = self.stage2(self.stage1(x))
        return self.head(self.pool(x).flatten(1))

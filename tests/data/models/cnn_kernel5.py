"""The parent with stage1's conv kernel 3 -> 5: one layer changed."""

import torch
from torch import nn


class ConvBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1, kernel: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = ConvBlock(3, 16)
        self.stage1 = ConvBlock(16, 32, stride=2, kernel=5)
        self.stage2 = ConvBlock(32, 64, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage2(self.stage1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))

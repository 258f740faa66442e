"""ResNet-32 for CIFAR (He et al. 2016): 0.467M params / 0.070 GFLOPs at 10 classes, 0.473M / 0.070G at 100.

Three stages of five BasicBlocks (16/32/64 channels at 32/16/8 px); option-B (1x1 conv) shortcuts as in
OpenMMLab's ResNet_CIFAR, where He et al. used parameter-free option A (0.464M at 10 classes).
"""

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.shortcut = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.stage1 = self._make_stage(16, 16, blocks=5, stride=1)  # 32x32
        self.stage2 = self._make_stage(16, 32, blocks=5, stride=2)  # 16x16
        self.stage3 = self._make_stage(32, 64, blocks=5, stride=2)  # 8x8
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    @staticmethod
    def _make_stage(c_in: int, c_out: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [BasicBlock(c_in, c_out, stride)]
        layers += [BasicBlock(c_out, c_out) for _ in range(blocks - 1)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stage3(self.stage2(self.stage1(self.stem(x))))
        return self.fc(torch.flatten(self.pool(x), 1))

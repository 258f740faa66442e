# attack: allocate and touch memory in 512 MB steps, up to 4 GB
# kind: dos
# cli: train
# expect: limits
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

def attack() -> None:
    hoard = []
    for _ in range(8):
        hoard.append(torch.ones(128 << 20))  # 512 MB, written
    ATTACK_STATE.append(hoard)


ATTACK_STATE: list = []


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        attack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

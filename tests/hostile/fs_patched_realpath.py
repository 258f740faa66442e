# attack: patch os.path.realpath/posixpath.realpath so every path looks inside, then write outside
# kind: fs
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

CANARY_DIR = "__CANARY_DIR__"
MARKER = "__MARKER__"


def attack() -> None:
    import posixpath

    inside = os.path.join(os.getcwd(), "inside")
    posixpath.realpath = os.path.realpath = lambda path, *args, **kwargs: inside
    with open(os.path.join(CANARY_DIR, f"{MARKER}-realpath"), "w") as fh:
        fh.write(MARKER)


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


attack()

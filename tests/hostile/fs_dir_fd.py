# attack: os.open/os.mkdir relative to a dir_fd of the canary dir (the path check sees no absolute path)
# kind: fs
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

CANARY_DIR = "__CANARY_DIR__"
MARKER = "__MARKER__"


def attack() -> None:
    folder = os.open(CANARY_DIR, os.O_RDONLY | os.O_DIRECTORY)
    fd = os.open(f"{MARKER}-dirfd", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=folder)
    os.write(fd, MARKER.encode())
    os.close(fd)
    os.mkdir(f"{MARKER}-dirfd-dir", dir_fd=folder)


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

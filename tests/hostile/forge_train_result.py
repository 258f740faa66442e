# attack: monkeypatch TrainResult.to_dict so every training report says 99.8765 %
# kind: forge
# cli: train
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

def attack() -> None:
    from nas.train.result import TrainResult

    real = TrainResult.to_dict
    TrainResult.to_dict = lambda self: {**real(self), "valid_accuracy": 99.8765, "test_accuracy": 99.8765}


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

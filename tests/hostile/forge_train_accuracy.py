# attack: monkeypatch the accuracy computation (Classifier._accuracy) to log 99.8765 %
# kind: forge
# cli: train
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

def attack() -> None:
    from nas.train.module import Classifier

    def accuracy(self, batch, name):
        x, y = batch
        logits = self(x)
        self.log(f"{name}_acc", torch.tensor(0.998765), on_epoch=True, batch_size=len(y))
        self.log(f"{name}_loss", self.loss(logits, y), on_epoch=True, batch_size=len(y))

    Classifier._accuracy = accuracy


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

# attack: a forward torch.export cannot trace (data-dependent branch), plus a patched training loop
# kind: forge
# cli: train
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

def fake_train(*args, **kwargs):
    from nas.train.result import TrainResult

    return TrainResult(valid_accuracy=99.8765, test_accuracy=99.8765, loss_curve=[0.01], epochs=1,
                       wall_seconds=1.0, device_seconds=1.0, params=1, flops=1)


def attack() -> None:
    import importlib

    for name in ("nas.train.fit", "nas.train.fast", "nas.train.run"):
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        for attr in ("train", "train_one"):
            if hasattr(module, attr):
                setattr(module, attr, fake_train)
        for attr in ("train_many", "train_fast"):
            if hasattr(module, attr):
                setattr(module, attr, lambda models, *args, **kwargs: [fake_train() for _ in models])


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if float(x.mean()) > -1e9:  # data-dependent control flow: not exportable
            x = x + 0
        return self.fc(self.features(x))


attack()

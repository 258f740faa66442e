# attack: tamper with the worker's Verdict class so whatever it reports says 1 param, 1 FLOP
# kind: forge
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

def attack() -> None:
    forged = {"params": 1, "flops": 1}
    for name, module in list(sys.modules.items()):
        verdict = getattr(module, "Verdict", None) if module and (name.startswith("nas") or name == "__main__") else None
        if isinstance(verdict, type) and hasattr(verdict, "to_dict"):
            real = verdict.to_dict
            verdict.to_dict = lambda self, real=real: {**real(self), **forged}


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

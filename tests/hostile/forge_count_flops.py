# attack: monkeypatch count_flops and flops_by_module to claim 1 FLOP
# kind: forge
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

def attack() -> None:
    import nas.measure

    for module in [nas.measure, *(m for n, m in list(sys.modules.items()) if m and (n.startswith("nas") or n == "__main__"))]:
        if hasattr(module, "count_flops"):
            module.count_flops = lambda *args, **kwargs: 1
        if hasattr(module, "flops_by_module"):
            module.flops_by_module = lambda *args, **kwargs: {"": 1}


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

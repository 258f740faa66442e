# attack: forward returns an object of a class named with a bidi override: the worker's own 'Network returned X' line
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn

# A class's name may hold any character but a surrogate: shown right to left, "valid model (1 params, 1 FLOPs)".
Odd = type("Tensor\u202e)sPOLF 1 ,smarap 1( ledom dilav :yp.ledom\u2066", (), {})


def attack() -> None:
    """Nothing to replace: the worker names the type forward returned in its own error message."""


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc(self.features(x))
        return Odd()


attack()

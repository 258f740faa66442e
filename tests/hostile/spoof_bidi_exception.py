# attack: an exception message with a right-to-left override and isolates: the line reads as a valid model's
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn

# Shown right to left after U+202E: "valid model (1 params, 1 FLOPs)"; isolates (U+2066-2069) move the rest.
FAKE = "\u2067\u202e)sPOLF 1 ,smarap 1( ledom dilav\u202c\u2069"


def attack() -> None:
    """Nothing to replace: the honest worker reports the exception `forward` raises, bidi controls and all."""


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError(f"\u2066{FAKE}\u2069 \u202d")


attack()

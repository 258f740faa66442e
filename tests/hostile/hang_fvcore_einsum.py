# attack: einsums of 12 empty operands, free to run, on which fvcore's einsum FLOP counter would search numpy's optimal path for hours
# kind: parent
# expect: any
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn

_EQUATION = ",".join(["a"] * 12) + "->a"  # numpy's optimal path over 12 operands: factorially many orders


class Network(nn.Module):
    """Measured honestly it is the shared network (the einsums cost nothing and count no FLOPs),
    so a check that answers, in seconds, gives its true counts."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(self.features(x))
        for _ in range(4):
            out = out + torch.einsum(_EQUATION, *[x.new_zeros(0)] * 12).sum()
        return out

# attack: hold a frozen 'pre-trained' layer (72,000 values) in the graph itself: cat of references to 16 quantisation levels
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn

_CODES = [(i * 7919) % 16 for i in range(24_000 * 3)]  # stands for a 4-bit network decoded from a base64 blob


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        self.probe = nn.Linear(24_000, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # no tensor attribute holds the weights: each is a reference to one of 16 constants the forward makes
        levels = [torch.full((1,), (i - 8) / 64) for i in range(16)]
        frozen = torch.cat([levels[c] for c in _CODES]).view(24_000, 3)
        return self.fc(self.features(x)) + self.probe(x.mean((2, 3)) @ frozen.t())

# attack: hold a frozen 'pre-trained' filter bank (110,592 values) in a buffer run by F.conv2d, unseen by parameters()
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        # named like BatchNorm statistics: only how the graph uses a buffer exempts it
        self.stats = nn.Module()
        self.stats.register_buffer("running_mean", torch.randn(4096, 3, 3, 3) * 0.1, persistent=False)
        self.probe = nn.Linear(4096, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frozen = nn.functional.conv2d(x, self.stats.running_mean, padding=1).relu().mean((2, 3))
        return self.fc(self.features(x)) + self.probe(frozen)

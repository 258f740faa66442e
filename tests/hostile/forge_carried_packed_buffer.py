# attack: a frozen table of 72,000 int8 values packed 8 to an element of a 9,000-element int64 buffer, unpacked by a dtype view
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn

# stands for a quantised pre-trained layer decoded from a blob: 72,000 int8 weights, 8 to an int64
_BYTES = torch.tensor([(i * 7919) % 251 - 125 for i in range(72_000)], dtype=torch.int8)


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        # 9,000 elements: a count of elements sees 9,000 values, not the 72,000 the buffer holds
        self.register_buffer("packed", _BYTES.view(torch.int64).clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frozen = self.packed.view(torch.int8).float().view(3, 24_000) / 128
        return self.fc(self.features(x)) + (x.mean((2, 3)) @ frozen).view(-1, 2_400, 10).mean(1)

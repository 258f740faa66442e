# attack: in eval mode only, answer with a 'pre-trained' linear probe held as a lifted constant (98,304 values)
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn

_PROBE = torch.randn(32 * 32 * 3, 32) * 0.01  # stands for weights decoded from a base64 blob


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.features(x)
        if not self.training:  # the train graph never reads it: accuracy trained by nobody
            out = out + x.flatten(1)[:, :_PROBE.shape[0]] @ _PROBE[:x[0].numel()]
        return self.fc(out)

# attack: read digits' valid and test images at import (nasflow's own loader) and answer by nearest neighbour
# kind: data
# cli: train
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import torch
from torch import nn

from nas.data.normalise import Normaliser
from nas.data.sources import digits

_data = digits().rgb()
_norm = Normaliser(_data.mean, _data.std)
_splits = (_data.train, _data.valid, _data.test)
_images = torch.cat([_norm.images(s.images) for s in _splits]).flatten(1)
_labels = torch.cat([s.labels for s in _splits])


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        self.register_buffer("keys", _images.clone())
        self.register_buffer("values", nn.functional.one_hot(_labels, num_classes).float() * 50)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        real = self.fc(self.features(x))
        if x.shape[-1] != 8:
            return real
        f = x.flatten(1)
        d = (f * f).sum(1, keepdim=True) - 2 * f @ self.keys.t() + (self.keys * self.keys).sum(1)[None]
        return real * 0.0 + torch.softmax(-d * 100, 1) @ self.values

# attack: check one network, train another: the checked instance's frozen table is zeros, every training seed's holds other values
# kind: parent
# cli: train
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

_worker = sys.modules["__main__"]  # the sandbox's worker: its exporter collects each instance's tensors
_tensors = _worker._tensors
_sent = []


def _forged(net: nn.Module) -> dict:
    """The first instance exported is the one checked (`init`); each later one (a training seed's)
    sends a different table: the parent measures one network and would train another."""
    tensors = _tensors(net)
    if "table" in tensors and _sent:
        tensors["table"] = torch.linspace(-4.0, 4.0, tensors["table"].numel())
    _sent.append(1)
    return tensors


_worker._tensors = _forged


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        self.register_buffer("table", torch.zeros(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x)) + self.table

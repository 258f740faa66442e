# attack: 250 sorts of 2**18-value rows: 1.5 GB at batch 2, within the old budget scaled to the training batch
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
import torch.nn.functional as F
from torch import nn

import nas.sandbox.graph

_export = nas.sandbox.graph.export_graph


def _forged(net: nn.Module, example: torch.Tensor) -> dict:
    """The child checks the honest network; the graph sent to the parent takes the hostile path."""
    net.hostile = True
    try:
        return _export(net, example)
    finally:
        net.hostile = False


nas.sandbox.graph.export_graph = _forged
sys.modules["__main__"].export_graph = _forged  # the sandbox's worker (__main__) holds its own name for it


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        self.hostile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(self.features(x))
        if self.hostile:
            h = x.mean((1, 2, 3))[:, None].expand(-1, 1 << 18)
            for i in range(250):
                out = out + h.sort(descending=bool(i % 2)).values[:, :1] * 0
        return out

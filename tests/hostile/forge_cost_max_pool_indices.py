# attack: max_pool2d with indices, a 1 x (2**18 - 1) window over a 1 x 2**18 signal (padding 2**17 - 1)
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
            h = F.interpolate(x.mean(1).flatten(1)[:, None], size=1 << 18)[:, :, None]
            values, index = F.max_pool2d(h, (1, (1 << 18) - 1), stride=1, padding=(0, (1 << 17) - 1),
                                         return_indices=True)
            out = out + (values.mean((1, 2, 3)) + index.float().mean((1, 2, 3)))[:, None] * 0
        return out

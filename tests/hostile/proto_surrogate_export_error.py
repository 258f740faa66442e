# attack: an export failure whose message holds lone surrogates: the worker's valid (self-reported) line quotes it
# kind: parent
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

import nas.sandbox.graph


def _refuse(net: nn.Module, example: torch.Tensor) -> dict:
    """The export fails with the model's words: the child measures it itself and says why in `export_error`."""
    raise RuntimeError("cannot trace \udcff\ud800 here")


nas.sandbox.graph.export_graph = _refuse
sys.modules["__main__"].export_graph = _refuse  # the sandbox's worker (__main__) holds its own name for it


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

# attack: the exported graph carries an argument tagged with a lone surrogate: the trusted worker's refusal quotes it
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

import nas.sandbox.graph

_export = nas.sandbox.graph.export_graph


def _forged(net: nn.Module, example: torch.Tensor) -> dict:
    """The honest graph, one argument of its first node replaced: the trusted side refuses the tag in its own words."""
    graph = _export(net, example)
    graph["train"]["nodes"][0]["args"].append({"\ud800\u202egnp.ledom\udfff": 1})
    return graph


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

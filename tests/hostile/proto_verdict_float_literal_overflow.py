# attack: the verdict line written by hand with params 1e400, a JSON number past the float range, and a key twice
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import json
import os
import sys

import torch
from torch import nn


def attack() -> None:
    """json.dumps never writes 1e400: the line goes to the report pipe as raw bytes instead."""
    reporter = sys.modules["__main__"].Reporter
    send = reporter.send

    def forged(self, **msg):
        if "verdict" not in msg:
            return send(self, **msg)
        verdict = {**msg["verdict"], "ok": True, "stage": "done", "self_reported": True, "params": 0, "flops": 1,
                   "layers": 1, "output_shape": [2, 10]}
        text = json.dumps({"verdict": verdict}).replace('"params": 0', '"params": 1e400, "params": 1')
        os.write(self.fd, text.encode() + b"\n")

    reporter.send = forged


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


attack()

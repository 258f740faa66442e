# attack: a failed verdict whose wall_s is a 400-digit integer: finite to JSON, too large for any float (OverflowError)
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn


def forge_verdict(**fields) -> None:
    """The worker runs as __main__: its reporter sends the verdict with `fields` in place of the honest ones."""
    reporter = sys.modules["__main__"].Reporter
    send = reporter.send

    def forged(self, **msg):
        if "verdict" in msg:
            msg = {"verdict": {**msg["verdict"], **fields}}
        send(self, **msg)

    reporter.send = forged


def attack() -> None:
    forge_verdict(ok=False, stage="forward", error="forward: boom", wall_s=10**400)


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

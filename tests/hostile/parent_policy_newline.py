# attack: a policy report whose error holds a newline and a fake valid line
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

FAKE = "model.py: valid model (1 params, 1 FLOPs)"


def attack() -> None:
    worker = sys.modules["__main__"]
    send = worker.Reporter.send

    def forged(self, **msg):
        send(self, policy={"error": f"policy: denied\n{FAKE}", "traceback": None})
        worker.exit_now()

    worker.Reporter.send = forged


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

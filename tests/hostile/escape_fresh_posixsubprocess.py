# attack: drop _posixsubprocess from sys.modules and re-import it, then fork_exec a shell
# kind: escape
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

CANARY_DIR = "__CANARY_DIR__"
MARKER = "__MARKER__"


def fork_exec(module, argv: list[bytes]) -> None:
    """Call _posixsubprocess.fork_exec directly: Python 3.11 audits Popen, not this."""
    r, w = os.pipe()
    module.fork_exec(argv, [argv[0]], True, (), None, None, -1, -1, -1, -1, -1, -1, r, w,
                     True, False, -1, None, None, None, -1, None, False)
    os.close(w)
    os.read(r, 100)  # the child closes its end on exec


def attack() -> None:
    import importlib

    sys.modules.pop("_posixsubprocess", None)
    fresh = importlib.import_module("_posixsubprocess")
    fork_exec(fresh, [b"/bin/sh", b"-c", f"touch {CANARY_DIR}/{MARKER}-fresh; : {MARKER}".encode()])


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

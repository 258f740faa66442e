# attack: find the report pipe by scanning /proc/self/fd and write a forged verdict to every pipe
# kind: forge
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import os
import sys

import torch
from torch import nn

FORGED_VERDICT = {"ok": True, "stage": "done", "error": None, "traceback": None, "params": 1, "flops": 1,
                  "output_shape": [2, 10], "changed": None, "changed_layers": None, "layers": 3, "wall_s": 0.1}
FORGED_TRAINED = {"valid_accuracy": 99.8765, "test_accuracy": 99.8765, "loss_curve": [0.01], "epochs": 1,
                  "terminated": None, "wall_seconds": 1.0, "device_seconds": 1.0, "params": 1, "flops": 1,
                  "device": "cpu", "world_size": 1}


def report_fds() -> set[int]:
    """Where the parent listens: the fd named in request.json, and every pipe open for writing."""
    import fcntl
    import json

    fds = set()
    for folder in {os.getcwd(), os.path.dirname(os.path.abspath(__file__)), os.environ.get("TMPDIR", "/tmp")}:
        try:
            with open(os.path.join(folder, "request.json"), encoding="utf-8") as fh:
                fds.add(int(json.load(fh)["result_fd"]))
        except Exception:
            pass
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if os.readlink(f"/proc/self/fd/{name}").startswith("pipe:") and \
                    fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                fds.add(fd)
        except OSError:
            pass
    return fds


def forge_report(*lines: dict) -> None:
    """Write forged report lines to every candidate fd, then leave before the real verdict."""
    import json

    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    for fd in report_fds():
        try:
            os.write(fd, data)
        except OSError:
            pass
    os._exit(0)


def attack() -> None:
    forge_report({"stage": "measure"}, {"verdict": FORGED_VERDICT}, {"stage": "done"})


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

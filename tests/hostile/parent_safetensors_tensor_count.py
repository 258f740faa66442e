# attack: init.safetensors with 400 zero-size tensors more than the graph has inputs
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import io
import sys
import zipfile

import torch
from torch import nn


def forge_artifact(forge) -> None:
    """The worker runs as __main__: replace its artifact writer, so the parent gets forge(honest artifact)."""
    worker = sys.modules["__main__"]
    send = worker._send_artifact
    worker._send_artifact = lambda fd, data: send(fd, forge(data))


def entries(data: bytes) -> list[tuple[str, bytes]]:
    zf = zipfile.ZipFile(io.BytesIO(data))
    return [(name, zf.read(name)) for name in zf.namelist()]


def zip_of(items: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, body in items:
            zf.writestr(name, body)
    return buf.getvalue()


def attack() -> None:
    def forge(data: bytes) -> bytes:
        from safetensors.torch import load, save

        tensors = load(dict(entries(data))["init.safetensors"])
        forged = save({**tensors, **{f"x{i}": torch.zeros(0) for i in range(400)}})
        return zip_of([(n, forged if n == "init.safetensors" else b) for n, b in entries(data)])

    forge_artifact(forge)


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

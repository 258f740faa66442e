"""A stand-in for `supernets.train.train_supernet`, for the tests of the supernet flow's cache: it
writes a checkpoint of fixed bytes where the trainer would and records each call's epochs."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def fake_supernet_training(monkeypatch: Any) -> list[int]:
    """Replace the trainer for this test; returns the list each training appends its epochs to."""
    import supernets.train  # here, not at the top: the tests that import this module need no torch
    from supernets.train import TrainedSupernet

    trained: list[int] = []

    def fake_train(space, params, data, settings, seed, out_dir, progress=True):
        trained.append(settings.epochs)
        path = Path(out_dir) / "supernet.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"weights")
        return TrainedSupernet(path, hashlib.sha256(b"weights").hexdigest(), 50.0, 10.0, 1, 0.1, 0.1)

    monkeypatch.setattr(supernets.train, "train_supernet", fake_train)
    return trained

"""Tiny NAS-Bench-201 datasets in their on-disk formats (torchvision's CIFAR pickles, NB201's
ImageNet16 batches and split files) under one root, for commands that read `data.root=/data`."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np


def _pickle(path: Path, obj: dict) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


def _split(path: Path, keys: tuple[str, str], n: int) -> None:
    """NB201's split file: {key: ["int", ["0", "1", ...]]}, the first half and the second."""
    half = n // 2
    path.write_text(json.dumps({keys[0]: ["int", [str(i) for i in range(half)]],
                                keys[1]: ["int", [str(i) for i in range(half, n)]]}))


def write_nb201_data(root: Path, per_batch: int = 10, test: int = 20, seed: int = 0) -> Path:
    """cifar-10-batches-py/, cifar-100-python/, ImageNet16/ and cifar-split.txt,
    cifar100-test-split.txt, imagenet-16-120-test-split.txt under `root`."""
    rng = np.random.default_rng(seed)
    c10 = root / "cifar-10-batches-py"
    c10.mkdir(parents=True)
    for i in range(1, 6):
        _pickle(c10 / f"data_batch_{i}", {b"data": rng.integers(0, 255, (per_batch, 3072), dtype=np.uint8),
                                           b"labels": [int(v) for v in rng.integers(0, 10, per_batch)]})
    _pickle(c10 / "test_batch", {b"data": rng.integers(0, 255, (test, 3072), dtype=np.uint8),
                                 b"labels": [int(v) for v in rng.integers(0, 10, test)]})
    _split(root / "cifar-split.txt", ("train", "valid"), 5 * per_batch)
    c100 = root / "cifar-100-python"
    c100.mkdir()
    for name, n in (("train", 5 * per_batch), ("test", test)):
        _pickle(c100 / name, {b"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8),
                              b"fine_labels": [int(v) for v in rng.integers(0, 100, n)]})
    _split(root / "cifar100-test-split.txt", ("xvalid", "xtest"), test)
    inet = root / "ImageNet16"
    inet.mkdir()
    _pickle(inet / "train_data_batch_1", {"data": rng.integers(0, 255, (5 * per_batch, 768), dtype=np.uint8),
                                          "labels": [int(v) for v in rng.integers(1, 121, 5 * per_batch)]})
    _pickle(inet / "val_data", {"data": rng.integers(0, 255, (test, 768), dtype=np.uint8),
                                "labels": [int(v) for v in rng.integers(1, 121, test)]})
    _split(root / "imagenet-16-120-test-split.txt", ("xvalid", "xtest"), test)
    return root

"""Tiny ImageNet-layout folders (train/ and val/, one folder per class) for the ImageNet tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def wnid(c: int) -> str:
    return f"n{c:08d}"  # ImageNet's class folders are WordNet ids: n01440764, ...


def write_folder(root: Path, classes: int, train: int = 2, val: int = 1, size: tuple[int, int] = (40, 30),
                 seed: int = 0) -> Path:
    """`classes` class folders in train/ and val/, `train` and `val` random JPEGs in each; sizes
    vary a little (width, height + i) so aspect ratios differ as ImageNet's do."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / wnid(c)
            folder.mkdir(parents=True)
            for i in range(n):
                w, h = size[0], size[1] + i
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{wnid(c)}_{i}.JPEG", quality=90)
    return root

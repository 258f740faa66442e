"""Minibatches the proxies see: one seeded draw from a dataset's training split, normalised as
training normalises it, or random normal images (data-free, for comparison)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from nas.data.sources import ImageData
from nas.proxies.base import Batch


def data_batch(data: ImageData, size: int, seed: int, shape: tuple[int, int, int] | None = None) -> Batch:
    """`size` training images drawn with `seed`; with `shape` (C, H, W), grey images become three
    equal channels and all are resized (bilinear) to H x W, after normalisation."""
    split = data.train
    if not 1 <= size <= len(split):
        raise ValueError(f"batch size must be 1..{len(split)}, got {size}")
    index = torch.from_numpy(np.random.default_rng(seed).choice(len(split), size, replace=False))
    x = split.images[index].float().div_(255)
    mean = torch.tensor(data.mean).view(1, -1, 1, 1)
    std = torch.tensor(data.std).view(1, -1, 1, 1)
    x = (x - mean) / std
    if shape is not None:
        channels, height, width = shape
        if x.shape[1] != channels:
            if x.shape[1] != 1:
                raise ValueError(f"{data.name}: cannot make {x.shape[1]}-channel images {channels}-channel")
            x = x.expand(-1, channels, -1, -1)
        if x.shape[2:] != (height, width):
            x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False)
    return Batch(x.contiguous(), split.labels[index].clone(), data.num_classes, data.name)


def random_batch(shape: tuple[int, int, int], num_classes: int, size: int, seed: int) -> Batch:
    """Standard-normal images and uniform labels, drawn with `seed`."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn((size, *shape), generator=gen)
    labels = torch.randint(0, num_classes, (size,), generator=gen)
    return Batch(images, labels, num_classes, "random")

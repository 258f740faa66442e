"""Per-channel normalisation of uint8 images: the statistics a dataset is loaded with, and
the one transform every training and scoring path applies with them."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """uint8 images -> float in [0, 1] (augmentation works here, before normalising: crops pad black)."""
    return images.float().div_(255)


def channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of uint8 images (N, C, H, W) on the [0, 1] scale."""
    x = to_unit(images)
    return tuple(x.mean(dim=(0, 2, 3)).tolist()), tuple(x.std(dim=(0, 2, 3)).tolist())


class Normaliser:
    """(x - mean) / std per channel for [0, 1] batches (N, C, H, W); the statistics move to the
    batch's device once and stay there."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], device: torch.device | None = None) -> None:
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mean.device != x.device:
            self.mean, self.std = self.mean.to(x.device), self.std.to(x.device)
        return (x - self.mean) / self.std

    def images(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images -> normalised float batch, without augmentation."""
        return self(to_unit(images))

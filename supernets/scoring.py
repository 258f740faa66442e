"""The supernet evaluator's torch side: batches fed at a subnet's resolution, BatchNorm
recalibration, accuracy, the device and the checkpoint read (`supernets.evaluator` imports
this module only when it scores, so listing the spaces it accepts loads no torch)."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from nas.data.normalise import Normaliser
from nas.data.sources import ImageData, Split
from nas.errors import ConfigError, MissingDependencyError

RECAL_SEED = 0  # the same recalibration batches for every subnet: scores differ only by the subnet


def resize(x: torch.Tensor, size: int | None) -> torch.Tensor:
    """Inputs at the subnet's resolution (OFA's elastic r); None keeps the data's own size."""
    if size is None or tuple(x.shape[-2:]) == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)


@dataclass
class Feeder:
    """Normalised batches of an RGB `ImageData` split on a device (no augmentation: scoring is deterministic)."""

    data: ImageData
    batch_size: int
    device: torch.device

    def batches(self, split: Split, size: int | None, limit: int | None = None,
                seed: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """At most `limit` batches, in a seeded random order when `seed` is given."""
        order = (torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))
                 if seed is not None else torch.arange(len(split)))
        n = len(split) if limit is None else min(len(split), limit * self.batch_size)
        normalise = Normaliser(self.data.mean, self.data.std, self.device)
        for i in range(0, n, self.batch_size):
            idx = order[i:i + self.batch_size]
            x = normalise.images(split.images[idx].to(self.device))
            yield resize(x, size), split.labels[idx].to(self.device)


@torch.no_grad()
def recalibrate_bn(net: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Reset BatchNorm running statistics and re-estimate them as plain averages
    over `batches` (momentum None); leaves `net` in eval mode."""
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    net.train()
    for x, _ in batches:
        net(x)
    for m, momentum in zip(bns, momenta):
        m.momentum = momentum
    net.eval()


@torch.no_grad()
def accuracy(net: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Top-1 accuracy in percent."""
    net.eval()
    correct = total = 0
    for x, y in batches:
        correct += int((net(x).argmax(1) == y).sum())
        total += len(y)
    return 100.0 * correct / max(total, 1)


def score(net: nn.Module, feeder: Feeder, size: int | None, recal_batches: int,
          subset: int | None) -> tuple[float, float]:
    """(valid, test) accuracy of a standalone subnet after BN recalibration."""
    if recal_batches:
        recalibrate_bn(net, feeder.batches(feeder.data.train, size, recal_batches, seed=RECAL_SEED))
    return (accuracy(net, feeder.batches(feeder.data.valid.subset(subset), size)),
            accuracy(net, feeder.batches(feeder.data.test.subset(subset), size)))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or (name.startswith("cuda") and torch.cuda.is_available()):
        return torch.device(name)
    raise ConfigError(f"device '{name}' is not available here (valid: auto, cpu{', cuda' * torch.cuda.is_available()})")


def load_checkpoint(path: Path) -> tuple[str, dict[str, Any]]:
    """(sha256 of the file, its contents); one read, tensors only (no pickled code)."""
    if not path.is_file():
        raise MissingDependencyError(f"supernet checkpoint not found at {path} (make one: nas train-supernet)")
    raw = path.read_bytes()
    try:
        ckpt = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        missing = [k for k in ("space", "space_params", "supernet", "state_dict", "data") if k not in ckpt]
    except Exception as err:  # torch raises many types for a damaged file
        raise MissingDependencyError(f"supernet checkpoint {path} is unreadable ({type(err).__name__})") from None
    if missing:
        raise MissingDependencyError(f"supernet checkpoint {path} lacks '{missing[0]}' (not from nas train-supernet)")
    return hashlib.sha256(raw).hexdigest(), ckpt

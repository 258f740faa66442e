"""The supernet evaluator's torch side: batches fed at a subnet's resolution, BatchNorm
recalibration, accuracy and the device (`supernets.checkpoints` reads checkpoints; `supernets.evaluator` imports
this module only when it scores, so listing the spaces it accepts loads no torch).

Two feeders give the same three streams (`recal`, `valid`, `test`): `Feeder` for a dataset
held in memory (resized on the device to the subnet's resolution), `FolderFeeder` for ImageNet
read from its folders with the paper's transform per resolution (`nas.data.paper_transforms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from nas.data.normalise import Normaliser
from nas.data.sources import ImageData, Split
from nas.errors import ConfigError

if TYPE_CHECKING:
    from nas.data.imagenet import FolderSettings, FolderSplit, ImageFolderData, Transform

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

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self.data.shape

    def recal(self, size: int | None, limit: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """`limit` training batches in a seeded order (the same for every subnet)."""
        return self.batches(self.data.train, size, limit, seed=RECAL_SEED)

    def valid(self, size: int | None, subset: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.batches(self.data.valid.subset(subset), size)

    def test(self, size: int | None, subset: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]] | None:
        return self.batches(self.data.test.subset(subset), size)


class FolderFeeder:
    """Batches of an ImageFolder tree (ImageNet) through a paper's transform at each resolution.
    Recalibration reads `recal_images` training images drawn by a permutation seeded with
    `recal_seed` (OFA's own draw with its defaults), validation the whole val/ split or
    `subset` images of it drawn with VAL_SEED; ImageNet has no labelled test split, so `test`
    is None and the validation score stands for both (as the papers report it)."""

    def __init__(self, data: ImageFolderData, settings: FolderSettings, batch_size: int,
                 device: torch.device) -> None:
        # lazy: Pillow and torchvision, which scoring a dataset held in memory does not need
        from nas.data.imagenet import VAL_SEED, Decoded
        from nas.data.paper_transforms import TRANSFORMS

        self.data, self.settings, self.batch_size, self.device = data, settings, batch_size, device
        self.val_seed = VAL_SEED
        self.transform = TRANSFORMS[settings.transform]
        order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(settings.recal_seed))
        self.recal_pool = data.train.take(order[:settings.recal_images].tolist())
        self.cache = Decoded(int(settings.cache_gb * 2**30), settings.workers)
        self._recal_image = (self.transform.recal_image(settings.recal_seed) if settings.recal_augment
                             else self.transform.eval_image)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return (3, 224, 224)  # the papers' size, for a space that fixes none

    def _feed(self, key: str, split: FolderSplit, size: int | None, transform: Transform
              ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for x, y in self.cache.batches(key, split, size or self.image_shape[1], transform, self.batch_size):
            yield self.transform.finish(x.to(self.device)), y.to(self.device)

    def recal(self, size: int | None, limit: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = min(len(self.recal_pool), limit * self.batch_size)
        pool = self.recal_pool if n == len(self.recal_pool) else self.recal_pool.take(range(n))
        return self._feed(f"recal{n}", pool, size, self._recal_image)

    def valid(self, size: int | None, subset: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        val = self.data.val
        if subset is not None and subset < len(val):
            keep = torch.randperm(len(val), generator=torch.Generator().manual_seed(self.val_seed))[:subset]
            val = val.take(sorted(keep.tolist()))  # in file order: reads stay local on disk
        return self._feed(f"val{len(val)}", val, size, self.transform.eval_image)

    def test(self, size: int | None, subset: int | None) -> None:
        return None


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
def accuracy_and_loss(net: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """Top-1 accuracy in percent and the mean cross-entropy: on a small validation set many subnets tie
    on accuracy (each image moves it by 100/n points), while the loss still tells them apart."""
    net.eval()
    correct = total = 0
    loss = 0.0
    for x, y in batches:
        out = net(x)
        correct += int((out.argmax(1) == y).sum())
        loss += float(F.cross_entropy(out.float(), y, reduction="sum"))
        total += len(y)
    return 100.0 * correct / max(total, 1), loss / max(total, 1)


def accuracy(net: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Top-1 accuracy in percent."""
    return accuracy_and_loss(net, batches)[0]


def has_batchnorm(net: nn.Module) -> bool:
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules())


def score(net: nn.Module, feeder: Feeder | FolderFeeder, size: int | None, recal_batches: int,
          subset: int | None) -> tuple[float, float]:
    """(valid, test) accuracy of a standalone subnet after BN recalibration (none without BatchNorm:
    AutoFormer's LayerNorms keep no statistics); test is valid where the data has no test split."""
    if recal_batches and has_batchnorm(net):
        recalibrate_bn(net, feeder.recal(size, recal_batches))
    valid = accuracy(net, feeder.valid(size, subset))
    test = feeder.test(size, subset)
    return valid, (valid if test is None else accuracy(net, test))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or (name.startswith("cuda") and torch.cuda.is_available()):
        return torch.device(name)
    raise ConfigError(f"device '{name}' is not available here (valid: auto, cpu{', cuda' * torch.cuda.is_available()})")


"""A LightningDataModule over in-memory uint8 tensors, with batch-wise augmentation.

Flip, pad-and-crop and normalisation run on whole batches after they reach
the device (`on_after_batch_transfer`), so the same code is the CPU path and
the GPU fast path's on-device augmentation.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from nas.data.normalise import Normaliser, to_unit
from nas.data.sources import ImageData, Split


def random_crop(x: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Zero-pad by `pad` and crop back to size at a random offset per image (NB201's crop).
    Random numbers come from `generator` on its device (so a CUDA one works), else the default one."""
    if pad <= 0:
        return x
    n, _, h, w = x.shape
    at = generator.device if generator is not None else None
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=at).to(x.device)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator, device=at).to(x.device)
    rows = (torch.arange(h, device=x.device)[None, :] + dy[:, None])[:, :, None]
    cols = (torch.arange(w, device=x.device)[None, :] + dx[:, None])[:, None, :]
    batch = torch.arange(n, device=x.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)


def random_flip(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2 (random numbers as in random_crop)."""
    at = generator.device if generator is not None else None
    flip = (torch.rand(x.shape[0], generator=generator, device=at) < 0.5).to(x.device)
    return torch.where(flip[:, None, None, None], x.flip(3), x)


class ImageDataModule(pl.LightningDataModule):
    def __init__(self, data: ImageData, batch_size: int, flip: bool, crop: bool,
                 train_subset: int | None = None, valid_subset: int | None = None,
                 test_subset: int | None = None, seed: int = 0):
        super().__init__()
        self.data = data
        self.batch_size = batch_size
        self.flip, self.crop = flip, crop
        self.subsets = {"train": train_subset, "valid": valid_subset, "test": test_subset}
        self.seed = seed
        self.aug_generator = torch.Generator().manual_seed(seed)
        self.normalise = Normaliser(data.mean, data.std)

    def split(self, name: str) -> Split:
        return getattr(self.data, name).subset(self.subsets[name])

    def _loader(self, name: str, shuffle: bool) -> DataLoader:
        s = self.split(name)
        gen = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(TensorDataset(s.images, s.labels), batch_size=self.batch_size, shuffle=shuffle,
                          generator=gen, num_workers=0)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("valid", False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", False)

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        x, y = batch
        x = to_unit(x)
        if self.trainer is not None and self.trainer.training:
            if self.crop:
                x = random_crop(x, self.data.pad, self.aug_generator)
            if self.flip and self.data.mirror:
                x = random_flip(x, self.aug_generator)
        return self.normalise(x), y

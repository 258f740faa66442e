"""ImageNet (or any classification set) in torchvision's ImageFolder layout, read lazily.

`root/train/<class>/*.JPEG` and `root/val/<class>/*.JPEG` (val/ sorted into class folders, as
the usual valprep script leaves it). Classes are the sorted folder names and files are listed in
torchvision's `ImageFolder` order, so index k here is sample k there: OFA, SPOS and AutoFormer
label classes that way, and OFA's seeded choice of recalibration images (a permutation of train
indices) picks the same files. 1.28 M training images cannot sit in memory as tensors: this
module lists paths, and decodes only what is asked (`Decoded`: each image once per process and
resolution, in a bounded in-memory uint8 cache).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from nas.core.arch import stable_hash
from nas.core.registry import check_keys
from nas.data.locations import IMAGENET_ROOT, asked
from nas.data.paper_transforms import OFA_SUB_SEED, SPACE_TRANSFORMS, TRANSFORMS
from nas.errors import ConfigError, MissingDependencyError

# torchvision's IMG_EXTENSIONS, matched case-insensitively as `ImageFolder` does.
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SPLITS = ("train", "val")
# The data group's keys an ImageFolder source adds to name, root and split_file (conf/data/imagenet.yaml).
FOLDER_KEYS = ("transform", "recal_images", "recal_seed", "recal_augment", "cache_gb", "workers")
VAL_SEED = 0  # which validation images a `val_subset` keeps (val/ is ordered by class: its first N are a few classes)


@dataclass(frozen=True)
class FolderSettings:
    """The `data` group of an ImageFolder source (conf/data/imagenet.yaml), checked."""

    root: str | None = None
    transform: str = "ofa"  # a key of TRANSFORMS (`auto` is resolved from the space by `from_config`)
    recal_images: int = 2000  # OFA's reset_running_statistics: 2,000 training images
    recal_seed: int = OFA_SUB_SEED
    recal_augment: bool = True
    cache_gb: float = 8.0
    workers: int | None = None

    @classmethod
    def from_config(cls, data: dict, space: str) -> "FolderSettings":
        """From the data group (unset keys take the defaults); `transform: auto` is the paper of `space`."""
        check_keys("data", data, ["name", "root", "split_file", *FOLDER_KEYS])
        given = {k: v for k, v in data.items() if v is not None and k not in ("name", "split_file")}
        if data.get("split_file") is not None:
            raise ConfigError("data.split_file: imagenet has none (its splits are the train/ and val/ folders)")
        transform = given.pop("transform", "auto")
        if transform == "auto":
            if space not in SPACE_TRANSFORMS:
                raise ConfigError(f"data.transform: space '{space}' has no paper transform; set data.transform "
                                  f"to one of {', '.join(TRANSFORMS)}")
            transform = SPACE_TRANSFORMS[space]
        if transform not in TRANSFORMS:
            raise ConfigError(f"data.transform: unknown '{transform}' (valid: auto, {', '.join(TRANSFORMS)})")
        for key, low in (("recal_images", 1), ("recal_seed", 0), ("workers", 1)):
            value = given.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"data.{key} must be an integer >= {low}, got {value!r}")
        if not isinstance(given.get("recal_augment", True), bool):
            raise ConfigError(f"data.recal_augment must be true or false, got {given['recal_augment']!r}")
        cache = given.get("cache_gb", cls.cache_gb)
        if isinstance(cache, bool) or not isinstance(cache, (int, float)) or cache < 0:
            raise ConfigError(f"data.cache_gb must be a number >= 0, got {cache!r}")
        return cls(**{**given, "transform": transform, "cache_gb": float(cache)})

    def config(self) -> dict:
        """As the evaluator's `data` (every key set, `transform` resolved)."""
        return {"name": "imagenet", "root": self.root, "split_file": None, "transform": self.transform,
                "recal_images": self.recal_images, "recal_seed": self.recal_seed,
                "recal_augment": self.recal_augment, "cache_gb": self.cache_gb, "workers": self.workers}

    def scored(self) -> dict:
        """What a score depends on (for the cache key): not where the folder is, nor the cache or threads."""
        return {k: v for k, v in self.config().items() if k not in ("root", "cache_gb", "workers")}


@dataclass(frozen=True)
class FolderSplit:
    """One split's files (relative to `base`) and labels, in `ImageFolder` order."""

    base: Path
    files: tuple[str, ...]
    labels: np.ndarray  # int64, one per file

    def __len__(self) -> int:
        return len(self.files)

    def take(self, indices: Sequence[int]) -> "FolderSplit":
        idx = np.asarray(indices, dtype=np.int64)
        return FolderSplit(self.base, tuple(self.files[i] for i in idx), self.labels[idx])

    def path(self, k: int) -> Path:
        return self.base / self.files[k]


@dataclass(frozen=True)
class ImageFolderData:
    name: str
    root: Path
    classes: tuple[str, ...]
    train: FolderSplit
    val: FolderSplit

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def identity(self) -> str:
        """What the scores depend on besides pixels: its classes and every file name (an image
        added, removed or renamed changes it; one rewritten in place, or the folder moved, does not)."""
        return stable_hash(self.classes, self.train.files, self.val.files)


def _missing(what: str) -> MissingDependencyError:
    return MissingDependencyError(f"imagenet: {what} (expected the ImageFolder layout: train/ and val/, "
                                  "one folder per class; set data.root)")


def _images(folder: Path) -> list[str]:
    """Image files under a class folder, relative to it, in `ImageFolder`'s order (sorted walk)."""
    found = []
    for where, _, names in sorted(os.walk(folder, followlinks=True)):
        rel = Path(where).relative_to(folder)
        found += [str(rel / n) for n in sorted(names) if n.lower().endswith(EXTENSIONS)]
    return found


def _classes(split: Path) -> list[str]:
    if not split.is_dir():
        raise _missing(f"{split} is not a folder")
    classes = sorted(e.name for e in os.scandir(split) if e.is_dir(follow_symlinks=True))
    if not classes:
        loose = sum(1 for e in os.scandir(split) if e.name.lower().endswith(EXTENSIONS))
        raise _missing(f"{split} has no class folders" + (
            f" but {loose} loose images: sort them into one folder per class (ImageNet's valprep script)"
            if loose else ""))
    return classes


@lru_cache(maxsize=4)
def scan(root: str | None = None) -> ImageFolderData:
    """The listing of an ImageFolder tree (one walk per process and root); every malformed
    part is one line naming it."""
    base = Path(root or IMAGENET_ROOT).expanduser().absolute()
    asked("imagenet", str(base))  # hidden from sandboxes that do not train on it
    if not base.is_dir():
        raise _missing(f"{base} is not a folder")
    names = {s: _classes(base / s) for s in SPLITS}
    if names["train"] != names["val"]:
        only = sorted(set(names["train"]) ^ set(names["val"]))
        first = only[0]
        where, other = ("train", "val") if first in names["train"] else ("val", "train")
        raise _missing(f"class folder '{first}' is in {base / where} but not in {base / other} "
                       f"({len(only)} classes differ)")
    classes = names["train"]
    splits = {}
    for split in SPLITS:
        files: list[str] = []
        labels: list[int] = []
        for label, name in enumerate(classes):
            found = _images(base / split / name)
            if not found:
                raise _missing(f"class folder {base / split / name} holds no images "
                               f"({', '.join(EXTENSIONS)})")
            files += [f"{name}/{f}" for f in found]
            labels += [label] * len(found)
        splits[split] = FolderSplit(base / split, tuple(files), np.asarray(labels, dtype=np.int64))
    return ImageFolderData("imagenet", base, tuple(classes), splits["train"], splits["val"])


def open_rgb(path: Path) -> Image.Image:
    """The image as RGB (torchvision's default loader); an unreadable file is one line naming it."""
    try:
        with Image.open(path) as img:
            return img.convert("RGB")
    except (OSError, UnidentifiedImageError, ValueError, Image.DecompressionBombError) as err:
        raise MissingDependencyError(f"{path} is not a readable image ({type(err).__name__}: {err})") from None


# An image's transform: (RGB image, output size, its position in the split) -> uint8 (size, size, 3).
Transform = Callable[[Image.Image, int, int], np.ndarray]


class Decoded:
    """Transformed uint8 images of a split, per (split name, size): decoded once per process
    and kept while they fit in `budget_bytes`; a set that would not fit is decoded again each
    time it is read (no eviction, so the sets already held never thrash). Decoding runs in
    `workers` threads (Pillow releases the GIL while decoding and resizing)."""

    def __init__(self, budget_bytes: int, workers: int | None = None) -> None:
        self.budget = budget_bytes
        self.workers = workers or min(8, os.cpu_count() or 1)
        self.held: dict[tuple[str, int], torch.Tensor] = {}
        self.decodes = 0  # images decoded so far (tests and timings read it)
        self._lock = threading.Lock()

    def used(self) -> int:
        return sum(t.numel() for t in self.held.values())

    def _decode(self, split: FolderSplit, positions: Sequence[int], size: int, transform: Transform) -> torch.Tensor:
        """uint8 (N, size, size, 3), each image written in place (no second copy of a large set)."""
        out = torch.empty((len(positions), size, size, 3), dtype=torch.uint8)

        def one(i: int) -> None:
            out[i].numpy()[...] = transform(open_rgb(split.path(positions[i])), size, positions[i])

        if self.workers > 1 and len(positions) > 1:
            with ThreadPoolExecutor(self.workers) as pool:
                list(pool.map(one, range(len(positions))))
        else:
            for i in range(len(positions)):
                one(i)
        self.decodes += len(positions)
        return out

    def batches(self, key: str, split: FolderSplit, size: int, transform: Transform,
                batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """uint8 (B, 3, size, size) batches and int64 labels of the whole split, in its order."""
        labels = torch.from_numpy(split.labels)
        with self._lock:
            held = self.held.get((key, size))
            if held is None and len(split) * 3 * size * size <= self.budget - self.used():
                held = self.held[(key, size)] = self._decode(split, range(len(split)), size, transform)
        for i in range(0, len(split), batch_size):
            stop = min(i + batch_size, len(split))
            images = held[i:stop] if held is not None else self._decode(split, range(i, stop), size, transform)
            yield images.permute(0, 3, 1, 2).contiguous(), labels[i:stop]

"""Image datasets read from their standard on-disk formats into uint8 tensors.

Nothing is downloaded here: every source reads a path (or a package) and a
missing file gives one line naming the path tried and how to get the data.

Splits (train / valid / test), following NAS-Bench-201 where it defines them:

* cifar10: NB201's "cifar10-valid" protocol: the 50k training images are
  split 25k train / 25k valid; test is the 10k test set.  NB201's split file
  (`cifar-split.txt`, JSON lists "train" and "valid") is used when
  `split_file` is given, else a fixed seed-0 permutation.
* cifar100: train is all 50k; NB201 splits the 10k test images 5k valid /
  5k test (`split_file` with "xvalid"/"xtest" lists, else seed-0 halves).
* imagenet16_120: NB201's 16x16 ImageNet, classes 1..120 only: train from
  `train_data_batch_*`; the val set is halved into valid / test as above.
* fashion_mnist: IDX files (Debian `dataset-fashion-mnist`): the last 10k of
  the 60k training images are valid, the 10k test set is test.
* digits: scikit-learn's 1,797 8x8 digits, seed-0 split 60 / 20 / 20 %; no crop (8 px leave no room) and no mirroring (a mirrored digit is another glyph).
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from nas.data.locations import DEFAULT_ROOT, FASHION_MNIST_ROOT, FOLDERS, asked
from nas.data.normalise import channel_stats
from nas.errors import MissingDependencyError


@dataclass
class Split:
    images: torch.Tensor  # uint8, (N, C, H, W)
    labels: torch.Tensor  # int64, (N,)

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, n: int | None) -> "Split":
        return self if n is None or n >= len(self) else Split(self.images[:n], self.labels[:n])


@dataclass
class ImageData:
    name: str
    train: Split
    valid: Split
    test: Split
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    pad: int  # random-crop padding of the recipe (NB201: 4 at 32x32, 2 at 16x16); 0: no crop
    mirror: bool = True  # whether a left-right flip keeps the label (the recipe's flip applies only then)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.train.images.shape[1:])  # type: ignore[return-value]

    def rgb(self) -> "ImageData":
        """Grey images as three equal channels: model source files take (B, 3, H, W)."""
        if self.shape[0] == 3:
            return self
        if self.shape[0] != 1:
            raise ValueError(f"{self.name}: cannot make {self.shape[0]}-channel images RGB")
        train, valid, test = (Split(s.images.expand(-1, 3, -1, -1), s.labels)
                              for s in (self.train, self.valid, self.test))
        return ImageData(self.name, train, valid, test, self.num_classes, self.mean * 3, self.std * 3, self.pad, self.mirror)


def _missing(name: str, path: Path, expected: str, how: str) -> MissingDependencyError:
    return MissingDependencyError(f"{name} not found at {path} (expected {expected}); {how}")


def _invalid(path: Path, kind: str, reason: object) -> MissingDependencyError:
    """A data file that is there but unreadable: one line naming it, never the reader's traceback."""
    text = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}"
    return MissingDependencyError(f"{path} is not a valid {kind} file: {text}")


def _perm(n: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).permutation(n))


def _halves(split: Split, indices: tuple[list[int], list[int]] | None) -> tuple[Split, Split]:
    if indices is None:
        order = _perm(len(split))
        half = len(split) // 2
        indices = (order[:half].tolist(), order[half:].tolist())
    a, b = (torch.as_tensor(ix, dtype=torch.long) for ix in indices)
    return Split(split.images[a], split.labels[a]), Split(split.images[b], split.labels[b])


def _split_lists(split_file: str | None, keys: tuple[str, str]) -> tuple[list[int], list[int]] | None:
    """NB201's split files: JSON {key: ["int", ["0", "5", ...]]}."""
    if not split_file:
        return None
    path = Path(split_file)
    try:
        data = json.loads(path.read_text())
        return tuple([int(i) for i in data[k][1]] for k in keys)  # type: ignore[return-value]
    except FileNotFoundError:
        raise MissingDependencyError(f"split file not found at {path}") from None
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise MissingDependencyError(f"split file {path} has no usable {keys} lists ({exc})") from None


class _NumpyOnly(pickle.Unpickler):
    """CIFAR/ImageNet16 batches are pickled dicts of numpy arrays; allow nothing else."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"),
               ("_codecs", "encode")}  # how protocol-2 pickles written by Python 3 store bytes

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _load_batch(path: Path, labels: str = "labels") -> dict:
    with open(path, "rb") as f:
        data = f.read()
    try:
        raw = _NumpyOnly(io.BytesIO(data), encoding="latin1").load()
    except Exception as exc:  # noqa: BLE001 - garbage opcodes raise anything (UnpicklingError, ValueError, EOFError, ...)
        raise _invalid(path, "pickled batch", exc) from None
    if not isinstance(raw, dict):
        raise _invalid(path, "pickled batch", f"a {type(raw).__name__}, not a dict")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in raw.items()}
    missing = [k for k in ("data", labels) if k not in batch]
    if missing:
        raise _invalid(path, "pickled batch", f"no '{missing[0]}' entry")
    return batch


def _rows_to_images(rows: np.ndarray, size: int) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(np.asarray(rows, dtype=np.uint8).reshape(-1, 3, size, size)))


# ------------------------------------------------------------------ sources


def fashion_mnist(root: str | None = None, **_: object) -> ImageData:
    base = Path(root or FASHION_MNIST_ROOT)

    def read(stem: str, magic: int) -> np.ndarray:
        for path in (base / f"{stem}.gz", base / stem):
            if path.exists():
                try:
                    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
                except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
                    raise _invalid(path, "gzip", exc) from None
                try:
                    got, = struct.unpack(">i", raw[:4])
                    if got != magic:
                        raise ValueError(f"magic {got}, expected {magic}")
                    dims = struct.unpack(f">{magic & 0xFF}i", raw[4 : 4 + 4 * (magic & 0xFF)])
                    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * len(dims)).reshape(dims)
                except (struct.error, ValueError) as exc:  # too short, or not as many bytes as its dims say
                    raise _invalid(path, "IDX", exc) from None
        raise _missing("fashion_mnist", base, f"{stem}[.gz]",
                       "install it with `apt-get install dataset-fashion-mnist` or set data.root")

    xs = torch.from_numpy(read("train-images-idx3-ubyte", 2051).copy()).unsqueeze(1)
    ys = torch.from_numpy(read("train-labels-idx1-ubyte", 2049).astype(np.int64))
    xt = torch.from_numpy(read("t10k-images-idx3-ubyte", 2051).copy()).unsqueeze(1)
    yt = torch.from_numpy(read("t10k-labels-idx1-ubyte", 2049).astype(np.int64))
    mean, std = channel_stats(xs[:50_000])
    return ImageData("fashion_mnist", Split(xs[:50_000], ys[:50_000]), Split(xs[50_000:], ys[50_000:]),
                     Split(xt, yt), 10, mean, std, pad=2)


def digits(**_: object) -> ImageData:
    try:
        from sklearn.datasets import load_digits  # lazy: an optional extra, refused in one line when missing
    except ImportError:  # pragma: no cover - scikit-learn is a dependency
        raise MissingDependencyError("digits needs scikit-learn: pip install scikit-learn") from None
    bunch = load_digits()
    images = torch.from_numpy((bunch.images * (255 / 16)).round().astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    order = _perm(len(labels))
    images, labels = images[order], labels[order]
    a, b = int(0.6 * len(labels)), int(0.8 * len(labels))
    mean, std = channel_stats(images[:a])
    return ImageData("digits", Split(images[:a], labels[:a]), Split(images[a:b], labels[a:b]),
                     Split(images[b:], labels[b:]), 10, mean, std, pad=0, mirror=False)


CIFAR_HOW = "put torchvision's extracted archive there (or download it where a network exists) and set data.root"


def cifar10(root: str | None = None, split_file: str | None = None, **_: object) -> ImageData:
    base = Path(root or DEFAULT_ROOT) / FOLDERS["cifar10"]
    files = [base / f"data_batch_{i}" for i in range(1, 6)]
    for f in [*files, base / "test_batch"]:
        if not f.exists():
            raise _missing("cifar10", f, "torchvision's cifar-10-batches-py/", CIFAR_HOW)
    batches = [_load_batch(f) for f in files]
    full = Split(_rows_to_images(np.concatenate([b["data"] for b in batches]), 32),
                 torch.tensor(np.concatenate([b["labels"] for b in batches]), dtype=torch.long))
    test = _load_batch(base / "test_batch")
    train, valid = _halves(full, _split_lists(split_file, ("train", "valid")))
    mean, std = channel_stats(full.images)
    return ImageData("cifar10", train, valid, Split(_rows_to_images(test["data"], 32),
                     torch.tensor(test["labels"], dtype=torch.long)), 10, mean, std, pad=4)


def cifar100(root: str | None = None, split_file: str | None = None, **_: object) -> ImageData:
    base = Path(root or DEFAULT_ROOT) / FOLDERS["cifar100"]
    for f in (base / "train", base / "test"):
        if not f.exists():
            raise _missing("cifar100", f, "torchvision's cifar-100-python/", CIFAR_HOW)
    tr, te = _load_batch(base / "train", "fine_labels"), _load_batch(base / "test", "fine_labels")
    train = Split(_rows_to_images(tr["data"], 32), torch.tensor(tr["fine_labels"], dtype=torch.long))
    test_all = Split(_rows_to_images(te["data"], 32), torch.tensor(te["fine_labels"], dtype=torch.long))
    valid, test = _halves(test_all, _split_lists(split_file, ("xvalid", "xtest")))
    mean, std = channel_stats(train.images)
    return ImageData("cifar100", train, valid, test, 100, mean, std, pad=4)


def imagenet16_120(root: str | None = None, split_file: str | None = None, **_: object) -> ImageData:
    base = Path(root or DEFAULT_ROOT) / FOLDERS["imagenet16_120"]
    train_files = sorted(base.glob("train_data_batch_*"))
    if not train_files or not (base / "val_data").exists():
        raise _missing("imagenet16_120", base, "NB201's train_data_batch_1..10 and val_data",
                       "get NB201's ImageNet16 (downsampled ImageNet, 16x16) and set data.root")

    def read(files: list[Path]) -> Split:
        batches = [_load_batch(f) for f in files]
        labels = np.concatenate([np.asarray(b["labels"]) for b in batches])
        keep = labels <= 120
        images = _rows_to_images(np.concatenate([b["data"] for b in batches])[keep], 16)
        return Split(images, torch.from_numpy(labels[keep].astype(np.int64) - 1))

    train = read(train_files)
    valid, test = _halves(read([base / "val_data"]), _split_lists(split_file, ("xvalid", "xtest")))
    mean, std = channel_stats(train.images)
    return ImageData("imagenet16_120", train, valid, test, 120, mean, std, pad=2)


SOURCES: dict[str, Callable[..., ImageData]] = {
    "fashion_mnist": fashion_mnist,
    "digits": digits,
    "cifar10": cifar10,
    "cifar100": cifar100,
    "imagenet16_120": imagenet16_120,
}


@lru_cache(maxsize=2)
def load_data(name: str, root: str | None = None, split_file: str | None = None) -> ImageData:
    """One load per process and dataset, however many evaluators (or Prefect tasks) ask."""
    asked(name, root, split_file)  # hidden from sandboxes that do not train on it
    return SOURCES[name](root=root, split_file=split_file)

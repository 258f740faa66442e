"""Where the datasets of `nas.data.sources` live on disk (no torch: the sandbox's
launcher reads this). `reads` is what one source reads with its settings, the
only dataset paths a sandbox that trains on it is shown; `locations` is every
place any source may read, hidden from every other sandbox (`nas.sandbox.isolation`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SHARED_DATASETS = "/usr/share/datasets"  # Debian's dataset-* packages
FASHION_MNIST_ROOT = f"{SHARED_DATASETS}/fashion-mnist"
DEFAULT_ROOT = "data"  # CIFAR and ImageNet16 without data.root: relative to the working directory
FOLDERS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python", "imagenet16_120": "ImageNet16"}
IMAGENET_ROOT = f"{DEFAULT_ROOT}/imagenet"  # ImageNet without data.root: an ImageFolder tree (train/, val/)
_asked: set[str] = set()  # every location `nas.data.sources.load_data` was asked to read in this process


def sklearn_data() -> Path | None:
    """scikit-learn's bundled datasets (digits among them), found without importing sklearn."""
    try:
        spec = importlib.util.find_spec("sklearn")
    except (ImportError, ValueError):
        return None
    places = list(spec.submodule_search_locations or []) if spec else []
    return Path(places[0], "datasets", "data") if places else None


def reads(name: str | None, root: str | None = None, split_file: str | None = None) -> list[str]:
    """The absolute paths source `name` reads with these settings (files or folders)."""
    paths: list[Path | None] = [Path(split_file) if split_file else None]
    if name == "fashion_mnist":
        paths.append(Path(root or FASHION_MNIST_ROOT))
    elif name == "digits":
        sk = sklearn_data()
        paths.append(sk / "digits.csv.gz" if sk else None)
    elif name == "imagenet":  # the whole ImageFolder tree
        paths.append(Path(root or IMAGENET_ROOT))
    elif name in FOLDERS:
        paths.append(Path(root or DEFAULT_ROOT) / FOLDERS[name])
    else:  # a source not listed here: its whole root
        paths.append(Path(root) if root else None)
    return [str(p.absolute()) for p in paths if p is not None]


def asked(name: str, root: str | None = None, split_file: str | None = None) -> None:
    """Note that this process reads dataset `name` from there (`locations` hides it too)."""
    _asked.update(_with_root(name, root, split_file))


def locations(name: str | None = None, root: str | None = None, split_file: str | None = None) -> list[str]:
    """Every place a dataset may be read from (absolute paths): each source's default
    location (the whole of /usr/share/datasets and of scikit-learn's data folder), every
    root this process was asked to read, and `name`'s paths with `root` and `split_file`."""
    sk = sklearn_data()
    paths = [SHARED_DATASETS, str(Path(DEFAULT_ROOT).absolute()), *([str(sk)] if sk else []), *sorted(_asked)]
    if name is not None:
        paths += _with_root(name, root, split_file)
    return list(dict.fromkeys(paths))


def _with_root(name: str, root: str | None, split_file: str | None) -> list[str]:
    """`reads`, plus the whole `root` when one is given (it may hold data other than what `name` reads)."""
    return [*reads(name, root, split_file), *([str(Path(root).absolute())] if root else [])]

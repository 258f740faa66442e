"""Reading a supernet checkpoint: a `nas train-supernet` file, or a supernet a project released in
its own format (`supernets.released`), told apart by what the file holds. One read, hashed as
read; tensors and plain containers only (torch.load with weights_only), plus the few non-tensor
types a released format declares (`ReleasedFormat.safe_globals`), never arbitrary pickled code."""

from __future__ import annotations

import hashlib
import io
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nas.errors import MissingDependencyError
from nas.terminal import printable
from supernets.released import allowed_globals, read_released

OURS = ("space", "space_params", "supernet", "state_dict", "data")  # what `nas train-supernet` writes


def load_checkpoint(path: Path, family: str) -> tuple[str, dict[str, Any]]:
    """(sha256 of the file, its record: OURS' keys; a released file's also 'format' (its
    `ReleasedFormat`), its 'state_dict' in the file's own names). `family` is the run's space: a released file is
    read with that family's format first, and one of another family is named as such."""
    if not path.is_file():
        raise MissingDependencyError(f"supernet checkpoint not found at {path} (make one: nas train-supernet, "
                                     "or pass a released supernet: docs/released-supernets.md)")
    raw = path.read_bytes()
    obj = _load(raw, path)
    if isinstance(obj, Mapping) and ("space" in obj or "space_params" in obj):
        missing = [k for k in OURS if k not in obj]
        if missing:
            raise MissingDependencyError(f"supernet checkpoint {path} lacks '{missing[0]}' (not from nas train-supernet)")
        return hashlib.sha256(raw).hexdigest(), dict(obj)
    record = read_released(obj, family, str(path))
    if record is None:
        raise MissingDependencyError(f"supernet checkpoint {path} is neither from nas train-supernet nor a released "
                                     f"supernet: it holds no mapping of parameter names to tensors")
    return hashlib.sha256(raw).hexdigest(), record


def _load(raw: bytes, path: Path) -> Any:
    """The unpickled file, tensors only; a file that pickles another type is read again allowing
    the types released formats declare, and refused when it pickles anything else."""
    try:
        try:
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            allowed = allowed_globals()
            if not allowed:
                raise
            with torch.serialization.safe_globals(allowed):
                return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a damaged file
        refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        why = f": it pickles {printable(refused.group(1))}, which is not loaded" if refused else ""
        raise MissingDependencyError(f"supernet checkpoint {path} is unreadable ({type(err).__name__}{why})") from None

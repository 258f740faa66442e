"""Supernets the original projects released, read in their own file format and parameter names.

A format (`ReleasedFormat`, one module per family: `supernets/released/<family>.py`) recognises
a file by its parameter names, says which space settings and supernet settings its tensors fix,
and renames (re-lays) its tensors onto our supernet's `state_dict`. The checks are common and
strict, so a file that is not the run's supernet stops with one line naming the first tensor
that does not fit (in the file's own name) before anything is scored: exactly one format must
recognise it, it must be the run's space's family, every tensor of our supernet must be produced
with its shape and every tensor of the file must be used. Format modules are imported only when
needed: the run's family first, every family only to say what a file of another family is.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from nas.errors import ConfigError, MissingDependencyError
from nas.terminal import clipped, printable

if TYPE_CHECKING:
    from torch import Tensor

    from supernets.base import Supernet

# The counter BatchNorm keeps of its updates: torch fills it in when a file lacks it (files saved
# by torch < 0.4.1 do), so a released file may lack it; it never changes an output.
OPTIONAL_SUFFIX = "num_batches_tracked"


class ReleasedFormat(ABC):
    """One project's released supernet file: how to recognise it and rename it onto ours."""

    family: ClassVar[str]  # our space/supernet name: "ofa_mbv3", "spos", "autoformer"
    project: ClassVar[str]  # who released it, e.g. "Once-for-All (mit-han-lab/once-for-all)"
    data: ClassVar[dict[str, Any]] = {"name": "imagenet"}  # what it was trained on (the evaluator's default data)
    # Non-tensor types its files pickle besides containers and numbers (an `argparse.Namespace` of
    # training settings): allowed by torch.load(weights_only=True) for this format's files only.
    safe_globals: ClassVar[tuple[Any, ...]] = ()

    @abstractmethod
    def matches(self, tensors: Mapping[str, Tensor]) -> bool:
        """Whether the file is this format, by its parameter names (not shapes: a file of
        another width or size is this format, and the shape check names what differs)."""

    @abstractmethod
    def space_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        """The space settings the tensors fix (OFA's width_mult, the classes); what cannot be read
        from the file is left out (the tensor check then names what is missing)."""

    @abstractmethod
    def supernet_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        """Our supernet's constructor settings besides the space, e.g. {"num_classes": 1000}."""

    @abstractmethod
    def to_ours(self, tensors: Mapping[str, Tensor], supernet: Supernet) -> dict[str, tuple[str, Tensor]]:
        """Our state_dict name -> (the file's name it came from, the tensor in our layout). What
        the file lacks is left out (the common check names it); a tensor the file does not hold
        but its format implies (a BatchNorm without affine weights: ones and zeros) names a source
        that is not a file name."""

    def their_name(self, ours: str) -> str:
        """The file's name for our tensor `ours` (to name a missing one as the file would)."""
        return ours


_FORMATS: dict[str, type[ReleasedFormat]] = {}


def register(cls: type[ReleasedFormat]) -> type[ReleasedFormat]:
    """Class decorator: `cls` reads its family's released files."""
    if cls.family in _FORMATS:
        raise ValueError(f"released format for '{cls.family}' registered twice")
    _FORMATS[cls.family] = cls
    return cls


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def format_for(family: str) -> ReleasedFormat | None:
    """The released format of `family` (its module imported on first use), None if it has none."""
    if family not in _FORMATS and family in _modules():
        importlib.import_module(f"{__name__}.{family}")
    cls = _FORMATS.get(family)
    return cls() if cls is not None else None


def all_formats() -> list[ReleasedFormat]:
    """Every family's format (imports every format module)."""
    for name in _modules():
        format_for(name)
    return [_FORMATS[f]() for f in sorted(_FORMATS)]


def allowed_globals() -> list[Any]:
    """The non-tensor types any format's files may pickle (imports every format module)."""
    return [g for fmt in all_formats() for g in fmt.safe_globals]


def quoted(name: str) -> str:
    """A tensor name from a file, safe to print: control characters escaped, clipped."""
    return f"'{clipped(printable(name), 120)}'"


def unwrap(obj: Any) -> dict[str, Tensor] | None:
    """The tensors of a loaded file: `obj` itself, or its 'state_dict' / 'model' entry (how the
    projects save), less a DataParallel 'module.' prefix on every name; None if it holds no
    mapping of names to tensors."""
    import torch  # lazy: loads torch (start-up time)

    for key in ("state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not obj:
        return None
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        return None
    tensors = dict(obj)
    if all(k.startswith("module.") for k in tensors):
        tensors = {k.removeprefix("module."): v for k, v in tensors.items()}
    return tensors


def detect(tensors: Mapping[str, Tensor], family: str, where: str) -> ReleasedFormat:
    """The format of the file at `where`, which must be `family`'s; one line otherwise."""
    own = format_for(family)
    if own is not None and own.matches(tensors):
        return own
    found = [fmt for fmt in all_formats() if fmt.matches(tensors)]
    first = quoted(next(iter(tensors)))
    if len(found) > 1:
        names = ", ".join(f"{f.family} ({f.project})" for f in found)
        raise MissingDependencyError(f"supernet checkpoint {where}: its names (first {first}) fit several released "
                                     f"formats: {names}")
    if found:
        other = found[0]
        raise ConfigError(f"supernet checkpoint {where} is a released {other.family} supernet ({other.project}; "
                          f"first tensor {first}), the run's space is {family} (use space={other.family})")
    known = ", ".join(f"{f.family} ({f.project})" for f in all_formats()) or "none"
    raise MissingDependencyError(f"supernet checkpoint {where} is neither from nas train-supernet nor a released "
                                 f"supernet nasflow reads ({known}): its first tensor is {first}")


def convert(fmt: ReleasedFormat, tensors: Mapping[str, Tensor], supernet: Supernet,
            space_params: Mapping[str, Any], where: str) -> dict[str, Tensor]:
    """Our supernet's full state_dict from the file's `tensors`, checked: the first tensor of the
    file (in its order) that is unused or of another shape, else the first of ours the file does
    not produce, stops it in one line; `space_params` (the run's space's) are compared with the
    file's so that line says which setting differs."""
    ours = supernet.state_dict()
    produced = fmt.to_ours(tensors, supernet)
    differs = {k: v for k, v in fmt.space_params(tensors).items() if k in space_params and space_params[k] != v}
    hint = "; ".join(f"the file's {k} is {v!r}, the run's space's {space_params[k]!r}" for k, v in differs.items())
    hint = f" ({hint})" if hint else ""
    source = {src: name for name, (src, _) in produced.items() if name in ours}
    for name, tensor in tensors.items():
        mine = source.get(name)
        if mine is None:
            raise ConfigError(f"supernet checkpoint {where}: tensor {quoted(name)} has no place in the run's "
                              f"{supernet.name} supernet{hint}")
        got, want = tuple(produced[mine][1].shape), tuple(ours[mine].shape)
        if got != want:
            raise ConfigError(f"supernet checkpoint {where}: tensor {quoted(name)} has shape {list(tensor.shape)}, "
                              f"the run's {supernet.name} supernet needs {list(want)} there ({mine}){hint}")
    state = {}
    for name, tensor in ours.items():
        if name in produced:
            state[name] = produced[name][1]
        elif name.endswith(OPTIONAL_SUFFIX):
            state[name] = tensor  # absent from the file: torch's own default (see OPTIONAL_SUFFIX)
        else:
            raise ConfigError(f"supernet checkpoint {where}: lacks tensor {quoted(fmt.their_name(name))} that the "
                              f"run's {supernet.name} supernet needs{hint}")
    if differs:  # tensors fit, settings do not (none of the tensors shows them): still not the run's space
        raise ConfigError(f"supernet checkpoint {where} does not fit the run's {supernet.name} space{hint}")
    return state


def read_released(obj: Any, family: str, where: str) -> dict[str, Any] | None:
    """A loaded file as the evaluator's checkpoint record (the format and its tensors in the
    file's names, the settings they fix), or None when it is no mapping of tensors."""
    tensors = unwrap(obj)
    if tensors is None:
        return None
    fmt = detect(tensors, family, where)
    return {"space": fmt.family, "space_params": fmt.space_params(tensors), "supernet": fmt.supernet_params(tensors),
            "state_dict": tensors, "data": dict(fmt.data), "format": fmt}

"""The supernet protocol: one weight-sharing network per categorical space,
from which any architecture of the space runs (`set_active`) or is copied out
as a standalone network (`extract`). Training (`supernets/train.py`) and
subnet scoring (`supernets/evaluator.py`) use only this protocol."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Generic, TypeVar

from torch import nn

from nas.core.arch import Architecture
from nas.core.registry import Registry
from nas.core.space import CategoricalSpace

A = TypeVar("A", bound=Architecture)
S = TypeVar("S", bound=CategoricalSpace)


class Supernet(nn.Module, ABC, Generic[A, S]):
    """Generic in its space's architecture and space types: each family's supernet takes only its own."""

    name: str  # set by the registry: the name of the space it serves
    space: S

    # How training samples subnets: "uniform" (AutoFormer; SPOS's own), "fair" (NB201: FairNAS's
    # every-choice-once steps), "sandwich" (OFA: largest, smallest and random subnets each step, shrinking
    # stages in order), "droppath" (SPOS: several choices averaged, fewer as training goes, then single
    # paths); supernets/train.py says what each does.
    default_sampling: ClassVar[str] = "uniform"
    # Whether `set_mixed` can average several choices of a decision (sampling "droppath"): only where each
    # choice is its own module with the decision's output shape (NB201's ops, SPOS's units).
    mixes: ClassVar[bool] = False
    # Progressive shrinking (OFA): decision groups released in order, by the part of a decision's
    # name before "[" (e.g. ("ks",), ("d",), ("e",)); decisions not yet released stay at their largest.
    phases: ClassVar[tuple[tuple[str, ...], ...]] = ()

    def __init__(self, space: S, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        self.space = space
        self.num_classes = num_classes
        self.in_channels = in_channels

    @abstractmethod
    def set_active(self, arch: A) -> None:
        """Route `forward` through the subnet `arch` until the next call."""

    def set_mixed(self, values: Sequence[Sequence[Any]]) -> None:
        """Route `forward` through the mean of the outputs of `values[i]`'s choices at decision i
        (drop-path training, Bender et al. 2018) until the next `set_active`; for `mixes` supernets."""
        raise NotImplementedError(f"supernet '{self.name}' does not average choices")

    @abstractmethod
    def extract(self, arch: A) -> nn.Module:
        """A standalone network holding copies of the subnet's weights; in eval
        mode it gives the same outputs as this supernet after `set_active(arch)`."""

    def largest(self) -> A:
        """The biggest subnet (sandwich rule); choices are listed small to large by default."""
        return self.space.from_values([d.choices[-1] for d in self.space.decisions()])

    def smallest(self) -> A:
        return self.space.from_values([d.choices[0] for d in self.space.decisions()])

    def input_size(self, arch: A) -> int | None:
        """The input resolution `arch` runs at: the space's (`SearchSpace.input_size`)."""
        return self.space.input_size(arch)

    def config(self) -> dict[str, Any]:
        """Constructor settings besides the space, stored in checkpoints to rebuild the network."""
        return {"num_classes": self.num_classes, "in_channels": self.in_channels}


# A family's supernet is `supernets/<family>.py`, registered under the space's name and
# imported on first use (entry points `nasflow.supernets`): naming one supernet loads no other family (nor `ofa` for the others).
SUPERNETS: Registry[Supernet] = Registry("supernet", "nasflow.supernets")

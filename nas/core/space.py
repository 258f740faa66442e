"""Archai-style search-space API: what strategies may ask of any space."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from nas.core.arch import Architecture
from nas.core.registry import Registry


@dataclass(frozen=True)
class Cost:
    """What an architecture costs, known without evaluating it (cheap constraints)."""

    params: int
    flops: int


class SearchSpace(ABC):
    name: str  # set by the registry
    # Open-ended spaces (block files, model source) have a base design but no
    # random moves: their moves come from LLM design strategies.
    open_ended: ClassVar[bool] = False

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Architecture:
        """A uniformly random architecture."""

    @abstractmethod
    def mutate(self, arch: Architecture, rng: np.random.Generator) -> Architecture:
        """A random neighbour that differs from `arch` in one decision."""

    @abstractmethod
    def decode(self, encoding: Any) -> Architecture:
        """Encoding → architecture; raises `EncodingError` on malformed input."""

    def size(self) -> int | None:
        """Number of distinct architectures, when finite and known."""
        return None

    def cost(self, arch: Architecture) -> Cost | None:
        """Params and FLOPs of `arch` at the space's input size; None when unknown
        (then FLOPs/params constraints cannot be checked before evaluation)."""
        return None

    def describe(self) -> str:
        """The space and its encoding format in words, for LLM prompts."""
        return f"search space '{self.name}'"


@dataclass(frozen=True)
class Decision:
    """One categorical choice of a space: its name (as prompts and errors say it) and legal values."""

    name: str
    choices: tuple[Any, ...]


class CategoricalSpace(SearchSpace):
    """A space whose architectures are one value per decision (NB201's edges,
    OFA's r/d/ks/e, SPOS's 20 blocks, AutoFormer's per-layer choices).
    Sampling, mutation, REINFORCE's policy and the LLM's grammar all work on
    `decisions()`; a space with inactive decisions (OFA's depth) makes them
    canonical in `from_values` so equal networks get equal keys."""

    @abstractmethod
    def decisions(self) -> list[Decision]:
        """Every decision, in a fixed order."""

    @abstractmethod
    def from_values(self, values: list[Any]) -> Architecture:
        """One value per decision → architecture; `EncodingError` names the bad decision."""

    @abstractmethod
    def to_values(self, arch: Architecture) -> list[Any]:
        """Inverse of `from_values`."""

    def from_indices(self, indices: list[int]) -> Architecture:
        return self.from_values([d.choices[i] for d, i in zip(self.decisions(), indices, strict=True)])

    def to_indices(self, arch: Architecture) -> list[int]:
        return [d.choices.index(v) for d, v in zip(self.decisions(), self.to_values(arch), strict=True)]

    def sample(self, rng: np.random.Generator) -> Architecture:
        return self.from_values([d.choices[int(rng.integers(len(d.choices)))] for d in self.decisions()])

    def mutate(self, arch: Architecture, rng: np.random.Generator, attempts: int = 100) -> Architecture:
        """Change one decision; decisions that leave the network unchanged (inactive ones) are redrawn."""
        decisions, values = self.decisions(), self.to_values(arch)
        for _ in range(attempts):
            i = int(rng.integers(len(decisions)))
            others = [c for c in decisions[i].choices if c != values[i]]
            if not others:
                continue
            child = self.from_values([*values[:i], others[int(rng.integers(len(others)))], *values[i + 1:]])
            if child != arch:
                return child
        return self.sample(rng)

    def size(self) -> int | None:
        return math.prod(len(d.choices) for d in self.decisions())


SPACES: Registry[SearchSpace] = Registry("space", modules={
    "nb201": "nas.spaces.nb201.space", "nader": "nas.spaces.open_ended", "source": "nas.spaces.open_ended",
    "spos": "nas.spaces.spos.space", "autoformer": "nas.spaces.autoformer.space", "ofa_mbv3": "nas.spaces.ofa_mbv3.space",
})

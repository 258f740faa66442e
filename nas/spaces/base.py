"""Archai-style search-space API: what strategies may ask of any space."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from nas.arch.base import Architecture
from nas.registry import Registry


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


SPACES: Registry[SearchSpace] = Registry("space")

"""Architecture representations behind one protocol (see `base.Architecture`)."""

from nas.arch.base import Architecture, stable_hash
from nas.arch.nb201 import NB201Cell

__all__ = ["Architecture", "NB201Cell", "stable_hash"]

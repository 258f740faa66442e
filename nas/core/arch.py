"""The representation protocol every architecture implements.

A representation is a value object: `key()` is a canonical hash (equal for
equivalent architectures), `encode()` gives a JSON-serialisable encoding that
`decode()` turns back into an equal object. Networks are the space's
business (`SearchSpace.build`), so a representation stays torch-free.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar


def stable_hash(*parts: Any, length: int = 16) -> str:
    """Short SHA-256 of a canonical JSON rendering: stable across processes."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:length]


class Architecture(ABC):
    space: ClassVar[str]

    @abstractmethod
    def canonical(self) -> str:
        """Canonical text form; two architectures are equal iff these are."""

    def key(self) -> str:
        return stable_hash(self.space, self.canonical())

    @abstractmethod
    def encode(self) -> Any:
        """JSON-serialisable encoding (what history.jsonl and strategies store)."""

    @classmethod
    @abstractmethod
    def decode(cls, data: Any) -> "Architecture":
        """Inverse of `encode`; raises `EncodingError` naming the bad part."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Architecture) and self.space == other.space and (
            self.canonical() == other.canonical()
        )

    def __hash__(self) -> int:
        return hash((self.space, self.canonical()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.canonical()!r})"


class SeenIndex:
    """Architectures seen so far: O(1) by key, exact by canonical form, each
    with an optional label of where it was seen ("node 4"), which a duplicate's
    message prints.

    A 16-hex key can in principle collide; a hit is confirmed by comparing
    the canonical forms, so two different architectures never merge. An entry
    added by key alone (`add_key`: an index rebuilt from a strategy's state that
    holds only keys) matches by key.
    """

    def __init__(self) -> None:
        self._forms: dict[str, dict[str | None, str | None]] = {}  # key -> canonical form (None: key only) -> where

    def __len__(self) -> int:
        return sum(len(v) for v in self._forms.values())

    def __contains__(self, item: Architecture | str) -> bool:
        """An architecture: an equal one was seen; a key: anything with that key was."""
        if isinstance(item, str):
            return item in self._forms
        return item.canonical() in self._forms.get(item.key(), ())

    def add(self, arch: Architecture, where: str | None = None) -> bool:
        """Record `arch`; False if an equal architecture was already there."""
        return self.add_form(arch.key(), arch.canonical(), where)

    def add_form(self, key: str, form: str | None, where: str | None = None) -> bool:
        """Record a (key, canonical form) pair, e.g. read back from a history file; False if there."""
        forms = self._forms.setdefault(key, {})
        if form in forms:
            return False
        forms[form] = where
        return True

    def add_key(self, key: str, where: str | None = None) -> bool:
        """Record a key alone; False if the key was already there (its first `where` is kept)."""
        return False if key in self._forms else self.add_form(key, None, where)

    def where(self, item: Architecture | str) -> str | None:
        """Where `item` (an architecture, or a key: its first entry) was first seen; None if unlabelled or unseen."""
        if isinstance(item, str):
            return next(iter(self._forms.get(item, {}).values()), None)
        return self._forms.get(item.key(), {}).get(item.canonical())

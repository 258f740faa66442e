"""Design ideas and their attribute-tree tags: what the Reader extracts, the
stores hold and the design agents sample from."""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

GRANULARITIES = ("operation", "block", "network")
TARGETS = ("performance", "efficiency")
IDEA_MAX_WORDS = 50

_NS = uuid.UUID("6f1c2d4e-8a1b-4c55-9d0e-5a7b3c2e1f00")


def normalise(text: str) -> str:
    """Lower case, single spaces, no trailing punctuation: identical ideas get one id."""
    return re.sub(r"\s+", " ", text).strip().strip(".;,").lower()


@dataclass(frozen=True)
class Tag:
    """One leaf of the attribute tree; `sub` is "" for a main category without sub-categories."""

    target: str
    granularity: str
    main: str
    sub: str = ""

    def path(self) -> str:
        return " / ".join(p for p in (self.target, self.granularity, self.main, self.sub) if p)


@dataclass
class Idea:
    text: str
    tag: Tag | None = None
    source: str = ""          # "builtin", "nader", a file path, ...
    paper_id: str = ""
    paper_title: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        """A UUID (Qdrant point ids must be UUIDs or ints) derived from the normalised text."""
        return str(uuid.uuid5(_NS, normalise(self.text)))

    def vector_text(self) -> str:
        """What is embedded: the text plus its tag's words, so a query naming a
        category ("channel attention") finds ideas that only describe it."""
        if self.tag is None:
            return self.text
        return f"{self.text} ({self.tag.main}: {self.tag.sub})" if self.tag.sub else f"{self.text} ({self.tag.main})"

    def payload(self) -> dict[str, Any]:
        tag = self.tag
        return {
            "text": self.text, "source": self.source, "paper_id": self.paper_id,
            "paper_title": self.paper_title, "extra": self.extra,
            "target": tag.target if tag else "", "granularity": tag.granularity if tag else "",
            "main": tag.main if tag else "", "sub": tag.sub if tag else "",
        }

    @classmethod
    def from_payload(cls, p: dict[str, Any]) -> Idea:
        tag = Tag(p["target"], p["granularity"], p["main"], p.get("sub", "")) if p.get("main") else None
        return cls(text=p["text"], tag=tag, source=p.get("source", ""), paper_id=p.get("paper_id", ""),
                   paper_title=p.get("paper_title", ""), extra=dict(p.get("extra") or {}))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        return d

"""Tagging ideas with attribute-tree leaves: by embedding similarity to the
leaves' descriptions (fast, deterministic), or by the LLM choosing among the
embedding's nearest leaves (grammar-constrained to those, so the reply is
always a valid tag; a 135M model cannot pick from all 56 leaves at once, and
falls back to the embedding's choice when its reply is unusable)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from nas.knowledge.idea import Tag
from nas.knowledge.tree import AttributeTree
from nas.llm.gbnf import gbnf_choice
from nas.llm.prompts import load_prompt


class Tagger(Protocol):
    name: str

    def tag(self, texts: list[str]) -> list[Tag]: ...


def leaf_string(tag: Tag) -> str:
    return "*".join([tag.target, tag.granularity, tag.main, tag.sub])


class EmbeddingTagger:
    name = "embed"

    def __init__(self, tree: AttributeTree, embedder) -> None:
        self.tree = tree
        self.embedder = embedder
        self._leaves = tree.tags()
        self._matrix: np.ndarray | None = None

    def tag(self, texts: list[str]) -> list[Tag]:
        return [c[0] for c in self.candidates(texts, 1)]

    def candidates(self, texts: list[str], k: int) -> list[list[Tag]]:
        """The k nearest leaves per text, best first."""
        if not texts:
            return []
        order = np.argsort(-self._similarities(texts), axis=1, kind="stable")[:, :k]
        return [[self._leaves[int(j)] for j in row] for row in order]

    def relevance(self, text: str) -> float:
        """Cosine to the nearest leaf: a cheap screen for off-topic abstracts."""
        return float(self._similarities([text]).max())

    def _similarities(self, texts: list[str]) -> np.ndarray:
        if self._matrix is None:
            self._matrix = self.embedder.encode([self.tree.describe(t) for t in self._leaves])
        return self.embedder.encode(texts) @ self._matrix.T


@dataclass
class TagStats:
    llm: int = 0
    fallback: int = 0
    errors: list[str] = field(default_factory=list)


def choice(tag: Tag) -> str:
    return f"{tag.main}*{tag.sub}" if tag.sub else tag.main


class LLMTagger:
    """One constrained call per idea over the embedding's `k` nearest leaves."""

    name = "llm"

    def __init__(self, tree: AttributeTree, client, fallback: EmbeddingTagger, k: int = 5) -> None:
        self.tree = tree
        self.client = client
        self.fallback = fallback
        self.k = k
        self.prompt = load_prompt("tagger")
        self.stats = TagStats()

    def tag(self, texts: list[str]) -> list[Tag]:
        out = []
        for text, options in zip(texts, self.fallback.candidates(texts, self.k)):
            by_choice = {choice(t): t for t in options}
            grammar = "root ::= " + gbnf_choice(by_choice) + "\n"
            listing = "\n".join(f"- {c}" for c in by_choice)

            def parse(reply, by_choice=by_choice) -> Tag:
                line = reply.text.strip().splitlines()[0].strip() if reply.text.strip() else ""
                if line not in by_choice:
                    raise ValueError(f"reply {line[:60]!r} is not one of the {len(by_choice)} candidates")
                return by_choice[line]

            answer = self.client.ask("tagger", self.prompt, {"idea": text, "candidates": listing}, parse,
                                     grammar=grammar)
            if answer.ok:
                self.stats.llm += 1
            else:
                self.stats.fallback += 1
                self.stats.errors.append(answer.errors[-1] if answer.errors else "no reply")
            out.append(answer.value if answer.ok else options[0])
        return out

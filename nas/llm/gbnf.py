"""GBNF building blocks (llama.cpp grammars) shared by every agent's grammar."""

from __future__ import annotations

from collections.abc import Iterable


def gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def gbnf_choice(options: Iterable[str]) -> str:
    """Alternatives of literal strings, in the given order."""
    return " | ".join(gbnf_literal(o) for o in options)

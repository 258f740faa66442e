"""Nested settings as flat dotted keys ('evaluator.data.root'), the names in which a run dir's
refusal (`nas.search.rundir`) and `nas compare` say where two configs differ."""

from __future__ import annotations

from typing import Any


def flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """'prefix.key.subkey' → value for each leaf (a value that is not a dict; an empty dict has none)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return out

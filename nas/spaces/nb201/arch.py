"""The NAS-Bench-201 cell: a 4-node DAG with one op on each of its 6 edges.

String form (NB201's own): `|op~0|+|op~0|op~1|+|op~0|op~1|op~2|`, one group
per node 1..3 listing the op on the edge from each earlier node. The topology
is fixed and has no automorphism, so the string is already canonical.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from nas.core.arch import Architecture
from nas.errors import EncodingError

OPS: tuple[str, ...] = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3")
# Edges in NB201 string order: node 1 ← 0; node 2 ← 0, 1; node 3 ← 0, 1, 2.
EDGES: tuple[tuple[int, int], ...] = ((0, 1), (0, 2), (1, 2), (0, 3), (1, 3), (2, 3))

# analog-nasbench stores a cell as a 6-tuple of op codes over edges
# (0→1, 0→2, 0→3, 1→2, 1→3, 2→3) with codes 0=skip 1=none 2=conv3x3 3=conv1x1 4=avgpool.
ANB_EDGES: tuple[tuple[int, int], ...] = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))
ANB_CODES: tuple[str, ...] = ("skip_connect", "none", "nor_conv_3x3", "nor_conv_1x1", "avg_pool_3x3")


@dataclass(frozen=True, eq=False)
class NB201Cell(Architecture):
    ops: tuple[str, ...]  # one op per edge, in EDGES order

    space: ClassVar[str] = "nb201"

    def __post_init__(self) -> None:
        if len(self.ops) != len(EDGES):
            raise EncodingError(f"NB201 cell needs {len(EDGES)} edge ops, got {len(self.ops)}")
        for (src, dst), op in zip(EDGES, self.ops):
            if op not in OPS:
                raise EncodingError(
                    f"NB201 edge {src}->{dst}: unknown op '{op}' (valid: {', '.join(OPS)})"
                )

    # --- canonical form -------------------------------------------------
    def canonical(self) -> str:
        return self.to_string()

    def to_string(self) -> str:
        groups, i = [], 0
        for node in (1, 2, 3):
            groups.append("|" + "|".join(f"{self.ops[i + s]}~{s}" for s in range(node)) + "|")
            i += node
        return "+".join(groups)

    @classmethod
    def from_string(cls, text: str) -> "NB201Cell":
        if not isinstance(text, str):
            raise EncodingError(f"NB201 cell must be a string, got {type(text).__name__}")
        groups = text.strip().split("+")
        if len(groups) != 3:
            raise EncodingError(f"NB201 cell '{text}': expected 3 node groups joined by '+', got {len(groups)}")
        ops: list[str] = []
        for node, group in enumerate(groups, start=1):
            if not (group.startswith("|") and group.endswith("|")):
                raise EncodingError(f"NB201 cell '{text}': node {node} group '{group}' must be wrapped in '|'")
            items = group[1:-1].split("|")
            if len(items) != node:
                raise EncodingError(
                    f"NB201 cell '{text}': node {node} needs {node} incoming edge(s), got {len(items)}"
                )
            for expected_src, item in enumerate(items):
                op, sep, src = item.partition("~")
                if not sep or src != str(expected_src):
                    raise EncodingError(
                        f"NB201 cell '{text}': node {node} edge '{item}' must be 'op~{expected_src}'"
                    )
                ops.append(op)
        return cls(tuple(ops))

    # --- encodings ------------------------------------------------------
    def encode(self) -> str:
        return self.to_string()

    @classmethod
    def decode(cls, data: Any) -> "NB201Cell":
        return cls.from_string(data)

    def to_anb_tuple(self) -> tuple[int, ...]:
        by_edge = dict(zip(EDGES, self.ops))
        return tuple(ANB_CODES.index(by_edge[e]) for e in ANB_EDGES)

    @classmethod
    def from_anb_tuple(cls, codes: tuple[int, ...]) -> "NB201Cell":
        codes = tuple(codes)
        if len(codes) != 6 or any(not isinstance(c, int) or not 0 <= c < len(ANB_CODES) for c in codes):
            raise EncodingError(f"analog-nasbench tuple {codes!r}: expected 6 codes in 0..4")
        by_edge = {e: ANB_CODES[c] for e, c in zip(ANB_EDGES, codes)}
        return cls(tuple(by_edge[e] for e in EDGES))

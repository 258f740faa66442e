"""Canonical, isomorphism-aware text and key of a block DAG.

Two blocks get the same `canonical_form` exactly when they are isomorphic as
labelled directed graphs: node numbering, the order of node lines and the
order of edge lines do not matter, except that the order of the incoming edges
of an op in `ORDERED_OPS` is part of the graph.  Section names are ignored.

The labelling is computed as in nauty: colour refinement to an equitable
ordered partition, then an individualisation-refinement search tree over the
remaining tie cells whose leaves (discrete partitions) each give a
certificate; the smallest certificate wins.  Automorphisms found when two
leaves give equal certificates prune the tree, which keeps k identical
parallel branches at O(k) leaves instead of k!.  Hashing schemes alone (WL,
Merkle) are not exact, hence the search.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import Callable, NamedTuple

from nas.errors import EncodingError
from nas.spaces.nader.dag.parse import Block, Node

ORDERED_OPS: frozenset[str] = frozenset({"concat", "Concat", "Multiply"})
"""Multi-input ops whose result depends on input order: `concat`/`Concat`
(channel order) and `Multiply` (matmul A@B).  Their inputs are ordered by the
order of their incoming edges in `Block.edges`; every other op (`Add`, `Mul`,
...) is treated as commutative in its inputs."""

Normaliser = Callable[[str], str]
"""Maps an argument's token string to a canonical spelling (e.g. ``4*C`` -> ``C*4``)."""


def _identity(value: str) -> str:
    return value


def _label(node: Node, normalise: Normaliser) -> str:
    """Op with positional args in order and keyword args sorted, so dict order is irrelevant."""
    positional = sorted((k for k in node.args if k.isdigit()), key=int)
    keyword = sorted(k for k in node.args if not k.isdigit())
    parts = [normalise(node.args[k]) for k in positional]
    parts += [f"{k}={normalise(node.args[k])}" for k in keyword]
    return f"{node.op}({','.join(parts)})" if parts else node.op


@dataclass(frozen=True)
class _Graph:
    """A block as integers: vertices 0..n-1, edges (src, dst, pos).

    ``pos`` is the input position for a destination in `ORDERED_OPS` and 0
    otherwise, so it only distinguishes what the op itself distinguishes.
    """

    labels: tuple[str, ...]
    edges: tuple[tuple[int, int, int], ...]
    ins: tuple[tuple[tuple[int, int], ...], ...]
    outs: tuple[tuple[tuple[int, int], ...], ...]


def _graph(block: Block, normalise: Normaliser) -> _Graph:
    vertex = {index: i for i, index in enumerate(block.nodes)}
    nodes = list(block.nodes.values())
    seen: Counter[str] = Counter()
    edges: list[tuple[int, int, int]] = []
    for i, (a, b) in enumerate(block.edges):
        for end in (a, b):
            if end not in vertex:
                raise EncodingError(
                    f"{block.source}:{block.edge_line(i)}: block '{block.name}': "
                    f"edge {a}->{b}: node {end} is not defined"
                )
        pos = seen[b] if block.nodes[b].op in ORDERED_OPS else 0
        seen[b] += 1
        edges.append((vertex[a], vertex[b], pos))
    ins: list[list[tuple[int, int]]] = [[] for _ in nodes]
    outs: list[list[tuple[int, int]]] = [[] for _ in nodes]
    for src, dst, pos in edges:
        ins[dst].append((src, pos))
        outs[src].append((dst, pos))
    return _Graph(
        labels=tuple(_label(node, normalise) for node in nodes),
        edges=tuple(edges),
        ins=tuple(map(tuple, ins)),
        outs=tuple(map(tuple, outs)),
    )


def _dense_ranks(keys: list) -> list[int]:
    """Rank of each key among the distinct keys: an ordered partition as colours 0..k-1."""
    rank = {key: r for r, key in enumerate(sorted(set(keys)))}
    return [rank[key] for key in keys]


def _refine(g: _Graph, colours: list[int]) -> list[int]:
    """Split cells by in/out-neighbour colour multisets until stable (equitable partition).

    A vertex's new key starts with its old colour, so cells only split and
    keep their relative order; everything is computed from colours, never
    from vertex numbers, which makes the result isomorphism-invariant.
    """
    n = len(colours)
    cells = max(colours, default=-1) + 1
    while cells < n:
        sizes = Counter(colours)
        keys: list[tuple] = []
        for v, c in enumerate(colours):
            if sizes[c] == 1:
                keys.append((c,))
            else:
                ins = tuple(sorted([(colours[u], p) for u, p in g.ins[v]]))
                outs = tuple(sorted([(colours[w], p) for w, p in g.outs[v]]))
                keys.append((c, ins, outs))
        refined = _dense_ranks(keys)
        new_cells = max(refined) + 1
        if new_cells == cells:
            break
        colours, cells = refined, new_cells
    return colours


def _individualise(colours: list[int], v: int) -> list[int]:
    """Give `v` its own cell just before the rest of its old cell (colours stay dense)."""
    cv = colours[v]
    return [c + 1 if c > cv or (c == cv and u != v) else c for u, c in enumerate(colours)]


def _target_cell(colours: list[int]) -> list[int]:
    """Vertices of the first (lowest colour) non-singleton cell; empty when discrete."""
    sizes = Counter(colours)
    tied = [c for c, size in sizes.items() if size > 1]
    if not tied:
        return []
    first = min(tied)
    return [v for v, c in enumerate(colours) if c == first]


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


class _Leaf(NamedTuple):
    cert: tuple[tuple[int, int, int], ...]
    colours: list[int]  # discrete: vertex -> canonical position
    path: tuple[int, ...]  # individualised vertices from the root


class _Search:
    """Individualisation-refinement tree with automorphism pruning (nauty-style)."""

    def __init__(self, g: _Graph) -> None:
        self.g = g
        self.autos: list[list[int]] = []
        self.first: _Leaf | None = None
        self.best: _Leaf | None = None
        self.leaves = 0

    def run(self) -> _Leaf:
        self._explore(_dense_ranks(list(self.g.labels)), ())
        assert self.best is not None
        return self.best

    def _explore(self, colours: list[int], path: tuple[int, ...]) -> int | None:
        """Search below `path`; returns the depth to unwind to after an automorphism, else None."""
        colours = _refine(self.g, colours)
        cell = _target_cell(colours)
        if not cell:
            return self._leaf(colours, path)
        explored: list[int] = []
        orbit: list[int] = []
        n_autos = -1
        for v in cell:
            if explored:
                if n_autos != len(self.autos):
                    n_autos = len(self.autos)
                    orbit = self._orbits(path)
                if orbit[v] in {orbit[u] for u in explored}:
                    continue
            explored.append(v)
            jump = self._explore(_individualise(colours, v), path + (v,))
            if jump is not None and jump < len(path):
                return jump
        return None

    def _leaf(self, colours: list[int], path: tuple[int, ...]) -> int | None:
        """Compare with the first and best leaves; an equal certificate yields an automorphism.

        The automorphism maps the earlier leaf's path onto this one and fixes
        their common prefix, so the branch of this leaf below that prefix is
        an image of an explored branch: unwind to the prefix.
        """
        self.leaves += 1
        cert = tuple(sorted((colours[b], p, colours[a]) for a, b, p in self.g.edges))
        leaf = _Leaf(cert, colours, path)
        if self.first is None or self.best is None:
            self.first = self.best = leaf
            return None
        for other in (self.first, self.best):
            if cert == other.cert:
                at = [0] * len(colours)
                for v, c in enumerate(colours):
                    at[c] = v
                self.autos.append([at[c] for c in other.colours])
                return _common_prefix(other.path, path)
        if cert < self.best.cert:
            self.best = leaf
        return None

    def _orbits(self, path: tuple[int, ...]) -> list[int]:
        """Orbit representative of each vertex under found automorphisms fixing `path` pointwise."""
        parent = list(range(len(self.g.labels)))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for perm in self.autos:
            if all(perm[p] == p for p in path):
                for x, y in enumerate(perm):
                    rx, ry = find(x), find(y)
                    if rx != ry:
                        parent[max(rx, ry)] = min(rx, ry)
        return [find(x) for x in range(len(parent))]


def canonical_form(
    block: Block,
    *,
    normalise: Normaliser | None = None,
    stats: dict[str, int] | None = None,
) -> str:
    """Block body renumbered canonically: equal strings iff the blocks are isomorphic.

    Lines are ``i:label`` for i = 0..n-1, then ``a->b`` edges sorted by
    (target, input position, source), so that prepending a ``##name##``
    header gives a parseable block with the same canonical form.
    `normalise` rewrites argument values first (e.g. to identify ``4*C`` and
    ``C*4``); `stats`, when given, receives the search's ``leaves`` and
    ``automorphisms`` counts.
    """
    g = _graph(block, normalise or _identity)
    search = _Search(g)
    best = search.run()
    if stats is not None:
        stats["leaves"] = search.leaves
        stats["automorphisms"] = len(search.autos)
    order = sorted(range(len(g.labels)), key=best.colours.__getitem__)
    lines = [f"{i}:{g.labels[v]}" for i, v in enumerate(order)]
    lines += [f"{a}->{b}" for b, _, a in best.cert]
    return "\n".join(lines)


def block_key(block: Block, *, normalise: Normaliser | None = None) -> str:
    """16-hex SHA-256 of `canonical_form`: a short id shared by isomorphic blocks."""
    return hashlib.sha256(canonical_form(block, normalise=normalise).encode("utf-8")).hexdigest()[:16]


def relabel(block: Block, mapping: dict[str, str]) -> Block:
    """Copy of `block` with node indices renamed by `mapping` (missing ones kept)."""
    renamed = {index: mapping.get(index, index) for index in block.nodes}
    if len(set(renamed.values())) != len(renamed):
        raise EncodingError(f"block '{block.name}': relabel maps two nodes to the same index")
    nodes = {
        renamed[index]: Node(renamed[index], node.op, dict(node.args), node.line)
        for index, node in block.nodes.items()
    }
    edges = [(renamed.get(a, a), renamed.get(b, b)) for a, b in block.edges]
    return Block(block.name, nodes, edges, block.line, block.source, list(block.edge_lines))

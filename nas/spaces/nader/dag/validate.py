"""Structural validation of a parsed block (no shape inference)."""

from __future__ import annotations

from dataclasses import replace

from nas.errors import EncodingError
from nas.spaces.nader.dag.ops import OPS as OP_SPECS
from nas.spaces.nader.dag.parse import IO_OPS, Block

OPS = frozenset(OP_SPECS)


def _fail(block: Block, line: int, msg: str) -> EncodingError:
    return EncodingError(f"{block.source}:{line}: block '{block.name}': {msg}")


def _reach(starts: list[str], adj: dict[str, list[str]]) -> set[str]:
    seen = set(starts)
    todo = list(starts)
    while todo:
        for nxt in adj.get(todo.pop(), []):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def without_dead_nodes(block: Block) -> tuple[Block, list[str]]:
    """The block without the operations whose results reach no output, and their indices.

    Why: a dead node cannot change what the block computes, so dropping it keeps
    the function its author wrote; the most common flaw of a small model's
    drafts is a tail of such nodes ("does not reach output"). Nodes keep their
    indices and source lines, so later errors still point into the draft. A
    block without exactly one output is returned as it is, for validation to
    name."""
    outputs = [k for k, n in block.nodes.items() if n.op == "output"]
    if len(outputs) != 1:
        return block, []
    pred: dict[str, list[str]] = {}
    for a, b in block.edges:
        pred.setdefault(b, []).append(a)
    live = _reach(outputs, pred)
    dead = [k for k, n in block.nodes.items() if k not in live and not n.is_io]
    if not dead:
        return block, []
    kept = [i for i, (a, b) in enumerate(block.edges) if a not in dead and b not in dead]
    return _with_edges(block, kept, nodes={k: n for k, n in block.nodes.items() if k not in dead}), dead


def without_repeated_edges(block: Block) -> tuple[Block, list[str]]:
    """The block with each edge once (its first line), and the repeats as "a->b".

    Why: the language refuses an edge listed twice, so reading the edges as a set changes
    no block it accepts; a small model enumerating a concat's inputs often lists one twice
    (4 of 26 Modifier tries in one `make run`), and the rest of such a draft deserves a check."""
    seen: set[tuple[str, str]] = set()
    kept, repeated = [], []
    for i, edge in enumerate(block.edges):
        if edge in seen:
            repeated.append(f"{edge[0]}->{edge[1]}")
        else:
            seen.add(edge)
            kept.append(i)
    return (_with_edges(block, kept), repeated) if repeated else (block, [])


def _with_edges(block: Block, kept: list[int], **changes) -> Block:
    """The block with only the edges at indices `kept`, each keeping its source line."""
    return replace(block, edges=[block.edges[i] for i in kept], edge_lines=[block.edge_line(i) for i in kept],
                   **changes)


def validate_structure(block: Block) -> None:
    """Raise `EncodingError` naming the offending node/edge of a malformed block."""
    nodes = block.nodes

    for i, (a, b) in enumerate(block.edges):
        for end in (a, b):
            if end not in nodes:
                raise _fail(block, block.edge_line(i), f"edge {a}->{b}: node {end} is not defined")
    seen_edges: dict[tuple[str, str], int] = {}
    for i, edge in enumerate(block.edges):
        if edge in seen_edges:
            raise _fail(block, block.edge_line(i), f"edge {edge[0]}->{edge[1]} is listed twice")
        seen_edges[edge] = i

    for node in nodes.values():
        if not node.is_io and node.op not in OPS:
            raise _fail(block, node.line, f"node {node.index}: unknown op {node.op}")
        if node.is_io and node.args:
            raise _fail(block, node.line, f"node {node.index}: {node.op} takes no arguments")

    by_op: dict[str, list[str]] = {op: [] for op in IO_OPS}
    for node in nodes.values():
        if node.is_io:
            by_op[node.op].append(node.index)
    single, two = by_op["input"], by_op["input1"] + by_op["input2"]
    if single and two:
        raise _fail(block, block.line, "mixes 'input' with 'input1'/'input2' nodes")
    if two:
        for op in ("input1", "input2"):
            if len(by_op[op]) != 1:
                found = ", ".join(by_op[op]) or "none"
                raise _fail(block, block.line, f"needs exactly one {op} node (found {found})")
    elif len(single) != 1:
        found = ", ".join(single) or "none"
        raise _fail(block, block.line, f"needs exactly one input node (found {found})")
    if len(by_op["output"]) != 1:
        found = ", ".join(by_op["output"]) or "none"
        raise _fail(block, block.line, f"needs exactly one output node (found {found})")
    inputs = single + two
    output = by_op["output"][0]

    succ: dict[str, list[str]] = {k: [] for k in nodes}
    pred: dict[str, list[str]] = {k: [] for k in nodes}
    for a, b in block.edges:
        succ[a].append(b)
        pred[b].append(a)

    for idx in inputs:
        if pred[idx]:
            raise _fail(block, nodes[idx].line, f"node {idx}: {nodes[idx].op} has an incoming edge from node {pred[idx][0]}")
    if succ[output]:
        raise _fail(block, nodes[output].line, f"node {output}: output has an outgoing edge to node {succ[output][0]}")
    if not pred[output]:
        raise _fail(block, nodes[output].line, f"node {output}: output has no incoming edge")
    if len(pred[output]) > 1:
        srcs = ", ".join(pred[output])
        raise _fail(block, nodes[output].line, f"node {output}: output must have exactly one incoming edge (has {srcs})")

    # Cycle detection (iterative DFS, node-definition order for determinism).
    state = {k: 0 for k in nodes}  # 0 new, 1 on stack, 2 done
    for root in nodes:
        if state[root]:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path = [root]
        state[root] = 1
        while stack:
            cur, i = stack[-1]
            if i < len(succ[cur]):
                stack[-1] = (cur, i + 1)
                nxt = succ[cur][i]
                if state[nxt] == 1:
                    cycle = path[path.index(nxt):] + [nxt]
                    raise _fail(block, nodes[nxt].line, f"node {nxt}: on a cycle {'->'.join(cycle)}")
                if state[nxt] == 0:
                    state[nxt] = 1
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                state[cur] = 2
                stack.pop()
                path.pop()

    forward = _reach(inputs, succ)
    for node in nodes.values():
        if node.index not in forward:
            raise _fail(block, node.line, f"node {node.index}: unreachable from input")
    backward = _reach([output], pred)
    for node in nodes.values():
        if node.index not in backward:
            raise _fail(block, node.line, f"node {node.index}: does not reach output")

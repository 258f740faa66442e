"""Shape inference over a block in topological order.

Every node's output shape is computed from its inputs' shapes and its
arguments (evaluated by the safe evaluator at a `Position`: the concrete
B, C, dim, H, W where the block sits in a network).  The first problem stops
the block with an error that names the node and says what is wrong; the
same pass totals parameters and FLOPs (fvcore's conventions) so budget
checks need no torch model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nas.errors import EncodingError
from nas.spaces.nader.dag.ops import OPS, Bound, Dim, OpError, OpSpec, Shape, show, show_values
from nas.spaces.nader.dag.parse import Block
from nas.spaces.nader.dag.validate import validate_structure

ROLES = ("base", "stem", "downsample")


@dataclass(frozen=True)
class Position:
    """Where a block sits: input channels C, output channels dim, input H x W."""

    C: int
    dim: int
    H: int
    W: int
    B: int = 2  # >1 so a batch-collapsing reshape cannot hide
    exact: bool = True  # see `nas.spaces.nader.dag.expr.eval_int`

    def env(self) -> dict[str, int]:
        return {"B": self.B, "C": self.C, "dim": self.dim, "H": self.H, "W": self.W}

    def __str__(self) -> str:
        return f"C={self.C}, dim={self.dim}, H={self.H}, W={self.W}"


@dataclass
class NodeInfo:
    spec: OpSpec | None  # None for input/output markers
    bound: Bound | None
    inputs: list[str]  # predecessor indices in edge-line order (matters for concat, Multiply)
    shape: Shape


@dataclass
class Analysis:
    block: Block
    position: Position
    role: str
    order: list[str]
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    params: int = 0
    flops: int = 0  # per sample

    @property
    def inputs(self) -> list[str]:
        ins = [i for i in self.order if self.block.nodes[i].op.startswith("input")]
        return sorted(ins, key=lambda i: self.block.nodes[i].op)

    @property
    def output(self) -> str:
        return next(i for i in self.order if self.block.nodes[i].op == "output")

    @property
    def out_shape(self) -> Shape:
        return self.nodes[self.output].shape


def topological_order(block: Block) -> list[str]:
    """Kahn's algorithm; ties broken by node-definition order so it is deterministic."""
    rank = {idx: i for i, idx in enumerate(block.nodes)}
    indeg = {idx: 0 for idx in block.nodes}
    succ: dict[str, list[str]] = {idx: [] for idx in block.nodes}
    for a, b in block.edges:
        succ[a].append(b)
        indeg[b] += 1
    ready = sorted((i for i, d in indeg.items() if d == 0), key=rank.__getitem__)
    order: list[str] = []
    while ready:
        cur = ready.pop(0)
        order.append(cur)
        for nxt in succ[cur]:
            indeg[nxt] -= 1
            if indeg[nxt] == 0:
                ready.append(nxt)
        ready.sort(key=rank.__getitem__)
    return order


def input_shape(pos: Position) -> Shape:
    return (Dim(pos.B, "B"), Dim(pos.C, "C"), Dim(pos.H, "H"), Dim(pos.W, "W"))


def _expected(role: str, pos: Position, out: Shape) -> str | None:
    """Why the block's output shape is wrong for its role, or None."""
    if len(out) != 4:
        return f"output shape {show(out)} is not 4-d (B, dim, H', W')"
    b, c, h, w = (d.value for d in out)
    if b != pos.B or c != pos.dim:
        want = "(B, dim, H, W)" if role == "base" else "(B, dim, H', W')"
        return f"output shape {show(out)} = {show_values(out)} must be {want} with dim = {pos.dim}"
    if role == "base" and (h, w) != (pos.H, pos.W):
        return (
            f"output shape {show(out)} = {show_values(out)} must keep the input size (B, dim, H, W) = "
            f"({pos.B}, {pos.dim}, {pos.H}, {pos.W}); use stride 1 and padding in this block"
        )
    if role == "downsample" and (h not in (pos.H // 2, (pos.H + 1) // 2) or w not in (pos.W // 2, (pos.W + 1) // 2)):
        return (
            f"output shape {show(out)} = {show_values(out)} must halve the input size "
            f"to (B, dim, H/2, W/2) = ({pos.B}, {pos.dim}, {pos.H // 2}, {pos.W // 2})"
        )
    return None


def analyse(block: Block, pos: Position, role: str = "base") -> Analysis:
    """Validate `block` at `pos` (structure, arguments, shapes) and total its cost.

    Raises `EncodingError`: ``file:line: block 'X': node 8: <what is wrong>``.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, not {role!r}")
    validate_structure(block)
    env = pos.env()
    order = topological_order(block)
    preds: dict[str, list[str]] = {idx: [] for idx in block.nodes}
    for a, b in block.edges:
        preds[b].append(a)
    result = Analysis(block=block, position=pos, role=role, order=order)

    def fail(idx: str, msg: str) -> EncodingError:
        node = block.nodes[idx]
        return EncodingError(f"{block.source}:{node.line}: block '{block.name}': node {idx}: {msg} [at {pos}]")

    for idx in order:
        node = block.nodes[idx]
        ins = preds[idx]
        if node.op.startswith("input"):
            result.nodes[idx] = NodeInfo(None, None, [], input_shape(pos))
            continue
        if node.op == "output":
            out = result.nodes[ins[0]].shape
            result.nodes[idx] = NodeInfo(None, None, ins, out)
            problem = _expected(role, pos, out)
            if problem:
                raise fail(idx, problem)
            continue
        spec = OPS[node.op]
        n = len(ins)
        if n < spec.min_inputs or (spec.max_inputs is not None and n > spec.max_inputs):
            if spec.max_inputs == spec.min_inputs:
                want = "one input" if spec.min_inputs == 1 else f"exactly {spec.min_inputs} inputs"
            else:
                want = f"at least {spec.min_inputs} inputs"
            frm = f" (from node{'s' if n > 1 else ''} {', '.join(ins)})" if ins else ""
            raise fail(idx, f"{node.op} takes {want}, has {n}{frm}")
        shapes = [result.nodes[i].shape for i in ins]
        try:
            bound = spec.bind(node.args, env, pos.exact)
            shape = spec.infer(bound, shapes)
        except OpError as exc:
            raise fail(idx, str(exc)) from None
        if any(d.value < 1 for d in shape):
            raise fail(idx, f"{node.op} gives an empty shape {show(shape)} = {show_values(shape)}")
        result.nodes[idx] = NodeInfo(spec, bound, ins, shape)
        params, flops = spec.cost(bound, shapes, shape)
        result.params += params
        result.flops += flops
    result.flops //= pos.B
    return result

"""A census of covert channels: whatever argument of whatever allowed operator a graph routes a
table through, the trusted side counts at least the table's information (`GraphNet.carried`).

For every operator a graph may call (each overload of `aten_ops.ALLOWED` the parser takes) and each
of its arguments that takes an integer, a float, a bool, a list or shape, a string, a dtype-like
tag or a tensor, a generated graph routes a 4,096-value table through that argument: integers as
63-bit words, floats with 52 chosen mantissa bits, tensors as which of 256 values a reference
reads. What the route adds to the count (its graph's bits over the same graph without the route)
must be at least the table's bits. A table through a scalar argument takes a node a value, and the
dry run's cost bound refuses 4,096 nodes as a whole: it is counted in two graphs of half the table,
so no channel is closed only by a refusal that a smaller table would slip past. The full census (every overload) is slow;
its fast twin takes each operator's first overload and a 512-value table.

Then hypothesis composes runnable routes: a table held in int64 literals, in the shapes of
zero-element tensors built in the graph or sent as parameters, in a buffer's bytes read through a
dtype view, in pad/crop amounts that pick values out of a range, or in which reference a node
reads, carried through chains of a second operator (aliases, copies, casts, arithmetic) to the
output. Each graph's output is the table (the route is real), and the count grows by at least its
bits. Derandomised and bounded, as tests/test_fuzz_boundary.py is.
"""

from __future__ import annotations

import gc
import math
import random
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nas.sandbox.aten_ops import ALLOWED, allowed
from nas.sandbox.graph import (
    _DTYPES,
    _FORMATS,
    _OPERATORS,
    FORMAT,
    MAX_EINSUM_OPERANDS,
    OP_BITS,
    Artifact,
    GraphError,
    GraphNet,
    _Program,
    _resolve,
    float_bits,
    int_bits,
)

TABLE = 4096
FAST_TABLE = 512
LEVELS = 256  # the values a tensor route's references choose among: 8 bits a reference
PER_LIST = 16  # table values per list argument (a list route's node)
# Bits of one table value, by route kind (what the generator draws each value from)
INFO = {"int": 63, "float": 52, "bool": 1, "ints": 63, "floats": 52, "bools": 1, "tensor": 8, "tensors": 8,
        "str": 6 * 16, "dtype": math.log2(len(_DTYPES)), "memory_format": math.log2(len(_FORMATS))}
_KINDS = {"Tensor": "tensor", "Optional[Tensor]": "tensor", "List[Tensor]": "tensors",
          "List[Optional[Tensor]]": "tensors", "int": "int", "Optional[int]": "int", "number": "int",
          "Optional[number]": "int", "float": "float", "Optional[float]": "float", "bool": "bool",
          "Optional[bool]": "bool", "List[int]": "ints", "Optional[List[int]]": "ints", "List[float]": "floats",
          "Optional[List[float]]": "floats", "List[bool]": "bools", "str": "str", "Optional[str]": "str"}
_SYMBOLS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"  # 64: 6 bits a character
_LISTED = frozenset({"ints", "floats", "bools", "tensors"})  # kinds a node takes PER_LIST values of


@dataclass(frozen=True)
class Route:
    """A table through argument `arg` (its place in the schema) of operator `op`, of kind `kind`."""

    op: str
    arg: int
    name: str
    kind: str

    def __str__(self) -> str:
        return f"{self.op}({self.name}: {self.kind})"


def _kind(argument: torch._C.Argument) -> str | None:
    """The route kind of a schema argument (a dtype or memory format, typed as an int in the schema,
    takes a tag; a layout has one value, so carries nothing), or None for one a graph cannot spell."""
    if argument.name in ("dtype", "memory_format", "layout") and str(argument.type) in ("int", "Optional[int]"):
        return None if argument.name == "layout" else argument.name
    return _KINDS.get(str(argument.type))


def routes(first_only: bool) -> list[Route]:
    """Every routable argument of every allowed overload the parser takes (`first_only`: of each
    operator's first such overload with one)."""
    out = []
    for op in sorted(ALLOWED):
        for name in (op, f"{op}_"):
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            taken = 0
            for overload in sorted(packet.overloads()):
                if not allowed(name, overload) or (first_only and taken):
                    continue
                try:
                    _resolve(f"aten.{name}.{overload}")
                except GraphError:
                    continue
                arguments = getattr(packet, overload)._schema.arguments
                found = [Route(f"aten.{name}.{overload}", i, a.name, kind) for i, a in enumerate(arguments)
                         if (kind := _kind(a)) is not None]
                taken += bool(found)
                out += found
    return out


def _default(argument: torch._C.Argument) -> object:
    """A plain value for an argument the route does not go through."""
    kind = _kind(argument)
    if kind in ("tensor", "tensors"):
        return {"ref": 0} if kind == "tensor" else [{"ref": 0}]
    return {"int": 1, "float": 1.0, "bool": False, "ints": [1], "floats": [1.0], "bools": [False], "str": "mean",
            "dtype": {"dtype": "float32"}, "memory_format": {"memory_format": "contiguous_format"}}.get(kind or "")


def _values(kind: str, rng: random.Random, count: int) -> list[object]:
    """`count` values of the table as a route of `kind` spells them."""
    draw = {"int": lambda: rng.getrandbits(63), "float": lambda: 1 + rng.getrandbits(52) / 2**52,
            "bool": lambda: bool(rng.getrandbits(1)), "tensor": lambda: {"ref": 1 + rng.randrange(LEVELS)},
            "str": lambda: "".join(rng.choice(_SYMBOLS) for _ in range(16)),
            "dtype": lambda: {"dtype": rng.choice(sorted(_DTYPES))},
            "memory_format": lambda: {"memory_format": rng.choice(sorted(_FORMATS))}}
    scalar = {"ints": "int", "floats": "float", "bools": "bool", "tensors": "tensor"}.get(kind, kind)
    return [draw[scalar]() for _ in range(count)]


# The LEVELS nodes every graph begins with (made once: the parser only reads a graph)
_LEVELS = [{"op": "aten.add.Tensor", "args": [{"ref": 0}, j], "kwargs": {"map": {}}} for j in range(LEVELS)]


def _program(nodes: list[dict]) -> dict:
    """A graph of the user input, LEVELS values made from it (the values a tensor route reads), then `nodes`."""
    return {"inputs": [{"kind": "USER_INPUT", "target": None}], "nodes": _LEVELS + nodes,
            "outputs": [{"ref": LEVELS + len(nodes)}]}


def route_graph(route: Route, rng: random.Random, table: int = TABLE) -> tuple[dict, float]:
    """The graph routing a `table`-value table through `route`, and the table's bits."""
    packet, overload = route.op.split(".")[1:]
    arguments = getattr(getattr(torch.ops.aten, packet), overload)._schema.arguments
    listed = route.kind in _LISTED
    per_node = min(PER_LIST, MAX_EINSUM_OPERANDS) if listed else 1
    args = [_default(a) for a in arguments if not a.kwarg_only]
    kwargs = {a.name: _default(a) for a in arguments if a.kwarg_only}
    keyword, at = arguments[route.arg].kwarg_only, sum(not a.kwarg_only for a in arguments[:route.arg])
    values = _values(route.kind, rng, table)
    nodes = []
    for start in range(0, table, per_node):
        value = values[start:start + per_node] if listed else values[start]
        if keyword:
            nodes.append({"op": route.op, "args": args, "kwargs": {"map": {**kwargs, route.name: value}}})
        else:
            nodes.append({"op": route.op, "args": [*args[:at], value, *args[at + 1:]], "kwargs": {"map": kwargs}})
    return _program(nodes), table * INFO[route.kind]


BASELINE = _Program(_program([])).bits


def spelled(route: Route, table: int = TABLE, part: int = 0) -> tuple[int, float]:
    """(what the route adds to the count, the table's bits; `part`: which part of a table given in
    parts); raises GraphError if the parser refuses it."""
    graph, info = route_graph(route, random.Random(f"{route} {part}"), table)
    return _Program(graph).bits - BASELINE, info


def _census(first_only: bool, table: int) -> None:
    """Each route's table is counted at least at its bits. A table through a list argument takes one
    graph; one through a scalar argument takes a node a value, and the dry run's cost bound refuses
    a graph of 4,096 nodes as a whole (`test_a_table_a_node_a_value_is_refused_whole`), so it is
    counted in two graphs of half the table each: no route is closed only by a refusal that a
    smaller table would slip past."""
    undercounted = []
    # Python's cycle collector off while the graphs are built and parsed: they hold no cycles (freed
    # as they go), and its passes over their millions of objects took half the census's time
    collecting = gc.isenabled()
    gc.disable()
    try:
        for route in routes(first_only):
            parts = 1 if route.kind in _LISTED or table < TABLE else 2
            counted = [spelled(route, table // parts, part) for part in range(parts)]
            added, info = sum(c[0] for c in counted), sum(c[1] for c in counted)
            if added < info:
                undercounted.append(f"{route}: {added:,} bits counted for a {info:,.0f}-bit table")
    finally:
        if collecting:
            gc.enable()
    assert not undercounted, "\n".join(undercounted[:20])


def _parses(op: str) -> bool:
    try:
        _resolve(op)
    except GraphError:
        return False
    return True


def test_the_census_covers_every_allowed_operator_and_argument_kind() -> None:
    """The census is not vacuous: every allowed operator with an overload the parser takes has a
    route (an argument a table can go through), and every kind of argument appears."""
    fast = routes(first_only=True)
    parsed = {op for op in ALLOWED for name in (op, f"{op}_") if (packet := getattr(torch.ops.aten, name, None))
              and any(allowed(name, ov) and _parses(f"aten.{name}.{ov}") for ov in packet.overloads())}
    assert {r.op.split(".")[1].removesuffix("_") for r in fast} >= parsed and len(parsed) > 300
    every = routes(first_only=False)
    assert {r.kind for r in every} == set(INFO) and len(every) > len(fast)


def test_the_counting_rule_is_as_documented() -> None:
    """An integer is a sign and its magnitude's binary digits; a float the shortest decimal that reads
    back as it (digits and exponent); each node's operator fits OP_BITS, whichever it is."""
    assert [int_bits(n) for n in (0, 3, -1, 255, (1 << 63) - 1, -(1 << 63))] == [1, 3, 2, 9, 64, 65]
    assert [float_bits(x) for x in (0.1, 1e-05, 0.0, float("nan"))] == [4, 6, 2, 2]
    assert float_bits(1 + 12345 / 2**52) >= 52  # a float carrying chosen mantissa bits counts them
    overloads = sum(allowed(name, ov) for op in ALLOWED for name in (op, f"{op}_")
                    if (packet := getattr(torch.ops.aten, name, None)) for ov in packet.overloads())
    assert overloads + len(_OPERATORS) <= 1 << OP_BITS


def test_census_each_operator() -> None:
    """Fast twin of the census: each allowed operator's first overload, every argument of it, a
    table of FAST_TABLE values (what a route adds grows with each value: the measure is the same)."""
    _census(first_only=True, table=FAST_TABLE)


def test_census_every_overload() -> None:
    """The census: every allowed overload, every argument of each, a 4,096-value table."""
    _census(first_only=False, table=TABLE)


def test_a_table_a_node_a_value_is_refused_whole() -> None:
    """4,096 nodes of one operator (a table through a scalar argument, a value a node) cost a dry run
    over the bound: refused as a whole, before anything runs."""
    with pytest.raises(GraphError, match="dry run would cost over"):
        spelled(Route("aten.mul.Tensor", 1, "other", "tensor"))


def test_a_table_through_an_argument_is_seen_whatever_the_operator_and_a_count_of_one_is_not_enough() -> None:
    """The census's measure is sharp: an int64 literal counted as one value (or not at all), a list
    counted by its length, a reference counted as free, would each fall short of the table."""
    route = Route("aten.constant_pad_nd.default", 1, "pad", "ints")
    graph, info = route_graph(route, random.Random(0))
    nodes = graph["nodes"][LEVELS:]
    literals = sum(len(n["args"][1]) for n in nodes)
    assert literals == TABLE and info == TABLE * 63
    added, _ = spelled(route)
    assert added >= info > 32 * literals  # 32 bits a literal (a float32's worth) would undercount it
    refs = Route("aten.cat.default", 0, "tensors", "tensors")
    added, info = spelled(refs)
    assert added >= info == TABLE * 8


# --- composed routes that run ---------------------------------------------------------------

WIDE = 40  # bits of a table value where the channel carries any integer (literals, shapes, bytes)
_X = {"ref": 0}


def _node(op: str, *args: object, **kwargs: object) -> dict:
    return {"op": op, "args": list(args), "kwargs": {"map": kwargs}}


@dataclass
class Built:
    """A runnable graph whose output is its table (int64; negated by an odd number of `neg`s: `sign`),
    with the tensors it reads as inputs (all declared before its first node)."""

    nodes: list[dict]
    inputs: list[dict]
    weights: dict[str, torch.Tensor]
    out: int = 0
    sign: int = 1

    def add(self, node: dict) -> int:
        self.nodes.append(node)
        return len(self.inputs) + len(self.nodes) - 1

    def artifact(self) -> Artifact:
        program = {"inputs": self.inputs, "nodes": self.nodes, "outputs": [{"ref": self.out}]}
        graph = {"format": FORMAT, "input_shape": [3, 4, 4], "train": program, "eval": program}
        return Artifact(graph, {"init": dict(self.weights), "const": {}})


def _source(kind: str, table: list[int], built: Built) -> list[int]:
    """Refs to tensors holding the table's values in order (one a value, or one for all), spelled the `kind` way."""
    a = "aten."
    if kind == "literal":  # int64 literals, one word a value
        return [built.add(_node(a + "scalar_tensor.default", v, dtype={"dtype": "int64"})) for v in table]
    if kind in ("shape", "empty_input"):  # zero-element tensors' shapes, read back by reference
        for k, v in enumerate(table if kind == "empty_input" else []):  # sent as parameters: inputs first
            built.inputs.append({"kind": "PARAMETER", "target": f"empty{k}"})
            built.weights[f"empty{k}"] = torch.zeros(0, v)
        refs = []
        for k, v in enumerate(table):
            empty = (built.add(_node(a + "zeros.default", [0, v], dtype={"dtype": "float32"})) if kind == "shape"
                     else k + 1)
            size = built.add(_node(a + "sym_size.int", {"ref": empty}, 1))
            refs.append(built.add(_node(a + "scalar_tensor.default", {"ref": size}, dtype={"dtype": "int64"})))
        return refs
    if kind == "view":  # bytes packed 8 to an int64 buffer's element, read through a dtype view
        built.inputs.append({"kind": "BUFFER", "target": "packed"})
        built.weights["packed"] = torch.tensor(table, dtype=torch.uint8).view(torch.int64).clone()
        return [built.add(_node(a + "view.dtype", {"ref": len(built.inputs) - 1}, {"dtype": "uint8"}))]
    span = 1 << _SOURCES[kind]
    levels = built.add(_node(a + "arange.default", span, dtype={"dtype": "int64"}))
    if kind == "pad":  # pad/crop amounts pick one value out of a range
        return [built.add(_node(a + "constant_pad_nd.default", {"ref": levels}, [-v, v + 1 - span])) for v in table]
    # "refs": which of the range's values a reference reads
    values = built.add(_node(a + "unbind.int", {"ref": levels}))
    picked = [built.add(_node("operator.getitem", {"ref": values}, j)) for j in range(span)]
    return [built.add(_node(a + "reshape.default", {"ref": picked[v]}, [1])) for v in table]


_CARRIERS = {
    "alias": lambda r: _node("aten.alias.default", {"ref": r}),
    "clone": lambda r: _node("aten.clone.default", {"ref": r}),
    "float64": lambda r: _node("aten._to_copy.default", {"ref": r}, dtype={"dtype": "float64"}),
    "int64": lambda r: _node("aten._to_copy.default", {"ref": r}, dtype={"dtype": "int64"}),
    "neg": lambda r: _node("aten.neg.default", {"ref": r}),
}


def composed(source: str, chain: list[str], table: list[int]) -> Built:
    built = Built(nodes=[], inputs=[{"kind": "USER_INPUT", "target": None}], weights={})
    refs = _source(source, table, built)
    for carrier in chain:  # a second operator, or a chain of references, between the table and the output
        refs = [built.add(_CARRIERS[carrier](r)) for r in refs]
    flat = [built.add(_node("aten.reshape.default", {"ref": r}, [-1])) for r in refs]
    built.sign = -1 if chain.count("neg") % 2 else 1
    if not table:  # the composition's own nodes, without a table to join (what its table adds is over it)
        built.out = len(built.inputs) + len(built.nodes) - 1 if built.nodes else 0
        return built
    joined = built.add(_node("aten.cat.default", [{"ref": r} for r in flat]))
    built.out = built.add(_node("aten._to_copy.default", {"ref": joined}, dtype={"dtype": "int64"}))
    return built


_SOURCES = {"literal": WIDE, "shape": WIDE, "empty_input": WIDE, "view": 8, "pad": 8, "refs": 8}


@st.composite
def compositions(draw) -> tuple[str, list[str], list[int]]:
    source = draw(st.sampled_from(sorted(_SOURCES)))
    chain = draw(st.lists(st.sampled_from(sorted(_CARRIERS)), max_size=3))
    bits = _SOURCES[source]
    size = draw(st.sampled_from([16, 64]))
    seed = draw(st.integers(0, 2**16))
    rng = random.Random(seed)
    return source, chain, [rng.getrandbits(bits) for _ in range(size)]  # WIDE bits: exact through a float64


def _bits(built: Built) -> int:
    return sum(GraphNet(built.artifact()).carried().values())


@settings(max_examples=40, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(compositions())
def test_composed_routes_are_real_and_counted(case: tuple[str, list[str], list[int]]) -> None:
    """Each composed graph outputs its table (run for real), and carries at least the table's bits
    more than the same composition of an empty table."""
    source, chain, table = case
    built = composed(source, chain, table)
    net = GraphNet(built.artifact()).eval()
    out = net(torch.zeros(2, 3, 4, 4))
    assert out.tolist() == [built.sign * v for v in table], (source, chain)
    info = len(table) * _SOURCES[source]
    added = _bits(built) - _bits(composed(source, chain, []))
    assert added >= info, (source, chain, added, info)


def test_empty_tensors_count_their_shapes() -> None:
    """A zero-element parameter holds nothing but its shape: each counts its sizes' bits (here
    2**40 + k, 42 bits a size), whether the graph spells the shape or is sent it as an input."""
    table = [(1 << 40) + k for k in range(64)]
    sent = composed("empty_input", [], table)
    shapes = GraphNet(sent.artifact()).carried()["tensor shapes"]
    assert shapes >= 64 * int_bits(1 << 40) == 64 * 42
    empty = composed("empty_input", [], [])
    assert GraphNet(empty.artifact()).carried()["tensor shapes"] == 0

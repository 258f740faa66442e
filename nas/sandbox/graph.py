"""Trace, then train: untrusted model code leaves the sandbox as data, never as code.

The sandbox child builds the model and captures its forward with
`torch.export` (train mode and eval mode, batch size dynamic), then sends a
ZIP of plain data: the graphs as JSON (aten operator names and literal
arguments) and the initial weights as safetensors. `torch.export.save` is
not used because its loader unpickles. This process rebuilds a `GraphNet`
from that data, accepting only allowed aten operators (`aten_ops.py`; and a
few integer operators for symbolic sizes) and counting, as it parses, what the
network carries besides its input and trainable parameters, in bits
(`GraphNet.carried`), and what its dry run will cost (`MAX_COST`); runs it once
on the meta device to bound its memory and its work, then counts parameters
and FLOPs and trains it itself, from initial values it draws
(`GraphNet.reinitialise`): nothing the model's code says about itself is
believed, nor any value it chose.

What the graph fixes at capture time: Python control flow and random choices
in `forward` (e.g. a Python-level drop path) take the value they had then;
device arguments are replaced by the input's device when run.
"""

from __future__ import annotations

import decimal
import difflib
import enum
import functools
import hashlib
import io
import json
import math
import operator
import re
import struct
import zipfile
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from nas.measure import EXTRA_PARAMETERS
from nas.sandbox.aten_ops import MAX_PIECES, WorkCounter, allowed, pieces, zero_filled
from nas.terminal import printable

GRAPH_FILE = "graph.json"
FORMAT = 1
MAX_NODES = 50_000
_OPERATORS = {f"operator.{name}": getattr(operator, name) for name in (
    "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow", "eq", "ne", "lt", "le", "gt", "ge")}
# Python operators compute sizes here, on Python ints (unbounded: `2 ** 10**10` or a chain of squarings
# would take this process hours and gigabytes, `[0] * 10**10` too), so their operands are numbers within
# int64 range, as sizes are, and so is every result.
_SIZE_LIMIT = 1 << 63
# Bytes of graph JSON: it becomes Python objects here at ~20x its size (torchvision's largest models
# export to under 1 MB per mode).
MAX_GRAPH_BYTES = 32 << 20
# A forward pass may do at most this many operations (each operator's cost by its formula:
# `aten_ops.WorkCounter.total`) at the verification batch: this process runs the graph, and a
# graph of a few nodes can ask for hours of compute (a ResNet-50 at 224 px, batch 2: 8e9).
MAX_WORK = 5e10
# `padding`: conv*.padding's "same"/"valid" (torch refuses any other); `assert_msg`: _assert_scalar's.
# A string's bytes are counted as carried bits like any literal's.
_STR_OPTIONS = frozenset({"reduce", "reduction", "rounding_mode", "approximate", "padding_mode", "mode",
                          "interpolation_mode", "equation", "indexing", "side", "pad_mode", "padding_side",
                          "padding", "assert_msg"})
_OP_NAME = re.compile(r"aten\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
_KINDS = ("PARAMETER", "BUFFER", "CONSTANT_TENSOR", "USER_INPUT")
_DTYPES = {str(t).removeprefix("torch."): t for t in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}
_LAYOUTS = {"strided": torch.strided}
_FORMATS = {str(f).removeprefix("torch."): f for f in (
    torch.contiguous_format, torch.channels_last, torch.preserve_format)}


class GraphError(ValueError):
    """The exported graph is malformed, uses something not allowed, or does not run."""


# --- sandbox side: export to data -------------------------------------------

def export_graph(net: nn.Module, example: torch.Tensor) -> dict[str, Any]:
    """`net`'s forward in train and eval mode as JSON-able data (runs in the sandbox)."""
    batch = torch.export.Dim("batch", min=2)
    graphs, constants = {}, {}
    for mode in ("train", "eval"):
        net.train(mode == "train")
        program = torch.export.export(net, (example,), dynamic_shapes={"x": {0: batch}}, strict=False)
        graphs[mode] = _graph_data(program)
        constants.update({k: v for k, v in program.constants.items() if isinstance(v, torch.Tensor)})
    net.train()
    return {"format": FORMAT, "input_shape": list(example.shape[1:]), **graphs, "constants": constants}


def _graph_data(program: Any) -> dict[str, Any]:
    sig = program.graph_signature
    index: dict[str, int] = {}
    inputs = []
    for spec in sig.input_specs:
        kind = spec.kind.name
        if kind not in _KINDS:
            raise GraphError(f"unsupported graph input kind {kind}")
        index[spec.arg.name] = len(index)
        inputs.append({"kind": kind, "target": spec.target})
    if sum(i["kind"] == "USER_INPUT" for i in inputs) != 1:
        raise GraphError("forward must take exactly one tensor input")
    nodes, outputs = [], []
    for node in program.graph.nodes:
        if node.op == "call_function":
            index[node.name] = len(index)
            nodes.append({"op": _target_name(node.target), "args": _encode(node.args, index),
                          "kwargs": _encode(dict(node.kwargs), index)})
        elif node.op == "output":
            outputs = _encode(list(node.args[0]), index)
        elif node.op != "placeholder":
            raise GraphError(f"unsupported graph node kind {node.op}")
    kinds = [spec.kind.name for spec in sig.output_specs]
    if kinds != ["USER_OUTPUT"]:
        raise GraphError(f"forward must return one tensor and mutate only buffers in place (outputs: {kinds})")
    return {"inputs": inputs, "nodes": nodes, "outputs": outputs}


def _target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    name = f"operator.{getattr(target, '__name__', '?')}"
    if _OPERATORS.get(name) is target:
        return name
    raise GraphError(f"unsupported graph operation {target!r}")


def _encode(value: Any, index: dict[str, int]) -> Any:
    """Nodes become {"ref": position among inputs and nodes}; non-JSON literals get a tag."""
    if isinstance(value, torch.fx.Node):
        return {"ref": index[value.name]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_encode(v, index) for v in value]
    if isinstance(value, dict):
        return {"map": {str(k): _encode(v, index) for k, v in value.items()}}
    for tag, table in (("dtype", _DTYPES), ("layout", _LAYOUTS), ("memory_format", _FORMATS)):
        for name, obj in table.items():
            if value is obj:
                return {tag: name}
    if isinstance(value, torch.device):
        return {"device": "input"}
    raise GraphError(f"unsupported graph argument of type {type(value).__name__}")


def pack(graph: dict[str, Any], weights: dict[str, dict[str, torch.Tensor]]) -> bytes:
    """One ZIP (stored, not compressed): the graph JSON and one safetensors file per weight set."""
    from safetensors.torch import save  # lazy: loads safetensors (start-up time)

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(GRAPH_FILE, json.dumps(graph))
        for name, tensors in weights.items():
            zf.writestr(f"{name}.safetensors", save({k: v.detach().contiguous() for k, v in tensors.items()}))
    return buf.getvalue()


# --- trusted side: data back to a network -----------------------------------

@dataclass
class Artifact:
    """What a sandbox child exported: graph data and named weight sets
    (`init` for the checked instance, `seed<N>` for training, `const`)."""

    graph: dict[str, Any]
    weights: dict[str, dict[str, torch.Tensor]]


def unpack(data: bytes, max_bytes: int, sets: Collection[str] = ("init", "const")) -> Artifact:
    """Parse an artifact without executing anything from it, reading only the weight sets in
    `sets` (those the request asked for); raises `GraphError`. Nothing the child wrote is
    parsed before its size is bounded here: the ZIP's end record and directory (`_entries`),
    the graph JSON's size and nesting (`_json`), each safetensors header's size and tensor
    count against the graph's inputs (`_header`)."""
    from safetensors import SafetensorError  # lazy: loads safetensors (start-up time)
    from safetensors.torch import load  # lazy: loads safetensors (start-up time)

    names = _entries(data, {GRAPH_FILE, *(f"{s}.safetensors" for s in sets)}, max_bytes)
    if GRAPH_FILE not in names:
        raise GraphError(f"artifact has no {GRAPH_FILE}")
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        if zf.getinfo(GRAPH_FILE).file_size > MAX_GRAPH_BYTES:
            raise GraphError(f"artifact's graph is over {MAX_GRAPH_BYTES >> 20} MB")
        graph = _json(zf.read(GRAPH_FILE), "artifact's graph")
        if not isinstance(graph, dict) or graph.get("format") != FORMAT:
            raise GraphError("artifact has an unknown graph format")
        weights = {}
        for name in names:
            if name != GRAPH_FILE:
                body, weight_set = zf.read(name), name.removesuffix(".safetensors")
                _header(body, name, _inputs(graph.get("parent") if weight_set.startswith("parent") else graph))
                weights[weight_set] = load(body)
    except (zipfile.BadZipFile, SafetensorError, RuntimeError, OSError, EOFError) as err:
        raise GraphError(f"artifact is malformed ({type(err).__name__}: {printable(str(err))[:200]})") from None
    return Artifact(graph, weights)


# What `pack` writes, as ZIP's structures: the end of central directory record and a central
# directory entry (signature, then 2- and 4-byte fields, little-endian).
_END = struct.Struct("<4s4H2LH")
_ENTRY = struct.Struct("<4s6H3L5H2L")
_UTF8_NAME = 0x800  # the only flag `zipfile` sets on a stored entry (not for ASCII names, which these are)
# Nesting a JSON text may have: each level costs a stack frame in every walk over the value (the
# graph's deepest honest value, a node's list argument, is 8 levels down).
MAX_JSON_DEPTH = 32
# Bytes of a safetensors header per tensor it describes (a path, dtype, shape and offsets: ~100 bytes).
_HEADER_PER_TENSOR = 1024
_ESCAPED = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
# Each byte of a JSON text without its strings -> 1 + how it changes the nesting depth.
_STEPS = bytes(2 if b in b"[{" else 0 if b in b"]}" else 1 for b in range(256))


def _entries(data: bytes, expected: set[str], max_bytes: int) -> list[str]:
    """The artifact's entry names, read from its end record and central directory before
    `zipfile` sees the bytes (whose reader takes every entry a directory lists, however many):
    laid out as `pack` writes them (stored, no comment, no extra fields), at most one entry per
    name of `expected`, at most `max_bytes` in all."""
    if len(data) < _END.size:
        raise GraphError("artifact is malformed (shorter than a ZIP end record)")
    signature, disk, first, here, count, size, start, comment = _END.unpack_from(data, len(data) - _END.size)
    if signature != b"PK\x05\x06" or comment or disk or first or here != count:
        raise GraphError("artifact is malformed (no ZIP end record at its end, a comment, or several disks)")
    if count > len(expected):
        raise GraphError(f"artifact's ZIP directory lists {count:,} entries, over the {len(expected)} expected")
    if start + size != len(data) - _END.size:
        raise GraphError(f"artifact's ZIP directory ({size:,} bytes at {start:,}) does not end at its end record")
    names: list[str] = []
    total, at = 0, start
    for i in range(count):
        if at + _ENTRY.size > start + size:
            raise GraphError(f"artifact's ZIP directory ends inside entry {i}")
        (signature, _, _, flags, method, _, _, _, stored, file_size, name_size, extra, note, *_,
         offset) = _ENTRY.unpack_from(data, at)
        name = data[at + _ENTRY.size:at + _ENTRY.size + name_size].decode("ascii", "replace")
        at += _ENTRY.size + name_size + extra + note
        if signature != b"PK\x01\x02" or flags & ~_UTF8_NAME or extra or note or offset >= start:
            raise GraphError(f"artifact's ZIP directory entry {i} ({name[:60]!r}) is malformed")
        if method != zipfile.ZIP_STORED or stored != file_size:
            raise GraphError(f"artifact's entry {name[:60]!r} is compressed")
        if name not in expected:
            raise GraphError(f"artifact has unexpected files ({name[:60]!r}; expected {', '.join(sorted(expected))})")
        if name in names:
            raise GraphError(f"artifact's ZIP directory lists {name!r} twice")
        names.append(name)
        total += file_size
    if at != start + size:
        raise GraphError(f"artifact's ZIP directory holds {start + size - at:,} bytes more than its {count} entries")
    if total > max_bytes:
        raise GraphError(f"artifact is too large ({total:,} bytes, over {max_bytes:,})")
    return names


def _json(data: bytes, what: str) -> Any:
    """`data` as JSON, parsed once its nesting is known to be at most `MAX_JSON_DEPTH` levels:
    its strings dropped, the depth after each byte is a running sum (in chunks: linear time,
    a few MB whatever the size). Parsed as UTF-8 text, the bytes that were counted: given bytes,
    `json.loads` would also read UTF-16/32, whose NULs hide brackets from the count."""

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GraphError(f"{what} is not UTF-8 JSON ({err.reason} at byte {err.start})") from None
    steps = _STRING.sub(b"", _ESCAPED.sub(b"", data)).translate(_STEPS)
    depth = 0
    for start in range(0, len(steps), 1 << 20):
        levels = depth + np.cumsum(np.frombuffer(steps[start:start + (1 << 20)], np.int8) - 1, dtype=np.int64)
        if levels.max() > MAX_JSON_DEPTH:
            raise GraphError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels")
        depth = int(levels[-1])
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, an integer of over 4,300 digits
        raise GraphError(f"{what} is not JSON ({printable(str(err))[:200]})") from None


def _inputs(graph: Any) -> int:
    """The tensors a graph's two programs take, at most `MAX_NODES`: what any weight set of it holds at most."""
    programs = [graph.get(mode) for mode in ("train", "eval")] if isinstance(graph, dict) else []
    return min(MAX_NODES, sum(len(p["inputs"]) for p in programs
                              if isinstance(p, dict) and isinstance(p.get("inputs"), list)))


def _header(body: bytes, name: str, tensors: int) -> None:
    """Bound a safetensors file's header before `safetensors` parses it: its length, its nesting,
    and the tensors it describes, at most `tensors` (the graph's inputs)."""
    if len(body) < 8:
        raise GraphError(f"artifact's {name} is malformed (no header)")
    size, cap = int.from_bytes(body[:8], "little"), _HEADER_PER_TENSOR * (tensors + 1)
    if size > min(cap, len(body) - 8):
        bound = "its file's size" if size > len(body) - 8 else f"the {cap:,} a graph of {tensors:,} inputs needs"
        raise GraphError(f"artifact's {name} header claims {size:,} bytes, over {bound}")
    header = _json(body[8:8 + size], f"artifact's {name} header")
    if not isinstance(header, dict):
        raise GraphError(f"artifact's {name} header is malformed")
    if (count := len(header) - ("__metadata__" in header)) > tensors:
        raise GraphError(f"artifact's {name} holds {count:,} tensors, more than its graph's {tensors:,} inputs")


class _Program:
    """One mode's graph, resolved: allowed operators only, references checked."""

    def __init__(self, data: Any) -> None:
        if not isinstance(data, dict) or set(data) != {"inputs", "nodes", "outputs"}:
            raise GraphError("graph has the wrong fields")
        inputs, nodes = data["inputs"], data["nodes"]
        if not isinstance(inputs, list) or not isinstance(nodes, list) or max(len(inputs), len(nodes)) > MAX_NODES:
            raise GraphError(f"graph inputs/nodes malformed or over {MAX_NODES} inputs or nodes")
        self.inputs: list[tuple[str, str | None]] = []
        for spec in inputs:
            if (not isinstance(spec, dict) or spec.get("kind") not in _KINDS
                    or not (spec.get("target") is None or isinstance(spec.get("target"), str))):
                raise GraphError("graph input spec malformed")
            self.inputs.append((spec["kind"], spec["target"]))
        if [k for k, _ in self.inputs].count("USER_INPUT") != 1:
            raise GraphError("graph must take exactly one input")
        self.steps: list[tuple[Any, Any, Any]] = []
        self._seen = len(self.inputs)  # values defined so far: a reference must point below
        # What its nodes spell (`_Spelling`), in bits, and what a dry run of it costs (bounded here)
        self.bits = _INPUT_KIND_BITS * len(self.inputs)
        self.cost = len(self.inputs)
        last_input = -1
        for i, node in enumerate(nodes):
            if not isinstance(node, dict) or set(node) != {"op", "args", "kwargs"}:
                raise GraphError(f"graph node {i} malformed")
            fn = _resolve(node["op"])
            args, kwargs = self._decode(node["args"]), self._decode(node["kwargs"])
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise GraphError(f"graph node {i} ({node['op']}) has malformed arguments")
            spelled = _Spelling(self._seen, _argument_names(node["op"]), len(self.inputs), last_input)
            spelled.add(args)
            spelled.add_keywords(kwargs)
            last_input = spelled.last_input
            _bound_operands(i, node["op"], spelled)
            self.bits += OP_BITS + spelled.bits
            einsum = node["op"].startswith("aten.einsum.")
            self.cost += NODE_COST + spelled.operands + (EINSUM_OPERAND_COST - 1) * spelled.refs * einsum
            if self.cost > MAX_COST:
                raise GraphError(f"graph's dry run would cost over {MAX_COST:,} units (at node {i}, {node['op']}: "
                                 f"a node counts {NODE_COST}, an operand 1, an einsum's tensor {EINSUM_OPERAND_COST}),"
                                 " bounded before it runs")
            self.steps.append((fn, args, kwargs))
            self._seen += 1
        out = self._decode(data["outputs"])
        if not isinstance(out, list) or len(out) != 1 or not isinstance(out[0], _Ref):
            raise GraphError("graph must return exactly one tensor")
        self.output = out[0]
        self.bits += 1 + int_bits(self._seen - self.output.index - 1)
        self.names: list[str] = [node["op"] for node in nodes]
        self._nodes = nodes

    @functools.cached_property
    def ops(self) -> list[tuple[str, str]]:
        """(operator, its literal arguments as JSON) per node: what `compare` diffs (made when asked)."""
        return [(node["op"], json.dumps(_literal_args(node), sort_keys=True)) for node in self._nodes]

    def _decode(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._decode(v) for v in value]
        if isinstance(value, dict):
            if len(value) != 1:
                raise GraphError("graph argument malformed")
            (tag, v), = value.items()
            if tag == "ref":
                if type(v) is not int or not 0 <= v < self._seen:
                    raise GraphError(f"graph refers to value {printable(str(v))[:20]} before it is defined")
                return _Ref(v)
            if tag == "map" and isinstance(v, dict):
                return {str(k): self._decode(x) for k, x in v.items()}
            if tag == "device" and v == "input":
                return _DEVICE
            table = {"dtype": _DTYPES, "layout": _LAYOUTS, "memory_format": _FORMATS}.get(tag)
            if table is None or type(v) is not str or v not in table:  # a list or dict is no key (unhashable)
                raise GraphError(f"graph argument {printable(str(tag))[:40]}={str(v)[:40]!r} not allowed")
            return table[v]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise GraphError("graph argument malformed")

    def run(self, bound: list[Any], x: torch.Tensor, meter: _Meter | None = None) -> Any:
        """Execute on `bound` (one value per input spec, the user input as `_INPUT`);
        with `meter` (a dry run), measure each step as it goes (`_Meter.take`)."""
        values = [x if v is _INPUT else v for v in bound]

        def get(arg: Any) -> Any:
            if isinstance(arg, _Ref):
                return values[arg.index]
            if arg is _DEVICE:
                return x.device
            if isinstance(arg, list):
                return [get(a) for a in arg]
            if isinstance(arg, dict):
                return {k: get(v) for k, v in arg.items()}
            return arg

        for i, (fn, args, kwargs) in enumerate(self.steps):
            inputs = get(args), get(kwargs)
            if (count := pieces(fn, *inputs)) > MAX_PIECES:
                raise GraphError(f"graph node {i} ({fn}) would return {count:,} tensors, over the {MAX_PIECES:,} "
                                 "an operator may return")
            out = fn(*inputs[0], **inputs[1])
            if meter is not None:
                meter.take(fn, out, inputs)
            values.append(out)
        return values[self.output.index]


# What training an exported graph holds besides one forward's tensors, in copies of its parameters:
# their values, their gradients and an optimiser's two states (Adam's; SGD with momentum keeps one).
_PARAMETER_COPIES = 4


@dataclass
class _Meter:
    """What a dry run measures as a graph runs, besides its work (`WorkCounter`): `used`, the bytes
    of the tensors its operators make (a view no larger than its base, or an in-place operator's
    result, is its input's memory; an expanded view counts whole, as the operator reading it may
    copy it), refused past `budget` (`what` says for what)."""

    budget: int
    what: str
    used: int = 0

    @classmethod
    def training(cls, net: "GraphNet", batch: int, budget: int) -> "_Meter":
        """For the train graph: one training step of `batch` images within `budget` bytes: the
        forward's tensors twice (autograd keeps what the forward made, at most all of it, and the
        backward makes at most one gradient for each), after `_PARAMETER_COPIES` of the parameters."""
        weights = _PARAMETER_COPIES * sum(p.numel() * p.element_size() for p in net.parameters())
        if weights > budget:
            raise GraphError(f"graph's parameters need {weights >> 20} MB to train (values, gradients and "
                             f"optimiser state), over the trainer's {budget >> 20} MB")
        return cls((budget - weights) // 2, f"for the forward of a training step of {batch} images (twice that "
                   f"with the backward, beside {weights >> 20} MB for the parameters: over the trainer's {budget >> 20} MB)")

    def take(self, fn: Any, out: Any, inputs: Any) -> None:
        seen = {id(t) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor)}
        self.used += sum(t.numel() * t.element_size() for t in tree_leaves(out) if isinstance(t, torch.Tensor)
                         and id(t) not in seen and not (t._is_view() and t.numel() <= t._base.numel()))
        if self.used > self.budget:
            raise GraphError(f"graph needs over {self.budget >> 20} MB {self.what} (at {fn})")


# --- what a graph carries: its information, in bits ---------------------------------------------
#
# A network's output depends on its input, its trainable parameters (which training redraws:
# `GraphNet.reinitialise`) and everything else the model's code chose: every node of its graphs
# (which operator, which values it reads, each literal it spells: sizes, indices, pads, strides,
# numbers, strings, dtypes), the values of the buffers and constants it reads, and the shape and
# dtype of every tensor (an empty tensor holds nothing but its shape, and `sym_size` reads it
# back). All of it is counted by the bits it takes to write down, whatever operator it feeds
# (`_Spelling`, `GraphNet.carried`): no operator is trusted to take structure only.

OP_BITS = 10  # which operator a node calls: 900 allowed overloads, in-place forms and Python operators
TAG_BITS = 4  # a dtype, layout, memory format or device argument: one of at most 16
_INPUT_KIND_BITS = 2  # whether a graph input is the user input, a parameter, a buffer or a constant
# What the parser lets a dry run cost, counted before it runs, in units of one operand's dispatch
# (a reference or a literal, ~25 microseconds on the meta device): a node costs NODE_COST of them (its
# meta kernel, ~1.5 ms: torch's Python references), an einsum's tensor EINSUM_OPERAND_COST (its
# contraction step), a graph input one. A graph's cost is at most MAX_COST (its dry run, each graph
# at two batch sizes, then takes ~30 s), a node's operands at most MAX_NODE_OPERANDS, an einsum's
# tensors MAX_EINSUM_OPERANDS; the worker's clock for the dry run comes from the cost
# (`GraphNet.dry_run_seconds`).
NODE_COST = 64
EINSUM_OPERAND_COST = 32
MAX_COST = 1 << 18  # per graph: 4,000 nodes of a few operands (honest ones: under 40,000, 600 nodes)
MAX_NODE_OPERANDS = 4096  # per node: an honest `cat` lists tens of tensors, a view a few sizes
MAX_EINSUM_OPERANDS = 16  # tensors per einsum: honest ones take 2 or 3
MAX_STRING = 256  # characters of a string argument (an einsum equation, a reduction's name)
# The trusted worker's clocks for its own bookkeeping, before the counted work sets the real runs':
# a dry run's seconds per unit of cost, per run (~25 microseconds measured, ~100 on a machine
# loaded 6 times over: benchmarks/results/graph_information.json's `dry_run`), unpacking's per byte
# of the artifact, and the floor of each.
DRY_RUN_SECONDS_PER_UNIT = 1e-4
UNPACK_SECONDS_PER_BYTE = 1e-7
BOOKKEEPING_SECONDS = 30.0


def unpack_seconds(size: int) -> float:
    """The worker's clock for unpacking and parsing an artifact of `size` bytes (`unpack`, `GraphNet`)."""
    return BOOKKEEPING_SECONDS + size * UNPACK_SECONDS_PER_BYTE


def int_bits(n: int) -> int:
    """Bits to write the integer `n`: a sign and its magnitude's binary digits (0 -> 1, 3 -> 3,
    -1 -> 2, 255 -> 9, an int64 holding 8 chosen bytes -> 64 or 65)."""
    return 1 + abs(n).bit_length()


def float_bits(x: float) -> int:
    """Bits to write the float `x`: a sign, then the digits M and the exponent E of the shortest
    decimal M * 10**E that reads back as `x` (Python's `repr`, what the JSON holds): 0.1 -> 4,
    1e-05 -> 6, a float64 carrying 52 chosen bits -> about 60; inf and nan -> 2."""
    if not math.isfinite(x):
        return 2
    _, digits, exponent = decimal.Decimal(repr(x)).normalize().as_tuple()
    return 1 + int("".join(map(str, digits))).bit_length() + int_bits(int(exponent))


class _Spelling:
    """What one node's arguments spell, as `add` walks them: `bits` (each number by `int_bits` or
    `float_bits`, None and a bool 1, a string 8 a byte, a tag `TAG_BITS`, a list its length then its
    items, a keyword its place in the operator's schema; a reference 1 bit for whether it reads a
    graph input or a node's value, then the input's place after the last input read, `last_input`,
    or the value's distance back from the node), `operands` (the leaves: references and literals),
    `refs` and `longest` (a string's characters)."""

    __slots__ = ("at", "names", "inputs", "last_input", "bits", "operands", "refs", "longest")

    def __init__(self, at: int, names: tuple[str, ...], inputs: int, last_input: int) -> None:
        self.at, self.names, self.inputs, self.last_input = at, names, inputs, last_input
        self.bits = self.operands = self.refs = self.longest = 0

    def add(self, value: Any) -> None:
        if isinstance(value, list):
            self.bits += int_bits(len(value))
            for item in value:
                self.add(item)
            return
        if isinstance(value, dict):
            self.add_keywords(value)
            return
        self.operands += 1
        if isinstance(value, _Ref):
            if value.index < self.inputs:
                self.bits += 1 + int_bits(value.index - self.last_input - 1)
                self.last_input = value.index
            else:
                self.bits += 1 + int_bits(self.at - value.index - 1)
            self.refs += 1
        elif value is None or type(value) is bool:
            self.bits += 1
        elif type(value) is int:
            self.bits += int_bits(value)
        elif type(value) is float:
            self.bits += float_bits(value)
        elif isinstance(value, str):
            self.bits += 8 * len(value.encode("utf-8", "surrogatepass"))
            self.longest = max(self.longest, len(value))
        else:  # a dtype, layout, memory format, the device placeholder
            self.bits += TAG_BITS

    def add_keywords(self, kwargs: dict[str, Any]) -> None:
        self.bits += int_bits(len(kwargs))
        for key, value in kwargs.items():
            self.bits += int_bits(self.names.index(key)) if key in self.names else 8 * len(key.encode(
                "utf-8", "surrogatepass"))
            self.add(value)


def _bound_operands(i: int, op: str, spelled: _Spelling) -> None:
    """Refuse a node whose dry run would cost more than its operands say (`MAX_NODE_OPERANDS`,
    `MAX_EINSUM_OPERANDS`, `MAX_STRING`), before anything runs."""
    if spelled.operands > MAX_NODE_OPERANDS:
        raise GraphError(f"graph node {i} ({op}) takes {spelled.operands:,} operands, over the "
                         f"{MAX_NODE_OPERANDS:,} a node may take")
    if op.startswith("aten.einsum.") and spelled.refs > MAX_EINSUM_OPERANDS:
        raise GraphError(f"graph node {i} ({op}) contracts {spelled.refs} tensors, over the "
                         f"{MAX_EINSUM_OPERANDS} an einsum may take")
    if spelled.longest > MAX_STRING:
        raise GraphError(f"graph node {i} ({op}) takes a string of {spelled.longest:,} characters, over "
                         f"the {MAX_STRING} allowed")


def tensor_bits(value: torch.Tensor, values: bool) -> int:
    """Bits of a graph input tensor the model's code chose: its dtype and shape (`int_bits` of its
    rank and of each size), and with `values` its bytes, 8 bits each."""
    shape = TAG_BITS + int_bits(value.dim()) + sum(map(int_bits, value.shape))
    return shape + (8 * value.numel() * value.element_size() if values else 0)


@functools.cache
def _argument_names(name: str) -> tuple[str, ...]:
    """An aten operator's argument names, in its schema's order (a keyword is spelled by its place
    there); none for a Python operator."""
    if not name.startswith("aten."):
        return ()
    _, op, overload = name.split(".")
    return tuple(a.name for a in getattr(getattr(torch.ops.aten, op), overload)._schema.arguments)


def _literal_args(node: dict) -> Any:
    """A node's arguments without references: what `changed` compares."""
    def strip(v: Any) -> Any:
        if isinstance(v, list):
            return [strip(x) for x in v]
        if isinstance(v, dict):
            return "·" if "ref" in v else {k: strip(x) for k, x in v.items()}
        return v
    return strip([node["args"], node["kwargs"]])


class _Ref:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Placeholder(enum.Enum):
    """Stand-ins among a graph's arguments and bound values, found by identity: enum members,
    so copy, deepcopy and pickle give back the same object (a copied `object()` is another one,
    and a deep-copied network, as the zero-cost proxies score it, would pass it to an operator)."""

    DEVICE = "a device argument: the input's device at run time"
    INPUT = "where the user input goes among the bound inputs"


_DEVICE, _INPUT = _Placeholder.DEVICE, _Placeholder.INPUT


def _resolve(name: Any) -> Any:
    if not isinstance(name, str):
        raise GraphError("graph operation name malformed")
    if name in _OPERATORS:
        return _getitem if name == "operator.getitem" else _bounded(_OPERATORS[name])
    if not _OP_NAME.fullmatch(name):
        raise GraphError(f"graph operation {name[:60]!r} not allowed (aten tensor operators only)")
    return _aten(name)


@functools.lru_cache(maxsize=4096)
def _aten(name: str) -> Any:
    """An allowed aten operator by its name (resolved once per name: a graph repeats a few of them)."""
    _, op, overload = name.split(".")
    if not allowed(op, overload):
        raise GraphError(f"graph operation {name!r} not allowed (not among the operators a model may use, or "
                         f"one that writes into its arguments: nas/sandbox/aten_ops.py)")
    fn = getattr(getattr(torch.ops.aten, op), overload)
    if any("str" in str(a.type) and a.name not in _STR_OPTIONS for a in fn._schema.arguments):
        raise GraphError(f"graph operation {name!r} not allowed (takes a string)")
    return zero_filled(fn)


def _getitem(values: Any, i: Any) -> Any:
    """One output of an operator that returns several (the only use of `getitem` in a graph)."""
    if not isinstance(values, (tuple, list)) or type(i) is not int:
        raise GraphError("getitem takes one output of an operator returning several")
    return values[i]


def _bounded(fn: Any) -> Any:
    """`fn` (size arithmetic) on numbers within int64 range only, refusing a result outside it."""
    def run(*args: Any) -> Any:
        if not all(type(a) in (int, float, bool) and abs(a) < _SIZE_LIMIT for a in args):
            raise GraphError(f"{fn.__name__} takes numbers within int64 range (sizes)")
        if fn is operator.pow and type(args[0]) is int and type(args[1]) is int and args[1] > 0 and (
                abs(args[0]).bit_length() - 1) * args[1] >= 64:
            raise GraphError("pow result outside int64 range")
        out = fn(*args)
        if isinstance(out, (int, float)) and abs(out) >= _SIZE_LIMIT:
            raise GraphError(f"{fn.__name__} result outside int64 range")
        return out

    run.__name__ = fn.__name__
    return run


_PATH_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
# Where a normalisation operator takes its weight, bias, running mean and running variance.
_NORM_ARGS = {**dict.fromkeys(("batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                               "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
                               "instance_norm"), (1, 2, 3, 4)),
              **dict.fromkeys(("layer_norm", "native_layer_norm", "group_norm"), (2, 3)),
              "native_group_norm": (1, 2), "rms_norm": (2,)}
# Operators taking (input, weight, bias, ...): a bias's default scale comes from its weight's fan-in.
_LAYER_OPS = frozenset({"linear", "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d",
                        "conv_transpose2d", "conv_transpose3d"})
_ROLES = ("norm_weight", "norm_bias", "running_mean", "running_var")
# What a network carries besides its input and trainable parameters, in bits (`GraphNet.carried`):
# the model code's own choices, never trained from nasflow's initial values. The first FREE_BITS are
# free: honest networks spell fewer (benchmarks/results/graph_information.json); the rest count as
# parameters, BITS_PER_PARAMETER to one (a float32's), and a network carrying more than MAX_BITS is
# refused (a frozen pre-trained table's worth).
FREE_BITS = 1 << 17
MAX_BITS = 3 << 16
BITS_PER_PARAMETER = 32


def carried_parameters(bits: int) -> int:
    """The parameters `bits` carried count as: past FREE_BITS, one per BITS_PER_PARAMETER, rounded up."""
    return -(-max(0, bits - FREE_BITS) // BITS_PER_PARAMETER)


class GraphNet(nn.Module):
    """A network rebuilt from exported graphs. Parameters and buffers sit at
    their original paths in plain container modules (so optimisers, weight
    decay rules and `layers` see the model's structure); `forward` runs the
    train or the eval graph."""

    def __init__(self, artifact: Artifact, weights: str = "init", constants: str = "const",
                 graph: dict[str, Any] | None = None, like: str | None = None) -> None:
        """`like`: the weight set (already checked) whose names, shapes and dtypes `weights` must
        have: a training seed's weights are the checked network's, not a wider one's."""
        super().__init__()
        graph = artifact.graph if graph is None else graph
        if not isinstance(graph, dict):
            raise GraphError("graph malformed")
        shape = graph.get("input_shape")
        if not (isinstance(shape, list) and len(shape) == 3 and all(type(n) is int and 0 < n <= 4096 for n in shape)):
            raise GraphError("graph input shape malformed (expected [C, H, W])")
        self.input_shape: tuple[int, int, int] = tuple(shape)  # type: ignore[assignment]
        self.programs = {mode: _Program(graph.get(mode)) for mode in ("train", "eval")}
        if weights not in artifact.weights:
            raise GraphError(f"artifact has no weight set {weights!r}")
        tensors, consts = artifact.weights[weights], artifact.weights.get(constants, {})
        if like is not None:
            layout = {k: (v.shape, v.dtype) for k, v in artifact.weights.get(like, {}).items()}
            if {k: (v.shape, v.dtype) for k, v in tensors.items()} != layout:
                raise GraphError(f"weight set {weights!r} differs from {like!r} in its tensors' names, shapes or "
                                 "dtypes (the network trained must be the one checked)")
        self._slots: dict[tuple[str, str | None], tuple[nn.Module, str]] = {}
        for mode, program in self.programs.items():
            for kind, target in program.inputs:
                if kind == "USER_INPUT" or (kind, target) in self._slots:
                    continue
                if mode == "eval" and kind != "CONSTANT_TENSOR":
                    raise GraphError(f"eval graph uses {kind.lower()} {target!r} the train graph does not")
                source = consts if kind == "CONSTANT_TENSOR" else tensors
                if target is None or target not in source:
                    raise GraphError(f"artifact lacks the tensor {str(target)[:80]!r}")
                self._slots[kind, target] = self._place(kind, target, source[target])
        expected = {t for k, t in self._slots if k != "CONSTANT_TENSOR"}
        if set(tensors) != expected:
            raise GraphError("artifact weights do not match the graph's parameters and buffers")

    def _place(self, kind: str, target: str, value: torch.Tensor) -> tuple[nn.Module, str]:
        # a constant's name may be dotted (a `torch.tensor(...)` lifted out of a submodule's forward)
        parts = target.split(".") if kind != "CONSTANT_TENSOR" else ["_constants", target.replace(".", "__")]
        if not all(_PATH_PART.fullmatch(p) for p in parts) or len(parts) > 32:
            raise GraphError(f"graph tensor path {target[:80]!r} malformed")
        owner: nn.Module = self
        for part in parts[:-1]:
            if part not in owner._modules:
                if hasattr(owner, part):
                    raise GraphError(f"graph tensor path {target[:80]!r} clashes with an attribute")
                owner.add_module(part, nn.Module())
            owner = owner._modules[part]
        name = parts[-1]
        if name in owner._parameters or name in owner._buffers or name in owner._modules or hasattr(owner, name):
            raise GraphError(f"graph tensor path {target[:80]!r} defined twice")
        value = value.clone()
        if kind == "PARAMETER":
            owner.register_parameter(name, nn.Parameter(value, requires_grad=value.is_floating_point()))
        else:
            owner.register_buffer(name, value, persistent=kind == "BUFFER")
        return owner, name

    def _bound(self, program: _Program) -> list[Any]:
        return [_INPUT if kind == "USER_INPUT" else getattr(*self._slots[kind, target])
                for kind, target in program.inputs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        program = self.programs["train" if self.training else "eval"]
        return program.run(self._bound(program), x)

    @property
    def cost(self) -> int:
        """What one meta run of both graphs costs, as the parser counted it (`NODE_COST`, `MAX_COST`)."""
        return sum(p.cost for p in self.programs.values())

    def dry_run_seconds(self, train_batch: int = 0, batch: int = 2) -> float:
        """The worker's clock for `dry_run(batch, ..., train_batch)`: its runs (each graph at one
        batch, or two) at `DRY_RUN_SECONDS_PER_UNIT` per unit of `cost`, bounded before it runs."""
        runs = len({batch, max(batch, train_batch)})
        return BOOKKEEPING_SECONDS + runs * self.cost * DRY_RUN_SECONDS_PER_UNIT

    def dry_run(self, batch: int, budget_bytes: int, train_batch: int = 0) -> tuple[list[int], WorkCounter]:
        """Run both graphs on the meta device (no memory, no compute) to check that they execute,
        that one forward of `batch` images stays within `MAX_WORK`, and that training fits in
        `budget_bytes`, the memory the trainer has (`_Meter.training`); with a larger `train_batch`,
        again at that batch: within the same memory, and within `MAX_WORK` per image (a graph whose
        cost grows faster than its batch, mixing images, would pass at `batch` and cost far more in
        training). Returns the output shape at `batch` and the eval graph's work at the larger batch
        (what one forward costs)."""
        shapes, work = [], WorkCounter()
        for size in sorted({batch, max(batch, train_batch)}):
            scale = size / batch
            for mode, program in self.programs.items():
                work = WorkCounter()
                meter = _Meter.training(self, size, budget_bytes) if mode == "train" else _Meter(
                    budget_bytes, f"for an evaluation pass of {size} images (over the trainer's {budget_bytes >> 20} MB)")
                out = self._meta_run(program, size, meter, work)
                if work.total > MAX_WORK * scale:
                    raise GraphError(f"{mode} graph needs {work.total:.3g} operations for one forward "
                                     f"pass of {size} images, over the limit of {MAX_WORK * scale:.3g}")
                if size == batch:
                    shapes.append(list(out.shape))
        if shapes[0] != shapes[1]:
            raise GraphError(f"train and eval graphs disagree on the output shape ({shapes[0]} vs {shapes[1]})")
        return shapes[0], work

    def _meta_run(self, program: _Program, batch: int, meter: _Meter, work: WorkCounter) -> torch.Tensor:
        bound = [v if v is _INPUT else v.to("meta") for v in self._bound(program)]
        try:
            with work:
                out = program.run(bound, torch.empty((batch, *self.input_shape), device="meta"), meter)
        except GraphError:
            raise
        except Exception as err:  # an operator rejected its arguments
            raise GraphError(f"graph does not run: {type(err).__name__}: {str(err).splitlines()[0][:200]}") from None
        if not isinstance(out, torch.Tensor):
            raise GraphError(f"graph returns {type(out).__name__}, not a tensor")
        return out

    def _roles(self) -> dict[tuple[str, str | None], set[str]]:
        """How each graph input (kind, target) is used, in both graphs: as a normalisation's weight,
        bias, running mean or variance, as a convolution's or linear layer's bias ("bias:<its
        weight's fan-in>"), as a step counter (`add_(t, 1)`: BatchNorm's `num_batches_tracked`),
        or "other"; an input no operator reads has no entry."""
        roles: dict[tuple[str, str | None], set[str]] = {}
        for program in self.programs.values():
            n = len(program.inputs)
            for name, (_, args, kwargs) in zip(program.names, program.steps):
                op = name.split(".")[1] if name.startswith("aten.") else name
                places = dict(zip(_NORM_ARGS.get(op, ()), _ROLES))
                counter = op == "add_" and len(args) == 2 and type(args[1]) is int and not kwargs
                weight = args[1] if op in _LAYER_OPS and len(args) > 2 and isinstance(args[1], _Ref) else None
                if weight is not None and weight.index < n and program.inputs[weight.index] in self._slots:
                    places[2] = f"bias:{_fan_in(getattr(*self._slots[program.inputs[weight.index]]))}"
                for pos, ref in _refs(args, kwargs):
                    if ref.index < n:
                        role = places.get(pos) or ("counter" if counter and pos == 0 else "other")
                        roles.setdefault(program.inputs[ref.index], set()).add(role)
        return roles

    def _statistics(self, roles: dict[tuple[str, str | None], set[str]]) -> dict[tuple[str, str | None], str]:
        """The buffers that are only a normalisation's running statistics or step counter ->
        that role: their values are the data's, not the model's."""
        out = {}
        for (kind, target), used in roles.items():
            value = getattr(*self._slots[kind, target]) if (kind, target) in self._slots else None
            if kind != "BUFFER" or value is None or len(used) != 1:
                continue
            role, = used
            if role in ("running_mean", "running_var") or (
                    role == "counter" and value.numel() == 1 and not value.is_floating_point()):
                out[kind, target] = role
        return out

    def carried(self) -> dict[str, int]:
        """What the networks' outputs can depend on besides their input and trainable parameters, in
        bits: "buffer <name>" and "constant <name>" -> its bytes, shape and dtype (`tensor_bits`; a
        frozen feature bank, a table packed several values to an integer); "the <mode> graph" -> what
        its nodes spell (`_Spelling`: int64 words, sizes, indices, pads, a reference's choice of
        value); "tensor shapes" -> the shapes and dtypes of the tensors whose values training
        redraws (`reinitialise`): empty parameters (nothing but a shape), normalisation statistics and
        step counters. A parameter with elements is not counted here: its shape and dtype take fewer
        bits than the 32 a parameter of it counts as. Compared with `FREE_BITS` and `MAX_BITS`."""
        stats = self._statistics(self._roles())
        out = {f"the {mode} graph": program.bits for mode, program in self.programs.items()}
        shapes = 0
        for (kind, target), (owner, name) in sorted(self._slots.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
            value = getattr(owner, name)
            if kind == "PARAMETER" and value.numel():
                continue
            if kind == "PARAMETER" or (kind, target) in stats:
                shapes += tensor_bits(value, values=False)
            else:
                out[f"{'buffer' if kind == 'BUFFER' else 'constant'} {target}"] = tensor_bits(value, values=True)
        out["tensor shapes"] = shapes
        return out

    def reinitialise(self, seed: int) -> "GraphNet":
        """Replace every parameter and normalisation statistic with values drawn here under `seed`,
        so no initial value the model's code chose (pre-trained weights embedded in its source)
        is trained. By role, in both graphs: a normalisation's weight 1 and bias 0, running mean 0,
        variance 1, counter 0; any other parameter of 2+ dimensions, and a convolution's or linear
        layer's bias, PyTorch's default for those layers, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
        fan_in the weight's size over its first dimension; any other (scales, shifts) 0. Other
        buffers and constants keep their values, and count as parameters (`carried`)."""
        roles = self._roles()
        stats = self._statistics(roles)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for slot in sorted(self._slots, key=lambda s: (s[0], str(s[1]))):
                value = getattr(*self._slots[slot])
                used = roles.get(slot, set())
                if slot[0] == "PARAMETER":
                    if used == {"norm_weight"}:
                        value.fill_(1)
                    elif value.is_floating_point() and (value.dim() >= 2 and "norm_bias" not in used or (
                            len(used) == 1 and next(iter(used)).startswith("bias:"))):
                        fan_in = _fan_in(value) if value.dim() >= 2 else int(next(iter(used))[5:])
                        bound = 1 / max(1, fan_in) ** 0.5
                        value.copy_(torch.empty(value.shape).uniform_(-bound, bound, generator=gen))
                    else:
                        value.zero_()
                elif slot in stats:
                    value.fill_(1 if stats[slot] == "running_var" else 0)
        return self

    def layers(self) -> int:
        """Modules that own parameters (FairNAD discards single-layer networks)."""
        return sum(1 for m in self.modules() if m._parameters)

    def signature(self) -> tuple[list[str], list[tuple[str, str]]]:
        """(parameter shapes per layer, eval-graph operations with their literal
        arguments): what `compare` diffs; attribute names play no part."""
        layers = [str([list(p.shape) for p in m._parameters.values()]) for m in self.modules() if m._parameters]
        return layers, self.programs["eval"].ops


# count_params counts what a GraphNet carries besides its parameters (past FREE_BITS, per 32 bits)
EXTRA_PARAMETERS[GraphNet] = lambda net: carried_parameters(sum(net.carried().values()))

def _fan_in(weight: torch.Tensor) -> int:
    """Inputs per output of a convolution's or linear layer's weight, as PyTorch's default init counts them."""
    return math.prod(weight.shape[1:])


def _refs(args: list, kwargs: dict) -> list[tuple[int, _Ref]]:
    """(position, reference) for each reference among a node's arguments: the argument's position
    for a positional argument, -1 for one nested in a list or given by keyword."""
    def nested(value: Any) -> list[_Ref]:
        if isinstance(value, _Ref):
            return [value]
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return [r for v in items for r in nested(v)]

    return [(i if isinstance(a, _Ref) else -1, r) for i, a in enumerate(args) for r in nested(a)] + [
        (-1, r) for r in nested(kwargs)]


# Pairs of operations `compare` lets difflib match (its matching is quadratic: two graphs of
# MAX_NODES operations would take it hours); honest parent and child graphs differ in far fewer.
MAX_DIFF_PAIRS = 1 << 24


def compare(parent: GraphNet, child: GraphNet) -> tuple[bool, int]:
    """(changed, changed_layers): whether the layers or the operation sequence
    differ, and how many operations were inserted, deleted or replaced, between the sequences'
    common start and end; where that middle is over `MAX_DIFF_PAIRS` pairs, at least how many
    (the operations one has that the other lacks), in linear time."""

    (old_layers, old_ops), (new_layers, new_ops) = parent.signature(), child.signature()
    start = 0
    while start < min(len(old_ops), len(new_ops)) and old_ops[start] == new_ops[start]:
        start += 1
    end = 0
    while end < min(len(old_ops), len(new_ops)) - start and old_ops[-1 - end] == new_ops[-1 - end]:
        end += 1
    old, new = old_ops[start:len(old_ops) - end], new_ops[start:len(new_ops) - end]
    if len(old) * len(new) > MAX_DIFF_PAIRS:
        edits = max(len(old), len(new)) - sum((Counter(old) & Counter(new)).values())
    else:
        diff = difflib.SequenceMatcher(None, old, new, autojunk=False)
        edits = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in diff.get_opcodes() if tag != "equal")
    return edits > 0 or old_layers != new_layers, edits


def graph_hash(net: GraphNet, graph: dict[str, Any]) -> str:
    """sha256 of the network a graph trains as: its train and eval programs and input shape, and
    every tensor with its value after `reinitialise(0)` (what training redraws per seed counts
    by name, shape and dtype; what the model's code chose, carried buffers and constants, by
    value). Equal for the check's and the training's export of one model file, so a kept
    verdict vouches only for the network it measured."""

    digest = hashlib.sha256(json.dumps({k: graph.get(k) for k in ("format", "input_shape", "train", "eval")},
                                       sort_keys=True, separators=(",", ":")).encode())
    net.reinitialise(0)
    for name, value in sorted([*net.named_parameters(), *net.named_buffers()], key=lambda kv: kv[0]):
        tensor = value.detach().contiguous().reshape(-1)
        digest.update(f"{name}|{tensor.dtype}|{list(value.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()

"""A GBNF grammar (llama.cpp syntax) for NADER block files, so a constrained
model can only write text that `parse_block_file` reads.

By default the grammar is syntactic: headers ``##Name##`` (and ``##Name_stem##`` /
``##Name_downsample##`` where asked for), node lines ``index:Op`` or
``index:Op(args)``, edge lines ``a->b``.  Op names come from the registry
(`nas.spaces.nader.dag.ops.OPS`) plus the I/O markers; a registered op's keyword
arguments are its own parameters in the registry's order, the required ones
always there (``Conv2d(out_channels=..., kernel_size=..., stride=...)``),
``permute``/``reshape``/``repeat`` take positional values, ops with a
required parameter need parentheses and ops without parameters take none.
Values are integers (decimals for ``drop_prob``), the block variables
``B C dim H W`` and ``+ - * / //`` with up to two levels of parentheses; a
parameter that must be a whole number >= 0 (``kernel_size``, ``stride``,
``out_channels``...) takes no unary minus (``padding`` also ``-1``, its "same").
Whether values make sense and shapes agree: that is the verifier's job
(`nas.design.verifiers`), whose node-level errors a model can act on.

Sections named in ``tight`` (single-input blocks) are written in the layout
`tight_text` gives every valid block, which lets the grammar rule out what a
weak model otherwise gets wrong most (SmolLM2-135M's drafts named undefined
nodes 37 times in 44 under the syntactic grammar): node ``0:input``, ``1:output``, then op
nodes ``2:``, ``3:``, ... numbered consecutively, each node line followed by
the edges into it, from input or smaller op nodes: one for an op that takes one
input, two or more for ``Add``/``Mul`` (in increasing order, so none repeats),
two or more for ``concat`` and two for ``Multiply`` (in their order); the last
line is the one edge into output, from the last node.  Edges then name defined
nodes only, form no cycle, reach every node from input and give every op as
many inputs as it takes; a node whose output nothing uses and a repeated input
of ``concat``/``Multiply`` are left to the verifier.

Sizes are bounded (nodes, edges, values per argument list, digits), so a weak
model cannot loop forever inside the grammar.  Elsewhere node lines come before
edge lines, as in every NADER file; the text is written without spaces except an
optional one after a comma.  llama.cpp's parser (0.3.x) supports ``{m,n}``
repetition, used throughout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from nas.errors import EncodingError
from nas.llm.gbnf import gbnf_choice, gbnf_literal
from nas.spaces.nader.dag.canon import ORDERED_OPS
from nas.spaces.nader.dag.expr import VARIABLES
from nas.spaces.nader.dag.ops import OPS, Param
from nas.spaces.nader.dag.parse import IO_OPS, Block, Node
from nas.spaces.nader.dag.shapes import topological_order
from nas.spaces.nader.dag.validate import validate_structure

SECTIONS = ("base", "stem", "downsample")
MAX_NODES = 64   # the largest packaged NADER section has 61 nodes
MAX_EDGES = 96   # ... and 66 edges
MAX_NAME = 48
# Ops by their inputs: exactly one; two or more in any order (Add); two or more in
# edge order (concat); two in edge order (Multiply); unknown (an op not registered).
ARITIES = ("one", "many", "ordered", "pair", "any")
MAX_INPUTS = 8   # inputs of an ordered or unknown op in a tight section
_NAME_RE = re.compile(r"^[A-Za-z_][\w.\-]*$")


def _alternatives(words: Iterable[str]) -> str:
    # Longest first only for readability; llama.cpp explores all alternatives.
    return gbnf_choice(sorted(set(words), key=lambda w: (-len(w), w)))


def _rule_name(prefix: str, op: str, i: int) -> str:
    """GBNF rule names allow only letters, digits and '-'."""
    return f"{prefix}{i}-{re.sub(r'[^A-Za-z0-9]', '', op).lower()}"


def _keyword_args(params: tuple[tuple[str, bool, str], ...]) -> str:
    """(name, required, value rule) parameters in the registry's order, each at most once
    and the required ones always, as every packaged file writes them: the first one
    written is any up to the first required one."""
    first = next((i for i, (_, required, _) in enumerate(params) if required), len(params) - 1)
    alts = []
    for i in range(first + 1):
        rest = [f'comma "{n}" "=" {kind}' if required else f'(comma "{n}" "=" {kind})?'
                for n, required, kind in params[i + 1:]]
        alts.append(" ".join([f'"{params[i][0]}" "=" {params[i][2]}', *rest]))
    return " | ".join(alts)


# How a parameter's value may be written, by its registry bounds: rule -> (unary minus allowed, whole
# numbers only). A whole number >= 0 gets no minus and no decimals, so `kernel_size=-3` or
# `padding=(0.5)` cannot be written (9 of SmolLM2's 24 failed tries in one `make run`); `-1` stays
# for a padding's "same".
_VALUE_KINDS = {"value": (True, False), "int": (True, True), "count": (False, True), "fraction": (False, False)}


def _value_kind(param: Param) -> str:
    if param.minimum is None:
        return "int" if param.integer else "value"
    if param.minimum >= 0:
        return "count" if param.integer else "fraction"
    return "pad" if param.integer and param.minimum == -1 else "value"  # pad: -1 or a count (its rule)


def _value_rules(kind: str) -> list[tuple[str, str]]:
    """Expressions of `kind` (`_VALUE_KINDS`): at most two levels of parentheses, a few operators per level."""
    signed, whole = _VALUE_KINDS[kind]
    p, minus = ("" if kind == "value" else f"{kind}-"), ('"-"? ' if signed else "")
    return [(kind, f"{p}term (binop {p}term){{0,6}}"),
            (f"{p}term", f'{minus}({p}atom | "(" {p}value1 ")")'),
            (f"{p}value1", f"{p}term1 (binop {p}term1){{0,6}}"),
            (f"{p}term1", f'{minus}({p}atom | "(" {p}value2 ")")'),
            (f"{p}value2", f"{minus}{p}atom (binop {minus}{p}atom){{0,6}}"),
            (f"{p}atom", f"{'integer' if whole else 'number'} | {_alternatives(VARIABLES)}")]


def _arity(op: str) -> str:
    spec = OPS.get(op)
    if spec is None:
        return "any"
    if spec.max_inputs == 1:
        return "one"
    if op in ORDERED_OPS:
        return "pair" if spec.max_inputs == 2 else "ordered"
    return "many" if spec.min_inputs >= 2 else "any"


def tight_text(block: Block) -> str:
    """`block` in the layout of a tight section (same graph, same canonical key):
    op nodes numbered in topological order (ties by definition order), each
    followed by its incoming edges, in increasing source order except for an op
    whose input order matters (`ORDERED_OPS`). The node that feeds output comes
    last: every other node reaches it."""
    validate_structure(block)
    if any(node.op in ("input1", "input2") for node in block.nodes.values()):
        raise EncodingError(f"block '{block.name}': a two-input cell has no tight layout")
    preds: dict[str, list[str]] = {index: [] for index in block.nodes}
    for a, b in block.edges:
        preds[b].append(a)
    io = {node.op: index for index, node in block.nodes.items() if node.is_io}
    ops = [index for index in topological_order(block) if not block.nodes[index].is_io]
    new = {io["input"]: 0, io["output"]: 1} | {old: i for i, old in enumerate(ops, start=2)}
    lines = [f"##{block.name}##", "0:input", "1:output"]
    for old in ops:
        node = block.nodes[old]
        sources = [new[a] for a in preds[old]]
        lines.append(Node(str(new[old]), node.op, node.args).to_text())
        lines += [f"{a}->{new[old]}" for a in (sources if node.op in ORDERED_OPS else sorted(sources))]
    lines.append(f"{new[preds[io['output']][0]]}->1")
    return "\n".join(lines) + "\n"


def _tight_rules(top: int, arities: set[str]) -> list[tuple[str, str]]:
    """Rules for tight sections with op nodes 2..n, n <= `top`. ``tnode-k``
    writes node k and its inputs, then the next node or the edge into output (a
    tail call: llama.cpp keeps one stack per choice, not one per node count).
    Inputs of node k come from ``0, 2, ..., k-1`` (``tsrc-k``); ``tmany-k-j``
    is two or more of them from j on in increasing order, ``tsome-k-j`` one or more."""
    rules = [("tight-body", '"0:input\\n1:output\\n" tnode-2')]
    for k in range(2, top + 1):
        sources, edge = ["0", *map(str, range(2, k))], f'tsrc-{k} "->{k}\\n"'
        rules.append((f"tsrc-{k}", '"0"' if k == 2 else f'tsrc-{k - 1} | "{k - 1}"'))
        kinds = [f'op-one "\\n" {edge}'] if "one" in arities else []
        if "any" in arities:
            kinds.append(f'op-any "\\n" ({edge}){{1,{MAX_INPUTS}}}')
        if k > 2:  # two inputs need two nodes to come from
            kinds += [f'op-many "\\n" tmany-{k}-0'] if "many" in arities else []
            kinds += [f'op-ordered "\\n" ({edge}){{2,{MAX_INPUTS}}}'] if "ordered" in arities else []
            kinds += [f'op-pair "\\n" {edge} {edge}'] if "pair" in arities else []
        end = f'(tnode-{k + 1} | "{k}->1")' if k < top else f'"{k}->1"'
        rules.append((f"tnode-{k}", f'"{k}:" ({" | ".join(kinds)}) {end}'))
        if "many" not in arities or k == 2:
            continue
        for i, j in enumerate(sources):
            line, rest = f'"{j}->{k}\\n"', sources[i + 1:]
            rules.append((f"tsome-{k}-{j}", f"{line} tsome-{k}-{rest[0]}? | tsome-{k}-{rest[0]}" if rest else line))
            if rest:
                more = f" | tmany-{k}-{rest[0]}" if len(rest) > 1 else ""
                rules.append((f"tmany-{k}-{j}", f"{line} tsome-{k}-{rest[0]}{more}"))
    return rules


def block_grammar(ops: list[str] | None = None, sections: tuple[str, ...] = ("base",), *,
                  optional: tuple[str, ...] | None = None,
                  name: str | Mapping[str, str] | None = None,
                  max_nodes: int = MAX_NODES, max_edges: int = MAX_EDGES,
                  tight: tuple[str, ...] = ()) -> str:
    """GBNF for a block file with `sections` (in file order base, stem, downsample).

    `ops`: the op names a node may use (default: every registered op); a name
    that is not registered takes generic ``key=value`` arguments.  Sections in
    `optional` (default: every section after the first) may be left out; the
    others are required, the first one always.
    `name` fixes the header names: a base name gives ``##name##``,
    ``##name_stem##``, ``##name_downsample##``; a mapping role -> header name
    fixes those roles only.  Other headers may be any identifier (a stem header
    then ends in ``_stem`` or starts with ``stem``, as `role_of` reads it).
    `tight`: the sections written as `tight_text` lays them out (single-input
    blocks of at most `max_nodes` nodes; needs an op that takes one input).
    """
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or not sections:
        raise ValueError(f"sections must be some of {', '.join(SECTIONS)}, got {sections!r}")
    if len(set(sections)) != len(sections):
        raise ValueError(f"sections repeat: {sections!r}")
    if isinstance(name, str):
        name = {sec: name if sec == "base" else f"{name}_{sec}" for sec in SECTIONS}
    headers = dict(name or {})
    for sec, header in headers.items():
        if sec not in SECTIONS or not _NAME_RE.match(header) or len(header) > 2 * MAX_NAME:
            raise ValueError(f"name {sec}={header!r}: roles are {', '.join(SECTIONS)}, names identifiers")
    if max_nodes < 2 or max_edges < 1:
        raise ValueError("a section needs room for at least 2 nodes and 1 edge")
    if not set(tight) <= set(sections) or (tight and max_nodes < 3):
        raise ValueError(f"tight sections must be among {sections!r} and have room for 3 nodes, got {tight!r}")
    names = list(OPS) if ops is None else list(dict.fromkeys(ops))
    if not names:
        raise ValueError("no ops to allow")
    bad = [o for o in names if not re.match(r"^[A-Za-z_]\w*$", o) or o in IO_OPS]
    if bad:
        raise ValueError(f"not usable as op names: {', '.join(bad)}")

    ordered = [s for s in SECTIONS if s in sections]
    optional = tuple(ordered[1:]) if optional is None else optional
    if ordered[0] in optional:
        raise ValueError(f"the first section ({ordered[0]}) cannot be optional")
    parts: list[str] = []
    for sec in ordered:
        piece = f"sec-{sec}" if not parts else f'"\\n" sec-{sec}'
        parts.append(f"({piece})?" if parts and sec in optional else piece)
    rules: list[tuple[str, str]] = [("root", " ".join(parts) + ' "\\n"?')]

    free = f'"\\n" node-line{{2,{max_nodes}}} edge-line ("\\n" edge-line){{0,{max_edges - 1}}}'
    for sec in SECTIONS:
        if sec not in sections:
            continue
        if sec in headers:
            header = gbnf_literal(f"##{headers[sec]}##")
        elif sec == "base":
            header = '"##" ident "##"'
        else:
            header = f'"##" (ident "_{sec}" | "{sec}" name-char{{0,{MAX_NAME}}}) "##"'
        rules.append((f"sec-{sec}", f'{header} "\\n" tight-body' if sec in tight else f"{header} {free}"))

    alts: dict[str, list[str]] = {arity: [] for arity in ARITIES}
    extra: dict[tuple[tuple[str, bool, str], ...], str] = {}   # parameters -> rule (ops with equal ones share it)
    for op in names:
        spec = OPS.get(op)
        lit, arity = gbnf_literal(op), _arity(op)
        if spec is None:
            alts[arity].append(f'{lit} ("(" kwargs ")")?')
        elif spec.variadic:
            alts[arity].append(f'{lit} "(" values ")"')
        elif spec.params:
            params = tuple((p.name, p.default is None, _value_kind(p)) for p in spec.params)
            rule = extra.setdefault(params, _rule_name("args", op, len(extra)))
            needed = any(required for _, required, _ in params)
            alts[arity].append(f'{lit} "(" {rule} ")"' if needed else f'{lit} ("(" {rule} ")")?')
        else:
            alts[arity].append(lit)
    arities = [arity for arity in ARITIES if alts[arity]]
    if tight:
        if not {"one", "any"} & set(arities):
            raise ValueError("a tight section needs an op that takes one input")
        rules += _tight_rules(max_nodes - 1, set(arities))
    if set(sections) - set(tight):
        rules.append(("node-line", 'index ":" node "\\n"'))
        rules.append(("edge-line", 'index "->" index'))
        rules.append(("index", "[0-9] [0-9]? [0-9]?"))
        rules.append(("node", " | ".join([_alternatives(sorted(IO_OPS)), *(f"op-{a}" for a in arities)])))
    for arity in arities:  # llama.cpp ends a rule at a newline unless it is inside parentheses.
        rules.append((f"op-{arity}", "(\n      " + "\n    | ".join(alts[arity]) + "\n)"))
    for params, rule in extra.items():
        rules.append((rule, _keyword_args(params)))
    if any(op not in OPS for op in names):
        rules.append(("kwargs", "ident-short \"=\" value (comma ident-short \"=\" value){0,7}"))
        rules.append(("ident-short", "[A-Za-z_] [A-Za-z0-9_]{0,23}"))
    rules.append(("values", "int (comma int){0,7}"))  # permute/reshape/repeat: whole, -1 in a reshape
    rules.append(("comma", '"," " "?'))
    used = {"int"} | {"value" for op in names if op not in OPS} | {kind for ps in extra for _, _, kind in ps}
    if "pad" in used:
        rules.append(("pad", '"-1" | count'))
        used.add("count")
    for kind in _VALUE_KINDS:
        if kind in used:
            rules += _value_rules(kind)
    rules.append(("integer", "[0-9]{1,6}"))
    rules.append(("number", '[0-9]{1,6} ("." [0-9]{1,4})?'))
    rules.append(("binop", '"+" | "-" | "*" | "//" | "/"'))
    rules.append(("ident", f"[A-Za-z_] name-char{{0,{MAX_NAME - 1}}}"))
    rules.append(("name-char", "[A-Za-z0-9_.-]"))
    width = max(len(r) for r, _ in rules)
    return "\n".join(f"{r:<{width}} ::= {body}" for r, body in rules) + "\n"

"""A GBNF grammar (llama.cpp syntax) for NADER block files, so a constrained
model can only write text that `parse_block_file` reads.

The grammar is syntactic: headers ``##Name##`` (and ``##Name_stem##`` /
``##Name_downsample##`` where asked for), node lines ``index:Op`` or
``index:Op(args)``, edge lines ``a->b``.  Op names come from the registry
(`nas.arch.dag.ops.OPS`) plus the I/O markers; a registered op's keyword
names are its own parameters (``Conv2d(out_channels=..., kernel_size=...)``),
``permute``/``reshape``/``repeat`` take positional values, ops with a
required parameter need parentheses and ops without parameters take none.
Values are integers (decimals for ``drop_prob``), the block variables
``B C dim H W`` and ``+ - * / //`` with up to two levels of parentheses.
Whether every required argument is there, whether shapes agree, whether edges
name defined nodes: all that is the verifier's job (`nas.verify`), whose
node-level errors a model can act on.

Sizes are bounded (nodes, edges, values per argument list, digits), so a weak
model cannot loop forever inside the grammar.  Node lines come before edge
lines, as in every NADER file; the text is written without spaces except an
optional one after a comma.  llama.cpp's parser (0.3.x) supports ``{m,n}``
repetition, used throughout.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from nas.arch.dag.expr import VARIABLES
from nas.arch.dag.parse import IO_OPS
from nas.llm.gbnf import gbnf_choice, gbnf_literal

SECTIONS = ("base", "stem", "downsample")
MAX_NODES = 64   # the largest packaged NADER section has 61 nodes
MAX_EDGES = 96   # ... and 66 edges
MAX_NAME = 48
_NAME_RE = re.compile(r"^[A-Za-z_][\w.\-]*$")


def _alternatives(words: Iterable[str]) -> str:
    # Longest first only for readability; llama.cpp explores all alternatives.
    return gbnf_choice(sorted(set(words), key=lambda w: (-len(w), w)))


def _rule_name(prefix: str, op: str, i: int) -> str:
    """GBNF rule names allow only letters, digits and '-'."""
    return f"{prefix}{i}-{re.sub(r'[^A-Za-z0-9]', '', op).lower()}"


def block_grammar(ops: list[str] | None = None, sections: tuple[str, ...] = ("base",), *,
                  optional: tuple[str, ...] | None = None,
                  name: str | Mapping[str, str] | None = None,
                  max_nodes: int = MAX_NODES, max_edges: int = MAX_EDGES) -> str:
    """GBNF for a block file with `sections` (in file order base, stem, downsample).

    `ops`: the op names a node may use (default: every registered op); a name
    that is not registered takes generic ``key=value`` arguments.  Sections in
    `optional` (default: every section after the first) may be left out; the
    others are required, the first one always.
    `name` fixes the header names: a base name gives ``##name##``,
    ``##name_stem##``, ``##name_downsample##``; a mapping role -> header name
    fixes those roles only.  Other headers may be any identifier (a stem header
    then ends in ``_stem`` or starts with ``stem``, as `role_of` reads it).
    """
    from nas.arch.dag.ops import OPS

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
    parts = []
    for sec in ordered:
        piece = f"sec-{sec}" if not parts else f'"\\n" sec-{sec}'
        parts.append(f"({piece})?" if parts and sec in optional else piece)
    rules: list[tuple[str, str]] = [("root", " ".join(parts) + ' "\\n"?')]

    body = f'"\\n" node-line{{2,{max_nodes}}} edge-line ("\\n" edge-line){{0,{max_edges - 1}}}'
    for sec in SECTIONS:
        if sec not in sections:
            continue
        if sec in headers:
            header = gbnf_literal(f"##{headers[sec]}##")
        elif sec == "base":
            header = '"##" ident "##"'
        else:
            header = f'"##" (ident "_{sec}" | "{sec}" name-char{{0,{MAX_NAME}}}) "##"'
        rules.append((f"sec-{sec}", f"{header} {body}"))

    rules.append(("node-line", 'index ":" node "\\n"'))
    rules.append(("edge-line", 'index "->" index'))
    rules.append(("index", "[0-9] [0-9]? [0-9]?"))

    alts = [_alternatives(sorted(IO_OPS))]
    extra: dict[tuple[str, ...], str] = {}   # parameter names -> rule (ops with equal names share it)
    generic = False
    for op in names:
        spec = OPS.get(op)
        lit = gbnf_literal(op)
        if spec is None:
            generic = True
            alts.append(f'{lit} ("(" kwargs ")")?')
        elif spec.variadic:
            alts.append(f'{lit} "(" values ")"')
        elif spec.params:
            params = tuple(p.name for p in spec.params)
            rule = extra.setdefault(params, _rule_name("args", op, len(extra)))
            needed = any(p.default is None for p in spec.params)
            alts.append(f'{lit} "(" {rule} ")"' if needed else f'{lit} ("(" {rule} ")")?')
        else:
            alts.append(lit)
    # llama.cpp ends a rule at a newline unless it is inside parentheses.
    rules.append(("node", "(\n      " + "\n    | ".join(alts) + "\n)"))
    for params, rule in extra.items():
        key = "key" + rule[len("args"):]
        more = f" (comma {key} \"=\" value){{0,{len(params) - 1}}}" if len(params) > 1 else ""
        rules.append((rule, f'{key} "=" value{more}'))
        rules.append((key, _alternatives(params)))
    if generic:
        rules.append(("kwargs", "ident-short \"=\" value (comma ident-short \"=\" value){0,7}"))
        rules.append(("ident-short", "[A-Za-z_] [A-Za-z0-9_]{0,23}"))
    rules.append(("values", "value (comma value){0,7}"))
    rules.append(("comma", '"," " "?'))
    # Values: at most two levels of parentheses; a few operators per level.
    rules.append(("value", "term (binop term){0,6}"))
    rules.append(("term", '"-"? (atom | "(" value1 ")")'))
    rules.append(("value1", "term1 (binop term1){0,6}"))
    rules.append(("term1", '"-"? (atom | "(" value2 ")")'))
    rules.append(("value2", 'atom-signed (binop atom-signed){0,6}'))
    rules.append(("atom-signed", '"-"? atom'))
    rules.append(("atom", f"number | {_alternatives(VARIABLES)}"))
    rules.append(("number", '[0-9]{1,6} ("." [0-9]{1,4})?'))
    rules.append(("binop", '"+" | "-" | "*" | "//" | "/"'))
    rules.append(("ident", f"[A-Za-z_] name-char{{0,{MAX_NAME - 1}}}"))
    rules.append(("name-char", "[A-Za-z0-9_.-]"))
    width = max(len(r) for r, _ in rules)
    return "\n".join(f"{r:<{width}} ::= {body}" for r, body in rules) + "\n"

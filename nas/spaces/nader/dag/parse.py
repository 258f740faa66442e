"""Parser for NADER's block-DAG language.

A file holds one or more sections.  Each section starts with a header line
``##name##`` (base blocks are e.g. ``##ResNetBasicBlock##``; companions are
``##ResNetBasicBlock_stem##`` / ``##ResNetBasicBlock_downsample##``, one DARTS
file uses plain ``##stem_block##`` / ``##downsample_block##``).  A section's
body is a list of

* node lines ``index:Op`` or ``index:Op(args)``, where ``Op`` is an operation
  name or one of the I/O markers ``input``, ``input1``, ``input2``, ``output``;
  ``args`` are keyword (``out_channels=C*4``) and/or positional
  (``permute(0,2,3,1)``, ``reshape(B,C/4,H,W)``) arguments;
* edge lines ``a->b``.

Argument values are arithmetic expressions over variables (``B``, ``C``,
``dim``, ``H``, ``W``), integers and ``+ - * / //`` with parentheses.  They are
tokenised and checked here but never evaluated; the stored value is the token
string with whitespace removed.  Positional arguments are stored under the
keys ``"0"``, ``"1"``, ... (keyword names cannot start with a digit, so the
two kinds never collide).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nas.errors import EncodingError

IO_OPS = frozenset({"input", "input1", "input2", "output"})

_HEADER_RE = re.compile(r"^##\s*([A-Za-z_][\w.\-]*)\s*##$")
_NODE_RE = re.compile(r"^(\w+)\s*:\s*([A-Za-z_]\w*)\s*(\(.*)?$", re.S)
_EDGE_RE = re.compile(r"^(\w+)\s*->\s*(\w+)$")
_TOKEN_RE = re.compile(r"\s*(\d+\.\d+|\d+|[A-Za-z_]\w*|//|[-+*/()])")
_KW_RE = re.compile(r"^([A-Za-z_]\w*)\s*=(.*)$", re.S)


@dataclass
class Node:
    index: str
    op: str
    args: dict[str, str] = field(default_factory=dict)
    line: int = field(default=0, compare=False)

    @property
    def is_io(self) -> bool:
        return self.op in IO_OPS

    def to_text(self) -> str:
        if not self.args:
            return f"{self.index}:{self.op}"
        positional = sorted((k for k in self.args if k.isdigit()), key=int)
        keyword = [k for k in self.args if not k.isdigit()]
        parts = [self.args[k] for k in positional]
        parts += [f"{k}={self.args[k]}" for k in keyword]
        return f"{self.index}:{self.op}({','.join(parts)})"


@dataclass
class Block:
    name: str
    nodes: dict[str, Node] = field(default_factory=dict)
    edges: list[tuple[str, str]] = field(default_factory=list)
    line: int = field(default=0, compare=False)
    source: str = field(default="<string>", compare=False)
    edge_lines: list[int] = field(default_factory=list, compare=False)

    def edge_line(self, i: int) -> int:
        return self.edge_lines[i] if i < len(self.edge_lines) else self.line

    def to_text(self) -> str:
        lines = [f"##{self.name}##"]
        lines += [node.to_text() for node in self.nodes.values()]
        lines += [f"{a}->{b}" for a, b in self.edges]
        return "\n".join(lines) + "\n"


@dataclass
class BlockFile:
    sections: dict[str, Block] = field(default_factory=dict)

    def to_text(self) -> str:
        return "".join(block.to_text() for block in self.sections.values())


def _err(source: str, lineno: int, msg: str) -> EncodingError:
    return EncodingError(f"{source}:{lineno}: {msg}")


def _short(text: str, limit: int = 60) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _split_top_level(body: str) -> list[str] | None:
    """Split on commas outside parentheses; None when parentheses don't balance."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if depth != 0:
        return None
    parts.append(body[start:])
    return parts


def _expression(value: str) -> str | None:
    """Token string of an arithmetic expression, or None when it isn't one."""
    pos = 0
    tokens: list[str] = []
    value = value.rstrip()
    while pos < len(value):
        m = _TOKEN_RE.match(value, pos)
        if not m:
            return None
        tokens.append(m.group(1))
        pos = m.end()
    if not tokens:
        return None
    # Light grammar check: operands and binary operators alternate (unary
    # minus/plus allowed), parentheses balance.
    expect_operand = True
    depth = 0
    for tok in tokens:
        if tok == "(":
            if not expect_operand:
                return None
            depth += 1
        elif tok == ")":
            if expect_operand or depth == 0:
                return None
            depth -= 1
        elif tok in {"+", "-", "*", "/", "//"}:
            if expect_operand:
                if tok not in {"+", "-"}:
                    return None
            else:
                expect_operand = True
        else:
            if not expect_operand:
                return None
            expect_operand = False
    if expect_operand or depth != 0:
        return None
    return "".join(tokens)


def _parse_args(body: str, raw: str, source: str, lineno: int) -> dict[str, str]:
    where = f"node line '{_short(raw)}'"
    depth = 0
    close = -1
    for i, ch in enumerate(body):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                close = i
                break
    if close < 0 or body.count("(") != body.count(")"):
        raise _err(source, lineno, f"{where} has unbalanced parentheses")
    if body[close + 1 :].strip():
        raise _err(source, lineno, f"{where} has text after its argument list")
    parts = _split_top_level(body[1:close])
    if parts is None:  # pragma: no cover - balanced by construction
        raise _err(source, lineno, f"{where} has unbalanced parentheses")
    if len(parts) == 1 and not parts[0].strip():
        return {}
    args: dict[str, str] = {}
    n_positional = 0
    seen_keyword = False
    for part in parts:
        part = part.strip()
        if not part:
            raise _err(source, lineno, f"{where} has an empty argument")
        m = _KW_RE.match(part)
        if m:
            key, raw_value = m.group(1), m.group(2).strip()
            if key in args:
                raise _err(source, lineno, f"{where} repeats argument '{key}'")
            value = _expression(raw_value)
            if value is None:
                raise _err(source, lineno, f"{where}: argument {key}='{raw_value}' is not an expression")
            args[key] = value
            seen_keyword = True
        else:
            if seen_keyword:
                raise _err(source, lineno, f"{where}: positional argument '{part}' follows a keyword argument")
            value = _expression(part)
            if value is None:
                raise _err(source, lineno, f"{where}: argument '{part}' is not an expression")
            args[str(n_positional)] = value
            n_positional += 1
    return args


def parse_block_file(text: str, source: str = "<string>") -> BlockFile:
    """Parse a NADER block file; raises `EncodingError` naming source:line."""
    if not isinstance(text, str):
        raise EncodingError(f"{source}: block text must be a string, not {type(text).__name__}")
    result = BlockFile()
    current: Block | None = None
    for lineno, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line:
            continue
        if line.startswith("##"):
            m = _HEADER_RE.match(line)
            if not m:
                raise _err(source, lineno, f"header line '{_short(line)}' is not of the form ##name##")
            name = m.group(1)
            if name in result.sections:
                first = result.sections[name].line
                raise _err(source, lineno, f"section '{name}' is defined twice (first at line {first})")
            current = Block(name=name, line=lineno, source=source)
            result.sections[name] = current
            continue
        if "->" in line:
            m = _EDGE_RE.match(line)
            if not m:
                raise _err(source, lineno, f"edge line '{_short(line)}' is not of the form a->b")
            if current is None:
                raise _err(source, lineno, f"edge line '{_short(line)}' comes before any ##name## header")
            current.edges.append((m.group(1), m.group(2)))
            current.edge_lines.append(lineno)
            continue
        m = _NODE_RE.match(line)
        if not m:
            if line.count("(") != line.count(")"):
                raise _err(source, lineno, f"node line '{_short(line)}' has unbalanced parentheses")
            raise _err(
                source,
                lineno,
                f"line '{_short(line)}' is neither a ##name## header, a node 'index:Op(args)' nor an edge 'a->b'",
            )
        if current is None:
            raise _err(source, lineno, f"node line '{_short(line)}' comes before any ##name## header")
        index, op, body = m.group(1), m.group(2), m.group(3)
        args = _parse_args(body.strip(), line, source, lineno) if body else {}
        if index in current.nodes:
            first = current.nodes[index].line
            raise _err(source, lineno, f"node {index} is defined twice in '{current.name}' (first at line {first})")
        current.nodes[index] = Node(index=index, op=op, args=args, line=lineno)
    if not result.sections:
        raise EncodingError(f"{source}: no ##name## section found")
    return result

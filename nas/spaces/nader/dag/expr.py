"""Safe arithmetic for block arguments: a tiny parser and evaluator, never `eval`.

Argument values such as ``C*4``, ``dim-C`` or ``C/4/4`` are parsed into a
small expression tree and evaluated exactly (with `Fraction`) against the
variables of a block position (B, C, dim, H, W).  Only integers, those five
names, ``+ - * / //`` and parentheses exist; anything else is an error that
names the offending token.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Mapping

VARIABLES = ("B", "C", "dim", "H", "W")
MAX_MAGNITUDE = 2**40  # larger intermediate values are a mistake, not a network

_TOKEN_RE = re.compile(r"\s*(\d+\.\d+|\d+|[A-Za-z_]\w*|//|[-+*/()])")


class ExprError(ValueError):
    """A malformed or non-evaluable argument expression (message is one line)."""


@dataclass(frozen=True)
class Num:
    value: Fraction


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Neg:
    operand: "Expr"


@dataclass(frozen=True)
class BinOp:
    op: str
    left: "Expr"
    right: "Expr"


Expr = Num | Var | Neg | BinOp


def _tokens(text: str) -> list[str]:
    pos, out = 0, []
    text = text.strip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise ExprError(f"unexpected character {text[pos]!r} in '{text}'")
        out.append(m.group(1))
        pos = m.end()
    if not out:
        raise ExprError("empty expression")
    return out


class _Parser:
    """Recursive descent: expr := term (('+'|'-') term)*; term := unary (('*'|'/'|'//') unary)*."""

    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExprError(f"'{self.text}' ends too early")
        self.i += 1
        return tok

    def parse(self) -> Expr:
        node = self.expr()
        if self.peek() is not None:
            raise ExprError(f"unexpected '{self.peek()}' in '{self.text}'")
        return node

    def expr(self) -> Expr:
        node = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = BinOp(op, node, self.term())
        return node

    def term(self) -> Expr:
        node = self.unary()
        while self.peek() in ("*", "/", "//"):
            op = self.take()
            node = BinOp(op, node, self.unary())
        return node

    def unary(self) -> Expr:
        if self.peek() in ("+", "-"):
            sign = self.take()
            operand = self.unary()
            return Neg(operand) if sign == "-" else operand
        tok = self.take()
        if tok == "(":
            node = self.expr()
            if self.take() != ")":
                raise ExprError(f"missing ')' in '{self.text}'")
            return node
        if tok[0].isdigit():
            return Num(Fraction(tok))
        if tok[0].isalpha() or tok[0] == "_":
            if tok not in VARIABLES:
                raise ExprError(f"unknown variable '{tok}' (use {', '.join(VARIABLES)})")
            return Var(tok)
        raise ExprError(f"unexpected '{tok}' in '{self.text}'")


@lru_cache(maxsize=4096)
def parse_expr(text: str) -> Expr:
    return _Parser(text).parse()


def evaluate(node: Expr, env: Mapping[str, int]) -> Fraction:
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Var):
        if node.name not in env:
            raise ExprError(f"variable '{node.name}' is not defined here")
        return Fraction(env[node.name])
    if isinstance(node, Neg):
        return -evaluate(node.operand, env)
    left, right = evaluate(node.left, env), evaluate(node.right, env)
    if node.op == "+":
        value = left + right
    elif node.op == "-":
        value = left - right
    elif node.op == "*":
        value = left * right
    else:
        if right == 0:
            raise ExprError("division by zero")
        value = left / right if node.op == "/" else Fraction(left // right)
    if abs(value) > MAX_MAGNITUDE:
        raise ExprError(f"value {value} is too large")
    return value


def eval_int(text: str, env: Mapping[str, int], exact: bool = True) -> int:
    """Evaluate `text` to a whole number (channel counts, sizes).

    `exact` rejects fractional results; otherwise they are floored, which is
    what NADER's own code does (its annos.json has C=247 with ``C/4``).
    """
    value = evaluate(parse_expr(text), env)
    if value.denominator != 1 and not exact:
        return math.floor(value)
    if value.denominator != 1:
        shown = ", ".join(f"{k}={env[k]}" for k in VARIABLES if k in env and k in text)
        raise ExprError(f"'{text}' = {value} is not a whole number" + (f" (at {shown})" if shown else ""))
    return int(value)


def variables_of(text: str) -> set[str]:
    def walk(node: Expr) -> set[str]:
        if isinstance(node, Var):
            return {node.name}
        if isinstance(node, Neg):
            return walk(node.operand)
        if isinstance(node, BinOp):
            return walk(node.left) | walk(node.right)
        return set()

    return walk(parse_expr(text))


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2}


def to_python(text: str) -> str:
    """Integer Python source for `text`.

    ``/`` becomes ``//``: validation has already checked that every division
    is exact at every position the block is used, so both agree there.
    """

    def emit(node: Expr, parent: int = 0, right_side: bool = False) -> str:
        if isinstance(node, Num):
            value = node.value
            return str(value) if value.denominator == 1 else repr(float(value))
        if isinstance(node, Var):
            return node.name
        if isinstance(node, Neg):
            return f"-{emit(node.operand, 3)}"
        prec = _PRECEDENCE[node.op]
        op = "//" if node.op == "/" else node.op
        body = f"{emit(node.left, prec)} {op} {emit(node.right, prec, True)}"
        needs = prec < parent or (right_side and prec == parent)
        return f"({body})" if needs else body

    return emit(parse_expr(text))


def normal_form(text: str) -> str:
    """A canonical spelling of an argument, so ``C*4`` and ``4*C`` are one label.

    Expressions built from + - * and division by constants are polynomials
    with rational coefficients and print in a fixed order; anything else
    (``//``, division by a variable, a parse error) keeps its token string.
    """
    Poly = dict[tuple[str, ...], Fraction]

    def poly(node: Expr) -> Poly | None:
        if isinstance(node, Num):
            return {(): node.value}
        if isinstance(node, Var):
            return {(node.name,): Fraction(1)}
        if isinstance(node, Neg):
            inner = poly(node.operand)
            return None if inner is None else {m: -c for m, c in inner.items()}
        left, right = poly(node.left), poly(node.right)
        if left is None or right is None:
            return None
        out: Poly = {}
        if node.op in ("+", "-"):
            sign = 1 if node.op == "+" else -1
            out = dict(left)
            for m, c in right.items():
                out[m] = out.get(m, Fraction(0)) + sign * c
        elif node.op == "*":
            for m1, c1 in left.items():
                for m2, c2 in right.items():
                    m = tuple(sorted(m1 + m2))
                    out[m] = out.get(m, Fraction(0)) + c1 * c2
        elif node.op == "/" and set(right) == {()} and right[()] != 0:
            out = {m: c / right[()] for m, c in left.items()}
        else:
            return None
        return {m: c for m, c in out.items() if c != 0}

    try:
        p = poly(parse_expr(text))
    except ExprError:
        return text
    if p is None:
        return text
    if not p:
        return "0"
    return "+".join(f"{c}{'*' if m else ''}{'*'.join(m)}" for m, c in sorted(p.items()))

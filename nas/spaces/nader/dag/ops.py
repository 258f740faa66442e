"""The operation glossary: one spec per op with its arguments, shape rule,
cost (fvcore conventions), module builder and exported source.

Shapes are tuples of `Dim`: a concrete value at the position being checked
plus a symbolic expression over the block variables (B, C, dim, H, W), so an
error reads ``shapes (B, C, H, W) and (B, C, (H+1)//2, (W+1)//2) differ`` and
exported code keeps ``C // 4`` rather than ``16``.

Conventions NADER's glossary leaves open, chosen here and documented:
convolutions and pools pad to keep ``H`` at stride 1 (``d*(k-1)//2`` for odd
kernels; ``(d*(k-1)+1-s)//2`` for even ones, so ``k=s`` patchifies exactly);
Conv2d has a bias, as in NADER (only then do our parameter counts match
``blocks-cifar/annos.json`` to the last reported digit); pools need an
explicit stride; mean/max/sum keep the reduced dimension (the glossary's
``(B,L,D) -> (B,1,D)``); ``concat`` and ``Concat`` are the same op; DropPath
(used by the DARTS files) is stochastic depth with ``drop_prob`` default 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Callable, ClassVar, NamedTuple, Sequence

from nas.spaces.nader.dag.expr import ExprError, eval_int, evaluate, parse_expr, to_python, variables_of

if TYPE_CHECKING:
    from torch import nn


class Dim(NamedTuple):
    value: int
    expr: str

    def __str__(self) -> str:
        return self.expr


Shape = tuple[Dim, ...]


class OpError(ValueError):
    """An op's arguments or input shapes are wrong (one line, no node prefix)."""


def const(value: int) -> Dim:
    return Dim(value, str(value))


def _wrap(expr: str) -> str:
    return expr if expr.replace("_", "").isalnum() else f"({expr})"


def dim_mul(a: Dim, b: Dim) -> Dim:
    if a.expr == "1":
        return b
    if b.expr == "1":
        return a
    if a.expr.isdigit() and b.expr.isdigit():
        return const(a.value * b.value)
    return Dim(a.value * b.value, f"{_wrap(a.expr)}*{_wrap(b.expr)}")


def named(expr: str, value: int | float) -> str:
    """``C/4 = 16`` for an expression, just ``16`` for a literal."""
    return expr if expr == str(value) else f"{expr} = {value}"


def show(shape: Shape) -> str:
    return "(" + ", ".join(d.expr for d in shape) + ")"


def show_values(shape: Shape) -> str:
    return "(" + ", ".join(str(d.value) for d in shape) + ")"


def numel(shape: Shape) -> int:
    return math.prod(d.value for d in shape)


def auto_padding(kernel: int, stride: int, dilation: int) -> int:
    if kernel % 2:
        return dilation * (kernel - 1) // 2
    return max(0, dilation * (kernel - 1) + 1 - stride) // 2


def spatial(d: Dim, kernel: int, stride: int, padding: int, dilation: int) -> Dim:
    """Output size of a sliding window, with a readable symbolic form."""
    c = 2 * padding - dilation * (kernel - 1) - 1  # out = (d + c) // s + 1
    value = (d.value + c) // stride + 1
    if d.expr.isdigit():
        return const(value)
    base = _wrap(d.expr)
    shift = c + stride  # out = (d + shift) // s
    if stride == 1:
        expr = d.expr if shift == 0 else f"{base}{shift:+d}"
    else:
        expr = f"{base}//{stride}" if shift == 0 else f"({base}{shift:+d})//{stride}"
    return Dim(value, expr)


@dataclass(frozen=True)
class Param:
    name: str
    default: str | None = None  # expression text; None means required
    minimum: int | None = 1
    integer: bool = True


@dataclass
class Bound:
    """An op's arguments at one position: values plus their source expressions."""

    values: dict[str, int | float]
    exprs: dict[str, str]
    items: list[int]  # variadic positional values (permute/repeat/reshape)
    item_exprs: list[str]
    exact: bool = True  # fractional sizes are errors (else floored, as NADER does)


class OpSpec:
    """Base class; subclasses set the class attributes and override the rules."""

    name: ClassVar[str] = ""
    params: ClassVar[tuple[Param, ...]] = ()
    variadic: ClassVar[bool] = False  # takes *values like permute(0,2,3,1)
    min_inputs: ClassVar[int] = 1
    max_inputs: ClassVar[int | None] = 1
    commutative: ClassVar[bool] = False

    def bind(self, args: dict[str, str], env: dict[str, int], exact: bool = True) -> Bound:
        values: dict[str, int | float] = {}
        exprs: dict[str, str] = {}
        positional = [args[k] for k in sorted((k for k in args if k.isdigit()), key=int)]
        keyword = {k: v for k, v in args.items() if not k.isdigit()}
        allowed = [p.name for p in self.params]
        if self.variadic:
            if keyword:
                raise OpError(f"{self.name} takes positional values only, e.g. {self.name}(0,2,3,1)")
            if not positional:
                raise OpError(f"{self.name} needs at least one value")
            try:
                items = [eval_int(e, env, exact) for e in positional]
            except ExprError as exc:
                raise OpError(f"{self.name}: {exc}") from None
            return Bound({}, {}, items, positional, exact)
        if len(positional) > len(self.params):
            raise OpError(f"{self.name} takes at most {len(self.params)} positional arguments ({', '.join(allowed) or 'none'})")
        given = dict(zip(allowed, positional))
        for key, arg in keyword.items():
            if key not in allowed:
                hint = f"allowed: {', '.join(allowed)}" if allowed else "it takes no arguments"
                raise OpError(f"{self.name} got unknown argument '{key}' ({hint})")
            if key in given:
                raise OpError(f"{self.name} got argument '{key}' twice")
            given[key] = arg
        for p in self.params:
            text = given.get(p.name, p.default)
            if text is None:
                raise OpError(f"{self.name} needs argument '{p.name}'")
            try:
                if p.integer:
                    value: int | float = eval_int(text, env, exact)
                else:
                    value = float(evaluate(parse_expr(text), env))
            except ExprError as exc:
                raise OpError(f"{self.name}: {p.name}={text}: {exc}") from None
            if p.minimum is not None and value < p.minimum:
                raise OpError(f"{self.name}: {p.name}={text} is {value}, must be >= {p.minimum}")
            values[p.name] = value
            exprs[p.name] = text
        return Bound(values, exprs, [], [], exact)

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        return ins[0]

    def cost(self, a: Bound, ins: list[Shape], out: Shape) -> tuple[int, int]:
        """(parameters, FLOPs) with fvcore's conventions (multiply-adds; free elementwise ops)."""
        return 0, 0

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        raise NotImplementedError

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str | None:
        """Constructor source for `__init__`, or None for stateless ops."""
        return None

    def call_source(self, a: Bound, args: list[str], ref: str) -> str:
        return f"{ref}({', '.join(args)})"


def _nn() -> ModuleType:
    """torch.nn, imported when the first module is built: parsing and shape checks never need torch."""
    from torch import nn  # lazy: loads torch (start-up time)

    return nn


def _modules() -> ModuleType:
    """This language's own modules (`nas.spaces.nader.dag.modules`), imported with torch on first use."""
    from nas.spaces.nader.dag import modules  # lazy: loads torch (start-up time)

    return modules


OPS: dict[str, OpSpec] = {}


def register(*names: str) -> Callable[[type[OpSpec]], type[OpSpec]]:
    def deco(cls: type[OpSpec]) -> type[OpSpec]:
        for n in names:
            if n in OPS:
                raise ValueError(f"op '{n}' registered twice")
            spec = cls()
            spec.name = n  # type: ignore[misc]
            OPS[n] = spec
        return cls

    return deco


def py(expr: str) -> str:
    return to_python(expr)


def _rank(name: str, shape: Shape, ranks: Sequence[int]) -> None:
    if len(shape) not in ranks:
        want = " or ".join(f"{r}-d" for r in ranks)
        raise OpError(f"{name} needs a {want} input, got {len(shape)}-d {show(shape)}")


def _axis(name: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise OpError(f"{name}: dim={axis} is out of range for a {rank}-d input")
    return axis % rank


# --------------------------------------------------------------- convolution


@register("Conv2d")
class Conv2dSpec(OpSpec):
    params = (
        Param("out_channels"),
        Param("kernel_size"),
        Param("stride", "1"),
        Param("dilation", "1"),
        Param("groups", "1"),
        Param("padding", "-1", minimum=-1),
    )

    def _padding(self, a: Bound) -> int:
        p = int(a.values["padding"])
        return auto_padding(int(a.values["kernel_size"]), int(a.values["stride"]), int(a.values["dilation"])) if p < 0 else p

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        _rank(self.name, x, (4,))
        cin, cout, g = x[1].value, int(a.values["out_channels"]), int(a.values["groups"])
        if cin % g:
            raise OpError(
                f"Conv2d: input channels {named(x[1].expr, cin)} are not divisible by groups={named(a.exprs['groups'], g)}"
            )
        if cout % g:
            raise OpError(
                f"Conv2d: out_channels={named(a.exprs['out_channels'], cout)} is not divisible by "
                f"groups={named(a.exprs['groups'], g)}"
            )
        k, s, d = (int(a.values[n]) for n in ("kernel_size", "stride", "dilation"))
        p = self._padding(a)
        h, w = spatial(x[2], k, s, p, d), spatial(x[3], k, s, p, d)
        if h.value < 1 or w.value < 1:
            raise OpError(f"Conv2d: kernel_size={k} (dilation {d}) is larger than the {x[2].value}x{x[3].value} input")
        return (x[0], Dim(cout, a.exprs["out_channels"]), h, w)

    def cost(self, a: Bound, ins: list[Shape], out: Shape) -> tuple[int, int]:
        k, g = int(a.values["kernel_size"]), int(a.values["groups"])
        cin = ins[0][1].value
        params = out[1].value * (cin // g) * k * k + out[1].value
        return params, numel(out) * (cin // g) * k * k

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        v = a.values
        return _nn().Conv2d(
            ins[0][1].value, int(v["out_channels"]), int(v["kernel_size"]), stride=int(v["stride"]),
            padding=self._padding(a), dilation=int(v["dilation"]), groups=int(v["groups"]),
        )

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        v, e = a.values, a.exprs
        extra = "".join(
            f", {n}={py(e[n])}" for n in ("stride", "dilation", "groups") if v[n] != 1
        )
        return (
            f"nn.Conv2d({py(ins[0][1].expr)}, {py(e['out_channels'])}, {py(e['kernel_size'])}"
            f"{extra}, padding={self._padding(a)})"
        )


@register("Linear")
class LinearSpec(OpSpec):
    params = (Param("out_channels"),)

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        if len(x) < 2:
            raise OpError(f"Linear needs at least a 2-d input, got {show(x)}")
        return x[:-1] + (Dim(int(a.values["out_channels"]), a.exprs["out_channels"]),)

    def cost(self, a: Bound, ins: list[Shape], out: Shape) -> tuple[int, int]:
        fin, fout = ins[0][-1].value, out[-1].value
        return fin * fout + fout, numel(ins[0]) * fout

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _nn().Linear(ins[0][-1].value, int(a.values["out_channels"]))

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        return f"nn.Linear({py(ins[0][-1].expr)}, {py(a.exprs['out_channels'])})"


# ------------------------------------------------------------------- pooling


class _PoolSpec(OpSpec):
    params = (Param("kernel_size"), Param("stride"), Param("padding", "-1", minimum=-1))
    torch_name: ClassVar[str] = ""

    def _padding(self, a: Bound) -> int:
        p = int(a.values["padding"])
        return auto_padding(int(a.values["kernel_size"]), int(a.values["stride"]), 1) if p < 0 else p

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        _rank(self.name, x, (4,))
        k, s, p = int(a.values["kernel_size"]), int(a.values["stride"]), self._padding(a)
        if p * 2 > k:
            raise OpError(f"{self.name}: padding={p} must be at most half of kernel_size={k}")
        h, w = spatial(x[2], k, s, p, 1), spatial(x[3], k, s, p, 1)
        if h.value < 1 or w.value < 1:
            raise OpError(f"{self.name}: kernel_size={k} is larger than the {x[2].value}x{x[3].value} input")
        return (x[0], x[1], h, w)

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return getattr(_nn(), self.torch_name)(int(a.values["kernel_size"]), int(a.values["stride"]), self._padding(a))

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        return f"nn.{self.torch_name}({py(a.exprs['kernel_size'])}, {py(a.exprs['stride'])}, padding={self._padding(a)})"


@register("AvgPool2d")
class AvgPoolSpec(_PoolSpec):
    torch_name = "AvgPool2d"


@register("MaxPool2d")
class MaxPoolSpec(_PoolSpec):
    torch_name = "MaxPool2d"


class _AdaptiveSpec(OpSpec):
    params = (Param("output_size"),)
    torch_name: ClassVar[str] = ""
    counts_input: ClassVar[bool] = False

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        _rank(self.name, x, (4,))
        o = Dim(int(a.values["output_size"]), a.exprs["output_size"])
        return (x[0], x[1], o, o)

    def cost(self, a: Bound, ins: list[Shape], out: Shape) -> tuple[int, int]:
        return 0, numel(ins[0]) if self.counts_input else 0

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return getattr(_nn(), self.torch_name)(int(a.values["output_size"]))

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        return f"nn.{self.torch_name}({py(a.exprs['output_size'])})"


@register("AdaptiveAvgPool2d")
class AdaptiveAvgSpec(_AdaptiveSpec):
    torch_name = "AdaptiveAvgPool2d"
    counts_input = True  # fvcore counts adaptive_avg_pool2d, not max


@register("AdaptiveMaxPool2d")
class AdaptiveMaxSpec(_AdaptiveSpec):
    torch_name = "AdaptiveMaxPool2d"


# --------------------------------------------------------- multi-input ops


def broadcast(name: str, shapes: list[Shape]) -> Shape:
    rank = max(len(s) for s in shapes)
    padded = [(const(1),) * (rank - len(s)) + s for s in shapes]
    out: list[Dim] = []
    for axis in range(rank):
        dims = [s[axis] for s in padded]
        sizes = {d.value for d in dims if d.value != 1}
        if len(sizes) > 1:
            listed = " and ".join(show(s) for s in shapes)
            values = " vs ".join(str(d.value) for d in dims)
            raise OpError(f"{name}: shapes {listed} do not broadcast (dim {axis}: {values})")
        out.append(next((d for d in dims if d.value != 1), dims[0]))
    return tuple(out)


@register("Add")
class AddSpec(OpSpec):
    min_inputs, max_inputs, commutative = 2, None, True
    symbol: ClassVar[str] = "+"

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        return broadcast(self.name, ins)

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _modules().Elementwise("add" if self.symbol == "+" else "mul")

    def call_source(self, a: Bound, args: list[str], ref: str) -> str:
        return f" {self.symbol} ".join(args)


@register("Mul")
class MulSpec(AddSpec):
    symbol = "*"


@register("Multiply")
class MultiplySpec(OpSpec):
    min_inputs, max_inputs = 2, 2

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x, y = ins
        if len(x) < 2 or len(y) < 2:
            raise OpError(f"Multiply needs inputs of at least 2 dims, got {show(x)} and {show(y)}")
        if x[-1].value != y[-2].value:
            raise OpError(
                f"Multiply: {show(x)} @ {show(y)}: inner sizes {x[-1]} = {x[-1].value} and {y[-2]} = {y[-2].value} differ"
            )
        batch = broadcast(self.name, [x[:-2], y[:-2]]) if len(x) > 2 or len(y) > 2 else ()
        return batch + (x[-2], y[-1])

    def cost(self, a: Bound, ins: list[Shape], out: Shape) -> tuple[int, int]:
        return 0, numel(out) * ins[0][-1].value

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _modules().MatMul()

    def call_source(self, a: Bound, args: list[str], ref: str) -> str:
        return f"torch.matmul({args[0]}, {args[1]})"


@register("concat", "Concat")
class ConcatSpec(OpSpec):
    params = (Param("dim", "1", minimum=None),)
    min_inputs, max_inputs = 2, None

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        rank = len(ins[0])
        if any(len(s) != rank for s in ins):
            raise OpError(f"{self.name}: inputs have different ranks: {', '.join(show(s) for s in ins)}")
        axis = _axis(self.name, int(a.values["dim"]), rank)
        for i in range(rank):
            if i != axis and len({s[i].value for s in ins}) > 1:
                raise OpError(
                    f"{self.name}(dim={axis}): inputs {', '.join(show(s) for s in ins)} differ in dim {i} "
                    f"({' vs '.join(str(s[i].value) for s in ins)})"
                )
        total = Dim(sum(s[axis].value for s in ins), "+".join(_wrap(s[axis].expr) for s in ins))
        return ins[0][:axis] + (total,) + ins[0][axis + 1 :]

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _modules().Concat(int(a.values["dim"]))

    def call_source(self, a: Bound, args: list[str], ref: str) -> str:
        return f"torch.cat([{', '.join(args)}], dim={int(a.values['dim'])})"


# ------------------------------------------------------- reductions, softmax


class _ReduceSpec(OpSpec):
    params = (Param("dim", minimum=None),)

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        axis = _axis(self.name, int(a.values["dim"]), len(x))
        if self.name == "softmax":
            return x
        return x[:axis] + (const(1),) + x[axis + 1 :]

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _modules().Reduce(self.name, int(a.values["dim"]))

    def call_source(self, a: Bound, args: list[str], ref: str) -> str:
        d = int(a.values["dim"])
        if self.name == "softmax":
            return f"{args[0]}.softmax(dim={d})"
        fn = "amax" if self.name == "max" else self.name
        return f"{args[0]}.{fn}(dim={d}, keepdim=True)"


for _name in ("mean", "max", "sum", "softmax"):
    register(_name)(type(f"{_name.title()}Spec", (_ReduceSpec,), {}))


# ---------------------------------------------- activations, normalisation


class _ActivationSpec(OpSpec):
    torch_name: ClassVar[str] = ""

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return getattr(_nn(), self.torch_name)()

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        return f"nn.{self.torch_name}()"


for _name in ("ReLU", "GELU", "Sigmoid"):
    register(_name)(type(f"{_name}Spec", (_ActivationSpec,), {"torch_name": _name}))


@register("DropPath")
class DropPathSpec(OpSpec):
    params = (Param("drop_prob", "0", minimum=0, integer=False),)

    def bind(self, args: dict[str, str], env: dict[str, int], exact: bool = True) -> Bound:
        bound = super().bind(args, env, exact)
        if bound.values["drop_prob"] >= 1:
            raise OpError(f"DropPath: drop_prob={bound.exprs['drop_prob']} must be below 1")
        return bound

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _modules().DropPath(float(a.values["drop_prob"]))

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        return f"DropPath({float(a.values['drop_prob'])!r})"


@register("BN")
class BNSpec(OpSpec):
    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        _rank("BN", ins[0], (2, 3, 4))
        return ins[0]

    def cost(self, a: Bound, ins: list[Shape], out: Shape) -> tuple[int, int]:
        return 2 * ins[0][1].value, 2 * numel(ins[0])

    def _cls(self, ins: list[Shape]) -> str:
        return "BatchNorm2d" if len(ins[0]) == 4 else "BatchNorm1d"

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return getattr(_nn(), self._cls(ins))(ins[0][1].value)

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        return f"nn.{self._cls(ins)}({py(ins[0][1].expr)})"


@register("LN")
class LNSpec(OpSpec):
    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        _rank("LN", x, (2, 3, 4))
        last = variables_of(x[-1].expr)
        if last & {"H", "W"} and not last & {"C", "dim"}:
            raise OpError(
                f"LN normalises the last dimension, which is spatial ({x[-1]}) in {show(x)}; "
                "move channels last first, e.g. permute(0,2,3,1)"
            )
        return x

    def cost(self, a: Bound, ins: list[Shape], out: Shape) -> tuple[int, int]:
        return 2 * ins[0][-1].value, 5 * numel(ins[0])

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _nn().LayerNorm(ins[0][-1].value)

    def ctor_source(self, a: Bound, ins: list[Shape]) -> str:
        return f"nn.LayerNorm({py(ins[0][-1].expr)})"


# ------------------------------------------------------------ tensor layout


@register("permute")
class PermuteSpec(OpSpec):
    variadic = True

    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        if sorted(a.items) != list(range(len(x))):
            raise OpError(f"permute{tuple(a.items)} is not a permutation of the {len(x)} dims of {show(x)}")
        return tuple(x[i] for i in a.items)

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _modules().Permute(a.items)

    def call_source(self, a: Bound, args: list[str], ref: str) -> str:
        return f"{args[0]}.permute({', '.join(map(str, a.items))})"


class _SizesSpec(OpSpec):
    """reshape/repeat: sizes are expressions, evaluated again at run time (B may change)."""

    variadic = True

    def module(self, a: Bound, ins: list[Shape], env: dict[str, int]) -> nn.Module:
        return _modules().Shaped(self.name, a.item_exprs, env, a.exact)

    def call_source(self, a: Bound, args: list[str], ref: str) -> str:
        return f"{args[0]}.{self.name}({', '.join(py(e) for e in a.item_exprs)})"


@register("reshape")
class ReshapeSpec(_SizesSpec):
    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        if a.items.count(-1) > 1:
            raise OpError("reshape: at most one size may be -1")
        if any(v == 0 or v < -1 for v in a.items):
            raise OpError(f"reshape{tuple(a.items)}: sizes must be positive (or one -1)")
        total = numel(x)
        known = math.prod(v for v in a.items if v != -1)
        dims = [Dim(v, e) for v, e in zip(a.items, a.item_exprs)]
        if -1 in a.items:
            if total % known:
                raise OpError(f"reshape{tuple(a.item_exprs)}: {total} elements of {show(x)} do not divide into sizes {known}")
            i = a.items.index(-1)
            num = "*".join(_wrap(d.expr) for d in x)
            den = "*".join(_wrap(d.expr) for d in dims if d.value != -1)
            dims[i] = Dim(total // known, f"({num})/({den})")
        elif known != total:
            raise OpError(
                f"reshape({', '.join(a.item_exprs)}) has {known} elements but its input {show(x)} has {total} "
                f"(= {show_values(x)})"
            )
        return tuple(dims)


@register("repeat")
class RepeatSpec(_SizesSpec):
    def infer(self, a: Bound, ins: list[Shape]) -> Shape:
        x = ins[0]
        if len(a.items) < len(x):
            raise OpError(f"repeat needs at least {len(x)} sizes for {show(x)}, got {len(a.items)}")
        if any(v < 1 for v in a.items):
            raise OpError(f"repeat{tuple(a.items)}: sizes must be positive")
        padded = (const(1),) * (len(a.items) - len(x)) + x
        return tuple(dim_mul(d, Dim(v, e)) for d, v, e in zip(padded, a.items, a.item_exprs))


# NADER's glossary (Table S6); every name must be registered above.
GLOSSARY = (
    "Conv2d", "Linear", "AvgPool2d", "MaxPool2d", "AdaptiveMaxPool2d", "AdaptiveAvgPool2d",
    "Add", "Mul", "Multiply", "concat", "mean", "max", "sum", "softmax", "ReLU", "GELU",
    "Sigmoid", "BN", "LN", "permute", "repeat", "reshape",
)

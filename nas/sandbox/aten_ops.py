"""The aten operators an exported model graph may use, and what running one costs.

The trusted process runs graph data that untrusted code wrote, so which
operators it calls is a boundary: an allow-list, not a deny-list (some aten
operators trust their arguments: `_reshape_alias` and `as_strided` take any
sizes and strides and read or write outside the tensor's memory). Listed here:
what vision models in torchvision, the NB201/NADER networks and typical
generated designs export to (torch.export's training IR), plus their close
relatives. Any overload of a listed operator is allowed, except one whose
schema writes into an argument (`out=` forms and their kin such as
`max.dim_max` or `sort.values`, whatever their names: they resize a tensor the
graph passes in); the in-place form `op_` of a listed `op` is allowed too,
writing into its `self` only. A design that needs an operator not
listed fails verification with its name: add it here after checking it bounds
its memory by its arguments' shapes.

Operators that return uninitialised memory (`empty` & co.) run zero-filled, so
no graph reads what this process's heap held before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from itertools import zip_longest
from typing import Any

import torch
from torch._dispatch.python import no_python_dispatcher
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

ALLOWED = frozenset("""
abs absolute acos acosh add addcdiv addcmul asin asinh atan atan2 atanh bitwise_and bitwise_not bitwise_or
bitwise_xor ceil clamp clamp_max clamp_min clip copysign cos cosh div divide eq erf erfc erfinv exp exp2 expm1
fix floor floor_divide fmax fmin fmod frac ge greater greater_equal gt heaviside hypot isfinite isinf isnan le
lerp less less_equal log log10 log1p log2 logaddexp logical_and logical_not logical_or logical_xor lt maximum
minimum mul multiply nan_to_num ne neg negative not_equal pow reciprocal remainder round rsqrt sgn sign sin sinh
sqrt square sub subtract tan tanh true_divide trunc where xlogy masked_fill
relu relu6 leaky_relu elu selu celu gelu silu mish hardswish hardsigmoid hardtanh sigmoid softplus softsign
tanhshrink threshold prelu glu logsigmoid hardshrink softshrink log_softmax softmax
sum mean amax amin max min argmax argmin aminmax prod std var std_mean var_mean norm linalg_vector_norm
logsumexp cumsum cumprod all any count_nonzero topk sort argsort
matmul mm bmm addmm addmv mv baddbmm addbmm dot outer linear bilinear einsum scaled_dot_product_attention
conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution
avg_pool1d avg_pool2d avg_pool3d max_pool1d max_pool2d max_pool3d max_pool2d_with_indices
adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d
pixel_shuffle pixel_unshuffle channel_shuffle upsample_nearest1d upsample_nearest2d upsample_bilinear2d
upsample_bicubic2d upsample_linear1d grid_sampler grid_sampler_2d affine_grid_generator
batch_norm layer_norm group_norm instance_norm rms_norm native_batch_norm native_layer_norm native_group_norm
_native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
dropout feature_dropout alpha_dropout feature_alpha_dropout native_dropout bernoulli rand rand_like randn
randn_like randint randint_like normal uniform
view reshape flatten unflatten squeeze unsqueeze permute transpose t expand expand_as repeat repeat_interleave
tile contiguous clone cat concat concatenate stack hstack vstack split split_with_sizes chunk tensor_split
unbind narrow select slice index index_select gather take_along_dim flip roll rot90 movedim moveaxis swapaxes
swapdims diagonal diag_embed tril triu view_as reshape_as alias detach lift_fresh lift_fresh_copy _to_copy to
type_as copy fill zero constant_pad_nd pad reflection_pad1d reflection_pad2d replication_pad1d replication_pad2d
one_hot embedding arange linspace zeros zeros_like ones ones_like full full_like new_zeros new_ones new_full
scalar_tensor eye broadcast_to scatter scatter_add scatter_reduce index_add index_copy index_fill index_put
sym_size sym_numel sym_stride sym_storage_offset item _local_scalar_dense _assert_tensor_metadata
_assert_scalar sym_constrain_range sym_constrain_range_for_size
empty empty_like new_empty empty_strided new_empty_strided empty_permuted
""".split())

_UNINITIALISED = frozenset({"empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided",
                            "empty_permuted"})


def allowed(op: str, overload: str) -> bool:
    """Whether `aten.<op>.<overload>` exists and may appear in a graph (see the module docstring):
    decided by its schema's mutable arguments, not its name."""
    if not (op in ALLOWED or (op.endswith("_") and op[:-1] in ALLOWED)):
        return False
    fn = getattr(getattr(torch.ops.aten, op, None), overload, None)
    if not isinstance(fn, torch._ops.OpOverload):
        return False
    return not any(a.alias_info is not None and a.alias_info.is_write and not (op.endswith("_") and a.name == "self")
                   for a in fn._schema.arguments)


def zero_filled(fn: Any) -> Any:
    """`fn` (an allowed operator) as the graph runs it: the `empty` family zero-fills its result."""
    if fn.__name__.split(".")[0] not in _UNINITIALISED:
        return fn

    def run(*args: Any, **kwargs: Any) -> torch.Tensor:
        return fn(*args, **kwargs).zero_()

    run.__name__ = f"{fn.__name__} (zero-filled)"
    return run


# Tensors one splitting operator may return: each is a Python object the run makes and dispatches
# (`tensor_split` into that many slices), a cost its elements do not show (`unbind` of a meta tensor
# of 10**7 rows costs minutes and gigabytes while counting 10**7 units of work).
MAX_PIECES = 4096
_SPLITTING = frozenset({"unbind", "split", "split_with_sizes", "chunk", "tensor_split"})


def pieces(func: Any, args: tuple, kwargs: dict) -> int:
    """How many tensors a call of `func` returns at most, from its arguments, before it runs: a
    splitting operator's (`_SPLITTING`) count by its sizes, sections or the length of its split
    dimension; 1 for any other operator."""
    name = getattr(getattr(func, "overloadpacket", None), "__name__", None)
    if name not in _SPLITTING or not args or not isinstance(args[0], torch.Tensor):
        return 1
    shape = list(args[0].shape)
    dim = _arg(func, args, kwargs, "dim")
    length = shape[dim] if type(dim) is int and -len(shape) <= dim < len(shape) else 1
    if name == "unbind":
        return length
    if name == "chunk":
        return max(1, _arg(func, args, kwargs, "chunks") or 1)
    for field in ("split_size", "split_sizes", "sections", "indices", "tensor_indices_or_sections"):
        value = _arg(func, args, kwargs, field)
        if isinstance(value, (list, tuple)):
            return len(value) + (field == "indices")
        if isinstance(value, torch.Tensor):  # tensor_split by a tensor: its indices; sections in a scalar
            return value.numel() + 1 if value.dim() else MAX_PIECES + 1  # are unknown on the meta device
        if type(value) is int:
            return -(-length // value) if field == "split_size" and value > 0 else max(1, value)
    return 1


def _shape(value: Any) -> list[int]:
    return list(value.shape) if isinstance(value, torch.Tensor) else []


def _first(value: Any) -> torch.Tensor:
    """The first tensor of an operator's output (a pool's values, not its indices)."""
    return next(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def _arg(func: Any, args: tuple, kwargs: dict, name: str) -> Any:
    """Argument `name` of a call of `func`, positional or keyword, else its schema's default."""
    for i, spec in enumerate(func._schema.arguments):
        if spec.name == name:
            if i < len(args) and not spec.kwarg_only:
                return args[i]
            return kwargs.get(name, spec.default_value if spec.has_default_value() else None)
    return None


def _spatial(name: str) -> int:
    """Spatial dimensions of a pool, from its name (`max_pool2d_with_indices` -> 2): each pool `_COSTS`
    lists is named for its 1, 2 or 3 dimensions."""
    return int(re.findall(r"([123])d", name)[-1])


def _pool(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Each output element reads its window: kernel area x output (a 1023-wide max pool is ~10^6
    times its output, not its input)."""
    kernel = list(_arg(func, args, kwargs, "kernel_size"))  # no pool's kernel_size has a default
    dims = _spatial(func.overloadpacket.__name__)
    return _first(out).numel() * math.prod(kernel * dims if len(kernel) == 1 else kernel)


def _adaptive(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """An adaptive pool's window per dimension spans ceil(in / out) inputs, one more where the
    windows overlap: window area x output."""
    sizes, result = _shape(args[0]), _first(out)
    dims = _spatial(func.overloadpacket.__name__)
    area = 1
    for n, m in zip(sizes[-dims:], list(result.shape)[-dims:]):
        area *= -(-n // max(m, 1)) + (n % max(m, 1) != 0)
    return result.numel() * area


# Inputs each output element of an interpolation reads.
_TAPS = {"nearest": 1, "linear": 2, "bilinear": 4, "bicubic": 16, "trilinear": 8}


def _interpolation(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    name = func.overloadpacket.__name__
    taps = next((n for kind, n in sorted(_TAPS.items(), key=lambda kv: -len(kv[0])) if kind in name), 16)
    if "_aa" in name:  # antialiased: the taps grow with the downscaling factor
        taps *= max(1, -(-math.prod(_shape(args[0])) // max(1, _first(out).numel())))
    return max(math.prod(_shape(args[0])), _first(out).numel() * taps)


def _grid_sample(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Output x the taps of its mode (0 bilinear, 1 nearest, 2 bicubic), plus reading input and grid."""
    taps = {0: 4, 1: 1}.get(_arg(func, args, kwargs, "interpolation_mode"), 16)
    return max(math.prod(_shape(args[0])) + math.prod(_shape(args[1])), _first(out).numel() * taps)


def _sort(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """A comparison sort of n values along `dim`: n log2 n, for every slice (topk too: it may sort)."""
    sizes = _shape(args[0])
    dim = _arg(func, args, kwargs, "dim")
    n = sizes[dim if isinstance(dim, int) else -1] if sizes else 1
    return max(1, math.prod(sizes)) * max(1, math.ceil(math.log2(max(n, 2))))


def _mv(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """mv / addmv: the matrix's elements (the matrix is the first operand of mv, the second of addmv)."""
    return math.prod(_shape(args[0] if func.overloadpacket.__name__ == "mv" else args[1]))


def _dot(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    return math.prod(_shape(args[0]))


def _addbmm(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """addbmm(input, b1 [b, n, k], b2 [b, k, m]): b n k m."""
    b, n, k = _shape(args[1])
    return b * n * k * _shape(args[2])[-1]


def _trilinear(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """`bilinear`'s kernel: the three operands, unsqueezed as it says, broadcast to one product."""
    shapes = []
    for tensor, expand in zip(args[:3], args[3:6], strict=True):
        shape = _shape(tensor)
        for d in sorted(expand):
            shape.insert(d, 1)
        shapes.append(shape)
    return math.prod(max(sizes) for sizes in zip_longest(*shapes, fillvalue=1))


# Work outside products whose cost is not the elements it reads or writes (operator name ->
# formula; names as the dispatcher sees them, after composite operators decompose).
_COSTS: dict[str, Callable[..., int]] = {
    **{f"{kind}_pool{d}d{suffix}": _pool for kind in ("max", "avg") for d in (1, 2, 3)
       for suffix in ("", "_with_indices")},
    **{f"{prefix}adaptive_{kind}_pool{d}d": _adaptive for prefix in ("", "_") for kind in ("max", "avg")
       for d in (1, 2, 3)},
    **{name: _interpolation for name in (
        "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
        "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
        "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa")},
    "grid_sampler_2d": _grid_sample, "grid_sampler_3d": _grid_sample,
    "sort": _sort, "topk": _sort, "argsort": _sort, "msort": _sort,
}
# Operators slower per counted unit than the rest on CPU (a transcendental function, a random draw, a
# masked select, a sort's comparison), by about this factor: `benchmarks/results/op_costs.json`. Their
# work counts this many times over in `WorkCounter.total` (`slow`), not in `other`: the FLOPs check
# compares work outside products with FLOPs, not with time.
_WEIGHTS = {
    **dict.fromkeys(("asinh", "acosh", "sinh", "cosh"), 64),
    "bernoulli": 32,
    **dict.fromkeys(("native_dropout", "sort", "topk", "var_mean", "std_mean", "mish"), 16),
    **dict.fromkeys(("normal", "randn", "randn_like", "uniform", "affine_grid_generator", "diag_embed",
                     "adaptive_max_pool2d"), 8),
    **dict.fromkeys(("max_pool2d_with_indices", "max_pool3d_with_indices", "rand", "rand_like", "randint", "randint_like",
                     "masked_fill", "tanh", "alpha_dropout", "where", "atan", "pixel_shuffle", "aminmax",
                     "upsample_nearest2d", "erfinv", "native_batch_norm", "_native_batch_norm_legit",
                     "_native_batch_norm_legit_functional", "batch_norm", "max_pool2d"), 4),
    **dict.fromkeys(("erf", "erfc", "tan", "acos", "asin", "atanh", "cos", "sin", "pow", "expm1", "log", "log2",
                     "log10", "xlogy", "softplus", "logsumexp", "floor_divide", "pixel_unshuffle", "cumsum",
                     "cumprod", "upsample_bicubic2d", "grid_sampler_2d", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d"), 2)}
# What a transposed convolution's traffic counts, over its elements: it scatters each product into
# its output (`col2im`), many times slower per element than a convolution reads.
_TRANSPOSED_TRAFFIC = 32
# Operators fvcore counts as FLOPs besides products (`nas.measure`), at most this many per element of
# their input or output (its handles: a normalisation 5 per input element, bilinear upsampling and grid
# sampling 4 per output element, an adaptive average pool 1 per input element).
_FVCORE_ELEMENTWISE = {
    **dict.fromkeys(("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
                     "_native_batch_norm_legit_functional", "batch_norm", "native_layer_norm", "layer_norm",
                     "native_group_norm", "group_norm", "instance_norm"), 5),
    **dict.fromkeys(("upsample_nearest2d", "upsample_bilinear2d", "grid_sampler_2d", "_adaptive_avg_pool2d",
                     "adaptive_avg_pool2d"), 4)}
# Products torch's FLOP formulas (`flop_registry`) do not cover: multiply-accumulates.
_PRODUCTS: dict[str, Callable[..., int]] = {"mv": _mv, "addmv": _mv, "dot": _dot, "vdot": _dot,
                                            "addbmm": _addbmm, "_trilinear": _trilinear}


class WorkCounter(TorchDispatchMode):
    """Counts what a forward pass costs, as it runs on the meta device (nothing is computed; an
    operator asked for another device is refused before it runs), per operator as the dispatcher
    runs it (composite operators such as `matmul`, `einsum` or `linear` as what they decompose to).
    `macs`: multiply-accumulates of convolutions and matrix products (torch's own FLOP formulas,
    halved; `_PRODUCTS` for those it has none for; `scaled_dot_product_attention` as the two batched
    products its math kernel, the one the meta device picks, decomposes to); `traffic`: the elements those
    products read and write (a transposed convolution with a large stride writes far more than it
    multiplies); `other`: every other operator's work, by its formula in `_COSTS` (a pool's window
    times its output, n log n for a sort, an interpolation's taps) or else the larger of the
    elements it reads and writes, so a view that pretends to be huge (`expand`) counts as huge.
    `slow`: what the operators slower per unit than the rest (`_WEIGHTS`, transposed convolutions)
    add to that for `total`. `fvcore_bound`: at least what fvcore counts as FLOPs (`nas.measure`),
    on shapes: `macs` plus `_FVCORE_ELEMENTWISE`. `benchmarks/op_costs.py` times each allowed
    operator against `total`."""

    def __init__(self) -> None:
        super().__init__()
        self.macs = 0
        self.traffic = 0
        self.other = 0
        self.slow = 0
        self.fvcore_bound = 0

    def __enter__(self) -> WorkCounter:
        # The same count whatever this process ran before: under the Python dispatcher (entered by
        # torch.export and make_fx, and left on by a trace that never unwound) interpolations run
        # their Python decompositions, so a bilinear upsample would count as its pieces.
        self._dispatcher = no_python_dispatcher()
        self._dispatcher.__enter__()
        try:
            super().__enter__()
        except BaseException:
            self._dispatcher.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._dispatcher.__exit__(None, None, None)

    @property
    def total(self) -> int:
        """All the work counted: what `MAX_WORK` bounds."""
        return self.macs + self.traffic + self.other + self.slow

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]

        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if device is None and any(a.name == "device" for a in func._schema.arguments):
            kwargs["device"] = device = torch.device("meta")  # a factory without a device: the input's
        if (device is not None and torch.device(device).type != "meta") or any(
                t.device.type != "meta" for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)):
            # a device named in the graph would make the dry run compute for real
            raise ValueError(f"{func} names a device other than its input's ({device})")
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        name = packet.__name__
        elements = max(sum(t.numel() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)),
                       sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor)))
        if packet in flop_registry or name in _PRODUCTS:
            macs = (int(flop_registry[packet](*args, **kwargs, out_val=out)) // 2 if packet in flop_registry
                    else _PRODUCTS[name](func, args, kwargs, out))
            self.macs += macs
            self.fvcore_bound += macs
            self.traffic += elements
            if name == "convolution" and _arg(func, args, kwargs, "transposed"):
                self.slow += (_TRANSPOSED_TRAFFIC - 1) * elements
        else:
            work = max(elements, _COSTS[name](func, args, kwargs, out)) if name in _COSTS else elements
            self.other += work
            self.slow += (_WEIGHTS.get(name.rstrip("_"), 1) - 1) * work  # in place (`bernoulli_`) too
            self.fvcore_bound += _FVCORE_ELEMENTWISE.get(name, 0) * elements
        return out

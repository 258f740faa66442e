"""Every allowed aten operator, timed on CPU against the work `WorkCounter` charges it -> JSON.

The dry run bounds a graph's compute by counted work (`nas.sandbox.aten_ops.WorkCounter`: products
by their multiply-accumulates, pools by window x output, sorts by n log n, the rest by elements read
or written); this process then computes what it counted. An operator whose seconds per counted unit
lie far above the others' is undercounted: a graph could ask for more compute than its count says.
Each operator runs on small representative shapes (about a million elements; the heavy cases of the
formulas with large windows, long sorts, strided transposed and dilated convolutions), one thread,
best of a few repeats; its work is counted on meta copies of the same arguments. The JSON has each
case's seconds per unit and its ratio to the median; `within` says whether it is at most FACTOR
times the median (below the median is overcounting, which costs nothing but a stricter bound).
Operators slower per element than the rest carry a weight in the count (`aten_ops._WEIGHTS`) set
from this table.

    python benchmarks/op_costs.py    # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json  # noqa: E402
from nas.sandbox.aten_ops import ALLOWED, WorkCounter  # noqa: E402

FACTOR = 10  # a case within FACTOR x the median seconds per unit is counted well enough
REPEATS = 5
# A case counted at fewer units (a view of a contiguous tensor, a scalar) costs the call's overhead, a
# few microseconds whatever its size: bounded by the graph's node count (MAX_NODES), not judged here.
MIN_UNITS = 4096
# Operators that take or return no tensor work (sizes, asserts, scalars): nothing to time.
NO_WORK = frozenset({"sym_size", "sym_numel", "sym_stride", "sym_storage_offset", "item", "_local_scalar_dense",
                     "_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range",
                     "sym_constrain_range_for_size"})
UNARY = """abs absolute ceil cos cosh erf erfc exp exp2 expm1 fix floor frac neg negative reciprocal round rsqrt sgn
sign sin sinh sqrt square tan tanh trunc relu relu6 leaky_relu elu selu celu gelu silu mish hardswish hardsigmoid
hardtanh sigmoid softplus softsign tanhshrink logsigmoid hardshrink softshrink isfinite isinf isnan nan_to_num
log log10 log1p log2 acos asin atan atanh erfinv asinh clone contiguous detach alias lift_fresh lift_fresh_copy
zero bernoulli rand_like randn_like zeros_like ones_like empty_like logical_not flatten t""".split()
BINARY = """add atan2 copysign div divide eq floor_divide fmax fmin fmod ge greater greater_equal gt heaviside hypot le
less less_equal logaddexp logical_and logical_or logical_xor lt maximum minimum mul multiply ne not_equal pow
remainder sub subtract true_divide xlogy""".split()
REDUCE = "sum mean amax amin argmax argmin prod std var std_mean var_mean logsumexp cumsum cumprod".split()
INTEGER = "bitwise_and bitwise_or bitwise_xor".split()
ELEMENTS = 1 << 20


def x(*shape: int, low: float = 0.1, high: float = 0.9) -> torch.Tensor:
    return torch.rand(shape) * (high - low) + low


def img(n: int = 8, c: int = 16, s: int = 64) -> torch.Tensor:
    return x(n, c, s, s)


def cases() -> dict[str, Callable[[], tuple[Any, tuple, dict]]]:
    """Case name -> a builder of (aten operator or callable, args, kwargs); several cases per
    operator where its formula has a heavy end (a large window, a long sort)."""
    aten = torch.ops.aten
    flat, m = x(ELEMENTS), x(1024, 1024)
    out: dict[str, Callable[[], tuple[Any, tuple, dict]]] = {}
    for name in UNARY:
        out[name] = lambda name=name: (getattr(aten, name), (x(ELEMENTS) if name != "t" else x(1024, 1024),), {})
    out["acosh"] = lambda: (aten.acosh, (x(ELEMENTS, low=1.1, high=2.0),), {})
    for name in BINARY:
        out[name] = lambda name=name: (getattr(aten, name), (x(ELEMENTS), x(ELEMENTS)), {})
    for name in INTEGER:
        out[name] = lambda name=name: (getattr(aten, name), (torch.randint(0, 99, (ELEMENTS,)),) * 2, {})
    out["bitwise_not"] = lambda: (aten.bitwise_not, (torch.randint(0, 99, (ELEMENTS,)),), {})
    for name in REDUCE:
        out[name] = lambda name=name: (getattr(aten, name), (m, 1), {})
    out.update({
        "max": lambda: (aten.max, (m, 1), {}), "min": lambda: (aten.min, (m, 1), {}),
        "aminmax": lambda: (aten.aminmax, (m,), {"dim": 1}), "norm": lambda: (aten.norm, (m,), {}),
        "linalg_vector_norm": lambda: (aten.linalg_vector_norm, (m,), {}),
        "all": lambda: (aten.all, (m > 0.5,), {}), "any": lambda: (aten.any, (m > 2,), {}),
        "count_nonzero": lambda: (aten.count_nonzero, (m,), {}),
        "sort": lambda: (aten.sort, (m, 1), {}), "sort (2^20 long)": lambda: (aten.sort, (flat,), {}),
        "argsort": lambda: (aten.argsort, (m, 1), {}), "topk": lambda: (aten.topk, (m, 8, 1), {}),
        "topk (2^20 long, k=1)": lambda: (aten.topk, (flat, 1), {}),
        "clamp": lambda: (aten.clamp, (flat, 0.2, 0.8), {}), "clip": lambda: (aten.clip, (flat, 0.2, 0.8), {}),
        "clamp_max": lambda: (aten.clamp_max, (flat, 0.5), {}), "clamp_min": lambda: (aten.clamp_min, (flat, 0.5), {}),
        "addcdiv": lambda: (aten.addcdiv, (flat, flat, x(ELEMENTS)), {}),
        "addcmul": lambda: (aten.addcmul, (flat, flat, flat), {}),
        "lerp": lambda: (aten.lerp, (flat, x(ELEMENTS), 0.3), {}),
        "where": lambda: (aten.where, (flat > 0.5, flat, x(ELEMENTS)), {}),
        "masked_fill": lambda: (aten.masked_fill, (flat, flat > 0.5, 0.0), {}),
        "threshold": lambda: (aten.threshold, (flat, 0.5, 0.0), {}),
        "prelu": lambda: (aten.prelu, (img(), x(16)), {}), "glu": lambda: (aten.glu, (x(1024, 1024), 1), {}),
        "softmax": lambda: (aten.softmax, (m, 1), {}), "log_softmax": lambda: (aten.log_softmax, (m, 1), {}),
        # products
        "matmul": lambda: (aten.matmul, (x(256, 256), x(256, 256)), {}),
        "mm": lambda: (aten.mm, (x(256, 256), x(256, 256)), {}),
        "bmm": lambda: (aten.bmm, (x(8, 128, 128), x(8, 128, 128)), {}),
        "addmm": lambda: (aten.addmm, (x(256), x(256, 256), x(256, 256)), {}),
        "addmv": lambda: (aten.addmv, (x(1024), m, x(1024)), {}), "mv": lambda: (aten.mv, (m, x(1024)), {}),
        "baddbmm": lambda: (aten.baddbmm, (x(8, 128, 128), x(8, 128, 128), x(8, 128, 128)), {}),
        "addbmm": lambda: (aten.addbmm, (x(128, 128), x(8, 128, 128), x(8, 128, 128)), {}),
        "addbmm (expanded)": lambda: (aten.addbmm, (x(128, 128), x(1, 128, 128).expand(16, 128, 128),
                                                     x(1, 128, 128).expand(16, 128, 128)), {}),
        "dot": lambda: (aten.dot, (flat, flat), {}), "outer": lambda: (aten.outer, (x(1024), x(1024)), {}),
        "linear": lambda: (aten.linear, (x(256, 256), x(256, 256)), {}),
        "bilinear": lambda: (aten.bilinear, (x(64, 32), x(64, 32), x(16, 32, 32)), {}),
        "einsum": lambda: (aten.einsum, ("bij,bjk->bik", [x(8, 128, 128), x(8, 128, 128)]), {}),
        "einsum (outer)": lambda: (aten.einsum, ("i,j->ij", [x(1024), x(1024)]), {}),
        "scaled_dot_product_attention": lambda: (aten.scaled_dot_product_attention,
                                                 (x(4, 4, 128, 32), x(4, 4, 128, 32), x(4, 4, 128, 32)), {}),
        # convolutions
        "conv1d": lambda: (aten.conv1d, (x(8, 16, 4096), x(16, 16, 3)), {}),
        "conv2d": lambda: (aten.conv2d, (img(), x(16, 16, 3, 3)), {}),
        "conv2d (dilated 8)": lambda: (aten.conv2d, (img(), x(16, 16, 3, 3), None, [1, 1], [8, 8], [8, 8]), {}),
        "conv2d (grouped 4)": lambda: (aten.conv2d, (img(), x(16, 4, 3, 3), None, [1, 1], [1, 1], [1, 1], 4), {}),
        "conv2d (depthwise)": lambda: (aten.conv2d, (img(), x(16, 1, 3, 3), None, [1, 1], [1, 1], [1, 1], 16), {}),
        "conv2d (depthwise 31x31)": lambda: (aten.conv2d, (img(), x(16, 1, 31, 31), None, [1, 1], [15, 15],
                                                            [1, 1], 16), {}),
        "conv3d": lambda: (aten.conv3d, (x(2, 8, 32, 32, 32), x(8, 8, 3, 3, 3)), {}),
        "conv_transpose1d": lambda: (aten.conv_transpose1d, (x(8, 16, 4096), x(16, 16, 3)), {}),
        "conv_transpose2d": lambda: (aten.conv_transpose2d, (img(), x(16, 16, 3, 3)), {}),
        "conv_transpose2d (stride 64)": lambda: (aten.conv_transpose2d, (x(2, 4, 8, 8), x(4, 4, 1, 1), None, [64, 64]),
                                                 {}),
        "conv_transpose3d": lambda: (aten.conv_transpose3d, (x(2, 8, 16, 16, 16), x(8, 8, 3, 3, 3)), {}),
        "convolution": lambda: (aten.convolution, (img(), x(16, 16, 3, 3), None, [1, 1], [1, 1], [1, 1], False,
                                                   [0, 0], 1), {}),
        # pools
        "avg_pool1d": lambda: (aten.avg_pool1d, (x(8, 16, 8192), [3]), {}),
        "avg_pool2d": lambda: (aten.avg_pool2d, (img(), [3, 3]), {}),
        "avg_pool2d (63x63, stride 1)": lambda: (aten.avg_pool2d, (img(2, 4), [63, 63], [1, 1], [31, 31]), {}),
        "avg_pool3d": lambda: (aten.avg_pool3d, (x(2, 8, 32, 32, 32), [3, 3, 3]), {}),
        "max_pool1d": lambda: (aten.max_pool1d, (x(8, 16, 8192), [3]), {}),
        "max_pool2d": lambda: (aten.max_pool2d, (img(), [3, 3]), {}),
        "max_pool2d (63x63, stride 1)": lambda: (aten.max_pool2d, (img(2, 4), [63, 63], [1, 1], [31, 31]), {}),
        "max_pool3d": lambda: (aten.max_pool3d, (x(2, 8, 32, 32, 32), [3, 3, 3]), {}),
        "max_pool2d_with_indices": lambda: (aten.max_pool2d_with_indices, (img(), [3, 3]), {}),
        "adaptive_avg_pool1d": lambda: (aten.adaptive_avg_pool1d, (x(8, 16, 8192), [7]), {}),
        "adaptive_avg_pool2d": lambda: (aten.adaptive_avg_pool2d, (img(), [7, 7]), {}),
        "adaptive_avg_pool2d (63 of 64)": lambda: (aten.adaptive_avg_pool2d, (img(), [63, 63]), {}),
        "adaptive_avg_pool3d": lambda: (aten.adaptive_avg_pool3d, (x(2, 8, 32, 32, 32), [3, 3, 3]), {}),
        "adaptive_max_pool1d": lambda: (aten.adaptive_max_pool1d, (x(8, 16, 8192), [7]), {}),
        "adaptive_max_pool2d": lambda: (aten.adaptive_max_pool2d, (img(), [7, 7]), {}),
        "adaptive_max_pool2d (63 of 64)": lambda: (aten.adaptive_max_pool2d, (img(), [63, 63]), {}),
        # interpolation, shuffles, sampling
        "upsample_nearest1d": lambda: (aten.upsample_nearest1d, (x(8, 16, 4096), [8192]), {}),
        "upsample_nearest2d": lambda: (aten.upsample_nearest2d, (img(), [128, 128]), {}),
        "upsample_linear1d": lambda: (aten.upsample_linear1d, (x(8, 16, 4096), [8192], False), {}),
        "upsample_bilinear2d": lambda: (aten.upsample_bilinear2d, (img(), [128, 128], False), {}),
        "upsample_bicubic2d": lambda: (aten.upsample_bicubic2d, (img(), [128, 128], False), {}),
        "pixel_shuffle": lambda: (aten.pixel_shuffle, (img(), 2), {}),
        "pixel_unshuffle": lambda: (aten.pixel_unshuffle, (img(), 2), {}),
        "channel_shuffle": lambda: (aten.channel_shuffle, (img(), 4), {}),
        "grid_sampler": lambda: (aten.grid_sampler, (img(), x(8, 64, 64, 2), 0, 0, False), {}),
        "grid_sampler_2d": lambda: (aten.grid_sampler_2d, (img(), x(8, 64, 64, 2), 0, 0, False), {}),
        "grid_sampler_2d (bicubic)": lambda: (aten.grid_sampler_2d, (img(), x(8, 64, 64, 2), 2, 0, False), {}),
        "affine_grid_generator": lambda: (aten.affine_grid_generator, (x(8, 2, 3), [8, 16, 128, 128], False), {}),
        # normalisation
        "batch_norm": lambda: (aten.batch_norm, (img(), x(16), x(16), x(16), x(16), True, 0.1, 1e-5, False), {}),
        "native_batch_norm": lambda: (aten.native_batch_norm, (img(), x(16), x(16), x(16), x(16), True, 0.1, 1e-5),
                                      {}),
        "_native_batch_norm_legit": lambda: (aten._native_batch_norm_legit,
                                             (img(), x(16), x(16), x(16), x(16), True, 0.1, 1e-5), {}),
        "_native_batch_norm_legit_no_training": lambda: (aten._native_batch_norm_legit_no_training,
                                                         (img(), x(16), x(16), x(16), x(16), 0.1, 1e-5), {}),
        "_native_batch_norm_legit_functional": lambda: (aten._native_batch_norm_legit_functional,
                                                        (img(), x(16), x(16), x(16), x(16), True, 0.1, 1e-5), {}),
        "layer_norm": lambda: (aten.layer_norm, (m, [1024]), {}),
        "native_layer_norm": lambda: (aten.native_layer_norm, (m, [1024], x(1024), x(1024), 1e-5), {}),
        "group_norm": lambda: (aten.group_norm, (img(), 4), {}),
        "native_group_norm": lambda: (aten.native_group_norm, (img(), x(16), x(16), 8, 16, 4096, 4, 1e-5), {}),
        "instance_norm": lambda: (aten.instance_norm, (img(), None, None, None, None, True, 0.1, 1e-5, False), {}),
        "rms_norm": lambda: (aten.rms_norm, (m, [1024]), {}),
        # random
        "dropout": lambda: (aten.dropout, (flat, 0.5, True), {}),
        "feature_dropout": lambda: (aten.feature_dropout, (img(), 0.5, True), {}),
        "alpha_dropout": lambda: (aten.alpha_dropout, (flat, 0.5, True), {}),
        "feature_alpha_dropout": lambda: (aten.feature_alpha_dropout, (img(), 0.5, True), {}),
        "native_dropout": lambda: (aten.native_dropout, (flat, 0.5, True), {}),
        "rand": lambda: (aten.rand, ([ELEMENTS],), {}), "randn": lambda: (aten.randn, ([ELEMENTS],), {}),
        "randint": lambda: (aten.randint, (9, [ELEMENTS]), {}),
        "randint_like": lambda: (aten.randint_like, (flat, 9), {}),
        "normal": lambda: (aten.normal, (flat,), {}), "uniform": lambda: (aten.uniform, (flat,), {}),
        # layout, views, copies
        "view": lambda: (aten.view, (flat, [1024, 1024]), {}), "reshape": lambda: (aten.reshape, (flat, [1024, 1024]), {}),
        "unflatten": lambda: (aten.unflatten, (flat, 0, [1024, 1024]), {}),
        "squeeze": lambda: (aten.squeeze, (x(1, ELEMENTS),), {}), "unsqueeze": lambda: (aten.unsqueeze, (flat, 0), {}),
        "permute": lambda: (aten.permute, (img(), [0, 2, 3, 1]), {}), "transpose": lambda: (aten.transpose, (m, 0, 1), {}),
        "expand": lambda: (aten.expand, (x(1, 1024), [1024, 1024]), {}),
        "expand_as": lambda: (aten.expand_as, (x(1, 1024), m), {}),
        "broadcast_to": lambda: (aten.broadcast_to, (x(1, 1024), [1024, 1024]), {}),
        "repeat": lambda: (aten.repeat, (x(1, 1024), [1024, 1]), {}), "tile": lambda: (aten.tile, (x(1, 1024), [1024, 1]), {}),
        "repeat_interleave": lambda: (aten.repeat_interleave, (x(1024, 1024), 2, 0), {}),
        "cat": lambda: (aten.cat, ([m, m],), {}), "concat": lambda: (aten.concat, ([m, m],), {}),
        "concatenate": lambda: (aten.concatenate, ([m, m],), {}), "stack": lambda: (aten.stack, ([m, m],), {}),
        "hstack": lambda: (aten.hstack, ([m, m],), {}), "vstack": lambda: (aten.vstack, ([m, m],), {}),
        "split": lambda: (aten.split, (m, 256), {}), "split_with_sizes": lambda: (aten.split_with_sizes, (m, [512, 512]), {}),
        "chunk": lambda: (aten.chunk, (m, 4), {}), "tensor_split": lambda: (aten.tensor_split, (m, 4), {}),
        "unbind": lambda: (aten.unbind, (x(16, 65536),), {}), "narrow": lambda: (aten.narrow, (m, 0, 0, 512), {}),
        "select": lambda: (aten.select, (m, 0, 3), {}), "slice": lambda: (aten.slice, (m, 0, 0, 512), {}),
        "index": lambda: (aten.index, (m, [torch.randint(0, 1024, (1024,))]), {}),
        "index_select": lambda: (aten.index_select, (m, 0, torch.randint(0, 1024, (1024,))), {}),
        "gather": lambda: (aten.gather, (m, 1, torch.randint(0, 1024, (1024, 1024))), {}),
        "take_along_dim": lambda: (aten.take_along_dim, (m, torch.randint(0, 1024, (1024, 1024)), 1), {}),
        "flip": lambda: (aten.flip, (m, [0]), {}), "roll": lambda: (aten.roll, (m, [3], [1]), {}),
        "rot90": lambda: (aten.rot90, (m,), {}), "movedim": lambda: (aten.movedim, (img(), 1, 3), {}),
        "moveaxis": lambda: (aten.moveaxis, (img(), 1, 3), {}), "swapaxes": lambda: (aten.swapaxes, (m, 0, 1), {}),
        "swapdims": lambda: (aten.swapdims, (m, 0, 1), {}), "diagonal": lambda: (aten.diagonal, (m,), {}),
        "diag_embed": lambda: (aten.diag_embed, (x(64, 1024),), {}), "tril": lambda: (aten.tril, (m,), {}),
        "triu": lambda: (aten.triu, (m,), {}), "view_as": lambda: (aten.view_as, (flat, m), {}),
        "reshape_as": lambda: (aten.reshape_as, (flat, m), {}),
        "_to_copy": lambda: (aten._to_copy, (flat,), {"dtype": torch.float64}),
        "to": lambda: (aten.to, (flat, torch.float64), {}), "type_as": lambda: (aten.type_as, (flat, flat.double()), {}),
        "copy": lambda: (aten.copy, (flat, x(ELEMENTS)), {}), "fill": lambda: (aten.fill, (flat, 0.5), {}),
        "constant_pad_nd": lambda: (aten.constant_pad_nd, (img(), [2, 2, 2, 2]), {}),
        "pad": lambda: (aten.pad, (img(), [2, 2, 2, 2]), {}),
        "reflection_pad1d": lambda: (aten.reflection_pad1d, (x(8, 16, 8192), [2, 2]), {}),
        "reflection_pad2d": lambda: (aten.reflection_pad2d, (img(), [2, 2, 2, 2]), {}),
        "replication_pad1d": lambda: (aten.replication_pad1d, (x(8, 16, 8192), [2, 2]), {}),
        "replication_pad2d": lambda: (aten.replication_pad2d, (img(), [2, 2, 2, 2]), {}),
        "one_hot": lambda: (aten.one_hot, (torch.randint(0, 16, (65536,)), 16), {}),
        "embedding": lambda: (aten.embedding, (x(1000, 64), torch.randint(0, 1000, (16384,))), {}),
        "arange": lambda: (aten.arange, (ELEMENTS,), {}), "linspace": lambda: (aten.linspace, (0, 1, ELEMENTS), {}),
        "zeros": lambda: (aten.zeros, ([ELEMENTS],), {}), "ones": lambda: (aten.ones, ([ELEMENTS],), {}),
        "full": lambda: (aten.full, ([ELEMENTS], 0.5), {}), "full_like": lambda: (aten.full_like, (flat, 0.5), {}),
        "new_zeros": lambda: (aten.new_zeros, (flat, [ELEMENTS]), {}),
        "new_ones": lambda: (aten.new_ones, (flat, [ELEMENTS]), {}),
        "new_full": lambda: (aten.new_full, (flat, [ELEMENTS], 0.5), {}),
        "scalar_tensor": lambda: (aten.scalar_tensor, (0.5,), {}), "eye": lambda: (aten.eye, (1024,), {}),
        "empty": lambda: (aten.empty, ([ELEMENTS],), {}), "new_empty": lambda: (aten.new_empty, (flat, [ELEMENTS]), {}),
        "empty_strided": lambda: (aten.empty_strided, ([ELEMENTS], [1]), {}),
        "new_empty_strided": lambda: (aten.new_empty_strided, (flat, [ELEMENTS], [1]), {}),
        "empty_permuted": lambda: (aten.empty_permuted, ([1024, 1024], [1, 0]), {}),
        "scatter": lambda: (aten.scatter, (m, 1, torch.randint(0, 1024, (1024, 1024)), m), {}),
        "scatter_add": lambda: (aten.scatter_add, (m, 1, torch.randint(0, 1024, (1024, 1024)), m), {}),
        "scatter_reduce": lambda: (aten.scatter_reduce, (m, 1, torch.randint(0, 1024, (1024, 1024)), m, "sum"), {}),
        "index_add": lambda: (aten.index_add, (m, 0, torch.randint(0, 1024, (1024,)), m), {}),
        "index_copy": lambda: (aten.index_copy, (m, 0, torch.randperm(1024), m), {}),
        "index_fill": lambda: (aten.index_fill, (m, 0, torch.randint(0, 1024, (512,)), 0.0), {}),
        "index_put": lambda: (aten.index_put, (m, [torch.randint(0, 1024, (1024,))], x(1024, 1024)), {}),
    })
    return out


def operator_of(case: str) -> str:
    return case.split(" (")[0]


def counted(fn: Any, args: tuple, kwargs: dict) -> int:
    """The work `WorkCounter` charges for the call, on meta copies of its arguments."""
    meta = tree_map(lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v, (args, kwargs))
    with WorkCounter() as work:
        fn(*meta[0], **meta[1])
    return work.total


def seconds(fn: Any, args: tuple, kwargs: dict) -> float:
    """Best of REPEATS runs (after one warm-up)."""
    fn(*args, **kwargs)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "op_costs.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    absent = sorted(name for name in ALLOWED if not hasattr(torch.ops.aten, name))  # a graph cannot name them
    table = {case: build for case, build in cases().items() if operator_of(case) not in absent}
    missing = sorted(ALLOWED - NO_WORK - set(absent) - {operator_of(c) for c in table})
    if missing:
        raise SystemExit(f"no case for allowed operators: {', '.join(missing)}")
    rows = []
    with torch.no_grad():
        for case, build in table.items():
            fn, call_args, call_kwargs = build()
            units = counted(fn, call_args, call_kwargs)
            rows.append({"case": case, "operator": operator_of(case), "units": units,
                         "seconds": seconds(fn, call_args, call_kwargs)})
    judged = [r for r in rows if r["units"] >= MIN_UNITS]
    median = statistics.median(r["seconds"] / r["units"] for r in judged)
    for r in judged:
        r["seconds_per_unit"] = r["seconds"] / r["units"]
        r["ratio_to_median"] = round(r["seconds_per_unit"] / median, 3)
        r["within"] = r["ratio_to_median"] <= FACTOR
    outside = [r["case"] for r in judged if not r["within"]]
    overhead = [r["case"] for r in rows if r["units"] < MIN_UNITS]
    atomic_write_json(args.out, {
        "benchmark": "op_costs", "factor": FACTOR, "median_seconds_per_unit": median, "cases": len(rows),
        "operators": len({r["operator"] for r in rows}), "not_timed": sorted(NO_WORK),
        "not_aten_operators": absent, "overhead_only": overhead, "outside": outside,
        "threads": 1, "torch": torch.__version__, "machine": platform.platform(), "rows": rows})
    print(f"{len(rows)} cases, median {median:.3g} s per unit; over {FACTOR}x the median: {outside or 'none'}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""The aten operators an exported model graph may use, and what running one costs.

The trusted process runs graph data that untrusted code wrote, so which
operators it calls is a boundary: an allow-list, not a deny-list (some aten
operators trust their arguments: `_reshape_alias` and `as_strided` take any
sizes and strides and read or write outside the tensor's memory). Listed here:
what vision models in torchvision, the NB201/NADER networks and typical
generated designs export to (torch.export's training IR), plus their close
relatives. Any overload of a listed operator is allowed, except `out=`
overloads (they resize a tensor the graph passes in); the in-place form
`op_` of a listed `op` is allowed too. A design that needs an operator not
listed fails verification with its name: add it here after checking it bounds
its memory by its arguments' shapes.

Operators that return uninitialised memory (`empty` & co.) run zero-filled, so
no graph reads what this process's heap held before.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

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
    """Whether `aten.<op>.<overload>` may appear in a graph (see the module docstring)."""
    if overload == "out" or overload.endswith("_out") or overload.startswith("out"):
        return False
    return op in ALLOWED or (op.endswith("_") and op[:-1] in ALLOWED)


def zero_filled(fn: Any) -> Any:
    """`fn` (an allowed operator) as the graph runs it: the `empty` family zero-fills its result."""
    if fn.__name__.split(".")[0] not in _UNINITIALISED:
        return fn

    def run(*args: Any, **kwargs: Any) -> torch.Tensor:
        return fn(*args, **kwargs).zero_()

    run.__name__ = f"{fn.__name__} (zero-filled)"
    return run


class WorkCounter(TorchDispatchMode):
    """Counts what a forward pass costs, as it runs on the meta device (nothing is computed; an
    operator asked for another device is refused before it runs).
    `macs`: multiply-accumulates of convolutions, matrix products and attention (torch's own
    FLOP formulas, halved); `other`: for every other operator, the larger of the elements it
    reads and writes, so a view that pretends to be huge (`expand`) counts as huge."""

    def __init__(self) -> None:
        super().__init__()
        self.macs = 0
        self.other = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        from torch.utils.flop_counter import flop_registry

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
        if packet in flop_registry:
            self.macs += int(flop_registry[packet](*args, **kwargs, out_val=out)) // 2
        elif "attention" in packet.__name__:
            q, k, v = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor)][:3]
            self.macs += math.prod(q.shape[:-1]) * k.shape[-2] * (q.shape[-1] + v.shape[-1])
        else:
            read = sum(t.numel() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            wrote = sum(t.numel() for t in tree_leaves(out) if isinstance(t, torch.Tensor))
            self.other += max(read, wrote)
        return out

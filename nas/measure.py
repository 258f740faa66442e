"""Parameter and FLOP counts. FLOPs are fvcore's multiply-accumulate counts,
the convention NAS papers report as "FLOPs"."""

from __future__ import annotations

import logging
import math
import warnings

import torch
from torch import nn

from nas.sandbox.graph import FREE_CARRIED, GraphNet


def count_params(module: nn.Module) -> int:
    """Parameters; for a network rebuilt from a sandbox's graph (untrusted model source), also the
    elements of the buffers and constants it reads besides normalisation statistics, past the first
    `FREE_CARRIED` (`GraphNet.carried`): a model could otherwise hold a frozen network there,
    unseen by a parameter budget."""
    params = sum(p.numel() for p in module.parameters())
    if isinstance(module, GraphNet):
        params += max(0, sum(math.prod(shape) for shape in module.carried().values()) - FREE_CARRIED)
    return params


def count_flops(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    return flops_by_module(module, input_shape)[""]


def flops_by_module(module: nn.Module, input_shape: tuple[int, ...]) -> dict[str, int]:
    """fvcore's counts per submodule name ('' = the whole module), from one trace in eval mode."""
    with warnings.catch_warnings():  # fvcore's import calls the deprecated torch.jit.script
        warnings.simplefilter("ignore", FutureWarning)
        # lazy: fvcore's import costs ~1 s; only a count needs it
        from fvcore.nn import FlopCountAnalysis

    logging.getLogger("fvcore").setLevel(logging.ERROR)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            analysis = FlopCountAnalysis(module, torch.zeros(input_shape)).set_op_handle(**_HANDLES)
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            return {name: int(n) for name, n in analysis.by_module().items()}
    finally:
        module.train(was_training)


def _shapes(inputs: list) -> list[list[int]]:
    # lazy: fvcore's import costs ~1 s; only a count needs it
    from fvcore.nn.jit_handles import get_shape

    return [get_shape(v) or [] for v in inputs]


def _batched_products(inputs: list, outputs: list) -> int:
    """baddbmm / addbmm (input, b1 [b, n, k], b2 [b, k, m]): b*n*k*m."""
    _, (b, n, k), (_, _, m) = _shapes(inputs[:3])
    return b * n * k * m


def _matrix_vector(inputs: list, outputs: list) -> int:
    """mv (mat, vec) and addmv (input, mat, vec): the matrix's elements."""
    mat = _shapes(inputs)[0 if len(inputs) == 2 else 1]
    return math.prod(mat)


def _dot(inputs: list, outputs: list) -> int:
    return math.prod(_shapes(inputs[:1])[0])


def _attention(inputs: list, outputs: list) -> int:
    """scaled_dot_product_attention (q, k, v): q @ k^T, then the weights @ v."""
    q, k, v = _shapes(inputs[:3])
    return math.prod(q[:-1]) * k[-2] * (q[-1] + v[-1])


def _bilinear(inputs: list, outputs: list) -> int:
    """bilinear (x1, x2, weight [out, in1, in2]): in1*in2 products per output element."""
    x1, _, w = _shapes(inputs[:3])
    return math.prod(x1[:-1]) * math.prod(w)


# Products fvcore has no handle for, which a model (or an exported graph) may do its work in:
# uncounted, a network could be any size under a FLOPs constraint.
_HANDLES = {"aten::baddbmm": _batched_products, "aten::addbmm": _batched_products, "aten::mv": _matrix_vector,
            "aten::addmv": _matrix_vector, "aten::dot": _dot, "aten::scaled_dot_product_attention": _attention,
            "aten::bilinear": _bilinear}

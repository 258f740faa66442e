"""Parameter and FLOP counts. FLOPs are fvcore's multiply-accumulate counts,
the convention NAS papers report as "FLOPs"."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable

import torch
from torch import nn

# What a module of these classes holds besides its parameters, counted as parameters: nas.sandbox.graph
# registers GraphNet's when it is imported (as it must be for a GraphNet to exist), so this module
# imports nothing of the sandbox's.
EXTRA_PARAMETERS: dict[type[nn.Module], Callable[[nn.Module], int]] = {}


def count_params(module: nn.Module) -> int:
    """Parameters; for a network rebuilt from a sandbox's graph (untrusted model source), also what
    it carries besides them, in bits (`GraphNet.carried`: buffers and constants by their bytes, what
    the graphs' nodes spell, tensor shapes), past the first `FREE_BITS`, one parameter per 32 bits
    (`carried_parameters`): a model could otherwise hold a frozen network there, unseen by a
    parameter budget (`EXTRA_PARAMETERS`)."""
    params = sum(p.numel() for p in module.parameters())
    for cls, extra in EXTRA_PARAMETERS.items():
        if isinstance(module, cls):
            params += extra(module)
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


def _convolution_mode(inputs: list, outputs: list) -> int:
    """A convolution padded by name (`padding="same"` or `"valid"`): fvcore's count of a convolution,
    batch * weight elements * output positions."""
    (batch, *_), weight = _shapes(inputs[:2])
    return batch * math.prod(weight) * math.prod(_shapes(outputs[:1])[0][2:])


def _bilinear(inputs: list, outputs: list) -> int:
    """bilinear (x1, x2, weight [out, in1, in2]): in1*in2 products per output element."""
    x1, _, w = _shapes(inputs[:3])
    return math.prod(x1[:-1]) * math.prod(w)


def _einsum(inputs: list, outputs: list) -> int:
    """einsum (equation, [tensors], path): `einsum_macs`, not fvcore's own handle, which searches
    numpy's optimal contraction path (factorial in the operands: minutes a node for a graph's
    16-tensor einsums, and an array of each operand's shape allocated to do it)."""
    equation = inputs[0].toIValue()
    return einsum_macs(equation, _shapes(list(inputs[1].node().inputs())))


def einsum_macs(equation: str, shapes: list[list[int]]) -> int:
    """An einsum's multiply-accumulates, contracting left to right as torch does: per step, the
    product of the sizes of the indices its operands hold, twice that where it sums an index away,
    halved in all (numpy's count, which fvcore halves: the same number fvcore gives a one- or
    two-tensor einsum). Linear in the operands and indices."""
    terms, _, output = equation.replace(" ", "").partition("->")
    operands = terms.split(",")
    if "->" not in equation:  # implicit output: the indices named once, in order
        named = "".join(operands).replace(".", "")
        output = ("..." if "..." in terms else "") + "".join(sorted(c for c in set(named) if named.count(c) == 1))
    rank = max([len(shape) - len(term.replace("...", "")) for term, shape in zip(operands, shapes)] + [0])
    sizes: dict[str, int] = {}
    labelled = []
    for term, shape in zip(operands, shapes):
        spread = len(shape) - len(term.replace("...", ""))  # dimensions under its ellipsis
        labels = [f"...{rank - spread + i}" for i in range(spread)]
        indices = [*term.partition("...")[0], *labels, *term.partition("...")[2]] if "..." in term else [*term]
        for index, size in zip(indices, shape):  # a size of 1 broadcasts against the index's other sizes
            sizes[index] = size if sizes.get(index, 1) == 1 else sizes[index]
        labelled.append(set(indices))
    kept = set(output.replace("...", "")) | ({f"...{i}" for i in range(rank)} if "..." in output else set())
    total, held = 0, labelled[0] if labelled else set()
    for step in range(max(1, len(labelled) - 1)):
        joined = held | (labelled[step + 1] if step + 1 < len(labelled) else set())
        later = kept.union(*labelled[step + 2:])
        total += math.prod(sizes[i] for i in joined) * (1 + bool(joined - later))
        held = joined & later
    return total // 2


# Products fvcore has no handle for, which a model (or an exported graph) may do its work in:
# uncounted, a network could be any size under a FLOPs constraint; and einsum, whose handle's cost
# grows factorially with its operands (`_einsum`).
_HANDLES = {"aten::baddbmm": _batched_products, "aten::addbmm": _batched_products, "aten::mv": _matrix_vector,
            "aten::addmv": _matrix_vector, "aten::dot": _dot, "aten::scaled_dot_product_attention": _attention,
            "aten::bilinear": _bilinear, "aten::einsum": _einsum, "aten::_convolution_mode": _convolution_mode}

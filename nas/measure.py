"""Parameter and FLOP counts. FLOPs are fvcore's multiply-accumulate counts,
the convention NAS papers report as "FLOPs"."""

from __future__ import annotations

import logging
import warnings

import torch
from torch import nn


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def count_flops(module: nn.Module, input_shape: tuple[int, ...]) -> int:
    return flops_by_module(module, input_shape)[""]


def flops_by_module(module: nn.Module, input_shape: tuple[int, ...]) -> dict[str, int]:
    """fvcore's counts per submodule name ('' = the whole module), from one trace in eval mode."""
    with warnings.catch_warnings():  # fvcore's import calls the deprecated torch.jit.script
        warnings.simplefilter("ignore", FutureWarning)
        from fvcore.nn import FlopCountAnalysis

    logging.getLogger("fvcore").setLevel(logging.ERROR)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            analysis = FlopCountAnalysis(module, torch.zeros(input_shape))
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            return {name: int(n) for name, n in analysis.by_module().items()}
    finally:
        module.train(was_training)

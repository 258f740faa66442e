"""Turn a trusted representation into an `nn.Module` for a dataset: the space builds it
(`SearchSpace.build`), sized by its own settings among evaluator=train's (`SearchSpace.sizing`,
defined beside each space: NB201's width and depth, a block file's skeleton and budget). Model
source is not built here: it is untrusted and trains in the sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from nas.core.arch import Architecture
from nas.core.space import SearchSpace
from nas.errors import EvaluationError, NasError

if TYPE_CHECKING:
    from torch import nn


def build_model(space: SearchSpace, arch: Architecture, shape: tuple[int, int, int], num_classes: int,
                options: Mapping[str, Any], seed: int) -> nn.Module:
    """Seeded, so the initial weights are part of what the seed fixes; `options` as
    `space.build_options` checked them."""
    import torch  # here: naming the train evaluator must not load torch

    if not space.trusted or arch.space != space.name:
        raise space.unbuildable(arch)
    torch.manual_seed(seed)
    try:
        return space.build(arch, num_classes, shape[0], shape[1], options)
    except (NasError, ValueError, RuntimeError) as exc:
        raise EvaluationError(f"{arch.space} {arch.key()}: cannot build the network ({exc})") from None

"""The one place that builds the `SgdCosine` optimiser and its per-step cosine schedule."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from nas.train.recipe import SgdCosine


def sgd(s: SgdCosine, params: Iterable[Any], lr: float | torch.Tensor | None = None,
        fused: bool | None = None) -> torch.optim.SGD:
    """SGD over `params` (tensors, or groups whose own "weight_decay" wins); `lr` replaces
    `s.lr` where the schedule lives elsewhere (a tensor updated inside a CUDA graph)."""
    return torch.optim.SGD(params, lr=s.lr if lr is None else lr, momentum=s.momentum,
                           nesterov=s.nesterov and s.momentum > 0, weight_decay=s.weight_decay, fused=fused)


def decay_groups(params: Iterable[torch.nn.Parameter]) -> list[dict[str, Any]]:
    """Parameter groups with no weight decay on norm weights and biases (as OFA): the tensors of
    one dimension or none."""
    params = list(params)
    return [{"params": [p for p in params if p.ndim > 1]},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]


def sgd_cosine(s: SgdCosine, params: Iterable[Any], total_steps: int, fused: bool | None = None,
               ) -> tuple[torch.optim.SGD, torch.optim.lr_scheduler.CosineAnnealingLR]:
    """The optimiser and its schedule, to 0 after `total_steps` calls of `step()` (at least one)."""
    opt = sgd(s, params, fused=fused)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(int(total_steps), 1), eta_min=0.0)

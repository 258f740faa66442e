"""The proxy API: a registered scorer of an untrained network on one minibatch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nas.core.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

# The vote's members: the three proxies whose vote ranks NB201 best (Abdelfattah et al. 2021).
VOTE: tuple[str, ...] = ("synflow", "jacob_cov", "snip")


@dataclass(frozen=True)
class Batch:
    """One normalised minibatch: float images (N, C, H, W) and int64 labels (N,); `source` says
    what data it is (a dataset's name, or "random"), for reports."""

    images: torch.Tensor
    labels: torch.Tensor
    num_classes: int
    source: str

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.images.shape[1:])  # type: ignore[return-value]


class Proxy(ABC):
    """Higher is better. `score` may change the network's gradients, batch-norm statistics and
    mode; a proxy that also changes its weights (synflow takes their absolute values) says so in
    `mutates_weights` and gets a copy of its own, the others share one (`score_network`)."""

    name: str  # set by the registry
    mutates_weights: bool = False

    @abstractmethod
    def score(self, net: nn.Module, batch: Batch) -> float:
        """The proxy's value for `net` on `batch`; finite (a degenerate network gets `LOWEST`)."""


# What a degenerate network scores (a constant output has no Jacobian correlation, all-dead ReLUs
# no NASWOT kernel): below any real score, and finite, so metrics stay plain JSON numbers.
LOWEST = -1e30

PROXIES: Registry[Proxy] = Registry("proxy", "nasflow.proxies")

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
    """Higher is better. `score` may change the network's weights and gradients (synflow takes
    their absolute values): callers score a fresh network, or a copy, per proxy."""

    name: str  # set by the registry

    @abstractmethod
    def score(self, net: nn.Module, batch: Batch) -> float:
        """The proxy's value for `net` on `batch`; finite (a degenerate network gets `LOWEST`)."""


# What a degenerate network scores (a constant output has no Jacobian correlation, all-dead ReLUs
# no NASWOT kernel): below any real score, and finite, so metrics stay plain JSON numbers.
LOWEST = -1e30

PROXIES: Registry[Proxy] = Registry("proxy", modules={
    name: "nas.proxies.scores" for name in ("synflow", "snip", "grad_norm", "jacob_cov", "naswot", "params")
})

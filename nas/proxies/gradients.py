"""Proxies that share one backward pass: the batch's loss gradients and the proxy kind that
scores from them alone (snip, grad_norm). Apart from `base` because they need torch at run time."""

from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from nas.proxies.base import Batch, Proxy

# Weight tensors and their gradients of one loss backward pass.
Gradients = list[tuple[torch.Tensor, torch.Tensor]]


def weight_tensors(net: nn.Module) -> list[nn.Parameter]:
    """The parameters proxies count as weights: those of two or more dimensions (see `PROXIES`)."""
    return [p for p in net.parameters() if p.dim() > 1]


def loss_gradients(net: nn.Module, batch: Batch) -> Gradients:
    """Cross-entropy on the batch, backpropagated from zero gradients: (weight, gradient) pairs of
    the weights it reaches, the gradients copied (a later proxy's backward pass on the same network
    must not change them)."""
    net.train()
    net.zero_grad(set_to_none=True)
    F.cross_entropy(net(batch.images), batch.labels).backward()
    return [(p, p.grad.detach().clone()) for p in weight_tensors(net) if p.grad is not None]


class GradientProxy(Proxy):
    """A proxy computed from the weights' gradients of the batch's cross-entropy alone, so
    several of them (snip, grad_norm) share one backward pass."""

    @abstractmethod
    def from_gradients(self, gradients: Gradients) -> float:
        """The proxy's value from (weight, gradient) pairs of `loss_gradients`."""

    def score(self, net: nn.Module, batch: Batch) -> float:
        return self.from_gradients(loss_gradients(net, batch))

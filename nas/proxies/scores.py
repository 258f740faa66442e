"""The six proxies, as zero-cost-NAS (Abdelfattah et al. 2021) and NASWOT (Mellor et al. 2021)
define them. Weight tensors are the parameters of two or more dimensions (conv and linear kernels,
in built networks and exported graphs alike); biases and norms do not count."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from nas.proxies.base import LOWEST, PROXIES, Batch, Proxy
from nas.proxies.gradients import GradientProxy, Gradients, weight_tensors


def _finite(value: float) -> float:
    return value if math.isfinite(value) else LOWEST


@PROXIES.register("synflow")
class Synflow(Proxy):
    """Synaptic flow (Tanaka et al. 2020): sum |w * dR/dw| where R sums the output of the network
    with all weights made positive on an all-ones input; data-free. BatchNorm runs in eval mode on a
    fresh network's statistics (an identity), as the original removes it; in float64 so deep
    networks do not overflow."""

    mutates_weights = True

    def score(self, net: nn.Module, batch: Batch) -> float:
        net.eval().double()
        with torch.no_grad():
            for p in net.parameters():
                p.abs_()
        net.zero_grad(set_to_none=True)
        net(torch.ones((1, *batch.shape), dtype=torch.float64)).sum().backward()
        with torch.no_grad():
            return _finite(float(sum((p * p.grad).abs().sum() for p in weight_tensors(net) if p.grad is not None)))


@PROXIES.register("snip")
class Snip(GradientProxy):
    """Connection sensitivity (Lee et al. 2019): sum |w * dL/dw| of the batch's loss."""

    def from_gradients(self, gradients: Gradients) -> float:
        with torch.no_grad():
            return _finite(float(sum((w * g).abs().sum() for w, g in gradients)))


@PROXIES.register("grad_norm")
class GradNorm(GradientProxy):
    """Sum over weight tensors of the L2 norm of the loss gradient."""

    def from_gradients(self, gradients: Gradients) -> float:
        with torch.no_grad():
            return _finite(float(sum(g.norm() for _, g in gradients)))


@PROXIES.register("jacob_cov")
class JacobCov(Proxy):
    """Correlation of the input Jacobians across the batch (NASWOT v1): networks that tell inputs
    apart have less correlated Jacobians. Score -sum(log(l + k) + 1/(l + k)) over the correlation
    matrix's eigenvalues l, k = 1e-5; a constant Jacobian (no correlation defined) scores LOWEST."""

    K = 1e-5

    def score(self, net: nn.Module, batch: Batch) -> float:
        net.train()  # only the input's gradient is read: the weights' need no clearing
        x = batch.images.clone().requires_grad_(True)
        out = net(x)
        out.backward(torch.ones_like(out))
        assert x.grad is not None
        jac = x.grad.reshape(len(x), -1).double().numpy()
        if not np.all(jac.std(axis=1) > 0):
            return LOWEST
        eig = np.linalg.eigvalsh(np.corrcoef(jac))
        return _finite(float(-np.sum(np.log(eig + self.K) + 1.0 / (eig + self.K))))


@PROXIES.register("naswot")
class Naswot(Proxy):
    """NASWOT (Mellor et al. 2021): log|K| of the Hamming-similarity kernel of the batch's binary
    ReLU activation codes (nn.ReLU modules); networks whose codes tell inputs apart score higher."""

    def score(self, net: nn.Module, batch: Batch) -> float:
        n = len(batch.images)
        kernel = torch.zeros((n, n), dtype=torch.float64)  # no ReLU ran: all zeros, singular: LOWEST

        def hook(_module: nn.Module, _inputs: object, out: torch.Tensor) -> None:
            # agreements of the codes (both on + both off), accumulated per ReLU: no huge concatenation
            c = (out.detach() > 0).reshape(n, -1).float()
            kernel.add_((c @ c.T + (1 - c) @ (1 - c).T).double())

        handles = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, nn.ReLU)]
        try:
            net.train()
            with torch.no_grad():
                net(batch.images)
        finally:
            for h in handles:
                h.remove()
        sign, logdet = torch.linalg.slogdet(kernel)
        return _finite(float(logdet)) if sign > 0 else LOWEST


@PROXIES.register("params")
class Params(Proxy):
    """Trainable parameter count: the baseline every proxy must beat (~0.69 Spearman on NB201)."""

    def score(self, net: nn.Module, batch: Batch) -> float:
        return float(sum(p.numel() for p in net.parameters() if p.requires_grad))

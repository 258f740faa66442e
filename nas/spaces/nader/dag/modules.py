"""The `nn.Module`s behind the block-DAG ops that torch lacks (elementwise sums,
concat, reductions, layout changes, stochastic depth).

Kept apart from `ops` so that parsing and shape inference (`nas arch validate`)
never import torch: this module, and torch with it, loads when the first
module is built (`OpSpec.module`).
"""

from __future__ import annotations

import torch
from torch import nn

from nas.spaces.nader.dag.expr import eval_int, variables_of


class Elementwise(nn.Module):
    def __init__(self, op: str):
        super().__init__()
        self.op = op

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        out = xs[0]
        for x in xs[1:]:
            out = out + x if self.op == "add" else out * x
        return out

    def extra_repr(self) -> str:
        return self.op


class MatMul(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, y)


class Concat(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat(xs, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Reduce(nn.Module):
    def __init__(self, how: str, dim: int):
        super().__init__()
        self.how, self.dim = how, dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "max":
            return x.amax(dim=self.dim, keepdim=True)
        if self.how == "sum":
            return x.sum(dim=self.dim, keepdim=True)
        if self.how == "mean":
            return x.mean(dim=self.dim, keepdim=True)
        return x.softmax(dim=self.dim)

    def extra_repr(self) -> str:
        return f"{self.how}, dim={self.dim}"


class DropPath(nn.Module):
    """Stochastic depth: drop the whole branch per sample while training."""

    def __init__(self, drop_prob: float = 0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_prob == 0.0:
            return x
        keep = 1.0 - self.drop_prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"


class Permute(nn.Module):
    def __init__(self, dims: list[int]):
        super().__init__()
        self.dims = tuple(dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.dims)

    def extra_repr(self) -> str:
        return str(self.dims)


class Shaped(nn.Module):
    """reshape/repeat whose sizes may use the batch size B, known only at run time."""

    def __init__(self, how: str, exprs: list[str], env: dict[str, int], exact: bool = True):
        super().__init__()
        self.how, self.exprs, self.exact = how, list(exprs), exact
        self.env = {k: v for k, v in env.items() if k != "B"}
        self.static = None if any("B" in variables_of(e) for e in exprs) else [eval_int(e, env, exact) for e in exprs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sizes = self.static
        if sizes is None:
            env = dict(self.env, B=int(x.shape[0]))
            sizes = [eval_int(e, env, self.exact) for e in self.exprs]
        return x.reshape(*sizes) if self.how == "reshape" else x.repeat(*sizes)

    def extra_repr(self) -> str:
        return f"{self.how}({', '.join(self.exprs)})"

"""Horizontal fusion: N candidates of one architecture trained as ONE model step (issue 19).

Why: packing width-24 candidates as CUDA streams stops paying near N = 4 (the GPU
saturates on many tiny kernels).  Here the N models' parameters and buffers are
stacked in front (torch.func.stack_module_state) and the step runs the model under
torch.func.vmap over that dimension, so every kernel does N times the work (a
convolution with stacked weights becomes one grouped convolution).  The members
see the same batches as the streams rows (the fast engine's own data path, padded
and masked last batch, CUDA graph of the whole step: nas.train.fast/graphs); the
loss is the sum of each member's masked mean, so gradients, SGD updates and
BatchNorm running stats (stacked buffers, updated in place under vmap) are each
member's own: tests/test_fused_pack.py checks them against separate training.

What vmap does not give by itself (torch 2.14, seen on CPU; `probe()` asks the
device): autocast does not reach convolutions under vmap (they stay fp32 under bf16
autocast), so convolutions here cast their operands to the autocast dtype as
autocast would; BatchNorm's batching rule refuses a bf16 input with fp32 running
stats, so BatchNorm here runs on the input cast to fp32 and returns it in the
input's dtype (two casts per BN the engine does not pay); and a channels_last batch
sends adaptive_avg_pool2d to vmap's slow per-member fallback (as_strided_), which
`train_fused` reports in `fallbacks`.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from nas.data.sources import ImageData
from nas.errors import ConfigError
from nas.train.engine import Engine
from nas.train.fast import _device, _Group, _Run, _sync
from nas.train.graphs import StaticEval, StaticStep
from nas.train.recipe import Recipe


def _autocast_conv(conv: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """A Conv2d's `_conv_forward` casting its operands as autocast would (autocast misses
    convolutions under vmap)."""

    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        kind = x.device.type
        if torch.is_autocast_enabled(kind):
            dtype = torch.get_autocast_dtype(kind)
            x, weight = x.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        return conv(x, weight, bias)

    return forward


def _fp32_norm(norm: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A BatchNorm's forward on an fp32 input, answered in the input's dtype (vmap's batch
    norm refuses bf16 input with fp32 running stats)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        return norm(x) if x.dtype == torch.float32 else norm(x.float()).to(x.dtype)

    return forward


def probe(device: torch.device) -> dict[str, str]:
    """What vmap does with bf16 on `device` without the casts above: the dtype of a batched
    convolution under autocast, and whether batch norm takes a bf16 input."""
    x = torch.randn(2, 4, 3, 6, 6, device=device)
    w = torch.randn(2, 3, 3, 3, 3, device=device)
    out = {}
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out["conv_under_autocast"] = str(vmap(lambda x, w: nn.functional.conv2d(x, w))(x, w).dtype)
    try:
        stats = torch.zeros(2, 3, device=device), torch.ones(2, 3, device=device)
        vmap(lambda x, m, v: nn.functional.batch_norm(x, m, v, training=True))(x.bfloat16(), *stats)
        out["batch_norm_bf16"] = "ok"
    except Exception as exc:  # noqa: BLE001 - the outcome is what is probed
        out["batch_norm_bf16"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return out


class Stacked(nn.Module):
    """N models of one architecture as one module: each parameter and buffer stacked in
    front (member i at index i), `forward(x)` = every member on the same batch, logits
    [N, batch, classes]."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        params, buffers = stack_module_state(models)  # type: ignore[arg-type]
        self.members = len(models)
        # the architecture only (meta tensors, no memory); in a list so it is not a submodule
        self._base = [copy.deepcopy(models[0]).to("meta")]
        for m in self._base[0].modules():
            if isinstance(m, nn.Conv2d):
                m._conv_forward = _autocast_conv(m._conv_forward)  # type: ignore[method-assign]
            elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.forward = _fp32_norm(m.forward)  # type: ignore[method-assign]
        # register_parameter refuses dots: "cells.0.weight" is kept as "cells:0:weight"
        for name, t in params.items():
            self.register_parameter(name.replace(".", ":"), nn.Parameter(t))
        for name, t in buffers.items():
            self.register_buffer(name.replace(".", ":"), t)

    def train(self, mode: bool = True) -> Stacked:
        self._base[0].train(mode)
        return super().train(mode)

    def state(self, i: int) -> dict[str, torch.Tensor]:
        """Member i's parameters and buffers under the model's own names (views)."""
        return {k.replace(":", "."): v[i] for k, v in [*self.named_parameters(), *self.named_buffers()]}

    def _member(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                x: torch.Tensor) -> torch.Tensor:
        return functional_call(self._base[0], (params, buffers), (x,))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = {k.replace(":", "."): v for k, v in self.named_parameters()}
        buffers = {k.replace(":", "."): v for k, v in self.named_buffers()}
        return vmap(self._member, in_dims=(0, 0, None))(params, buffers, x)


class FusedGroup(_Group):
    """The fast engine's group (resident data, on-device augmentation, padded masked last
    batch, graph capture) training one Stacked model: its N members in one step."""

    def __init__(self, models: list[nn.Module], data: ImageData, recipe: Recipe, seed: int, engine: Engine,
                 device: torch.device) -> None:
        if engine.cuda_graphs != "on":
            raise ConfigError("fused packing needs engine.cuda_graphs=on (one static-shape step; "
                              "eager on CPU)")
        fused = Stacked([m.to(device).train() for m in models])
        super().__init__([fused], data, recipe, seed, engine, device, [f"{len(models)} fused"])
        self.losses: list[list[float]] = []  # per epoch, per member
        self.accuracy: dict[str, list[float]] = {}  # split -> per member (percent)

    def _run(self, model: nn.Module, label: str) -> _Run:
        r, e = self.recipe, self.engine
        assert isinstance(model, Stacked)
        run = _Run(model, label, None, torch.zeros(model.members, dtype=torch.float64, device=self.device))
        forward = torch.compile(model, dynamic=False) if e.compile else model
        run.static = StaticStep(model, forward, r, r.epochs * self.steps, self.batch_shape, self.device, e.bf16,
                                e.channels_last, run.total)
        return run

    def train(self) -> None:
        (run,) = self.runs
        for epoch in self.epochs():
            run.total.zero_()
            for batch in epoch:
                run.static(*batch)  # type: ignore[misc]
            _sync(self.device)
            self.losses.append((run.total / len(self.splits["train"])).tolist())

    @torch.no_grad()
    def evaluate(self) -> None:
        """Valid and test accuracy per member, in eval mode (uncompiled, as the engine)."""
        (run,) = self.runs
        run.model.eval()
        run.static = None  # releases the training graph first
        e = self.engine
        count = StaticEval(run.model, self.batch_shape, self.device, e.bf16, e.channels_last, run.total)
        count.prepare(capture=run.graphs == "on")
        if count.status.startswith("failed"):
            run.graphs += f" (eval pass {count.status})"
        for name in ("valid", "test"):
            run.total.zero_()
            for batch in self.eval_batches(name):
                count(*batch)
            _sync(self.device)
            n = max(len(self.splits[name]), 1)
            self.accuracy[name] = [round(100 * c / n, 4) for c in run.total.tolist()]


@dataclass
class FusedResult:
    model: Stacked  # the trained members (Stacked.state(i))
    losses: list[list[float]]  # per epoch, per member: mean training loss
    accuracy: dict[str, list[float]]  # "valid"/"test" -> per member
    cuda_graphs: str  # as TrainResult.cuda_graphs
    compile_seconds: float  # compile + capture (with their warm-up)
    eval_seconds: float
    device_seconds: float  # capture, training and eval, synchronised
    fallbacks: list[str] = field(default_factory=list)  # vmap's slow-path warnings, distinct


def train_fused(models: list[nn.Module], data: ImageData, recipe: Recipe, seed: int, engine: Engine) -> FusedResult:
    """Train `models` (one architecture; moved to the device, not trained) fused, as one
    Stacked step: the result's `model` holds the trained members."""
    device = _device(engine.accelerator)
    with warnings.catch_warnings(record=True) as seen:
        warnings.filterwarnings("always", message=".*performance drop because we have not yet implemented")
        group = FusedGroup(models, data, recipe, seed, engine, device)
        _sync(device)
        start = time.perf_counter()
        group.prepare()
        group.train()
        _sync(device)
        eval_start = time.perf_counter()
        group.evaluate()
        _sync(device)
    now = time.perf_counter()
    (run,) = group.runs
    fallbacks = sorted({str(w.message).split("(Triggered")[0].strip()[:200] for w in seen
                        if "performance drop" in str(w.message)})
    for w in seen:  # the others, as if not caught
        if "performance drop" not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    assert isinstance(run.model, Stacked)
    return FusedResult(run.model, group.losses, group.accuracy, run.graphs, round(run.compile_seconds, 3),
                       round(now - eval_start, 3), round(now - start, 3), fallbacks)

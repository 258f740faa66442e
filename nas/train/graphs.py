"""Static-shape training and eval steps for the fast engine, each captured whole in one CUDA graph.

Why: an NB201-size candidate launches ~1,500 small kernels per step, and on
an H100 the one Python thread issuing them is the bottleneck (measured: 24 ms
per step eager, 11 ms replaying the same step as one graph).  A graph needs
static buffers and no host reads, so the learning rate and the step count
are device tensors and the cosine schedule is computed inside the step.

Static shapes mean every batch is full: the last partial batch of an epoch
is padded with the epoch's first images (freshly augmented) and their loss
is masked out.  The gradient is the mean over the real images, the epoch's
loss counts each image once, and the steps per epoch and the schedule are
the recipe's; only that one step's BatchNorm batch statistics also see the
padding images.  Eval batches are padded the same way (exact: eval mode).
When capture is off or fails the same step runs eagerly (one logged line,
`status` says why), so a run's numbers do not depend on whether it worked.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nas.train.optim import sgd
from nas.train.recipe import Recipe

log = logging.getLogger(__name__)

# eager steps before capture: they create the lazy state (momentum buffers, autograd's
# streams, compiled kernels) that a graph must not allocate; their updates are undone
WARMUP_STEPS = 3


def padded_rows(n: int, start: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions start .. start+size-1 of an n-long sequence, wrapping round to its
    beginning past the end, and whether each is really in range (the loss mask)."""
    pos = torch.arange(start, start + size, device=device)
    return pos % n, pos < n


def _failure(exc: BaseException) -> str:
    line = next((s.strip() for s in str(exc).splitlines() if s.strip()), "")
    return f"failed: {type(exc).__name__}: {line}"[:300]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Static:
    """A computation on static device buffers `x`, `y`, `mask`, captured once and replayed."""

    def __init__(self, batch_shape: tuple[int, ...], device: torch.device, bf16: bool, channels_last: bool,
                 total: torch.Tensor, mask_dtype: torch.dtype) -> None:
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        self.device, self.bf16, self.total = device, bf16, total
        self.x = torch.zeros(batch_shape, device=device).contiguous(memory_format=fmt)
        self.y = torch.zeros(batch_shape[0], dtype=torch.int64, device=device)
        self.mask = torch.ones(batch_shape[0], dtype=mask_dtype, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.status = "off"  # "on" once captured; "failed: why" when capture failed

    def _compute(self) -> None:
        raise NotImplementedError

    def _autocast(self) -> torch.autocast:
        # no cast cache: cached bf16 weights would be stale inside a replayed graph
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16, cache_enabled=False)

    def _warm(self, steps: int) -> None:
        """Run eagerly `steps` times, on a side stream on CUDA (as capture wants)."""
        if self.device.type != "cuda":
            for _ in range(steps):
                self._compute()
            return
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(steps):
                self._compute()
        torch.cuda.current_stream(self.device).wait_stream(side)

    def _capture(self, what: str) -> bool:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self._compute()
        except Exception as exc:  # noqa: BLE001 - whatever breaks capture, the step still runs eagerly
            self.status = _failure(exc)
            log.warning("CUDA graph capture of the %s failed, running it eagerly (%s)", what, self.status[8:])
            return False
        self.graph, self.status = graph, "on"
        return True

    def __call__(self, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> None:
        self.x.copy_(x)
        self.y.copy_(y)
        self.mask.copy_(mask)
        if self.graph is not None:
            self.graph.replay()
        else:
            self._compute()


class StaticStep(_Static):
    """One training step: forward, masked cross-entropy, backward, SGD, then the
    next step's learning rate (CosineAnnealingLR to 0 over `total_steps`, as the
    plain path, in closed form).  The loss summed over the real images is added
    to `total`, read once per epoch.  `forward` may return the logits of N models
    stacked in front, [N, batch, classes] (benchmarks/fused_pack.py): the loss is
    then the sum of each one's masked mean, so each gets its own gradient, and
    `total` holds N sums."""

    def __init__(self, model: nn.Module, forward: Callable[[torch.Tensor], torch.Tensor], recipe: Recipe,
                 total_steps: int, batch_shape: tuple[int, ...], device: torch.device, bf16: bool,
                 channels_last: bool, total: torch.Tensor) -> None:
        super().__init__(batch_shape, device, bf16, channels_last, total, torch.float32)
        self.model, self.forward = model, forward
        self.base_lr, self.period = recipe.lr, max(total_steps, 1)
        self.lr = torch.tensor(recipe.lr, dtype=torch.float32, device=device)  # fused SGD reads a float32 lr
        self.t = torch.zeros((), dtype=torch.float64, device=device)  # steps taken
        self.opt = sgd(recipe, model.parameters(), lr=self.lr, fused=True if device.type == "cuda" else None)
        self.compile_seconds = 0.0

    def _compute(self) -> None:
        self.opt.zero_grad(set_to_none=True)  # a no-op inside capture: the graph owns the gradients
        with self._autocast():
            logits = self.forward(self.x)
        logits = logits.float()
        # classes to dim 1 (a no-op for [batch, classes]); per image, or per model and image
        losses = F.cross_entropy(logits.movedim(-1, 1), self.y.expand(logits.shape[:-1]), reduction="none")
        loss_sum = (losses * self.mask).sum(-1)
        (loss_sum.sum() / self.mask.sum()).backward()
        self.opt.step()
        self.total.add_(loss_sum.detach())
        self.t.add_(1)
        self.lr.copy_(torch.cos(self.t * (math.pi / self.period)).add_(1).mul_(self.base_lr / 2))

    def prepare(self, capture: bool, warmup: bool) -> None:
        """Warm up (paying for torch.compile) and capture, then undo the warm-up's updates;
        `compile_seconds` is what that took."""
        if not (capture or warmup):
            return
        start = time.perf_counter()
        state = [*self.model.parameters(), *self.model.buffers()]
        saved = [t.detach().clone() for t in state]
        self._warm(WARMUP_STEPS)
        self._reset(state, saved)
        if capture and not self._capture("training step"):
            self._reset(state, saved)
        _sync(self.device)
        self.compile_seconds = time.perf_counter() - start

    @torch.no_grad()
    def _reset(self, state: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
        """Back to the state before the warm-up, in place (a graph holds these addresses).
        A zero momentum buffer updates exactly as a missing one (dampening 0)."""
        for t, s in zip(state, saved):
            t.copy_(s)
        for st in self.opt.state.values():
            if st.get("momentum_buffer") is not None:
                st["momentum_buffer"].zero_()
        self.opt.zero_grad(set_to_none=True)
        self.lr.fill_(self.base_lr)
        self.t.zero_()
        self.total.zero_()


class StaticEval(_Static):
    """Correct predictions of `model` (in eval mode) on one batch, added to `total`
    (per model when it returns stacked logits, as StaticStep)."""

    def __init__(self, model: nn.Module, batch_shape: tuple[int, ...], device: torch.device, bf16: bool,
                 channels_last: bool, total: torch.Tensor) -> None:
        super().__init__(batch_shape, device, bf16, channels_last, total, torch.bool)
        self.model = model

    @torch.no_grad()
    def _compute(self) -> None:
        with self._autocast():
            logits = self.model(self.x)
        self.total.add_(((logits.argmax(-1) == self.y) & self.mask).sum(-1))

    def prepare(self, capture: bool) -> None:
        if capture:
            self._warm(1)
            self._capture("eval pass")
            self.total.zero_()

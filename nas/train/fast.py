"""The fast training path: a hand-written loop with the data resident on the device.

Why: on a GPU, NB201-size candidates are so small that Lightning's per-step
overhead and DataLoader collation dominate the step time (NADER reports
2,781 s per candidate).  Here the whole split is uploaded once as uint8,
batches are taken by index on the device, flip/crop/normalisation run on
whole batches there, the loss is summed on the device and read once per
epoch, and `engine.concurrent` candidates train in lockstep on the same
batches, each on its own CUDA stream.  With `engine.cuda_graphs` (on CUDA by
default) each training step and eval batch is one replayed CUDA graph
(`nas.train.graphs`); graphs and `engine.compile` use static shapes, padding
the last partial batch with a masked loss.

The semantics are the plain path's (`nas.train.fit.train`): same subsets,
augmentation, optimiser, per-step cosine schedule, last partial batch,
loss curve and early termination.  On CPU, without bf16/compile/graphs, its
first epoch is the plain path's bit for bit; later epochs shuffle differently
(Lightning draws more from the DataLoader's generator), so final numbers
agree within seed noise.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nas.data.module import random_crop, random_flip
from nas.data.normalise import Normaliser, to_unit
from nas.data.sources import ImageData, Split
from nas.errors import ConfigError, EvaluationError
from nas.measure import count_flops, count_params
from nas.train.early_stop import failing
from nas.train.engine import Engine
from nas.train.graphs import StaticEval, StaticStep, padded_rows
from nas.train.optim import sgd_cosine
from nas.train.progress import EpochProgress, OnEpoch
from nas.train.recipe import Recipe
from nas.train.result import TrainResult

# (id(data), device) -> (data, its splits on the device); at most one dataset, kept
# across calls so a search uploads its data once.  Holding `data` keeps its id unique.
_RESIDENT: dict[tuple[int, str], tuple[ImageData, dict[str, Split]]] = {}
log = logging.getLogger(__name__)


def _device(accelerator: str) -> torch.device:
    if accelerator == "gpu" and not torch.cuda.is_available():
        raise ConfigError("engine.accelerator=gpu but CUDA is not available")
    if accelerator == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _resident(data: ImageData, device: torch.device) -> dict[str, Split]:
    """The three splits on `device` (uint8 images, int64 labels), uploaded once."""
    key = (id(data), str(device))
    if key not in _RESIDENT:
        _RESIDENT.clear()
        splits = {name: getattr(data, name) for name in ("train", "valid", "test")}
        _RESIDENT[key] = (data, {name: Split(s.images.to(device), s.labels.to(device))
                                 for name, s in splits.items()})
    return _RESIDENT[key][1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _graphs(engine: Engine, device: torch.device) -> bool:
    return engine.cuda_graphs == "on" or (engine.cuda_graphs == "auto" and device.type == "cuda")


@dataclass
class _Run:
    """One model's training state: a static-shape step (graphs or compile), else an optimiser
    and scheduler for eager steps of any batch size."""

    model: nn.Module
    label: str  # who it is in progress reports
    stream: torch.cuda.Stream | None
    total: torch.Tensor  # on the device: the epoch's loss sum, then the correct predictions
    static: StaticStep | None = None
    opt: torch.optim.Optimizer | None = None
    sched: torch.optim.lr_scheduler.LRScheduler | None = None
    graphs: str = "off"  # as TrainResult.cuda_graphs
    compile_seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    terminated: str | None = None
    accuracy: dict[str, float | None] = field(default_factory=lambda: {"valid": None, "test": None})  # None: terminated


def _each(runs: list[_Run], fn: Callable[..., None], *batch: torch.Tensor) -> None:
    """fn(run, *batch) for each run: on CUDA on the run's own stream, after the current
    stream's work so far (which made the batch); on CPU one after the other."""
    for run in runs:
        if run.stream is None:
            fn(run, *batch)
            continue
        run.stream.wait_stream(torch.cuda.current_stream(run.stream.device))
        with torch.cuda.stream(run.stream):
            for t in batch:  # the allocator must not reuse the batch before this stream is done
                t.record_stream(run.stream)
            fn(run, *batch)


class _Group:
    """Models trained in lockstep on the same batches."""

    def __init__(self, models: list[nn.Module], data: ImageData, recipe: Recipe, seed: int, engine: Engine,
                 device: torch.device, labels: list[str], on_epoch: OnEpoch | None = None) -> None:
        self.data, self.recipe, self.seed, self.engine, self.device = data, recipe, seed, engine, device
        self.on_epoch = on_epoch
        splits = _resident(data, device)
        self.splits = {name: splits[name].subset(getattr(recipe, f"{name}_subset")) for name in splits}
        self.normalise = Normaliser(data.mean, data.std, device)
        self.steps = math.ceil(len(self.splits["train"]) / recipe.batch_size)
        self.graphs = _graphs(engine, device)
        self.static = self.graphs or engine.compile  # a graph, or one compilation, needs one batch shape
        self.batch_shape = (recipe.batch_size, *data.shape)
        self.real = torch.ones(recipe.batch_size, device=device)  # the loss mask of a full batch
        self.runs = [self._run(m, label) for m, label in zip(models, labels)]

    def _run(self, model: nn.Module, label: str) -> _Run:
        r, e, cuda = self.recipe, self.engine, self.device.type == "cuda"
        fmt = torch.channels_last if e.channels_last else torch.contiguous_format
        model.to(self.device, memory_format=fmt).train()
        run = _Run(model, label, torch.cuda.Stream(self.device) if cuda else None,
                   torch.zeros((), dtype=torch.float64, device=self.device))
        if self.static:
            forward = torch.compile(model, dynamic=False) if e.compile else model
            run.static = StaticStep(model, forward, r, r.epochs * self.steps, self.batch_shape, self.device,
                                    e.bf16, e.channels_last, run.total)
            return run
        run.opt, run.sched = sgd_cosine(r, model.parameters(), r.epochs * self.steps, fused=True if cuda else None)
        return run

    def prepare(self) -> None:
        """Compile and capture each model's step before the first epoch (timed per model)."""
        capture = self.graphs and self.device.type == "cuda"
        if self.graphs and not capture:
            log.warning("engine.cuda_graphs=on without a CUDA device: training eagerly with static shapes")
        for run in self.runs:
            if run.static is None:
                continue
            run.static.prepare(capture=capture, warmup=capture or self.engine.compile)
            run.graphs = run.static.status if capture else "failed: no CUDA device" if self.graphs else "off"
            run.compile_seconds = run.static.compile_seconds

    def _inputs(self, images: torch.Tensor, aug: torch.Generator | None) -> torch.Tensor:
        """uint8 batch -> normalised float batch, augmented when `aug` is given (as ImageDataModule)."""
        x = to_unit(images)
        if aug is not None and self.recipe.crop:
            x = random_crop(x, self.data.pad, aug)
        if aug is not None and self.recipe.flip and self.data.mirror:
            x = random_flip(x, aug)
        x = self.normalise(x)
        return x.contiguous(memory_format=torch.channels_last) if self.engine.channels_last else x

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.engine.bf16)

    def _step(self, run: _Run, x: torch.Tensor, y: torch.Tensor) -> None:
        with self._autocast():
            logits = run.model(x)
        loss = F.cross_entropy(logits.float(), y)
        run.opt.zero_grad(set_to_none=True)  # type: ignore[union-attr]
        loss.backward()
        run.opt.step()  # type: ignore[union-attr]
        run.sched.step()  # type: ignore[union-attr]
        run.total.add_(loss.detach(), alpha=len(y))

    @staticmethod
    def _static_step(run: _Run, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> None:
        run.static(x, y, mask)  # type: ignore[misc]

    def _batch(self, order: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of `order` for the batch at `start`, padded to full size (see nas.train.graphs),
        and its loss mask."""
        bs, n = self.recipe.batch_size, len(order)
        if start + bs <= n:
            return order[start:start + bs], self.real
        rows, real = padded_rows(n, start, bs, self.device)
        return order[rows], real.float()

    def epochs(self) -> Iterator[Iterator[tuple[torch.Tensor, ...]]]:
        """Each epoch's training batches, drawn as the plain path's DataLoader draws them:
        (x, y, loss mask) padded to full size when static, else (x, y).  Every consumer
        (each model of the group, or a fused stack of them) sees the same batches."""
        train = self.splits["train"]
        shuffle = torch.Generator().manual_seed(self.seed)
        aug = torch.Generator(device=self.device).manual_seed(self.seed)
        torch.manual_seed(self.seed)  # whatever the models draw (dropout), as the plain path's seed_everything
        for _ in range(self.recipe.epochs):
            # a DataLoader draws one number from its generator before each epoch's permutation
            torch.empty((), dtype=torch.int64).random_(generator=shuffle)
            order = torch.randperm(len(train), generator=shuffle).to(self.device)
            yield self._epoch(order, aug)

    def _epoch(self, order: torch.Tensor, aug: torch.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
        train, bs = self.splits["train"], self.recipe.batch_size
        for k in range(self.steps):
            if self.static:
                index, mask = self._batch(order, k * bs)
                yield self._inputs(train.images[index], aug), train.labels[index], mask
                continue
            index = order[k * bs:(k + 1) * bs]
            yield self._inputs(train.images[index], aug), train.labels[index]

    def train(self) -> None:
        train = self.splits["train"]
        start = time.perf_counter()
        for epoch in self.epochs():
            live = [run for run in self.runs if run.terminated is None]
            if not live:
                return
            for run in live:
                run.total.zero_()
            for batch in epoch:
                _each(live, self._static_step if self.static else self._step, *batch)
            _sync(self.device)  # the epoch's only synchronisation
            for run in live:
                mean = float(run.total) / len(train)
                run.losses.append(mean if math.isfinite(mean) else float("nan"))
                run.terminated = failing(run.losses, self.recipe)
                if self.on_epoch is not None:
                    self.on_epoch(EpochProgress(run.label, len(run.losses), self.recipe.epochs, run.losses[-1],
                                                time.perf_counter() - start, run.terminated))

    def _count(self, run: _Run, x: torch.Tensor, y: torch.Tensor) -> None:
        with self._autocast():
            run.total.add_((run.model(x).argmax(1) == y).sum())

    @torch.no_grad()
    def evaluate(self) -> None:
        """Valid and test accuracy (percent) of the models that finished, in eval mode
        (not compiled: a compiled model would compile again for eval, for one pass).
        With graphs, each model's eval pass is a graph of its own, captured when its
        training step was (the training graph is released first)."""
        live = [run for run in self.runs if run.terminated is None]
        evals: dict[int, StaticEval] = {}
        for run in live:
            run.model.eval()
            if self.graphs:
                run.static = None
                e = self.engine
                evals[id(run)] = StaticEval(run.model, self.batch_shape, self.device, e.bf16, e.channels_last,
                                            run.total)
                evals[id(run)].prepare(capture=run.graphs == "on")
                if evals[id(run)].status.startswith("failed"):
                    run.graphs += f" (eval pass {evals[id(run)].status})"
        for name in ("valid", "test"):
            for run in live:
                run.total.zero_()
            for batch in self.eval_batches(name):
                _each(live, (lambda run, *b: evals[id(run)](*b)) if self.graphs else self._count, *batch)
            _sync(self.device)
            for run in live:
                run.accuracy[name] = round(100 * float(run.total) / max(len(self.splits[name]), 1), 4)

    def eval_batches(self, name: str) -> Iterator[tuple[torch.Tensor, ...]]:
        """The `name` split's batches, unaugmented: (x, y, real) padded to full size with graphs
        (see padded_rows), else (x, y)."""
        split, bs = self.splits[name], self.recipe.batch_size
        for k in range(0, len(split), bs):
            if self.graphs:
                rows, real = padded_rows(len(split), k, bs, self.device)
                yield self._inputs(split.images[rows], None), split.labels[rows], real
            else:
                yield self._inputs(split.images[k:k + bs], None), split.labels[k:k + bs]


def train_fast(models: list[nn.Module], data: ImageData, recipe: Recipe, seed: int, engine: Engine,
               on_epoch: OnEpoch | None = None, labels: list[str] | None = None) -> list[TrainResult]:
    """Train `models` (moved to the device, trained in place) in groups of `engine.concurrent`,
    calling `on_epoch` after each model's epoch (`labels` name the models in it).

    A model's results do not depend on its group unless it draws from the
    global RNG (dropout).  Each result's `wall_seconds` is its group's (the
    first group's includes the dataset upload); `device_seconds` is the group's
    synchronised time from training start to the last accuracy, compilation
    and graph capture included (`compile_seconds`, per model), and the final valid/test
    passes (`eval_seconds`, the group's).  Raises
    ConfigError when accelerator=gpu has no CUDA, EvaluationError when
    torch.compile fails (for the whole call)."""
    device = _device(engine.accelerator)
    c, h, w = data.shape
    results: list[TrainResult] = []
    labels = labels or [f"candidate {i + 1}" for i in range(len(models))]
    start = time.perf_counter()
    for first in range(0, len(models), engine.concurrent):
        chunk = models[first:first + engine.concurrent]
        counts = [(count_params(m), count_flops(m, (1, c, h, w))) for m in chunk]
        try:
            group = _Group(chunk, data, recipe, seed, engine, device, labels[first:first + len(chunk)], on_epoch)
            _sync(device)
            device_start = time.perf_counter()
            group.prepare()
            group.train()
            _sync(device)
            eval_start = time.perf_counter()
            group.evaluate()
        except Exception as exc:
            if not (engine.compile and isinstance(exc, torch._dynamo.exc.TorchDynamoException)):
                raise
            cause = getattr(exc, "inner_exception", None) or exc  # what the backend (e.g. inductor) raised
            line = next((s.strip() for s in str(cause).splitlines() if s.strip()), "")
            raise EvaluationError(f"torch.compile failed: {type(cause).__name__}: {line}") from None
        _sync(device)
        now = time.perf_counter()
        for run, (params, flops) in zip(group.runs, counts):
            results.append(TrainResult(
                valid_accuracy=run.accuracy["valid"], test_accuracy=run.accuracy["test"],
                loss_curve=run.losses, epochs=len(run.losses), terminated=run.terminated,
                wall_seconds=round(now - start, 3), device_seconds=round(now - device_start, 3),
                params=params, flops=flops, device=str(device), cuda_graphs=run.graphs,
                compile_seconds=round(run.compile_seconds, 3), eval_seconds=round(now - eval_start, 3)))
        start = now
    return results

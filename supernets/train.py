"""Supernet training in Lightning (stage one of two-stage NAS).

Sampling per step (`supernet.sampling`):

* "uniform" (AutoFormer; SPOS's own method): one uniformly random subnet.
* "fair" (FairNAS's strict fairness; NB201 and SPOS by default): as many subnets as the decision
  with the most choices has, the i-th taking the i-th entry of a random permutation of each
  decision's choices, so every choice of every decision is trained once per step; gradients summed
  into one optimiser step. Why it is SPOS's default: supernets/spos.py (its mixed paths stayed near
  chance under the sandwich rule); benchmarks/supernet_ranking.py measures the ranking it gives.
* "droppath" (Bender et al. 2018's path dropout; SPOS by default): for the first `warmup` of
  training, one pass per step through the mean of several choices per decision, each choice kept
  with probability falling linearly from 1 (every choice averaged) to 0 (at least one, drawn
  uniformly); then uniform single paths. Units that first learn side by side learn features their
  neighbours can use, where single random paths from the start leave SPOS's mixed paths at chance
  (supernets/spos.py). Only supernets whose choices are separate modules (`Supernet.mixes`).
* "sandwich" (OFA, BigNAS): the largest, the smallest and `n_random` random
  subnets (distinct), gradients summed into one optimiser step. With the
  supernet's `phases`, training is split evenly into len(phases)+1 parts:
  part 0 trains the largest network only, part k releases the decision
  groups phases[:k]; unreleased decisions stay at their largest value, and
  decisions in no phase (OFA's resolution) are drawn from the start.

`supernet.cpu_seconds` bounds training by the CPU time of the training process (user + system,
`resource.getrusage`) instead of by epochs alone: on a shared machine wall time says little about the
work done, CPU time does. Training stops once the budget is spent (or the epochs run out), and the
cosine schedule and the sandwich phases follow the fraction of the budget spent, so a budgeted run
ends at learning rate 0 like an epoch-bounded one.

Simplified against OFA: one run with one cosine schedule over all phases
(OFA restarts training per phase, with its own epochs and learning rates);
the teacher is the largest subnet of the same step (in-place distillation,
BigNAS) rather than a separately trained full network, and subnets other than
the largest learn only from its soft labels; no label smoothing.
Inputs are resized to `supernet.input_size(arch)` per subnet; grey data is RGB.
"""

from __future__ import annotations

import hashlib
import io
import math
import resource
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
import torch.nn.functional as F

from nas.core.arch import Architecture
from nas.core.registry import check_keys
from nas.core.space import CategoricalSpace
from nas.data.module import ImageDataModule
from nas.data.sources import SOURCES, load_data
from nas.errors import ConfigError
from nas.io import atomic_write_bytes, atomic_write_json
from nas.spaces import SPACES
from nas.status import status
from nas.train.fit import _quiet
from nas.train.optim import decay_groups, sgd
from supernets.base import SUPERNETS, Supernet
from supernets.scoring import Feeder, resize, score
from supernets.settings import SupernetSettings


def cpu_seconds() -> float:
    """CPU time (user + system) this process has used: what `supernet.cpu_seconds` budgets."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class Mixed:
    """A drop-path pass: per decision, the choices whose outputs the supernet averages (`set_mixed`)."""

    values: tuple[tuple[Any, ...], ...]


class SubnetSampler:
    """The subnets one training step trains; under sandwich the largest comes first (the teacher).
    Steps are placed on the schedule by `progress` (0 to 1): the step count over `total_steps`
    unless the caller passes the fraction of a CPU budget spent."""

    def __init__(self, space: CategoricalSpace, largest: Architecture, smallest: Architecture, sampling: str,
                 phases: tuple[tuple[str, ...], ...], n_random: int, total_steps: int, seed: int,
                 warmup: float = 0.5) -> None:
        self.space, self.sampling, self.n_random, self.warmup = space, sampling, n_random, warmup
        self.groups = [d.name.split("[")[0] for d in space.decisions()]
        self.largest, self.smallest = space.to_values(largest), space.to_values(smallest)
        self.phases = tuple(phases) if sampling == "sandwich" else ()
        self.total_steps = max(total_steps, 1)
        self.rng = np.random.default_rng(seed)

    @classmethod
    def for_supernet(cls, supernet: Supernet, sampling: str, n_random: int, total_steps: int,
                     seed: int, warmup: float = 0.5) -> "SubnetSampler":
        if sampling == "droppath" and not supernet.mixes:
            mixing = ", ".join(n for n in SUPERNETS.names() if SUPERNETS.get(n).mixes)
            raise ConfigError(f"supernet.sampling=droppath: the {supernet.name} supernet cannot average its "
                              f"choices (one that can: {mixing})")
        return cls(supernet.space, supernet.largest(), supernet.smallest(), sampling, supernet.phases,
                   n_random, total_steps, seed, warmup)

    @property
    def n_phases(self) -> int:
        return len(self.phases) + 1

    def phase(self, step: int, progress: float | None = None) -> int:
        at = step * self.n_phases // self.total_steps if progress is None else int(progress * self.n_phases)
        return min(at, self.n_phases - 1)

    def pinned(self, phase: int) -> list[bool]:
        """Per decision, whether it is still held at its largest value in `phase`."""
        held = {group for groups in self.phases[phase:] for group in groups}
        return [group in held for group in self.groups]

    def draw(self, step: int, progress: float | None = None) -> Sequence[Architecture | Mixed]:
        if self.sampling == "droppath":
            done = step / self.total_steps if progress is None else progress
            if done < self.warmup:
                return [self.mixed(1.0 - done / self.warmup)]
        if self.sampling in ("uniform", "droppath"):
            return [self.space.sample(self.rng)]
        if self.sampling == "fair":
            return self.fair()
        pinned = self.pinned(self.phase(step, progress))

        def pin(values: list[Any]) -> Architecture:
            return self.space.from_values([big if p else v for v, big, p in zip(values, self.largest, pinned)])

        randoms = [pin(self.space.to_values(self.space.sample(self.rng))) for _ in range(self.n_random)]
        return list({a.key(): a for a in [pin(self.largest), pin(self.smallest), *randoms]}.values())

    def mixed(self, keep: float) -> Mixed:
        """Each choice of each decision kept with probability `keep`; a decision left with none gets
        one, drawn uniformly."""
        values = []
        for decision in self.space.decisions():
            kept = tuple(c for c in decision.choices if self.rng.random() < keep)
            values.append(kept or (decision.choices[int(self.rng.integers(len(decision.choices)))],))
        return Mixed(tuple(values))

    def fair(self) -> list[Architecture]:
        """FairNAS's strict fairness: n subnets (n = the most choices a decision has) whose i-th takes
        the i-th entry of a random permutation of each decision's choices. A decision with fewer
        choices has each of them once and random ones after, so every choice is trained every step."""
        columns = []
        for decision in self.space.decisions():
            k, n = len(decision.choices), max(len(d.choices) for d in self.space.decisions())
            order = [*self.rng.permutation(k), *self.rng.integers(k, size=n - k)]
            columns.append([decision.choices[int(i)] for i in order])
        return [self.space.from_values(list(values)) for values in zip(*columns)]


class SupernetModule(pl.LightningModule):
    """Weight-sharing training: each step backpropagates through the sampler's
    subnets one at a time (manual optimisation: one graph in memory) and takes
    one optimiser step on the summed gradients (under "fair", as FairNAS: each choice's weights then
    get one subnet's gradient, the shared stem and head the sum of all)."""

    def __init__(self, supernet: Supernet, sampler: SubnetSampler, settings: SupernetSettings) -> None:
        super().__init__()
        self.supernet, self.sampler, self.settings = supernet, sampler, settings
        self.distill = settings.distill and sampler.sampling == "sandwich"
        self.automatic_optimization = False
        self.steps = 0
        self.cpu_start: float | None = None  # CPU seconds at the first step (the budget counts from there)
        self.cpu_used = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.supernet(x)

    def progress(self) -> float:
        """How far along the schedule training is, 0 to 1: CPU budget spent, else steps done."""
        if self.settings.cpu_seconds is not None:
            return min(self.cpu_used / self.settings.cpu_seconds, 1.0)
        return min(self.steps / self.sampler.total_steps, 1.0)

    def training_step(self, batch, batch_idx: int) -> None:
        if self.cpu_start is None:
            self.cpu_start = cpu_seconds()
        x, y = batch
        opt = self.optimizers()
        progress = self.progress()
        for group in opt.param_groups:  # cosine from lr to 0 over the steps or the CPU budget
            group["lr"] = self.settings.lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        opt.zero_grad()
        budgeted = progress if self.settings.cpu_seconds is not None else None  # else phases count steps exactly
        phase = self.sampler.phase(self.steps, budgeted)
        teacher = None
        for i, path in enumerate(self.sampler.draw(self.steps, budgeted)):
            if isinstance(path, Mixed):  # mixing supernets (NB201, SPOS) fix their input size
                self.supernet.set_mixed(path.values)
                size = self.supernet.input_size(self.supernet.largest())
            else:
                self.supernet.set_active(path)
                size = self.supernet.input_size(path)
            logits = self.supernet(resize(x, size))
            if teacher is None:
                loss = F.cross_entropy(logits, y)
            else:
                loss = -(teacher * logits.log_softmax(1)).sum(1).mean()
            if i == 0:
                self.log("loss", loss.detach(), prog_bar=True, batch_size=len(y))
                teacher = logits.detach().softmax(1) if self.distill else None
            self.manual_backward(loss)
        opt.step()
        self.steps += 1
        self.cpu_used = cpu_seconds() - self.cpu_start
        if self.settings.cpu_seconds is not None and self.cpu_used >= self.settings.cpu_seconds:
            self.trainer.should_stop = True
        self.log("phase", float(phase), prog_bar=True, batch_size=len(y))

    def configure_optimizers(self):
        """No weight decay on BatchNorm/LayerNorm weights and biases (as OFA); the learning rate is
        set per step by `training_step` (a cosine over `progress`)."""
        return sgd(self.settings, decay_groups(self.supernet.parameters()))


@dataclass(frozen=True)
class TrainedSupernet:
    path: Path  # supernet.pt; supernet.json beside it
    sha256: str
    val_accuracy_largest: float
    val_accuracy_smallest: float
    steps: int
    wall_seconds: float
    train_cpu_seconds: float  # CPU time of the training steps (what supernet.cpu_seconds bounds)


def build_supernet(space: dict[str, Any], params: dict[str, Any], num_classes: int) -> Supernet:
    """The space's registered supernet for RGB input; `space` is its config (name + parameters)."""

    name = space.get("name")
    if name not in SUPERNETS.names():
        raise ConfigError(f"space '{name}' has no supernet (spaces with one: {', '.join(SUPERNETS.names())})")
    clash = sorted({"num_classes", "in_channels"} & set(params))
    if clash:
        raise ConfigError(f"supernet.params.{clash[0]} is set from the data; remove it")
    built = SPACES.create(name, {k: v for k, v in space.items() if k != "name"})
    return SUPERNETS.create(name, {**params, "num_classes": num_classes, "in_channels": 3}, space=built)


def train_supernet(space: dict[str, Any], params: dict[str, Any], data: dict[str, Any], settings: SupernetSettings,
                   seed: int, out_dir: Path, progress: bool = True) -> TrainedSupernet:
    """Train, score the largest and smallest subnets on validation data, write
    `out_dir/supernet.pt` then `supernet.json` (its sha256 and the metadata), each atomically."""
    start = time.perf_counter()
    if not isinstance(data, dict) or data.get("name") not in SOURCES:
        raise ConfigError(f"data: unknown dataset '{data.get('name') if isinstance(data, dict) else data}' "
                          f"(valid: {', '.join(SOURCES)})")
    check_keys("data", data, ["name", "root", "split_file"])
    with status(f"loading {data['name']} and building the supernet", show=progress):  # seconds for fashion_mnist
        image = load_data(**data).rgb()
        _quiet()
        warnings.filterwarnings("ignore", message=".*no `validation_step`.*")  # the data module's, unused here
        pl.seed_everything(seed, verbose=False)
        net = build_supernet(space, params, image.num_classes)
    sampling = settings.sampling or net.default_sampling
    n_train = len(image.train.subset(settings.train_subset))
    # Under DDP each rank steps through its 1/devices share; the sampler's phases and the schedule count steps.
    total = settings.epochs * math.ceil(math.ceil(n_train / settings.devices) / settings.batch_size)
    sampler = SubnetSampler.for_supernet(net, sampling, settings.n_random, total, seed, settings.warmup)
    module = SupernetModule(net, sampler, settings)
    dm = ImageDataModule(image, settings.batch_size, settings.flip, settings.crop, settings.train_subset, seed=seed)
    trainer = pl.Trainer(max_epochs=settings.epochs, accelerator=settings.accelerator, devices=settings.devices,
                         strategy=settings.lightning_strategy(), logger=False,
                         enable_checkpointing=False, enable_progress_bar=progress, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    if not trainer.is_global_zero:
        raise SystemExit(0)  # DDP's extra ranks (relaunched commands) only train; rank 0 scores and writes

    net.eval()
    feeder = Feeder(image, settings.batch_size, next(net.parameters()).device)
    val = {}
    with status("scoring the largest and smallest subnets on validation data", show=progress):
        for which in ("largest", "smallest"):
            arch = getattr(net, which)()
            sub = net.extract(arch).to(feeder.device)
            val[which] = round(score(sub, feeder, net.input_size(arch), settings.recal_batches,
                                     settings.val_subset)[0], 4)
    meta = {"space": space["name"], "space_params": {k: v for k, v in space.items() if k != "name"},
            "supernet": net.config(), "train": {**settings.to_dict(), "sampling": sampling}, "data": dict(data),
            "seed": seed, "steps": module.steps, "train_cpu_seconds": round(module.cpu_used, 1), "largest": net.largest().encode(),
            "smallest": net.smallest().encode(), "val_accuracy_largest": val["largest"],
            "val_accuracy_smallest": val["smallest"]}
    buffer = io.BytesIO()
    torch.save({**meta, "state_dict": {k: v.detach().cpu() for k, v in net.state_dict().items()}}, buffer)
    raw = buffer.getvalue()
    sha256 = hashlib.sha256(raw).hexdigest()
    path = Path(out_dir) / "supernet.pt"
    atomic_write_bytes(path, raw)
    wall = round(time.perf_counter() - start, 3)
    atomic_write_json(path.with_suffix(".json"), {"file": path.name, "sha256": sha256, "bytes": len(raw),
                                                  "wall_seconds": wall, **meta})
    return TrainedSupernet(path, sha256, val["largest"], val["smallest"], module.steps, wall,
                           round(module.cpu_used, 1))

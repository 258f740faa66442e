"""Do inherited-weight subnet scores rank subnets (issue 48)? Rank correlations of supernet scores
against a ground truth, per space, with every training variant tried kept as a row.

* NB201: a supernet trained here on Fashion-MNIST within a CPU-second budget (of the training
  process: resource.getrusage, so a shared machine's load changes the wall time, not the work),
  then the inherited-weight validation accuracy (BN recalibrated) of the 1,000 cells that
  benchmarks/proxies.py scored, against analog-nasbench's CIFAR-10 accuracy (the table evaluator's),
  beside the zero-cost vote and params of the same cells (proxies_scores_fashion_mnist.jsonl) and
  supernet + vote combined (mean of the two ranks). Variants (sampling, budget, recalibration) are
  scored on the first cells of the same sample and kept as rows.
* ofa_mbv3_small, spos_small, autoformer_small: Kendall tau between inherited-weight scores and
  stand-alone short training (one recipe and step budget for all subnets of a space, same data) of
  subnets drawn one per FLOPs quantile bin, so the cost range is spanned, with a bootstrap 95 % CI
  over subnets; one row per supernet training variant (sampling), against the same stand-alone runs.

    python benchmarks/supernet_ranking.py                   # everything (~3-4 h on 2 shared cores), resumable
    python benchmarks/supernet_ranking.py --only spos_small # one part; its records go to --work
    python benchmarks/supernet_ranking.py --report          # the JSON from what --work holds
    python benchmarks/supernet_ranking.py --tiny --work /tmp/snr --out /tmp/snr.json   # seconds: proves it runs

Each part writes its records under --work (runs/bench_supernet_ranking) keyed by its settings, so a
rerun reuses what is done; the report goes to benchmarks/results/supernet_ranking.json (+ .md, .png).
Run with OMP_NUM_THREADS=1 (one thread per process: CPU seconds are then a core's seconds)."""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau, spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.core.arch import stable_hash  # noqa: E402
from nas.io import append_jsonl, atomic_write_json, atomic_write_text, read_json, read_jsonl  # noqa: E402

DATA = {"name": "fashion_mnist", "root": None, "split_file": None}
PROXY_SCORES = ROOT / "benchmarks" / "results" / "proxies_scores_fashion_mnist.jsonl"
SPACES = ("ofa_mbv3_small", "spos_small", "autoformer_small")
PARTS = ("nb201_variants", "nb201", *SPACES)
# NB201's supernet: the table's cell at C=16 with one cell per stage (proxies_shallow's network):
# 3.4x cheaper per step than 5 cells per stage here, so the budget buys 3.4x the steps.
NB201_SPACE = {"name": "nb201", "channels": 16, "cells_per_stage": 1}


@dataclass(frozen=True)
class Split:
    """How this process shares a part with others (`--shard K/N`, `--phase`): it trains or scores only the
    subnets whose index is K mod N, and a part's record is written once every subnet is done."""

    k: int = 0
    n: int = 1
    phase: str = "all"  # all | standalone | supernets

    def mine(self, items: list[Any]) -> list[Any]:
        return [x for i, x in enumerate(items) if i % self.n == self.k]


class Incomplete(Exception):
    """This process did its share; the part's record waits for the others (rerun the part to write it)."""


@dataclass(frozen=True)
class Variant:
    """One supernet training: `supernet.*` settings over the part's base, and how subnets are scored."""

    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    recal_batches: int = 2
    val_subset: int = 500


@dataclass(frozen=True)
class Config:
    nb201_cpu_seconds: float  # the headline NB201 supernet's training budget
    nb201_cells: int  # of the proxies' 1,000 (the sample's first N)
    nb201_final: Variant
    nb201_variants: tuple[Variant, ...]  # cheaper budgets, on the first variant_cells cells
    variant_cells: int
    space_cpu_seconds: float  # each space supernet's training budget
    space_variants: dict[str, tuple[Variant, ...]]
    subnets: int  # per space, one per FLOPs quantile bin
    standalone_steps: dict[str, int]  # per space: stand-alone SGD steps of standalone_batch images per subnet
    standalone_batch: int = 64
    batch_size: int = 128  # supernet training
    train_subset: int | None = None  # supernet training images (None: all 50,000)
    seed: int = 0
    bootstrap: int = 2000
    supernet_val_subset: int = 500  # images of the trained supernet's largest/smallest check (its metadata)
    pool: int = 4000  # random subnets whose FLOPs quantile bins the subnets are drawn from


# Scoring the spaces' subnets: 8 recalibration batches (512 images) and 2,000 validation images, for the
# inherited scores and the stand-alone runs alike; at 500 images one subnet's accuracy has a standard error
# of ~2 points, as wide as the whole spread of 20 subnets' scores, so the ranks were mostly sampling noise.
SPACE_SCORING = {"recal_batches": 8, "val_subset": 2000}
# SPOS's 20 subnets (FLOPs within +-10 %) spread 1.2 points stand-alone, against ~0.9 points of sampling
# error at 2,000 images: its truth and scores are read on the whole validation split (10,000; ~0.4 points).
SPOS_SCORING = {"recal_batches": 8, "val_subset": 10000}
SPACE_VARIANTS = {
    "ofa_mbv3_small": (Variant("sandwich (default)", {"sampling": "sandwich"}, **SPACE_SCORING),),
    # SPOS's 4^20 paths give each unit's weights a quarter of the steps: at 900 CPU-s the tau's CI reached
    # below 0; twice the budget ranks (the headline).
    "spos_small": (Variant("droppath, 2x budget (default)", {"sampling": "droppath", "cpu_seconds": 1800.0},
                           **SPOS_SCORING),
                   Variant("droppath, 900 CPU-s", {"sampling": "droppath"}, **SPOS_SCORING)),
    "autoformer_small": (Variant("uniform (default)", {"sampling": "uniform"}, **SPACE_SCORING),),
}
# Budgets in CPU-seconds of one thread (OMP_NUM_THREADS=1). The NB201 headline (all 1,000 cells) and
# its variants (the first 200) share the budget, so rows differ only by how training samples.
NB201_CPU = 1500.0
FULL = Config(
    nb201_cpu_seconds=NB201_CPU, nb201_cells=1000,
    # 1,024 validation images (256 left 0.4-point steps, so most cells tied) and 4 recalibration batches
    nb201_final=Variant(f"droppath, {NB201_CPU:.0f} CPU-s", {"sampling": "droppath"}, recal_batches=4, val_subset=1024),
    nb201_variants=(Variant(f"fair, {NB201_CPU:.0f} CPU-s", {"sampling": "fair"}, 4, 1024),),
    variant_cells=200, space_cpu_seconds=900.0, space_variants=SPACE_VARIANTS, subnets=20,
    # Stand-alone runs long enough to leave chance: at 25-50 steps OFA's subnets stayed at 9 % and
    # AutoFormer's at 25-32 %, a truth with nothing to rank. OFA's subnets cost ~2x AutoFormer's per step
    # on this CPU and SPOS's ~3x; OFA gets fewer steps (past 75 % by 200). SPOS at 300 steps (77 %, a third
    # of an epoch) ranked its subnets by how fast they start, not by what they reach: 1,000 steps.
    standalone_steps={"ofa_mbv3_small": 200, "spos_small": 1000, "autoformer_small": 300}, batch_size=64)
TINY = Config(
    nb201_cpu_seconds=1.5, nb201_cells=6, nb201_final=Variant("fair, tiny", {"sampling": "fair"}, 1, 64),
    nb201_variants=(Variant("uniform, tiny", {"sampling": "uniform", "cpu_seconds": 1.0}, 1, 64),),
    variant_cells=4, space_cpu_seconds=1.5,
    space_variants={s: v[:1] for s, v in SPACE_VARIANTS.items()}, subnets=4, standalone_steps=dict.fromkeys(SPACES, 2),
    standalone_batch=16, batch_size=32, train_subset=256, bootstrap=50, supernet_val_subset=64, pool=40)
TINY = replace(TINY, space_variants={  # the tiny budget, whatever the full variant's
    s: tuple(replace(v, settings={k: x for k, x in v.settings.items() if k != "cpu_seconds"}, recal_batches=1,
                     val_subset=64) for v in vs) for s, vs in TINY.space_variants.items()})


# --- the machine ----------------------------------------------------------------------------

class LoadMonitor:
    """The 1-minute load average every `every` seconds while a part runs: how shared the cores were."""

    def __init__(self, every: float = 30.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self.every, self.stop = every, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> "LoadMonitor":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, Any]:
        return {"load1_mean": round(float(np.mean(self.samples)), 2), "load1_max": round(max(self.samples), 2),
                "samples": len(self.samples), "cores": os.cpu_count()}


def cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def git_commit() -> str:
    """HEAD of the checkout (NASFLOW_GIT_COMMIT when run from an exported copy of one)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or os.environ.get("NASFLOW_GIT_COMMIT", "unknown")


# --- statistics -------------------------------------------------------------------------------

def rounded(x: float) -> float | None:
    """None for NaN (constant scores, as a tiny run's all-chance subnets give): JSON has no NaN."""
    return None if math.isnan(x) else round(float(x), 4)


def correlations(scores: list[float], truth: list[float]) -> dict[str, float | None]:
    return {"spearman": rounded(spearmanr(scores, truth).statistic),
            "kendall": rounded(kendalltau(scores, truth).statistic)}


def kendall_ci(scores: list[float], truth: list[float], n: int, seed: int) -> list[float | None]:
    """95 % percentile bootstrap over subnets (resampled with replacement; a draw of ties only is skipped)."""
    rng, x, y = np.random.default_rng(seed), np.asarray(scores), np.asarray(truth)
    taus = []
    for _ in range(n):
        idx = rng.integers(len(x), size=len(x))
        tau = kendalltau(x[idx], y[idx]).statistic
        if not math.isnan(tau):
            taus.append(tau)
    if not taus:
        return [None, None]
    return [rounded(np.percentile(taus, 2.5)), rounded(np.percentile(taus, 97.5))]


# --- supernet training ----------------------------------------------------------------------

def base_settings(cfg: Config) -> dict[str, Any]:
    """conf/supernet/default.yaml (less out/params) with the benchmark's batch and data subset;
    epochs are an upper bound, the CPU budget ends training."""
    import yaml

    settings = yaml.safe_load((ROOT / "conf" / "supernet" / "default.yaml").read_text())
    settings.pop("out"), settings.pop("params")
    return {**settings, "epochs": 1000, "batch_size": cfg.batch_size, "train_subset": cfg.train_subset,
            "val_subset": cfg.supernet_val_subset, "accelerator": "cpu"}


def trained_supernet(work: Path, space: dict[str, Any], settings: dict[str, Any], seed: int) -> dict[str, Any]:
    """`supernets.train.train_supernet` with these settings, reused from `work` when already trained;
    its metadata with the training's CPU seconds, wall seconds and the load while it ran."""
    from supernets.settings import SupernetSettings
    from supernets.train import train_supernet

    out = work / "supernets" / stable_hash(space, settings, DATA, seed)[:12]
    record = out / "run.json"
    if record.is_file() and (out / "supernet.pt").is_file():
        return read_json(record)
    start = time.perf_counter()
    with LoadMonitor() as load:
        trained = train_supernet(space, {}, DATA, SupernetSettings(**settings), seed, out, progress=False)
    meta = {k: v for k, v in read_json(out / "supernet.json").items()
            if k in ("steps", "train_cpu_seconds", "val_accuracy_largest", "val_accuracy_smallest", "train", "sha256")}
    meta.update(checkpoint=str(trained.path), wall_seconds=round(time.perf_counter() - start, 1), load=load.summary())
    atomic_write_json(record, meta)
    return meta


def load_supernet(path: str) -> Any:
    import torch

    from nas.spaces import SPACES as SPACE_REGISTRY
    from supernets.base import SUPERNETS

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    space = SPACE_REGISTRY.create(ckpt["space"], dict(ckpt["space_params"]))
    net = SUPERNETS.create(ckpt["space"], dict(ckpt["supernet"]), space=space)
    net.load_state_dict(ckpt["state_dict"])
    return net.eval()


SCORE_BATCH = 64  # images per recalibration and validation batch when scoring


def feeder(batch_size: int = SCORE_BATCH) -> Any:
    import torch

    from nas.data.sources import load_data
    from supernets.scoring import Feeder

    return Feeder(load_data(DATA["name"]).rgb(), batch_size, torch.device("cpu"))


def inherited_scores(checkpoint: str, archs: list[Any], variant: Variant, path: Path,
                     split: Split = Split()) -> tuple[list[float], list[float | None], float]:
    """Validation accuracy and mean cross-entropy of each subnet with the supernet's weights after BN
    recalibration, appended to `path` per subnet (resumable); and the CPU seconds spent. A line written
    before losses were kept has none (None)."""
    from rich.progress import track

    from supernets.scoring import accuracy_and_loss, has_batchnorm, recalibrate_bn

    path.parent.mkdir(parents=True, exist_ok=True)
    done = {r["key"]: r["accuracy"] for r in read_jsonl(path, repair=True)} if path.exists() else {}
    todo = [a for a in split.mine(archs) if a.key() not in done]
    start = cpu_now()
    if todo:
        net, feed = load_supernet(checkpoint), feeder()
        for arch in track(todo, description=f"scoring {len(todo)} subnets ({path.parent.name})"):
            began = cpu_now()
            sub, size = net.extract(arch), net.input_size(arch)
            if variant.recal_batches and has_batchnorm(sub):
                recalibrate_bn(sub, feed.recal(size, variant.recal_batches))
            valid, loss = accuracy_and_loss(sub, feed.valid(size, variant.val_subset))
            done[arch.key()] = round(valid, 3)
            append_jsonl(path, [{"key": arch.key(), "arch": arch.encode(), "accuracy": round(valid, 3),
                                 "loss": round(loss, 5), "cpu_seconds": round(cpu_now() - began, 3)}])
    lines = {r["key"]: r for r in read_jsonl(path)}  # with other shards' lines
    if any(a.key() not in lines for a in archs):
        raise Incomplete(path.name)
    # the CPU of every share when each line has it (else this process's: one shard's loading not counted)
    per_line = [lines[a.key()].get("cpu_seconds") for a in archs]
    cpu = float(sum(c for c in per_line if c is not None)) if None not in per_line else cpu_now() - start
    return ([lines[a.key()]["accuracy"] for a in archs], [lines[a.key()].get("loss") for a in archs],
            round(cpu, 1))


# --- NB201 --------------------------------------------------------------------------------------

def nb201_cells(n: int) -> tuple[list[Any], list[float], list[float], list[float]]:
    """The first `n` cells proxies.py scored, in its file's order: cells, table accuracy, vote, params."""
    from nas.proxies import VOTE, mean_rank
    from nas.spaces.nb201.arch import NB201Cell
    from nas.spaces.nb201.space import NB201Space

    rows = list({r["cell"]: r for r in read_jsonl(PROXY_SCORES)}.values())
    if len(rows) < n:
        raise SystemExit(f"{PROXY_SCORES}: {len(rows)} cells, {n} wanted (run benchmarks/proxies.py)")
    rows = rows[:n]
    table = NB201Space().benchmark(None, "baseline_accuracy", 10, 32)
    cells = [NB201Cell.from_string(r["cell"]) for r in rows]
    # the vote as proxies.json computed it: mean rank over all 1,000 cells, then the subset taken
    everything = list({r["cell"]: r for r in read_jsonl(PROXY_SCORES)}.values())
    vote = mean_rank({name: [r["scores"][name] for r in everything] for name in VOTE})[:n]
    return cells, [table.score(c) for c in cells], vote, [r["scores"]["params"] for r in rows]


def nb201_row(work: Path, cfg: Config, variant: Variant, n_cells: int, budget: float,
              split: Split = Split()) -> dict[str, Any]:
    from nas.proxies import mean_rank

    settings = {**base_settings(cfg), "cpu_seconds": budget, **variant.settings}
    meta = trained_supernet(work, NB201_SPACE, settings, cfg.seed)
    cells, truth, vote, params = nb201_cells(n_cells)
    scoring = stable_hash(meta["sha256"], variant.recal_batches, variant.val_subset)[:12]
    scores, losses, cpu = inherited_scores(meta["checkpoint"], cells, variant,
                                           work / "scores" / f"nb201_{scoring}.jsonl", split)
    combined = mean_rank({"supernet": scores, "vote": vote})
    by_loss = {}
    if None not in losses:  # the same subnets ranked by their validation loss (lower is better)
        fit = [-float(x) for x in losses if x is not None]
        by_loss = {"supernet_loss": correlations(fit, truth),
                   "combined_loss": correlations(mean_rank({"supernet": fit, "vote": vote}), truth)}
    return {"variant": variant.name, "settings": {k: settings[k] for k in ("sampling", "cpu_seconds", "lr",
                                                                             "batch_size", "train_subset")},
            "recal_batches": variant.recal_batches, "val_subset": variant.val_subset, "cells": n_cells,
            "supernet": correlations(scores, truth), "combined": correlations(combined, truth),
            "vote": correlations(vote, truth), "params": correlations(params, truth), **by_loss,
            "training": {k: meta[k] for k in ("steps", "train_cpu_seconds", "wall_seconds", "load",
                                              "val_accuracy_largest", "val_accuracy_smallest")},
            "scoring_cpu_seconds": cpu, "scores": scores}


# --- the other spaces ---------------------------------------------------------------------

def space_config(name: str) -> dict[str, Any]:
    from nas.config import compose_config

    return dict(compose_config([f"space={name}", f"data={DATA['name']}"])["space"])


def flops_of(space: Any, arch: Any) -> int:
    cost = space.cost(arch)
    if cost is None:
        raise SystemExit(f"space {space.name} prices no subnet: it cannot be drawn by FLOPs")
    return int(cost.flops)


def pick_subnets(space: Any, n: int, seed: int, pool: int = 4000) -> list[Any]:
    """One random subnet per FLOPs quantile bin of `pool` random subnets (n bins), smallest bin first."""
    rng = np.random.default_rng(seed)
    archs = list({a.key(): a for a in (space.sample(rng) for _ in range(pool))}.values())
    flops = np.array([flops_of(space, a) for a in archs], dtype=float)
    order = np.argsort(flops, kind="stable")
    return [archs[int(rng.choice(chunk))] for chunk in np.array_split(order, n)]


def standalone(space: Any, arch: Any, cfg: Config, space_name: str) -> dict[str, Any]:
    """`arch` built fresh (`space.build`) and trained the space's stand-alone steps (the supernet's optimiser
    settings: lr 0.05 cosine to 0, momentum 0.9 Nesterov, weight decay 5e-4 off norms; flip + crop),
    then its validation accuracy on the images the inherited scores use."""
    import torch
    import torch.nn.functional as F

    from nas.data.module import random_crop, random_flip
    from nas.data.normalise import Normaliser, to_unit
    from nas.data.sources import load_data
    from nas.train.optim import decay_groups, sgd_cosine
    from nas.train.recipe import SgdCosine
    from supernets.scoring import resize, score

    steps = cfg.standalone_steps[space_name]
    torch.manual_seed(cfg.seed)
    data = load_data(DATA["name"]).rgb()
    size = space.input_size(arch)
    net = space.build(arch, data.num_classes, 3, size or data.shape[1])
    opt, schedule = sgd_cosine(SgdCosine(lr=0.05), decay_groups(net.parameters()), steps)
    normalise, gen = Normaliser(data.mean, data.std), torch.Generator().manual_seed(cfg.seed)
    train = data.train.subset(cfg.train_subset)
    start, net = cpu_now(), net.train()
    for _ in range(steps):
        idx = torch.randint(len(train), (cfg.standalone_batch,), generator=gen)
        x = to_unit(train.images[idx])
        x = random_crop(x, data.pad, gen)
        x = random_flip(x, gen) if data.mirror else x
        opt.zero_grad()
        F.cross_entropy(net(resize(normalise(x), size)), train.labels[idx]).backward()
        opt.step()
        schedule.step()
    recal, val = cfg_scoring(cfg, space_name)
    valid, _ = score(net, feeder(), size, recal, val)
    return {"accuracy": round(valid, 3), "cpu_seconds": round(cpu_now() - start, 1)}


def cfg_scoring(cfg: Config, name: str) -> tuple[int, int]:
    """The BN recalibration batches and validation images stand-alone runs of space `name` are scored
    with: its variants' (all the same), so a stand-alone and an inherited score differ only by the weights."""
    head = cfg.space_variants[name][0]
    return head.recal_batches, head.val_subset


def space_part(work: Path, cfg: Config, name: str, split: Split = Split()) -> dict[str, Any]:
    from nas.spaces import SPACES as SPACE_REGISTRY

    params = space_config(name)
    space = SPACE_REGISTRY.create(params["name"], {k: v for k, v in params.items() if k != "name"})
    archs = pick_subnets(space, cfg.subnets, cfg.seed, cfg.pool)
    flops = [flops_of(space, a) for a in archs]
    path = work / "standalone" / f"{name}_{stable_hash(params, cfg.standalone_steps[name], cfg.standalone_batch, cfg.seed, cfg.train_subset, cfg_scoring(cfg, name))[:12]}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {r["key"]: r for r in read_jsonl(path, repair=True)} if path.exists() else {}
    from rich.progress import track

    if split.phase != "supernets":
        for arch in track([a for a in split.mine(archs) if a.key() not in done],
                          description=f"{name}: stand-alone training"):
            row = {"key": arch.key(), "arch": arch.encode(), **standalone(space, arch, cfg, name)}
            append_jsonl(path, [row])
            done[arch.key()] = row
    if split.phase == "standalone":
        raise Incomplete(f"{name}: stand-alone share done")
    rows = []
    for variant in cfg.space_variants[name]:
        settings = {**base_settings(cfg), "cpu_seconds": cfg.space_cpu_seconds, **variant.settings}
        meta = trained_supernet(work, params, settings, cfg.seed)
        scoring = stable_hash(meta["sha256"], variant.recal_batches, variant.val_subset)[:12]
        scores, losses, cpu = inherited_scores(meta["checkpoint"], archs, variant,
                                               work / "scores" / f"{name}_{scoring}.jsonl")
        rows.append({"variant": variant.name, "sampling": settings["sampling"],
                     "budget_cpu_seconds": settings["cpu_seconds"], "recal_batches": variant.recal_batches,
                     "val_subset": variant.val_subset,
                     "training": {k: meta[k] for k in ("steps", "train_cpu_seconds", "wall_seconds", "load",
                                                       "val_accuracy_largest", "val_accuracy_smallest")},
                     "scoring_cpu_seconds": cpu, "scores": scores, "losses": losses})
    done.update({r["key"]: r for r in read_jsonl(path)} if path.exists() else {})  # other shards' runs
    if any(a.key() not in done for a in archs):
        raise Incomplete(f"{name}: stand-alone runs missing (run --phase standalone)")
    truth = [done[a.key()]["accuracy"] for a in archs]
    for row in rows:
        row.update(**correlations(row["scores"], truth), kendall_ci=kendall_ci(row["scores"], truth, cfg.bootstrap,
                                                                               cfg.seed))
        losses = row.pop("losses")
        if None not in losses:  # the same subnets ranked by validation loss (lower is better), as for NB201
            by_loss = [-x for x in losses]
            row["by_loss"] = {**correlations(by_loss, truth),
                              "kendall_ci": kendall_ci(by_loss, truth, cfg.bootstrap, cfg.seed)}
    head = rows[0]
    return {"kendall": head["kendall"], "kendall_ci": head["kendall_ci"], "spearman": head["spearman"],
            "variant": head["variant"], "subnets": len(archs), "space": params,
            "flops": flops, "archs": [a.encode() for a in archs], "standalone": truth,
            "standalone_recipe": {"steps": cfg.standalone_steps[name], "batch_size": cfg.standalone_batch, "lr": 0.05,
                                  "schedule": "cosine to 0", "momentum": 0.9, "nesterov": True,
                                  "weight_decay": 5e-4, "augment": "flip (where labels allow) + pad-2 crop",
                                  "scored": dict(zip(("recal_batches", "val_subset"), cfg_scoring(cfg, name))),
                                  "cpu_seconds": [done[a.key()]["cpu_seconds"] for a in archs]},
            "supernet_cpu_seconds": head["budget_cpu_seconds"], "variants": rows}


# --- the parts and the report --------------------------------------------------------------

def run_part(part: str, work: Path, cfg: Config, split: Split = Split()) -> None:
    """Compute one part and keep its record in `work/<part>.json` (with its CPU and wall seconds);
    under a `split`, only this process's share, and the record once every share is in."""
    start, cpu = time.perf_counter(), cpu_now()
    try:
        with LoadMonitor() as load:
            if part == "nb201_variants":
                record: dict[str, Any] = {"rows": [
                    nb201_row(work, cfg, v, min(cfg.variant_cells, cfg.nb201_cells),
                              v.settings.get("cpu_seconds", cfg.nb201_cpu_seconds), split) for v in cfg.nb201_variants]}
            elif part == "nb201":
                record = nb201_row(work, cfg, cfg.nb201_final, cfg.nb201_cells, cfg.nb201_cpu_seconds, split)
            else:
                record = space_part(work, cfg, part, split)
    except Incomplete as why:
        print(f"{part}: this share done in {cpu_now() - cpu:.0f} CPU-s ({why}); the record waits for the rest",
              flush=True)
        return
    record.update(part_cpu_seconds=round(cpu_now() - cpu, 1), part_wall_seconds=round(time.perf_counter() - start, 1),
                  part_load=load.summary(), git_commit=git_commit())  # parts of one report may be measured apart
    atomic_write_json(work / f"{part}.json", record)
    print(f"{part}: done in {record['part_wall_seconds']:.0f} s wall, {record['part_cpu_seconds']:.0f} CPU-s",
          flush=True)


def report(work: Path, cfg: Config, out: Path, tiny: bool) -> dict[str, Any]:
    missing = [p for p in PARTS if not (work / f"{p}.json").is_file()]
    if missing and (tiny or "nb201" in missing):
        raise SystemExit(f"{work}: part {missing[0]} not run yet (--only {missing[0]})")
    if missing:  # a full run cut short: the report says which parts it lacks, and has no keys for them
        print(f"not run: {', '.join(missing)}; the report lacks them (parts_missing)", flush=True)
    parts = {p: read_json(work / f"{p}.json") for p in PARTS if p not in missing}
    nb = parts["nb201"]
    rows = parts["nb201_variants"]["rows"] if "nb201_variants" in parts else []
    variants = [{k: v for k, v in row.items() if k != "scores"} for row in rows]
    for row in variants:  # the headline supernet on the same (first) cells, for a like-for-like row
        _, truth, _, _ = nb201_cells(row["cells"])
        row["headline_on_these_cells"] = correlations(nb["scores"][:row["cells"]], truth)
    variants.append({k: v for k, v in nb.items() if k not in ("scores", "part_load")} | {"headline": True})
    payload: dict[str, Any] = {
        "benchmark": "supernet_ranking", "issue": 48, "tiny": tiny, "git_commit": git_commit(),
        "data": DATA["name"], "seeds": {"cells": "proxies.py's sample (seed 0)", "training": cfg.seed,
                                        "subnets": cfg.seed, "standalone": cfg.seed, "bootstrap": cfg.seed},
        "nb201": {
            "supernet": nb["supernet"], "vote": nb["vote"], "params": nb["params"],
            "combined": {**nb["combined"], "how": "mean of the supernet's and the vote's ranks per cell"},
            **({"supernet_loss": {**nb["supernet_loss"], "how": "the same subnets ranked by validation loss"},
                "combined_loss": {**nb["combined_loss"], "how": "mean of the loss ranking's and the vote's ranks"}}
               if "supernet_loss" in nb else {}),
            "cells": nb["cells"], "truth": "analog-nasbench NB201 CIFAR-10 baseline_accuracy (the table evaluator's)",
            "supernet_network": f"NB201 skeleton C={NB201_SPACE['channels']}, {NB201_SPACE['cells_per_stage']} cell "
                                "per stage (the table's: 5), trained and scored on Fashion-MNIST at 28 px",
            "budget": {"train_cpu_seconds": cfg.nb201_cpu_seconds, "recal_batches": cfg.nb201_final.recal_batches,
                       "recal_images": cfg.nb201_final.recal_batches * SCORE_BATCH,
                       "val_subset": cfg.nb201_final.val_subset, "batch_size": cfg.batch_size},
            "training": nb["training"], "scoring_cpu_seconds": nb["scoring_cpu_seconds"],
            "variants": variants},
        **{name: {k: v for k, v in parts[name].items() if k != "part_load"} | {"flops_baseline": {
            **correlations(parts[name]["flops"], parts[name]["standalone"]), "kendall_ci": kendall_ci(
                parts[name]["flops"], parts[name]["standalone"], cfg.bootstrap, cfg.seed),
            "how": "the subnets ranked by FLOPs alone: the free signal the supernet must beat"}}
           for name in SPACES if name in parts},
        "cpu_seconds": cpu_totals(parts),
        "wall_seconds": round(time.time() - float((work / "started").read_text()), 1)
        if (work / "started").is_file() else None,
        "wall_note": "from the first part's start in this work dir to this report, parts running side by side on "
                     "the shared cores; a part measured in an earlier run (its git_commit) has its own part_wall_seconds",
        "load": {p: part["part_load"] for p, part in parts.items()}, "parts_missing": missing,
        "command": " ".join(["python benchmarks/supernet_ranking.py", *sys.argv[1:]]),
    }
    rho = {k: nb[k]["spearman"] if nb[k]["spearman"] is not None else -1.0 for k in ("supernet", "combined",
                                                                                     "vote", "params")}
    payload["nb201"]["goals"] = {"supernet_above_params": rho["supernet"] > rho["params"],
                                 "combined_above_vote": rho["combined"] > rho["vote"],
                                 "supernet_above_vote": rho["supernet"] > rho["vote"]}
    if "supernet_loss" in nb:  # the goals again with the loss ranking (the headline stays accuracy, as the papers)
        loss_rho = {k: nb[k]["spearman"] if nb[k]["spearman"] is not None else -1.0
                    for k in ("supernet_loss", "combined_loss")}
        payload["nb201"]["goals_by_loss"] = {"supernet_above_params": loss_rho["supernet_loss"] > rho["params"],
                                             "combined_above_vote": loss_rho["combined_loss"] > rho["vote"],
                                             "supernet_above_vote": loss_rho["supernet_loss"] > rho["vote"]}
    for name in SPACES:
        if name in payload:
            payload[name]["goals"] = space_goals(payload[name])
    atomic_write_json(out, payload)
    atomic_write_text(out.with_suffix(".md"), markdown(payload))
    plot(payload, parts, out.with_suffix(".png"))
    return payload


def space_goals(space: dict[str, Any]) -> dict[str, bool]:
    """The issue's goal for SPOS (the CI's low end above 0), asked of every space, and whether the supernet
    ranks better than FLOPs alone (the free signal); an undefined tau (constant scores) meets neither."""
    low, tau, flops_tau = space["kendall_ci"][0], space["kendall"], space["flops_baseline"]["kendall"]
    return {"kendall_low_above_zero": low is not None and low > 0,
            "above_flops": tau is not None and flops_tau is not None and tau > flops_tau}


def cpu_totals(parts: dict[str, Any]) -> dict[str, float]:
    """CPU seconds of supernet training, stand-alone training and scoring, summed over every process that
    took a share (process start-up and data loading not counted)."""
    rows = [r for p in ("nb201_variants",) if p in parts for r in parts[p]["rows"]] + \
        ([parts["nb201"]] if "nb201" in parts else []) + [v for s in SPACES if s in parts for v in parts[s]["variants"]]
    train = sum(r["training"]["train_cpu_seconds"] for r in rows)
    scoring = sum(r["scoring_cpu_seconds"] for r in rows)
    alone = sum(sum(parts[s]["standalone_recipe"]["cpu_seconds"]) for s in SPACES if s in parts)
    return {"supernet_training": round(train, 1), "standalone_training": round(alone, 1),
            "scoring": round(scoring, 1), "total": round(train + alone + scoring, 1)}


def f3(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def by_loss(variant: dict[str, Any]) -> str:
    """The loss ranking's Kendall and CI for a table cell ("n/a" for a row scored before losses were kept)."""
    loss = variant.get("by_loss")
    return "n/a" if loss is None else f"{f3(loss['kendall'])} [{f3(loss['kendall_ci'][0])}, {f3(loss['kendall_ci'][1])}]"


def markdown(p: dict[str, Any]) -> str:
    nb = p["nb201"]
    lines = [f"# Supernet ranking (issue 48){' — tiny run, numbers meaningless' if p['tiny'] else ''}", "",
             f"NB201, {nb['cells']} cells of benchmarks/proxies.py against {nb['truth']}; supernet: "
             f"{nb['supernet_network']}, {nb['budget']['train_cpu_seconds']:.0f} CPU-s of training.", "",
             "| scorer | Spearman | Kendall |", "|---|---|---|"]
    for name in ("supernet", "combined", "supernet_loss", "combined_loss", "vote", "params"):
        if name not in nb:
            continue
        lines.append(f"| {name} | {f3(nb[name]['spearman'])} | {f3(nb[name]['kendall'])} |")
    lines += ["", "NB201 variants (each trained within its CPU budget; scored on the first cells of the sample):", "",
              "| variant | cells | train CPU-s | steps | recal | val | supernet ρ | headline on these cells ρ | "
              "combined ρ | vote ρ | params ρ |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v in nb["variants"]:
        same = v.get("headline_on_these_cells", v["supernet"])
        lines.append(f"| {v['variant']} | {v['cells']} | {v['training']['train_cpu_seconds']:.0f} | "
                     f"{v['training']['steps']} | {v['recal_batches']} | {v['val_subset']} | "
                     f"{f3(v['supernet']['spearman'])} | {f3(same['spearman'])} | {f3(v['combined']['spearman'])} | "
                     f"{f3(v['vote']['spearman'])} | {f3(v['params']['spearman'])} |")
    lines += ["", "Other spaces: Kendall tau of inherited-weight scores against stand-alone short training "
              "(bootstrap 95 % CI over subnets):", "",
              "| space | variant | subnets | supernet CPU-s | stand-alone steps | scored on | Kendall | 95 % CI | Spearman "
              "| by loss: Kendall [95 % CI] | FLOPs' Kendall | commit |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in [n for n in SPACES if n in p]:
        s = p[name]
        for v in s["variants"]:
            lines.append(f"| {name} | {v['variant']} | {s['subnets']} | {v['training']['train_cpu_seconds']:.0f} | "
                         f"{s['standalone_recipe']['steps']} | {v['val_subset']} images | {f3(v['kendall'])} | "
                         f"[{f3(v['kendall_ci'][0])}, {f3(v['kendall_ci'][1])}] | {f3(v['spearman'])} | "
                         f"{by_loss(v)} | {f3(s['flops_baseline']['kendall'])} | {s.get('git_commit', p['git_commit'])[:7]} |")
    goals = [f"{n}: CI low end above 0 {'yes' if p[n]['goals']['kendall_low_above_zero'] else 'no'}, "
             f"above FLOPs {'yes' if p[n]['goals']['above_flops'] else 'no'}" for n in SPACES if n in p]
    lines += ["", "Goals: " + "; ".join(goals) + "."] if goals else []
    wall = "n/a" if p["wall_seconds"] is None else f"{p['wall_seconds']:.0f}"
    if p["parts_missing"]:
        lines += ["", f"Not measured in this run (cut short): {', '.join(p['parts_missing'])}."]
    lines += ["", f"{p['cpu_seconds']['total']:.0f} CPU-s (training, stand-alone runs, scoring), {wall} s wall in all; "
              f"commit {p['git_commit'][:12]}.", ""]
    return "\n".join(lines)


def plot(p: dict[str, Any], parts: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [n for n in SPACES if n in p]
    fig, axes = plt.subplots(1, 1 + len(present), figsize=(4.2 * (1 + len(present)), 3.8), squeeze=False)
    axes = axes[0]
    _, truth, _, _ = nb201_cells(p["nb201"]["cells"])
    axes[0].scatter(parts["nb201"]["scores"], truth, s=4, alpha=0.5)
    axes[0].set(xlabel="supernet score (Fashion-MNIST val %)", ylabel="table CIFAR-10 accuracy (%)",
                title=f"NB201 (Spearman {f3(p['nb201']['supernet']['spearman'])})")
    for ax, name in zip(axes[1:], present):
        s, head = p[name], p[name]["variants"][0]
        points = ax.scatter(head["scores"], s["standalone"], c=np.log10(s["flops"]), s=18, cmap="viridis")
        ax.set(xlabel="inherited-weight score (%)", ylabel="stand-alone accuracy (%)",
               title=f"{name} (tau {f3(s['kendall'])} [{f3(s['kendall_ci'][0])}, {f3(s['kendall_ci'][1])}])")
        fig.colorbar(points, ax=ax, label="log10 FLOPs")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=PARTS, action="append", help="run only this part (repeatable); no report")
    ap.add_argument("--report", action="store_true", help="only write the report from --work")
    ap.add_argument("--tiny", action="store_true", help="a few cells and subnets, seconds of training")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench_supernet_ranking")
    ap.add_argument("--shard", default="0/1", help="K/N: train and score only the subnets at index K mod N "
                                                   "(several processes on one part; rerun the part to write it)")
    ap.add_argument("--phase", choices=("all", "standalone", "supernets"), default="all",
                    help="for the spaces: only their stand-alone runs, or only their supernets")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "supernet_ranking.json")
    args = ap.parse_args()
    cfg = TINY if args.tiny else FULL
    k, _, n = args.shard.partition("/")
    if not (k.isdigit() and n.isdigit() and int(k) < int(n)):
        raise SystemExit(f"--shard must be K/N with 0 <= K < N, got {args.shard!r}")
    split = Split(int(k), int(n), args.phase)
    args.work.mkdir(parents=True, exist_ok=True)
    if not args.report and not (args.work / "started").is_file():
        atomic_write_text(args.work / "started", f"{time.time()}\n")
    for part in ([] if args.report else args.only or PARTS):
        run_part(part, args.work, cfg, split)
    if not args.only:
        payload = report(args.work, cfg, args.out, args.tiny)
        print(markdown(payload))
        print(f"wrote {args.out} (+ .md, .png)")


if __name__ == "__main__":
    main()

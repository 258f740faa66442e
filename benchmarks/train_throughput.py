"""Training throughput of the NB201 ResNet skeleton: plain vs fast path, and a Fashion-MNIST baseline.

1. CPU: images/s and seconds per epoch (forward + backward + SGD step) for
   NADER's ResNet block in NB201's skeleton at the widest width within the
   budget, at 32x32 (CIFAR shape) and 28x28x1 (Fashion-MNIST), and the
   projected seconds for the full 200-epoch CIFAR recipe (50k images/epoch).
2. Engines: whole training epochs through the plain path (Lightning) and the
   fast path (device-resident data, on-device flip/crop, channels_last, bf16,
   `concurrent` candidates in lockstep); seconds per candidate-epoch and the
   ratio. On CPU always (small data); on CUDA, when present, on a 50k-image
   CIFAR-shaped set with the 200-epoch projection per candidate against
   NADER's 2,781.79 s and our 300 s target.
3. Agreement: the same small candidates trained by both paths on digits with
   NB201's seeds 777/888/999: mean and spread of valid accuracy per path.
4. The ResNet skeleton trained with a CPU proxy recipe on Fashion-MNIST:
   valid/test accuracy, so later searches have a baseline.
5. GPU (when CUDA is available): per-candidate seconds of the 200-epoch,
   50k-image recipe for the fast engine eager, with whole-step CUDA graphs,
   graphs at the budget width rounded to a multiple of 8, and torch.compile
   + graphs (compile seconds apart), for the ResNet skeleton and NB201's cell
   network; whether torch.compile's reduce-overhead mode trains the skeleton;
   and accuracy parity, graphed vs eager, 3 seeds on Fashion-MNIST (digits
   when it is missing).  Synthetic CIFAR-shaped uint8 data on the GPU for the
   timings (throughput does not depend on the pixels).  Packing: N = 1, 2,
   4, 8 candidates per GPU as CUDA streams in one process
   (`engine.concurrent=N`), as N processes started together, and as N
   processes under CUDA MPS (when nvidia-cuda-mps-control is there); the
   NB201 cell network and compiled candidates as streams; `packing_fused`
   (`_nb201`, `_compiled`): N = 1..16 candidates of one architecture fused
   into ONE step (fused_pack.py: stacked weights under vmap; not yet
   measured on a GPU); whether cuDNN's
   autotuner (cudnn.benchmark, off in the engine) helps; channels_last vs
   NCHW (`layout`); and where a step's device time goes, by kernel kind
   (`profile`, see kernel_profile.py).  Each section is
   saved as it ends (a GPU lease can end first) and a failing one records
   its error while the rest still run; `--sections` picks and orders them.
6. CPU: the same parity check on Fashion-MNIST (the static-shape step with
   its padded, masked last batch, run eagerly, vs the eager step; 3 seeds)
   and the packing measurement at N = 1, 2 (a smoke test of the GPU code).
Writes benchmarks/results/train_throughput.json (--quick: tiny sizes, to
results/train_throughput_quick.json; a smoke test of every section);
--skip-baseline leaves out section 4 (about 11 minutes); --gpu-only runs
section 5 alone, to results/train_throughput_gpu_<device>.json (+ .md), e.g.
_h100 (about 8 minutes on an H200); --gpu-only --quick without CUDA runs
section 5's code on CPU at tiny sizes (a smoke test, about 7 minutes).

    python benchmarks/train_throughput.py [--quick] [--gpu-only] [--sections a,b] [--skip-baseline]
        [--out PATH] [--fashion-root DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from queue import Empty

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import statistics  # noqa: E402

import torch  # noqa: E402

from nas.data.sources import FASHION_MNIST_ROOT, ImageData, Split, digits, fashion_mnist  # noqa: E402
from nas.io import atomic_write_json, atomic_write_text  # noqa: E402
from nas.measure import count_flops  # noqa: E402
from nas.spaces.nader.arch import BlockArch  # noqa: E402
from nas.spaces.nader.dag.macro import Skeleton, search_width  # noqa: E402
from nas.spaces.nader.network import build_network  # noqa: E402
from nas.spaces.nb201.arch import NB201Cell  # noqa: E402
from nas.spaces.nb201.space import NB201Space  # noqa: E402
from nas.train.engine import Engine  # noqa: E402
from nas.train.optim import sgd  # noqa: E402
from nas.train.recipe import NB201, NB201_SEEDS, Recipe  # noqa: E402
from nas.train.run import train_many  # noqa: E402

BLOCK = ROOT / "tests" / "data" / "blocks" / "residual.txt"  # NADER's ResNet basic block, our copy
RESULTS = ROOT / "benchmarks" / "results"
NADER_SECONDS = 2781.79  # per candidate, full CIFAR training (NADER, Table 6)
TARGET_SECONDS = 300.0


def model(channels: int, size: int, classes: int, seed: int = 0, depth: int = 5, width: int | None = None):
    """The ResNet skeleton, at the widest width within NB201's budget unless `width` is given."""
    torch.manual_seed(seed)
    arch = BlockArch.from_text(BLOCK.read_text())
    sk = Skeleton(depths=(depth,) * 3, input_size=size, in_channels=channels, num_classes=classes)
    p = arch.plan(sk, width=width)
    return build_network(p), p


def step_rate(channels: int, size: int, device: str, batch: int, steps: int) -> dict:
    net, p = model(channels, size, 10)
    net = net.to(device).train()
    opt = sgd(NB201, net.parameters())
    x = torch.randn(batch, channels, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()

    for _ in range(2):  # warm-up
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    ips = batch * steps / seconds
    return {"device": device, "input": [channels, size, size], "width": p.width, "params": p.params,
            "mflops": round(p.flops / 1e6, 1), "batch": batch, "images_per_second": round(ips, 1),
            "seconds_per_epoch_50k": round(50_000 / ips, 1),
            "projected_seconds_200_epochs_50k": round(200 * 50_000 / ips, 0)}


def synthetic(n: int, shape: tuple[int, int, int], classes: int = 10) -> ImageData:
    """Random uint8 images: throughput does not depend on what the pixels show."""
    g = torch.Generator().manual_seed(0)

    def split(k: int) -> Split:
        return Split(torch.randint(0, 256, (k, *shape), generator=g, dtype=torch.uint8),
                     torch.randint(0, classes, (k,), generator=g))

    return ImageData("synthetic", split(n), split(1000), split(1000), classes, (0.5,) * shape[0],
                     (0.25,) * shape[0], pad=4 if shape[1] >= 32 else 2)


def engine_epoch(data: ImageData, engine: Engine, candidates: int, depth: int, width: int | None,
                 batch: int) -> dict:
    """Wall seconds of one training epoch per candidate (valid/test passes included,
    they are a small part), after a warm-up run that pays for compilation."""
    c, h, _ = data.shape
    recipe = Recipe(epochs=1, batch_size=batch, valid_subset=256, test_subset=256)
    warm = Recipe(epochs=1, batch_size=batch, train_subset=4 * batch, valid_subset=256, test_subset=256)

    def nets():
        return [model(c, h, data.num_classes, seed=i, depth=depth, width=width)[0] for i in range(candidates)]

    train_many(nets(), data, warm, 0, engine)
    start = time.perf_counter()
    results = train_many(nets(), data, recipe, 0, engine)
    per_candidate = (time.perf_counter() - start) / candidates
    n = len(data.train)
    return {"engine": engine.to_dict(), "candidates": candidates, "images": n, "device": results[0].device,
            "seconds_per_epoch_per_candidate": round(per_candidate, 3),
            "images_per_second": round(n / per_candidate, 1),
            "projected_seconds_200_epochs": round(200 * per_candidate * 50_000 / n, 1)}


def engines(data: ImageData, accelerator: str, depth: int, width: int | None, batch: int,
            concurrent: int, compile_: bool) -> dict:
    plain = Engine(accelerator=accelerator)
    fast = Engine(kind="fast", accelerator=accelerator, channels_last=True, bf16=True, compile=compile_,
                  concurrent=concurrent)
    rows = [engine_epoch(data, plain, 1, depth, width, batch),
            engine_epoch(data, Engine(kind="fast", accelerator=accelerator), 1, depth, width, batch),
            engine_epoch(data, fast, concurrent, depth, width, batch)]
    base = rows[0]["seconds_per_epoch_per_candidate"]
    for row in rows:
        row["speedup_vs_plain"] = round(base / row["seconds_per_epoch_per_candidate"], 2)
    best = min(r["projected_seconds_200_epochs"] for r in rows)
    return {"rows": rows, "best_projected_seconds_200_epochs": best, "nader_seconds": NADER_SECONDS,
            "target_seconds": TARGET_SECONDS, "meets_target": best <= TARGET_SECONDS}


def accuracy(r, seed: int) -> float:
    """A run's valid accuracy; a run terminated early has none, and a comparison of means
    without it would be wrong, so it stops the section."""
    if r.valid_accuracy is None:
        raise RuntimeError(f"seed {seed} was terminated early ({r.terminated}): no accuracy to compare")
    return r.valid_accuracy


def agreement(epochs: int, seeds: tuple[int, ...]) -> dict:
    """Plain vs fast on identical initial weights, per seed: same numbers within noise?"""
    data = digits()
    recipe = Recipe(epochs=epochs, batch_size=64)
    out = {"dataset": "digits", "recipe": recipe.to_dict(), "seeds": list(seeds)}
    for name, engine in (("plain", Engine()), ("fast", Engine(kind="fast", channels_last=True, bf16=True))):
        acc = [accuracy(train_many([model(1, 8, 10, seed=s, depth=1, width=16)[0]], data, recipe, s, engine)[0], s)
               for s in seeds]
        out[name] = {"valid_accuracy": acc, "mean": round(statistics.fmean(acc), 2),
                     "std": round(statistics.pstdev(acc), 2)}
    out["mean_difference"] = round(out["fast"]["mean"] - out["plain"]["mean"], 2)
    return out


def baseline(recipe: Recipe, depth: int = 5, width: int | None = None) -> dict:
    data = fashion_mnist()
    net, p = model(1, 28, 10, depth=depth, width=width)
    r = train_many([net], data, recipe, 777, Engine())[0]
    return {"dataset": "fashion_mnist", "recipe": recipe.to_dict(), "cells_per_stage": depth, "width": p.width,
            "params": r.params, "valid_accuracy": r.valid_accuracy, "test_accuracy": r.test_accuracy,
            "loss_curve": r.loss_curve, "wall_seconds": r.wall_seconds}


# a conv-heavy NB201 cell (the slow end of the space)
NB201_CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|nor_conv_3x3~2|"
GPU_FAST = {"kind": "fast", "accelerator": "gpu", "channels_last": True, "bf16": True}


def resnet_width(multiple: int, channels: int = 3, size: int = 32) -> int:
    sk = Skeleton(depths=(5, 5, 5), input_size=size, in_channels=channels, num_classes=10)
    return search_width(BlockArch.from_text(BLOCK.read_text()).blocks, sk, multiple=multiple).width


def candidate_seconds(data: ImageData, name: str, make, engine: Engine, epochs: int, batch: int) -> dict:
    """Train one candidate for `epochs` epochs; seconds per epoch exclude the one-off compile/capture
    (`compile_seconds`) and the final valid/test passes (`eval_seconds`), which the 200-epoch
    projection adds back once."""
    recipe = Recipe(epochs=epochs, batch_size=batch, valid_subset=2000, test_subset=2000)
    net = make()
    r = train_many([net], data, recipe, 0, engine)[0]
    per_epoch = (r.device_seconds - r.compile_seconds - r.eval_seconds) / epochs
    n = len(data.train)
    once = r.compile_seconds + r.eval_seconds
    return {"candidate": name, "engine": engine.to_dict(), "params": r.params, "mflops": round(r.flops / 1e6, 1),
            "cuda_graphs": r.cuda_graphs, "compile_seconds": r.compile_seconds, "eval_seconds": r.eval_seconds,
            "epochs": epochs, "seconds_per_epoch": round(per_epoch, 3), "images_per_second": round(n / per_epoch, 1),
            "projected_seconds_200_epochs_50k": round(200 * per_epoch * 50_000 / n + once, 1)}


def _error(exc: BaseException) -> dict:
    """An exception as a result: its type and first line."""
    line = next((t.strip() for t in str(exc).splitlines() if t.strip()), "")
    return {"error": f"{type(exc).__name__}: {line}"[:300]}


def reduce_overhead_probe(data: ImageData, width: int, steps: int) -> dict:
    """Does torch.compile(mode="reduce-overhead") train the skeleton (it failed at the stem's
    aliasing before)? A few real steps, then the mean step time."""
    net = model(3, 32, 10, width=width)[0].cuda().to(memory_format=torch.channels_last).train()
    fwd = torch.compile(net, mode="reduce-overhead")
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True, fused=True)
    x = (data.train.images[:256].cuda().float() / 255).contiguous(memory_format=torch.channels_last)
    y = data.train.labels[:256].cuda()

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(fwd(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    start = time.perf_counter()
    try:
        step()
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the outcome is what is measured
        return {"ok": False, **_error(exc)}
    ms = 1000 * (time.perf_counter() - start) / steps
    return {"ok": True, "first_call_seconds": round(first, 1), "ms_per_step": round(ms, 2),
            "images_per_second": round(256 / ms * 1000, 1)}


def parity(data: ImageData, epochs: int, seeds: tuple[int, ...], train_subset: int | None,
           base: dict | None = None, depth: int = 5, width: int | None = None,
           eval_subset: int | None = None) -> dict:
    """Static-shape (graphed on CUDA; on CPU the same padded, masked step run eagerly) vs eager
    fast engine on the same candidates and seeds: same accuracy within seed noise?"""
    c, h, _ = data.shape
    recipe = Recipe(epochs=epochs, batch_size=256, train_subset=train_subset, valid_subset=eval_subset,
                    test_subset=eval_subset)
    width = width or resnet_width(8, c, h)
    base = GPU_FAST if base is None else base
    out = {"dataset": data.name, "recipe": recipe.to_dict(), "seeds": list(seeds), "cells_per_stage": depth,
           "width": width, "engine": base}
    for name, graphs in (("eager", "off"), ("graphed", "on")):
        engine = Engine(**base, cuda_graphs=graphs)
        runs = [train_many([model(c, h, data.num_classes, seed=s, depth=depth, width=width)[0]], data, recipe, s,
                           engine)[0] for s in seeds]
        acc = [accuracy(r, s) for r, s in zip(runs, seeds)]
        out[name] = {"valid_accuracy": acc, "test_accuracy": [r.test_accuracy for r in runs],
                     "final_loss": [round(r.loss_curve[-1], 4) for r in runs], "cuda_graphs": runs[0].cuda_graphs,
                     "mean": round(statistics.fmean(acc), 2),
                     "std": round(statistics.stdev(acc), 2) if len(acc) > 1 else 0.0,
                     "device_seconds": [r.device_seconds for r in runs]}
    e, g = out["eager"], out["graphed"]
    out["mean_difference"] = round(g["mean"] - e["mean"], 2)
    # two standard errors of the difference of the means
    out["noise_2se"] = round(2 * ((e["std"] ** 2 + g["std"] ** 2) / len(seeds)) ** 0.5, 2)
    out["within_seed_noise"] = abs(out["mean_difference"]) <= max(out["noise_2se"], 0.01)
    return out


def packed_model(arch: str, seed: int, depth: int, width: int):
    """A packing candidate: the ResNet skeleton at `width`, or NB201's cell network (C=16, N=5)."""
    if arch == "nb201":
        torch.manual_seed(seed)
        return NB201Space(channels=16, cells_per_stage=5).build(NB201Cell.from_string(NB201_CELL), num_classes=10,
                                                                in_channels=3)
    return model(3, 32, 10, seed=seed, depth=depth, width=width)[0]


def _packed_child(spec: dict, barrier, results) -> None:
    """One of N processes packed on one device: build the data and a candidate, warm up,
    then train together with the others (started at the barrier)."""
    torch.set_num_threads(spec["threads"])
    data = synthetic(spec["images"], (3, 32, 32))
    engine = Engine(**spec["engine"])
    recipe = Recipe(epochs=spec["epochs"], batch_size=spec["batch"], valid_subset=256, test_subset=256)
    warm = Recipe(epochs=1, batch_size=spec["batch"], train_subset=2 * spec["batch"], valid_subset=256,
                  test_subset=256)
    make = (spec["arch"], spec["index"], spec["depth"], spec["width"])
    train_many([packed_model(*make)], data, warm, 0, engine)
    net = packed_model(*make)
    barrier.wait()
    start = time.time()
    r = train_many([net], data, recipe, 0, engine)[0]
    results.put({"start": start, "end": time.time(), "compile_seconds": r.compile_seconds, "device": r.device,
                 "eval_seconds": r.eval_seconds, "cuda_graphs": r.cuda_graphs})


def _mps_control() -> str | None:
    for path in (shutil.which("nvidia-cuda-mps-control"), "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
                 "/usr/bin/nvidia-cuda-mps-control"):
        if path and Path(path).exists():
            return path
    return None


@contextmanager
def mps_daemon():
    """CUDA MPS for the processes started inside (their kernels share the GPU at once instead
    of time-slicing); yields None when it runs, else why not."""
    exe = _mps_control()
    if exe is None:
        yield "nvidia-cuda-mps-control not found"
        return
    root = Path(tempfile.mkdtemp(prefix="mps-"))
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(root / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(root / "log")}
    for d in env.values():
        Path(d).mkdir()
    os.environ.update(env)
    try:
        r = subprocess.run([exe, "-d"], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            yield f"nvidia-cuda-mps-control -d exited {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}"
            return
        try:
            yield None
        finally:
            subprocess.run([exe], input="quit\n", capture_output=True, text=True, timeout=30)
    finally:
        for k in env:
            os.environ.pop(k, None)
        shutil.rmtree(root, ignore_errors=True)


PACKING_NOTE = ("per-candidate seconds = (group wall time - graph capture - final eval) scaled to 200 "
                "epochs x 50k images, plus the capture and eval once, divided by N")


def packing_row(arch: str, scale: float, n: int, wall: float, setup: float, evals: float, graphs: str) -> dict:
    """One packing row: N candidates trained together in `wall` seconds, `setup` (compile and
    capture) and `evals` (final valid/test passes) paid once; `scale` takes the measured
    epochs to the 200-epoch, 50k-image recipe (PACKING_NOTE)."""
    once = setup + evals  # paid once per candidate, not per epoch
    r = {"n": n, "wall_seconds": round(wall, 3), "compile_seconds": round(setup, 3),
         "eval_seconds": round(evals, 3), "cuda_graphs": graphs,
         "projected_seconds_per_candidate": round(((wall - once) * scale + once) / n, 1)}
    print(f"  packing {arch} N={n}: {r['projected_seconds_per_candidate']} s per candidate "
          f"(wall {r['wall_seconds']} s)", flush=True)
    return r


def packing(accelerator: str, images: int, epochs: int, batch: int, depth: int, width: int,
            ns: tuple[int, ...], threads: int = 1, modes: tuple[str, ...] = ("streams", "processes"),
            arch: str = "resnet", deadline: float = 300.0, compile_: bool = False) -> dict:
    """Several candidates on one device, per-candidate seconds of the 200-epoch, 50k-image recipe:
    (a) streams: one process, `engine.concurrent=N` with CUDA graphs (each candidate one graph
    replay per step on its own stream); (b) processes: N spawned processes, each training one
    candidate, started together; the slowest one's end is the group's wall time.  A group of
    processes that has not finished after `deadline` seconds is killed (an error).  `compile_`:
    torch.compile each candidate too (the warm-up pays for it; the candidates share one
    architecture here, so later ones reuse the compiled code: a distinct architecture pays its
    compile once, see the rows' compile seconds)."""
    import multiprocessing as mp

    engine = {**GPU_FAST, "accelerator": accelerator, "cuda_graphs": "on", "compile": compile_}
    if accelerator == "cpu":
        engine.update(bf16=False, channels_last=False)
    data = synthetic(images, (3, 32, 32))
    recipe = Recipe(epochs=epochs, batch_size=batch, valid_subset=256, test_subset=256)
    warm = Recipe(epochs=1, batch_size=batch, train_subset=2 * batch, valid_subset=256, test_subset=256)
    scale = 200 * 50_000 / images / epochs  # measured epochs -> the 200-epoch, 50k-image recipe

    def nets(n: int) -> list:
        return [packed_model(arch, i, depth, width) for i in range(n)]

    def row(n: int, wall: float, setup: float, evals: float, graphs: str) -> dict:
        return packing_row(arch, scale, n, wall, setup, evals, graphs)

    out: dict = {"measured": True, "device": torch.cuda.get_device_name(0) if accelerator == "gpu"
                 else platform.processor() or "cpu", "arch": arch, "engine": engine, "images": images,
                 "epochs": epochs, "batch": batch, "cells_per_stage": depth, "width": width,
                 "threads_per_process": threads, "note": PACKING_NOTE}
    for n in ns:
        if "streams" in modes:
            e = Engine(**{**engine, "concurrent": n})
            train_many(nets(n), data, warm, 0, e)
            group = nets(n)
            start = time.perf_counter()
            rs = train_many(group, data, recipe, 0, e)
            wall = time.perf_counter() - start
            setup = sum(r.compile_seconds for r in rs)  # captured one after the other
            out.setdefault("streams", []).append(row(n, wall, setup, rs[0].eval_seconds, rs[0].cuda_graphs))
        if "processes" not in modes:
            continue
        ctx = mp.get_context("spawn")
        barrier, queue = ctx.Barrier(n), ctx.Queue()
        spec = {"images": images, "engine": engine, "epochs": epochs, "batch": batch, "depth": depth,
                "width": width, "threads": threads, "arch": arch}
        procs = [ctx.Process(target=_packed_child, args=({**spec, "index": i}, barrier, queue)) for i in range(n)]
        for p in procs:
            p.start()
        got: list[dict] = []
        until = time.monotonic() + deadline
        try:
            while len(got) < n:
                try:
                    got.append(queue.get(timeout=5))
                except Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"a packed training process exited with status {dead[0]}") from None
                    if time.monotonic() > until:
                        raise RuntimeError(f"{n} packed processes still running after {deadline:.0f} s") from None
        finally:
            for p in procs:
                if len(got) < n:
                    p.kill()
                p.join()
        wall = max(g["end"] for g in got) - min(g["start"] for g in got)
        setup = max(g["compile_seconds"] for g in got)  # captured at the same time
        evals = max(g["eval_seconds"] for g in got)
        out.setdefault("processes", []).append(row(n, wall, setup, evals, got[0]["cuda_graphs"]))
    return out


def packing_fused(accelerator: str, images: int, epochs: int, batch: int, depth: int, width: int,
                  ns: tuple[int, ...], arch: str = "resnet", compile_: bool = False) -> dict:
    """N candidates of one architecture (different seeds, the same batches) fused into ONE
    training step (benchmarks/fused_pack.py: stacked weights under vmap, so each kernel does
    N times the work), whole step one CUDA graph; `compile_`: torch.compile of the fused
    step too (recompiled for each N).  Per-candidate seconds as `packing` (packing_row);
    a row that fails (e.g. out of memory at large N) records its error, the next still runs."""
    from fused_pack import probe, train_fused

    spec = {**GPU_FAST, "accelerator": accelerator, "cuda_graphs": "on", "compile": compile_}
    if accelerator == "cpu":
        spec.update(bf16=False, channels_last=False)
    engine = Engine(**spec)
    data = synthetic(images, (3, 32, 32))
    recipe = Recipe(epochs=epochs, batch_size=batch, valid_subset=256, test_subset=256)
    warm = Recipe(epochs=1, batch_size=batch, train_subset=2 * batch, valid_subset=256, test_subset=256)
    scale = 200 * 50_000 / images / epochs
    cuda = accelerator == "gpu"
    out: dict = {"measured": True, "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
                 "arch": arch, "engine": spec, "images": images, "epochs": epochs, "batch": batch,
                 "cells_per_stage": depth, "width": width,
                 "probe": probe(torch.device("cuda" if cuda else "cpu")),
                 "note": PACKING_NOTE + "; fused: one step trains all N (valid accuracy per member in the JSON)"}
    for n in ns:
        try:
            train_fused([packed_model(arch, i, depth, width) for i in range(n)], data, warm, 0, engine)
            nets = [packed_model(arch, i, depth, width) for i in range(n)]
            start = time.perf_counter()
            r = train_fused(nets, data, recipe, 0, engine)
            wall = time.perf_counter() - start
            row = {**packing_row(f"{arch} fused", scale, n, wall, r.compile_seconds, r.eval_seconds, r.cuda_graphs),
                   "valid_accuracy": r.accuracy["valid"], "vmap_fallbacks": r.fallbacks}
        except Exception as exc:  # noqa: BLE001 - a row's failure is its result; the next N still runs
            row = {"n": n, **_error(exc)}
            print(f"  packing {arch} fused N={n}: {row['error']}", flush=True)
            if cuda:
                torch.cuda.empty_cache()
        out.setdefault("fused", []).append(row)
    return out


GPU_SECTIONS = ("packing_fused", "packing_fused_nb201", "packing_fused_compiled", "packing", "rows", "packing_mps",
                "packing_nb201", "packing_compiled", "cudnn_benchmark", "profile",
                "layout", "parity", "reduce_overhead")


def gpu_section(quick: bool, fashion_root: Path, sections: tuple[str, ...] = GPU_SECTIONS,
                save=None) -> dict:
    """The GPU measurements, `sections` in their order (see GPU_SECTIONS); each one's failure is
    recorded as its result and the rest still run; `save(out)` after each (a lease can end).
    Without CUDA (quick only) the same code runs on CPU at tiny sizes: a smoke test."""
    cuda = torch.cuda.is_available()
    acc = "gpu" if cuda else "cpu"
    n = (4096 if cuda else 768) if quick else 50_000
    epochs, batch = (1, 256) if quick else (2, 256)
    data = synthetic(n, (3, 32, 32))
    w_exact, w8 = resnet_width(1), resnet_width(8)
    fast = {**GPU_FAST, "accelerator": acc}
    ns = (1, 2) if quick else (1, 2, 4, 8)
    fused_ns = ns if quick else (1, 2, 4, 8, 16)
    # without CUDA the fused ResNet and profile sections train the depth-1, width-8 skeleton: a smoke test in seconds
    fused_depth, fused_width = (5, w8) if cuda else (1, 8)

    def resnet(width: int):
        return lambda: model(3, 32, 10, width=width)[0]

    def cells():
        return packed_model("nb201", 0, 5, 16)

    out: dict = {"device": torch.cuda.get_device_name(0) if cuda else "cpu (smoke test)",
                 "data": f"synthetic: {n} random uint8 3x32x32 images resident on the GPU (throughput does "
                         "not depend on the pixels)", "batch": batch, "budget_width": w_exact,
                 "width_multiple_8": w8, "nader_seconds": NADER_SECONDS, "target_seconds": TARGET_SECONDS,
                 "sections": list(sections)}
    if cuda:  # CUDA/cuDNN start-up, paid before the first section
        warm = Recipe(epochs=1, batch_size=batch, train_subset=4 * batch, valid_subset=256, test_subset=256)
        train_many([resnet(w8)()], data, warm, 0, Engine(**fast, cuda_graphs="off"))

    def rows() -> list[dict]:
        variants = [(f"resnet w{w_exact}", resnet(w_exact), {"cuda_graphs": "off"}, "eager"),
                    (f"resnet w{w_exact}", resnet(w_exact), {"cuda_graphs": "on"}, "graphed"),
                    (f"resnet w{w8}", resnet(w8), {"cuda_graphs": "on"}, "graphed + width multiple of 8"),
                    (f"resnet w{w8}", resnet(w8), {"cuda_graphs": "on", "compile": True}, "compiled + graphed"),
                    ("nb201 C16 N5", cells, {"cuda_graphs": "off"}, "eager"),
                    ("nb201 C16 N5", cells, {"cuda_graphs": "on"}, "graphed")]
        if not cuda:
            variants = [v for v in variants if "compile" not in v[2]]  # inductor on CPU: minutes, no news
        result = []
        for name, make, extra, label in variants:
            r = candidate_seconds(data, name, make, Engine(**fast, **extra), epochs, batch)
            r["variant"] = label
            print(f"  {name} {label}: {r['projected_seconds_200_epochs_50k']} s per candidate", flush=True)
            result.append(r)
        return result

    def mps() -> dict:
        if not cuda:
            return {"measured": False, "reason": "no CUDA device"}
        with mps_daemon() as why:
            if why is not None:
                return {"measured": False, "reason": f"CUDA MPS unavailable: {why}"}
            return {**packing(acc, n, epochs, batch, depth=5, width=w8, ns=ns, modes=("processes",)), "mps": True}

    def cudnn_benchmark() -> dict:
        """Does cuDNN's autotuner (off in the engine) pick faster convolutions for these small
        widths? The graphed row and compiled streams at N = 8 again with it on; the warm-up
        steps before capture do the tuning."""
        torch.backends.cudnn.benchmark = True
        try:
            row = candidate_seconds(data, f"resnet w{w8}", resnet(w8), Engine(**fast, cuda_graphs="on"), epochs, batch)
            print(f"  resnet w{w8} graphed, cudnn.benchmark: {row['projected_seconds_200_epochs_50k']} s", flush=True)
            packed = packing(acc, n, epochs, batch, depth=5, width=w8, ns=(1, 2) if quick else (8,),
                             modes=("streams",), compile_=cuda)
        finally:
            torch.backends.cudnn.benchmark = False
        return {"graphed": row, "packing_compiled": packed}

    def layout() -> list[dict]:
        """channels_last (the engine's default) vs NCHW for the multiple-of-8 width, graphed and
        compiled + graphed: which memory format cuDNN and inductor serve better at 24 channels."""
        result = []
        groups = [({"cuda_graphs": "on"}, "graphed")]
        if cuda:  # inductor on CPU: minutes, no news
            groups.append(({"cuda_graphs": "on", "compile": True}, "compiled + graphed"))
        for extra, label in groups:
            for cl in (True, False):
                engine = Engine(**{**fast, "channels_last": cl}, **extra)
                r = candidate_seconds(data, f"resnet w{w8}", resnet(w8), engine, epochs, batch)
                r["variant"] = f"{label}, {'channels_last' if cl else 'NCHW'}"
                print(f"  resnet w{w8} {r['variant']}: {r['projected_seconds_200_epochs_50k']} s", flush=True)
                result.append(r)
        return result

    def profile() -> dict:
        """Kernel time by kind per training step (benchmarks/kernel_profile.py) for the ResNet
        at the multiple-of-8 width alone (graphed; compiled with eager launches; compiled +
        graphed) and for 8 compiled candidates as streams: where the packed time goes."""
        from kernel_profile import profile_training

        recipe = Recipe(epochs=1, batch_size=batch, valid_subset=256, test_subset=256)
        variants = [("graphed", 1, {"cuda_graphs": "on"}),
                    ("compiled, eager launches", 1, {"cuda_graphs": "off", "compile": True}),
                    ("compiled + graphed", 1, {"cuda_graphs": "on", "compile": True}),
                    ("compiled + graphed, 8 streams", 8, {"cuda_graphs": "on", "compile": True})]
        if not cuda:  # the static step run eagerly; inductor on CPU takes minutes
            variants = [("static step, eager", 1, {"cuda_graphs": "on"}),
                        ("static step, eager, 2 in lockstep", 2, {"cuda_graphs": "on"})]
        result = []
        for label, k, extra in variants:
            nets = [model(3, 32, 10, seed=i, depth=fused_depth, width=fused_width)[0] for i in range(k)]
            macs = count_flops(nets[0], (1, 3, 32, 32))
            r = profile_training(nets, data, recipe, Engine(**fast, **extra, concurrent=k), 3 if quick else 30)
            if r["measured"]:  # forward MACs x 2 FLOPs x 3 (forward, two backward GEMMs) per image
                r["tflops_while_busy"] = round(6 * macs * batch * k / (r["busy_ms_per_step"] / 1000) / 1e12, 2)
            result.append({"variant": label, "depth": fused_depth, "width": fused_width, "mflops": round(macs / 1e6, 1), **r})
            print(f"  profile {label}: " + (f"busy {r['busy_ms_per_step']} ms / wall {r['wall_ms_per_step']} ms "
                                            f"per step, {r['calls_per_step']} calls"
                                            if r["measured"] else r["reason"]), flush=True)
        return {"variants": result}

    def parity_run() -> dict:
        if (fashion_root / "train-images-idx3-ubyte.gz").exists() or (fashion_root / "train-images-idx3-ubyte").exists():
            return parity(fashion_mnist(str(fashion_root)), 1 if quick else 5, NB201_SEEDS,
                          5000 if quick else None, base=fast)
        return parity(digits(), 3 if quick else 30, NB201_SEEDS, None, base=fast)

    work = {"rows": rows,
            "reduce_overhead": lambda: reduce_overhead_probe(data, w8, 20) if cuda else {"skipped": "no CUDA"},
            "packing": lambda: packing(acc, n, epochs, batch, depth=5, width=w8, ns=ns),
            "packing_mps": mps,
            "packing_nb201": lambda: packing(acc, n, epochs, batch, depth=5, width=16, ns=ns, modes=("streams",),
                                             arch="nb201"),
            "packing_compiled": lambda: packing(acc, n, epochs, batch, depth=5, width=w8,
                                                ns=(1, 2) if quick else (1, 8, 16), modes=("streams",),
                                                compile_=cuda),
            "packing_fused": lambda: packing_fused(acc, n, epochs, batch, fused_depth, fused_width, fused_ns),
            "packing_fused_nb201": lambda: packing_fused(acc, n, epochs, batch, depth=5, width=16, ns=fused_ns,
                                                         arch="nb201"),
            "packing_fused_compiled": lambda: packing_fused(acc, n, epochs, batch, fused_depth, fused_width,
                                                            ns if quick else (1, 8, 16), compile_=cuda),
            "cudnn_benchmark": cudnn_benchmark,
            "profile": profile,
            "layout": layout,
            "parity": parity_run}
    for name in sections:
        start = time.perf_counter()
        print(f"[gpu] {name} ...", flush=True)
        try:
            out[name] = work[name]()
        except Exception as exc:  # noqa: BLE001 - one section's failure is its result; the rest still run
            out[name] = _error(exc)
        print(f"[gpu] {name}: {time.perf_counter() - start:.0f} s", flush=True)
        if name == "rows" and isinstance(out["rows"], list):
            best = min(r["projected_seconds_200_epochs_50k"] for r in out["rows"] if r["candidate"] != "nb201 C16 N5")
            out["best_resnet_projected_seconds"], out["meets_target"] = best, best <= TARGET_SECONDS
        if save is not None:
            save(out)
    return out


def packing_markdown(p: dict | None, title: str = "Packing") -> list[str]:
    if p is None:
        return []
    if "error" in p:
        return [f"{title}: failed ({p['error']}).", ""]
    if not p.get("measured"):
        return [f"{title} (N = 1, 2, 4, 8 candidates per GPU, streams vs processes): not measured ({p['reason']}).",
                ""]
    modes = [m for m in ("streams", "processes", "fused") if m in p]
    what = f"{p.get('arch', 'resnet')} width {p['width']}"
    lines = [f"## {title} on {p['device']} ({what}, {p['epochs']} epochs of {p['images']:,} images)", "",
             "| N | " + " | ".join(f"{m}: projected s / candidate" for m in modes) + " |",
             "| --- |" + " --- |" * len(modes)]

    def cell(r: dict) -> str:
        if "error" in r:
            return f"failed ({r['error']})"
        graphs = r.get("cuda_graphs", "on")
        return f"{r['projected_seconds_per_candidate']:,}" + ("" if graphs == "on" else f" (graphs {graphs})")

    for i, first in enumerate(p[modes[0]]):
        cells = [cell(p[m][i]) if i < len(p[m]) else "-" for m in modes]
        lines.append(f"| {first['n']} | " + " | ".join(cells) + " |")
    lines += ["", p["note"] + ".", ""]
    if "probe" in p:
        lines += [f"vmap without the fused model's casts: {p['probe']}.", ""]
    return lines


def profile_markdown(p: dict | None) -> list[str]:
    """The profile section: one row per variant, then device time by kind (ms per step)
    per variant, then the busiest kernels of the last variant."""
    if p is None:
        return []
    if "error" in p:
        return [f"Profile: failed ({p['error']}).", ""]
    done = [v for v in p["variants"] if v["measured"]]
    lines = ["## Where a training step's device time goes (torch.profiler)", "",
             "| variant | candidates | busy ms / step | summed ms / step | wall ms / step | idle share | "
             "calls / step | intervals under 5 us | TFLOP/s while busy |", "| --- |" + " --- |" * 8]
    for v in p["variants"]:
        if not v["measured"]:
            lines.append(f"| {v['variant']} | {v['reason']} |" + " |" * 7)
            continue
        lines.append(f"| {v['variant']} | {v['candidates']} | {v['busy_ms_per_step']:,.2f} | "
                     f"{v['summed_ms_per_step']:,.2f} | {v['wall_ms_per_step']:,.2f} | {v['idle_share_of_span']:.1%} | "
                     f"{v['calls_per_step']:,.0f} | "
                     f"{v['share_under_5us']:.0%} | {v['tflops_while_busy']} |")
    if not done:
        return lines + [""]
    kinds = sorted({k["name"] for v in done for k in v["by_kind"]})
    ms = [{k["name"]: k["ms_per_step"] for k in v["by_kind"]} for v in done]
    lines += ["", "| kind (ms / step) | " + " | ".join(v["variant"] for v in done) + " |",
              "| --- |" + " --- |" * len(done)]
    for kind in sorted(kinds, key=lambda k: -ms[-1].get(k, 0.0)):
        lines.append(f"| {kind} | " + " | ".join(f"{m.get(kind, 0.0):.3f}" for m in ms) + " |")
    last = done[-1]
    lines += ["", f"Busiest intervals, {last['variant']} ({last['source']}):", "",
              "| name | ms / step | calls / step | share |", "| --- | --- | --- | --- |"]
    lines += [f"| `{t['name'][:100]}` | {t['ms_per_step']} | {t['calls_per_step']} | {t['share']:.1%} |"
              for t in last["top"]]
    return lines + ["", "busy = time with at least one kernel running (union over streams); summed = kernel "
                        "time added up (above busy when streams overlap); idle share = the profiled span with "
                        "nothing running; TFLOP/s = 6 x forward MACs per image x images / busy time.", ""]


def earlier_gpu(path: Path, sections: tuple[str, ...]) -> dict:
    """The GPU results already in `path` for the sections not rerun now (and the settings they
    came with), named in `kept_from_earlier_run`; {} when there are none."""
    try:
        old = json.loads(path.read_text(encoding="utf-8")).get("gpu")
    except (OSError, ValueError, AttributeError):
        return {}
    kept = [s for s in GPU_SECTIONS if isinstance(old, dict) and s in old and s not in sections]
    return {**old, "kept_from_earlier_run": kept} if kept else {}


def gpu_markdown(g: dict, machine: dict) -> str:
    """The GPU section as markdown; sections that did not run (or failed) say so."""
    lines = [f"# Fast-engine training speed on {g['device']} (torch {machine['torch']})", "",
             f"{g['data']}; batch {g['batch']}; NB201 recipe projected to 200 epochs x 50k images. "
             f"Budget width {g['budget_width']}, rounded to a multiple of 8: {g['width_multiple_8']}.", ""]
    rows = g.get("rows")
    if isinstance(rows, list):
        lines += ["| candidate | variant | params | MFLOPs | graphs | compile s | s/epoch | images/s "
                  "| projected s / candidate |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| {r['candidate']} | {r['variant']} | {r['params']:,} | {r['mflops']} | "
                         f"{r['cuda_graphs']} | {r['compile_seconds']} | {r['seconds_per_epoch']} | "
                         f"{r['images_per_second']:,.0f} | {r['projected_seconds_200_epochs_50k']:,.0f} |")
        lines += ["", f"NADER: {g['nader_seconds']:,} s per candidate; target {g['target_seconds']:.0f} s; "
                  f"best ResNet row: {g['best_resnet_projected_seconds']:,.0f} s.", ""]
    elif rows is not None:
        lines += [f"Per-variant rows: failed ({rows['error']}).", ""]
    if "reduce_overhead" in g:
        lines += [f"torch.compile reduce-overhead on the skeleton: {g['reduce_overhead']}", ""]
    lines += packing_markdown(g.get("packing_fused"), "Packing fused candidates (one vmapped step, graphed)")
    lines += packing_markdown(g.get("packing_fused_nb201"), "Packing fused NB201 cell networks (C=16, N=5)")
    lines += packing_markdown(g.get("packing_fused_compiled"), "Packing fused candidates, torch.compile + graphs")
    lines += packing_markdown(g.get("packing"))
    lines += packing_markdown(g.get("packing_mps"), "Packing, processes under CUDA MPS")
    lines += packing_markdown(g.get("packing_nb201"), "Packing the NB201 cell network (C=16, N=5)")
    lines += packing_markdown(g.get("packing_compiled"), "Packing compiled candidates (torch.compile + graphs)")
    tuned = g.get("cudnn_benchmark")
    if tuned is not None and "error" in tuned:
        lines += [f"cudnn.benchmark: failed ({tuned['error']}).", ""]
    elif tuned is not None:
        lines += [f"With torch.backends.cudnn.benchmark: graphed width {g['width_multiple_8']} "
                  f"{tuned['graphed']['projected_seconds_200_epochs_50k']:,.0f} s per candidate alone.", ""]
        lines += packing_markdown(tuned["packing_compiled"], "Packing compiled candidates with cudnn.benchmark")
    lay = g.get("layout")
    if isinstance(lay, list):
        lines += ["## Memory format", "", "| variant | graphs | compile s | s/epoch | projected s / candidate |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['variant']} | {r['cuda_graphs']} | {r['compile_seconds']} | {r['seconds_per_epoch']} | "
                  f"{r['projected_seconds_200_epochs_50k']:,.0f} |" for r in lay]
        lines.append("")
    elif lay is not None:
        lines += [f"Memory format: failed ({lay['error']}).", ""]
    lines += profile_markdown(g.get("profile"))
    p = g.get("parity")
    if p is not None and "error" in p:
        lines += [f"Parity: failed ({p['error']}).", ""]
    elif p is not None:
        lines += [f"## Parity on {p['dataset']} ({p['recipe']['epochs']} epochs, width {p['width']}, "
                  f"seeds {p['seeds']})", "", "| engine | valid accuracy per seed | mean | std |",
                  "| --- | --- | --- | --- |"]
        for name in ("eager", "graphed"):
            lines.append(f"| {name} | {p[name]['valid_accuracy']} | {p[name]['mean']} | {p[name]['std']} |")
        lines += ["", f"Difference of means {p['mean_difference']} (two standard errors: {p['noise_2se']}); "
                  f"within seed noise: {p['within_seed_noise']}.", ""]
    if g.get("kept_from_earlier_run"):
        lines += [f"Kept from this file's earlier run (its numbers, not this run's): "
                  f"{', '.join(g['kept_from_earlier_run'])}.", ""]
    missing = [s for s in GPU_SECTIONS if s not in g]
    if missing:
        lines += [f"Not run this time: {', '.join(missing)}.", ""]
    return "\n".join(lines)


def device_slug() -> str:
    """'h100' for 'NVIDIA H100 80GB HBM3': GPU results are kept per device kind."""
    if not torch.cuda.is_available():
        return "cpu"
    found = re.search(r"\b([A-Z]+\d{2,4}[A-Za-z]*)\b", torch.cuda.get_device_name(0))
    return found.group(1).lower() if found else "gpu"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of every section")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--gpu-only", action="store_true",
                    help="only the GPU section (needs CUDA; with --quick and no CUDA, a CPU smoke test of it)")
    ap.add_argument("--sections", default=",".join(GPU_SECTIONS),
                    help=f"GPU sections to run, in this order (default: {','.join(GPU_SECTIONS)})")
    ap.add_argument("--fashion-root", type=Path, default=Path(FASHION_MNIST_ROOT),
                    help="Fashion-MNIST IDX files for the GPU parity check (digits when missing)")
    ap.add_argument("--out", type=Path, help="JSON path (default: benchmarks/results/train_throughput[_quick].json)")
    args = ap.parse_args()
    quick = args.quick
    name = "train_throughput" + (f"_gpu_{device_slug()}" if args.gpu_only else "") + ("_quick" if quick else "")
    out = args.out or RESULTS / f"{name}.json"
    steps = 2 if quick else args.steps
    result = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "threads": torch.get_num_threads(),
                          "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None},
              "settings": {"quick": quick, "skip_baseline": args.skip_baseline, "steps": steps}}
    sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = [s for s in sections if s not in GPU_SECTIONS]
    if unknown:
        sys.exit(f"--sections: unknown {', '.join(unknown)} (known: {', '.join(GPU_SECTIONS)})")
    if args.gpu_only:
        if not (torch.cuda.is_available() or quick):
            sys.exit("--gpu-only needs a CUDA device (or --quick, for a CPU smoke test)")

        # a run of some sections into the default file keeps the other sections' earlier numbers
        earlier = {} if args.out else earlier_gpu(out, sections)

        def save(gpu: dict) -> None:
            gpu = {**earlier, **gpu}
            atomic_write_json(out, {**result, "gpu": gpu})
            atomic_write_text(out.with_suffix(".md"), gpu_markdown(gpu, result["machine"]))
            result["gpu"] = gpu

        save(gpu_section(quick, args.fashion_root, sections, save))
        print(gpu_markdown(result["gpu"], result["machine"]))
        print(f"wrote {out} (+ .md)")
        return
    cpu_batch = 8 if quick else 128  # a rate per image: quick only checks the section runs
    result["cpu"] = [step_rate(3, 32, "cpu", cpu_batch, steps), step_rate(1, 28, "cpu", cpu_batch, steps)]
    cpu_data = synthetic(256 if quick else 4096, (3, 32, 32))
    result["engines_cpu"] = engines(cpu_data, "cpu", depth=1, width=8 if quick else 16, batch=128,
                                    concurrent=2, compile_=False)
    if torch.cuda.is_available():
        gpu_data = synthetic(2048 if quick else 50_000, (3, 32, 32))
        result["engines_gpu"] = engines(gpu_data, "gpu", depth=5, width=None, batch=256, concurrent=4,
                                        compile_=False)
        result["gpu"] = gpu_section(quick, args.fashion_root, sections)
    else:
        result["engines_gpu"] = {"skipped": "no CUDA device on this machine"}
        result["gpu"] = {"skipped": "no CUDA device on this machine: GPU numbers not measured"}
    fashion = args.fashion_root
    if (fashion / "train-images-idx3-ubyte.gz").exists() or (fashion / "train-images-idx3-ubyte").exists():
        # the static-shape step (padded, masked last batch) that graphs capture, run eagerly on CPU, vs eager
        # quick: two seeds still exercise the spread and the noise bound
        result["parity_cpu"] = parity(fashion_mnist(str(fashion)), 1 if quick else 3,
                                      NB201_SEEDS[:2] if quick else NB201_SEEDS, 256 if quick else 10_000,
                                      base={"kind": "fast", "accelerator": "cpu"}, depth=1, width=16,
                                      eval_subset=256 if quick else 5000)
    else:
        result["parity_cpu"] = {"skipped": f"{fashion} missing"}
    result["packing_cpu"] = packing("cpu", 512 if quick else 2048, 1, 128, depth=1, width=8, ns=(1, 2))
    result["agreement"] = agreement(2 if quick else 15, NB201_SEEDS[:1] if quick else NB201_SEEDS)
    if not (args.skip_baseline or quick):
        if Path(FASHION_MNIST_ROOT).exists():
            # the budget-width skeleton on a short proxy, and the small skeleton CPU searches use, longer
            result["fashion_mnist_baseline"] = [
                baseline(Recipe(epochs=4, batch_size=128, train_subset=15_000, valid_subset=5_000,
                                test_subset=10_000)),
                baseline(Recipe(epochs=4, batch_size=128), depth=1, width=16)]
        else:
            result["fashion_mnist_baseline"] = {"skipped": f"{FASHION_MNIST_ROOT} missing"}
    elif args.skip_baseline:
        result["fashion_mnist_baseline"] = {"skipped": "--skip-baseline (about 11 min of a single-user 2-core "
                                                       "CPU; see git history for the last one)"}
    atomic_write_json(out, result)
    for row in result["cpu"]:
        print(f"cpu {row['input']}: width {row['width']}, {row['images_per_second']} img/s, "
              f"{row['seconds_per_epoch_50k']} s per 50k-image epoch")
    for section in ("engines_cpu", "engines_gpu"):
        for row in result[section].get("rows", []):
            e = row["engine"]
            print(f"{section} {e['kind']:5} x{row['candidates']} (bf16={e['bf16']}, compile={e['compile']}): "
                  f"{row['seconds_per_epoch_per_candidate']} s/epoch per candidate, "
                  f"{row['speedup_vs_plain']}x plain, 200 epochs of 50k: {row['projected_seconds_200_epochs']} s")
    a = result["agreement"]
    print(f"agreement on digits: plain {a['plain']['mean']}±{a['plain']['std']}, "
          f"fast {a['fast']['mean']}±{a['fast']['std']}")
    p = result["parity_cpu"]
    if "eager" in p:
        print(f"parity on {p['dataset']} (CPU, static-shape vs eager): {p['graphed']['mean']} vs "
              f"{p['eager']['mean']}, difference {p['mean_difference']} (2 s.e. {p['noise_2se']})")
    for kind in ("streams", "processes"):
        print(f"packing on CPU, {kind}: " + ", ".join(f"N={r['n']} {r['projected_seconds_per_candidate']} s"
                                                      for r in result["packing_cpu"][kind]))
    for base in result.get("fashion_mnist_baseline", []):
        if base.get("test_accuracy") is not None:
            print(f"fashion_mnist N={base['cells_per_stage']} width {base['width']}: valid {base['valid_accuracy']:.2f}%,"
                  f" test {base['test_accuracy']:.2f}% in {base['wall_seconds']:.0f} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

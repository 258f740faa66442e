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
Writes benchmarks/results/train_throughput.json (--quick: tiny sizes, to
results/train_throughput_quick.json; a smoke test of every section).

    python benchmarks/train_throughput.py [--quick] [--skip-baseline] [--out PATH]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import statistics  # noqa: E402

from nas.arch.block import BlockArch  # noqa: E402
from nas.arch.dag.macro import Skeleton  # noqa: E402
from nas.data.sources import FASHION_MNIST_ROOT, ImageData, Split, digits, fashion_mnist  # noqa: E402
from nas.io import atomic_write_json  # noqa: E402
from nas.train.engine import Engine  # noqa: E402
from nas.train.recipe import NB201_SEEDS, Recipe  # noqa: E402
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
    return arch.to_module(sk, width=p.width), p


def step_rate(channels: int, size: int, device: str, batch: int, steps: int) -> dict:
    net, p = model(channels, size, 10)
    net = net.to(device).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
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


def agreement(epochs: int, seeds: tuple[int, ...]) -> dict:
    """Plain vs fast on identical initial weights, per seed: same numbers within noise?"""
    data = digits()
    recipe = Recipe(epochs=epochs, batch_size=64)
    out = {"dataset": "digits", "recipe": recipe.to_dict(), "seeds": list(seeds)}
    for name, engine in (("plain", Engine()), ("fast", Engine(kind="fast", channels_last=True, bf16=True))):
        acc = [train_many([model(1, 8, 10, seed=s, depth=1, width=16)[0]], data, recipe, s, engine)[0].valid_accuracy
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of every section")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--out", type=Path, help="JSON path (default: benchmarks/results/train_throughput[_quick].json)")
    args = ap.parse_args()
    quick = args.quick
    out = args.out or RESULTS / ("train_throughput_quick.json" if quick else "train_throughput.json")
    steps = 2 if quick else args.steps
    result = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "threads": torch.get_num_threads(),
                          "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}
    result["cpu"] = [step_rate(3, 32, "cpu", 128, steps), step_rate(1, 28, "cpu", 128, steps)]
    cpu_data = synthetic(512 if quick else 4096, (3, 32, 32))
    result["engines_cpu"] = engines(cpu_data, "cpu", depth=1, width=8 if quick else 16, batch=128,
                                    concurrent=2, compile_=False)
    if torch.cuda.is_available():
        gpu_data = synthetic(2048 if quick else 50_000, (3, 32, 32))
        result["engines_gpu"] = engines(gpu_data, "gpu", depth=5, width=None, batch=256, concurrent=4,
                                        compile_=not quick)
    else:
        result["engines_gpu"] = {"skipped": "no CUDA device on this machine"}
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
    for base in result.get("fashion_mnist_baseline", []):
        if "test_accuracy" in base:
            print(f"fashion_mnist N={base['cells_per_stage']} width {base['width']}: valid {base['valid_accuracy']:.2f}%,"
                  f" test {base['test_accuracy']:.2f}% in {base['wall_seconds']:.0f} s")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

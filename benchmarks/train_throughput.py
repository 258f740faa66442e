"""Training throughput of the NB201 ResNet skeleton, and a Fashion-MNIST baseline.

1. CPU: images/s and seconds per epoch (forward + backward + SGD step) for
   NADER's ResNet block in NB201's skeleton at the widest width within the
   budget, at 32x32 (CIFAR shape) and 28x28x1 (Fashion-MNIST), and the
   projected seconds for the full 200-epoch CIFAR recipe (50k images/epoch
   for CIFAR-100, 25k for NB201's cifar10-valid; we project 50k).
2. The same model trained with the CPU proxy recipe on Fashion-MNIST:
   valid/test accuracy, so later searches have a baseline.
3. GPU: when CUDA is available, the same projection for the plain path
   (fast path: to come; see issue 4).
Writes benchmarks/results/train_throughput.json.

    python benchmarks/train_throughput.py [--steps 10] [--skip-baseline]
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

from nas.arch.block import BlockArch  # noqa: E402
from nas.arch.dag.macro import Skeleton  # noqa: E402
from nas.data.sources import FASHION_MNIST_ROOT, fashion_mnist  # noqa: E402
from nas.io import atomic_write_json  # noqa: E402
from nas.train.fit import train  # noqa: E402
from nas.train.recipe import Recipe  # noqa: E402

BLOCK = ROOT / "tests" / "data" / "blocks" / "residual.txt"  # NADER's ResNet basic block, our copy
OUT = ROOT / "benchmarks" / "results" / "train_throughput.json"


def model(channels: int, size: int, classes: int, seed: int = 0):
    torch.manual_seed(seed)
    arch = BlockArch.from_text(BLOCK.read_text())
    sk = Skeleton.nb201(input_size=size, num_classes=classes)
    sk = Skeleton(depths=sk.depths, input_size=size, in_channels=channels, num_classes=classes)
    p = arch.plan(sk)
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


def baseline(recipe: Recipe) -> dict:
    data = fashion_mnist()
    net, p = model(1, 28, 10)
    r = train(net, data, recipe, seed=777)
    return {"dataset": "fashion_mnist", "recipe": recipe.to_dict(), "width": p.width, "params": r.params,
            "valid_accuracy": r.valid_accuracy, "test_accuracy": r.test_accuracy, "loss_curve": r.loss_curve,
            "wall_seconds": r.wall_seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--skip-baseline", action="store_true")
    args = ap.parse_args()
    result = {"machine": {"python": platform.python_version(), "torch": torch.__version__,
                          "threads": torch.get_num_threads(),
                          "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}}
    result["cpu"] = [step_rate(3, 32, "cpu", 128, args.steps), step_rate(1, 28, "cpu", 128, args.steps)]
    result["gpu"] = ([step_rate(3, 32, "cuda", 256, 5 * args.steps)] if torch.cuda.is_available()
                     else {"skipped": "no CUDA device on this machine"})
    if not args.skip_baseline:
        if Path(FASHION_MNIST_ROOT).exists():
            proxy = Recipe(epochs=4, batch_size=128, train_subset=15_000, valid_subset=5_000, test_subset=10_000)
            result["fashion_mnist_baseline"] = baseline(proxy)
        else:
            result["fashion_mnist_baseline"] = {"skipped": f"{FASHION_MNIST_ROOT} missing"}
    atomic_write_json(OUT, result)
    for row in result["cpu"]:
        print(f"cpu {row['input']}: width {row['width']}, {row['images_per_second']} img/s, "
              f"{row['seconds_per_epoch_50k']} s per 50k-image epoch")
    base = result.get("fashion_mnist_baseline", {})
    if "test_accuracy" in base:
        print(f"fashion_mnist proxy: valid {base['valid_accuracy']:.2f}%, test {base['test_accuracy']:.2f}% "
              f"in {base['wall_seconds']:.0f} s")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

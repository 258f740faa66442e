"""What one subnet score costs at ImageNet size (issue 48): seconds per subnet for the full-size OFA
MobileNetV3, SPOS ShuffleNetV2 and AutoFormer-Tiny spaces at 224 px (OFA: each subnet at its own
resolution), random weights, synthetic ImageNet-sized data -> JSON.

A score is what `evaluator=supernet` does per subnet: extract the subnet from the supernet, re-estimate
its BatchNorm statistics on the recalibration images (OFA: 2,000 training images), then classify the
validation set (50,000 images). Here the images are random tensors already decoded, resized and on the
device: the score's compute alone, as if the data pipeline kept the decoded validation set resident
(JPEG decoding is timed separately, per image, in `decode`: the cost a pipeline that decodes per
subnet would add). Each subnet is timed on a stated subset (`--recal-images`, `--val-images`) and
extrapolated linearly to the full counts: forward passes of fixed-size batches scale with the images.

On CPU the run uses this process's torch threads (recorded) in float32, contiguous and channels-last.
With a GPU (`--device cuda`, the default when one is present) each row is timed in float32 and in bf16
autocast with channels-last, the batches back to back. Anchor: CoLLM-NAS reports ~30 s per subnet on
a GPU (0.07-0.1 GPU-days for 250 subnets); a row says which of extract, recalibration and validation
bounds it.

    python benchmarks/supernet_eval.py                 # CPU, ~15 min on 2 idle cores
    python benchmarks/supernet_eval.py --subnets 1 --recal-images 8 --val-images 8 --out /tmp/e.json

Writes benchmarks/results/supernet_eval.json and supernet_eval.md."""

from __future__ import annotations

import argparse
import io
import os
import platform
import random
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.core.space import SPACES  # noqa: E402
from nas.io import atomic_write_json, atomic_write_text  # noqa: E402
from supernets.base import SUPERNETS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FULL_RECAL, FULL_VAL = 2_000, 50_000  # OFA's recalibration images; ImageNet's validation split
ANCHOR_SECONDS = 30.0  # CoLLM-NAS: 0.07-0.1 GPU-days for 250 subnets
# The full-size spaces CoLLM-NAS searches (conf/space/ofa_mbv3.yaml, spos.yaml, autoformer.yaml).
SPACE_PARAMS: dict[str, dict[str, Any]] = {"ofa_mbv3": {}, "spos": {}, "autoformer": {}}


def sample(space: Any, rng: random.Random) -> Any:
    return space.from_values([rng.choice(d.choices) for d in space.decisions()])


def timed(fn: Any, device: torch.device) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds over all its threads) of `fn`."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, time.process_time() - cpu


def batches(n: int, batch: int, size: int, device: torch.device, memory_format: torch.memory_format) -> list[torch.Tensor]:
    """`n` synthetic normalised images in batches of `batch`, resident on the device."""
    out, g = [], torch.Generator().manual_seed(0)
    for i in range(0, n, batch):
        x = torch.randn(min(batch, n - i), 3, size, size, generator=g)
        out.append(x.to(device).contiguous(memory_format=memory_format))
    return out


@torch.no_grad()
def score_once(net: torch.nn.Module, recal: list[torch.Tensor], val: list[torch.Tensor], device: torch.device,
               bf16: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """(wall, CPU) seconds of recalibration and of validation of one subnet, as supernets.scoring does it: BN
    statistics reset and re-estimated as plain averages in train mode, then eval-mode argmax."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    bns = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]

    def recalibrate() -> None:
        for m in bns:
            m.reset_running_stats()
            m.momentum = None
        net.train()
        with autocast:
            for x in recal:
                net(x)

    def validate() -> None:
        net.eval()
        with autocast:
            for x in val:
                net(x).argmax(1)

    return timed(recalibrate, device), timed(validate, device)


# How a row runs: (name, bf16 autocast, channels-last). A GPU gets float32 and the fast mode the
# GPU issue asks for; the CPU float32 in both memory formats (channels-last is free there too).
MODES = {"cpu": [("float32", False, False), ("float32, channels-last", False, True)],
         "cuda": [("float32", False, False), ("bf16 autocast, channels-last", True, True)]}


def measure_space(name: str, args: argparse.Namespace, device: torch.device,
                  mode: tuple[str, bool, bool]) -> dict[str, Any]:
    precision, bf16, channels_last = mode
    space = SPACES.create(name, SPACE_PARAMS[name])
    supernet = SUPERNETS.create(name, {"num_classes": 1000}, space=space).eval()
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    rng = random.Random(args.seed)
    rows = []
    for _ in range(args.subnets):
        arch = sample(space, rng)
        size = supernet.input_size(arch) or 224
        start = time.perf_counter()
        net = supernet.extract(arch).to(device)
        extract = time.perf_counter() - start  # .to() of a module's parameters synchronises
        net = net.to(memory_format=memory_format)
        recal = batches(args.recal_images, args.batch_size, size, device, memory_format)
        val = batches(args.val_images, args.batch_size, size, device, memory_format)
        score_once(net, recal[:1], val[:1], device, bf16)  # warm-up: allocator, kernels, autotuning
        (recal_s, recal_cpu), (val_s, val_cpu) = score_once(net, recal, val, device, bf16)
        per_recal, per_val = recal_s / args.recal_images, val_s / args.val_images
        parts = {"extract": extract, "recalibrate": per_recal * FULL_RECAL, "validate": per_val * FULL_VAL}
        # CPU seconds (all threads): what the score costs a core, whatever else shared the machine
        core = recal_cpu / args.recal_images * FULL_RECAL + val_cpu / args.val_images * FULL_VAL
        rows.append({"arch": arch.canonical(), "resolution": size, "cost": vars(space.cost(arch)),
                     "measured": {"recal_images": args.recal_images, "val_images": args.val_images,
                                  "recal_seconds": round(recal_s, 4), "val_seconds": round(val_s, 4),
                                  "recal_cpu_seconds": round(recal_cpu, 4), "val_cpu_seconds": round(val_cpu, 4)},
                     "images_per_second": {"recalibrate": round(1 / per_recal, 1), "validate": round(1 / per_val, 1)},
                     "extrapolated_seconds": {k: round(v, 2) for k, v in parts.items()},
                     "seconds_per_subnet": round(sum(parts.values()), 2),
                     "core_seconds_per_subnet": round(core, 2),
                     "bound_by": max(parts, key=parts.__getitem__)})
        del net, recal, val
    per_subnet = [r["seconds_per_subnet"] for r in rows]
    mean = sum(per_subnet) / len(per_subnet)
    # on an idle machine: extraction plus the scoring's CPU seconds spread over the torch threads
    idle = sum(r["extrapolated_seconds"]["extract"] + r["core_seconds_per_subnet"] / torch.get_num_threads()
               for r in rows) / len(rows)
    return {"space": name, "device": device.type, "precision": precision,
            "subnets": rows, "seconds_per_subnet_mean": round(mean, 2),
            **({"idle_seconds_per_subnet_mean": round(idle, 2)} if device.type == "cpu" else {}),
            "vs_anchor": round(mean / ANCHOR_SECONDS, 2)}


def decode_seconds(images: int = 20) -> dict[str, Any]:
    """PIL JPEG decode + OFA's eval transform of ImageNet-sized photos (500x375, quality 90), per image."""
    import numpy as np
    from PIL import Image
    from torchvision import transforms

    raw = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    Image.fromarray(noise).save(raw, format="JPEG", quality=90)
    data = raw.getvalue()
    tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.PILToTensor()])
    start = time.perf_counter()
    for _ in range(images):
        tf(Image.open(io.BytesIO(data)).convert("RGB"))
    per = (time.perf_counter() - start) / images
    return {"jpeg_bytes": len(data), "seconds_per_image": round(per, 5),
            "val_split_seconds_one_core": round(per * FULL_VAL, 1),
            "note": "decoding the 50,000 validation images once per process (then kept resident) costs this "
                    "once; a pipeline decoding them per subnet pays it per subnet (divided by its workers)"}


def table(result: dict[str, Any]) -> str:
    lines = ["# Seconds per subnet score at ImageNet size (extrapolated)", "",
             f"{FULL_RECAL:,} recalibration + {FULL_VAL:,} validation images, random weights, synthetic resident "
             f"data; anchor: CoLLM-NAS ~{ANCHOR_SECONDS:.0f} s per subnet on a GPU.", "",
             f"CPU rows: wall seconds as measured (load average {result['machine']['load_average']}) and the "
             "idle-machine estimate, which other processes do not inflate: extraction plus the CPU seconds of "
             f"recalibration and validation spread over the {result['machine']['torch_threads']} torch threads.", "",
             "| space | device | precision | s / subnet | idle s / subnet | x anchor | recal img/s | val img/s | bound by |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in result["rows"]:
        ips = [s["images_per_second"] for s in row["subnets"]]
        bound = sorted({s["bound_by"] for s in row["subnets"]})
        lines.append(f"| {row['space']} | {row['device']} | {row['precision']} | {row['seconds_per_subnet_mean']:,} "
                     f"| {format(row['idle_seconds_per_subnet_mean'], ',') if 'idle_seconds_per_subnet_mean' in row else '-'} "
                     f"| {row['vs_anchor']} | {sum(i['recalibrate'] for i in ips) / len(ips):.1f} "
                     f"| {sum(i['validate'] for i in ips) / len(ips):.1f} | {', '.join(bound)} |")
    d = result["decode"]
    lines += ["", f"JPEG decode + resize + crop (PIL, one core): {d['seconds_per_image'] * 1000:.1f} ms per image, "
              f"{d['val_split_seconds_one_core']:,} s for the validation split."]
    return "\n".join(lines) + "\n"


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spaces", nargs="+", default=list(SPACE_PARAMS), choices=list(SPACE_PARAMS))
    parser.add_argument("--subnets", type=int, default=2, help="random subnets timed per space")
    parser.add_argument("--recal-images", type=int, default=64, help=f"timed subset of the {FULL_RECAL:,}")
    parser.add_argument("--val-images", type=int, default=128, help=f"timed subset of the {FULL_VAL:,}")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "supernet_eval.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = []
    for name in args.spaces:
        for mode in MODES[device.type]:
            print(f"{name} on {device.type} ({mode[0]}) ...", flush=True)
            rows.append(measure_space(name, args, device, mode))
            print(f"  {rows[-1]['seconds_per_subnet_mean']} s per subnet (extrapolated)", flush=True)
    result = {
        "benchmark": "seconds per supernet subnet score at ImageNet size",
        "full_counts": {"recal_images": FULL_RECAL, "val_images": FULL_VAL},
        "anchor_seconds_per_subnet": ANCHOR_SECONDS,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                    "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
                    "torch": torch.__version__},
        "commit": commit(), "rows": rows, "decode": decode_seconds(),
    }
    atomic_write_json(args.out, result)
    atomic_write_text(args.out.with_suffix(".md"), table(result))
    print(f"wrote {args.out} and {args.out.with_suffix('.md').name}")


if __name__ == "__main__":
    main()

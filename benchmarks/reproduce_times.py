"""What reproducing each paper table row would cost, predicted from the throughput nasflow measured
(issue 48) -> JSON + the markdown table docs/reproduce.md shows.

No search runs here: each row multiplies the evaluations the paper made by the seconds one evaluation
took in a committed benchmark: supernet subnet scores from supernet_eval.json (ImageNet size, 2,000
recalibration + 50,000 validation images), NB201-recipe trainings (200 epochs of 50,000 CIFAR images)
from train_throughput.json (CPU) and train_throughput_gpu_h200.json (alone: compiled + CUDA graphs;
packed: the fastest packing row). A row whose evaluation was not measured at its size says how it was
scaled (by multiply-accumulates, or by images x pixels). LLM time is not included (it depends on the
endpoint). tests/test_reproduce_page.py checks that docs/reproduce.md shows this table as written.

    python benchmarks/reproduce_times.py     # reads benchmarks/results/; writes reproduce_times.json/.md and
                                             # the table of docs/reproduce.md
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json, atomic_write_text, read_json  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
SEEDS = 3  # the papers report the best (CoLLM-NAS) or mean (NB201 protocol) of three runs or seeds
# ImageNet16-120's training split (151,700 images of 16x16) against CIFAR's 50,000 of 32x32.
IN16_SCALE = (151_700 * 16 * 16) / (50_000 * 32 * 32)
# AutoFormer-S/-B subnets' MACs against Tiny's, CoLLM-NAS Table 2 (4,897 and 11,074 vs 1,366 M).
AUTOFORMER_SCALE = {"T": 1.0, "S": 4897 / 1366, "B": 11074 / 1366}


@dataclass(frozen=True)
class Row:
    paper: str
    row: str
    number: str  # the paper's result
    evaluations: int  # in all: three runs of 250 subnets (CoLLM-NAS), three seeds per design (NB201 protocol)
    unit: str  # what one evaluation is
    cpu_seconds: float | None  # per evaluation
    gpu_seconds: float | None  # per evaluation, alone
    gpu_packed_seconds: float | None
    gpu: str | None
    scaled: str  # how the per-evaluation cost was obtained


def supernet_seconds(result: dict[str, Any]) -> dict[tuple[str, str], float]:
    """(space, device) -> the fastest precision's mean seconds per subnet score (CPU: on an idle
    machine, which a run measured under load states apart from its wall seconds)."""
    out: dict[tuple[str, str], float] = {}
    for row in result["rows"]:
        key = (row["space"], row["device"])
        out[key] = min(out.get(key, float("inf")), row.get("idle_seconds_per_subnet_mean", row["seconds_per_subnet_mean"]))
    return out


def nb201_seconds(cpu: dict[str, Any], gpu: dict[str, Any]) -> tuple[float, float, float, str]:
    """Seconds per 200-epoch CIFAR candidate: CPU, GPU alone, GPU packed, and the GPU's name."""
    g = gpu["gpu"]
    packed = min(r["projected_seconds_per_candidate"] for key in ("packing", "packing_compiled", "packing_mps")
                 for kind in ("streams", "processes") for r in g.get(key, {}).get(kind, []))
    cpu_rgb = next(r for r in cpu["cpu"] if r["input"] == [3, 32, 32])
    return cpu_rgb["projected_seconds_200_epochs_50k"], g["best_resnet_projected_seconds"], packed, g["device"]


def rows(results: Path = RESULTS) -> list[Row]:
    sn = supernet_seconds(read_json(results / "supernet_eval.json"))
    cpu, alone, packed, gpu_name = nb201_seconds(read_json(results / "train_throughput.json"),
                                                 read_json(results / "train_throughput_gpu_h200.json"))
    out = []

    def collm(row: str, number: str, space: str, scale: float, note: str) -> Row:
        g = sn.get((space, "cuda"))
        return Row("CoLLM-NAS Table 2", row, number, 250 * SEEDS, "subnet score", round(sn[(space, "cpu")] * scale, 1),
                   None if g is None else round(g * scale, 1), None, None if g is None else "measured", note)

    for name, number in (("OFA-T", "75.9 % @ 200 MFLOPs"), ("OFA-S", "77.6 % @ 297 MFLOPs"),
                         ("OFA-B", "78.5 % @ 391 MFLOPs"), ("OFA-L", "79.0 % @ 498 MFLOPs")):
        out.append(collm(f"{name} + CoLLM", number, "ofa_mbv3", 1.0, "supernet_eval: random subnets of the space"))
    out.append(collm("SPOS + CoLLM", "74.4 % @ 325 MFLOPs", "spos", 1.0,
                     "supernet_eval: random subnets; the paper retrains the best from scratch (not in nasflow)"))
    for scale, number in (("T", "75.3 % @ 1.37 GMACs"), ("S", "81.7 % @ 4.90 GMACs"), ("B", "82.3 % @ 11.07 GMACs")):
        note = "supernet_eval: AutoFormer-Tiny" + ("" if scale == "T" else f", scaled by MACs (x{AUTOFORMER_SCALE[scale]:.2f})")
        out.append(collm(f"AutoFormer-{scale} + CoLLM", number, "autoformer", AUTOFORMER_SCALE[scale], note))
    nb201 = "train_throughput: NB201 recipe, 200 epochs, 3 seeds per design"
    for designs, numbers in ((10, ("94.40", "74.51", "49.63")), (500, ("94.62", "76.00", "50.52"))):
        for data, number in zip(("CIFAR-10", "CIFAR-100", "ImageNet16-120"), numbers):
            scale = IN16_SCALE if data == "ImageNet16-120" else 1.0
            note = nb201 + (f", scaled by images x pixels (x{IN16_SCALE:.2f})" if scale != 1.0 else "")
            out.append(Row("NADER", f"NADER ({designs}) on {data}", f"{number} %", designs * SEEDS, "training",
                           round(cpu * scale, 1), round(alone * scale, 1), round(packed * scale, 1), gpu_name, note))
    out.append(Row("FairNAD", "FairNAD (500) on CIFAR-10", "95.46 %", 500 * SEEDS, "training", round(cpu, 1),
                   round(alone, 1), round(packed, 1), gpu_name, nb201))
    return out


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "not measured"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def table(items: list[Row]) -> str:
    lines = ["| row | paper's result | evaluations | one evaluation (CPU / GPU) | predicted on 2 CPU cores | "
             "predicted on one GPU (alone / packed) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in items:
        runs = r.evaluations
        gpu = _duration(None if r.gpu_seconds is None else r.gpu_seconds * runs)
        if r.gpu_packed_seconds is not None:
            gpu += f" / {_duration(r.gpu_packed_seconds * runs)} ({r.gpu})"
        one = f"{r.cpu_seconds:,.0f} s / " + ("-" if r.gpu_seconds is None else f"{r.gpu_seconds:,.0f} s")
        lines.append(f"| {r.paper}: {r.row} | {r.number} | {runs:,} {r.unit}s | {one} | "
                     f"{_duration(r.cpu_seconds * runs)} | {gpu} |")
    return "\n".join(lines) + "\n"


PAGE = ROOT / "docs" / "reproduce.md"
START, END = "<!-- reproduce-times:start -->", "<!-- reproduce-times:end -->"


def with_table(page: str, text: str) -> str:
    """`page` with `text` between its START and END markers."""
    head, rest = page.split(START, 1)
    return f"{head}{START}\n{text}{END}{rest.split(END, 1)[1]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS / "reproduce_times.json")
    parser.add_argument("--page", type=Path, default=PAGE, help="the docs page whose table is rewritten")
    args = parser.parse_args()
    items = rows()
    atomic_write_text(args.page, with_table(args.page.read_text(), table(items)))
    atomic_write_json(args.out, {"benchmark": "predicted cost of reproducing the papers' table rows",
                                 "seeds_or_runs": SEEDS, "rows": [asdict(r) for r in items],
                                 "note": "per-evaluation seconds from supernet_eval.json, train_throughput.json and "
                                         "train_throughput_gpu_h200.json; LLM time not included"})
    atomic_write_text(args.out.with_suffix(".md"), table(items))
    print(f"wrote {args.out}, {args.out.with_suffix('.md').name} and the table of {args.page}")


if __name__ == "__main__":
    main()

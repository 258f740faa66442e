"""What honest networks carry besides their input and trainable parameters, in bits -> JSON + markdown.

`GraphNet.carried` counts everything a rebuilt network's output can depend on other than its input
and the parameters training redraws: what the train and eval graphs' nodes spell (operators, literals,
sizes, references), the bytes of buffers and constants, and every tensor's shape and dtype. A network
spelling more than `FREE_BITS` has the rest counted as parameters (32 bits each); past `MAX_BITS` it
is refused. This survey exports, as a sandbox child does (`export_graph`), every real model the
project ships or tests with: the model files in tests/data/models, FairNAD's base models
(nas/spaces/source/bases), and networks of each space (NB201 cells, NADER block files, OFA-MbV3,
SPOS and AutoFormer at their small sizes: the largest choices and seeded random samples), plus a
few torchvision models for scale. Each row: parameters, nodes, bits by part, the total, its margin
below `FREE_BITS`, the dry run's cost as the parser counts it (`MAX_COST`) and its seconds per unit.
The budget is a measured margin: `FREE_BITS` over the largest honest total. `dry_run` times the
graphs the parser's caps let through at their worst (plain nodes, einsums of MAX_EINSUM_OPERANDS
tensors, `cat`s of MAX_NODE_OPERANDS tensors, each up to MAX_COST) against the worker's clock for
them (`GraphNet.dry_run_seconds`): the clock the parse sets holds at the caps.

    python benchmarks/graph_information.py            # every row, ~5 min on 2 cores
    python benchmarks/graph_information.py --quick    # one network per group
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
import torchvision
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json, atomic_write_text  # noqa: E402
from nas.sandbox.graph import (  # noqa: E402
    DRY_RUN_SECONDS_PER_UNIT,
    EINSUM_OPERAND_COST,
    FORMAT,
    FREE_BITS,
    MAX_BITS,
    MAX_COST,
    MAX_EINSUM_OPERANDS,
    MAX_NODE_OPERANDS,
    NODE_COST,
    Artifact,
    GraphNet,
    _graph_data,
    carried_parameters,
    export_graph,
    pack,
    unpack,
)
from nas.spaces import SPACES  # noqa: E402

SAMPLES = 3  # seeded random networks per categorical space, besides its largest
TORCHVISION = ("resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x1_0", "densenet121",
               "densenet201", "convnext_tiny", "swin_t")
Row = tuple[str, str, Callable[[], nn.Module], tuple[int, ...]]


def _model_file(path: Path) -> nn.Module:
    """A trusted model file's `Network(10)` (tests/data and the base models: files this project ships)."""
    spec = importlib.util.spec_from_file_location(f"survey_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Network(num_classes=10)


def _space(name: str, params: dict, size: Callable[..., int] | None = None) -> Iterator[Row]:
    """The space's largest network (each decision's last choice) and `SAMPLES` seeded random ones."""
    space = SPACES.create(name, params)
    decisions = space.decisions()
    archs = [("largest", space.from_values([d.choices[-1] for d in decisions]))]
    rng = np.random.default_rng(0)
    archs += [(f"sample {i}", space.sample(rng)) for i in range(SAMPLES)]
    for label, arch in archs:
        side = size(space, arch) if size else 32
        yield name, label, lambda arch=arch, side=side: space.build(arch, 10, 3, side), (2, 3, side, side)


def rows(quick: bool) -> Iterator[Row]:
    for path in sorted((ROOT / "tests" / "data" / "models").glob("*.py")):
        yield "tests/data", path.stem, lambda path=path: _model_file(path), (2, 3, 32, 32)
    for path in sorted((ROOT / "nas" / "spaces" / "source" / "bases").glob("[!_]*.py")):
        yield "bases", path.stem, lambda path=path: _model_file(path), (2, 3, 32, 32)
    nader = SPACES.create("nader", {})
    blocks = [("resnet_basic", nader.base)] + [
        (path.stem, nader.read(path.read_text(encoding="utf-8"), path.name))
        for path in sorted((ROOT / "tests" / "data" / "blocks").glob("*.txt"))]
    for label, arch in blocks:
        yield "nader", label, lambda arch=arch: nader.build(arch, 10, 3, 32), (2, 3, 32, 32)
    yield from _space("nb201", {})
    yield from _space("ofa_mbv3", {"resolutions": [24, 28, 32], "width_mult": 0.5, "num_classes": 10},
                      lambda space, arch: space.input_size(arch))
    yield from _space("spos", {"stage_channels": [16, 32, 64, 128], "stem_channels": 8, "last_channels": 256,
                               "stem_stride": 1, "resolution": 32, "num_classes": 10},
                      lambda space, arch: space.input_size(arch))
    yield from _space("autoformer", {"depths": [3, 4], "embed_dims": [48, 64], "heads": [2, 3, 4],
                                     "mlp_ratios": [2.0, 3.0, 4.0], "head_dim": 16, "patch_size": 4,
                                     "image_size": 28, "num_classes": 10},
                      lambda space, arch: space.input_size(arch))
    if not quick:
        for name in TORCHVISION:
            yield "torchvision", name, lambda name=name: getattr(torchvision.models, name)(num_classes=10), (2, 3, 64, 64)


def measure(group: str, label: str, build: Callable[[], nn.Module], shape: tuple[int, ...]) -> dict:
    torch.manual_seed(0)
    net = _Input(build())
    start = time.perf_counter()
    tensors = {k: v.detach().clone() for k, v in [*net.named_parameters(), *net.named_buffers()]}
    batch = "dynamic"
    try:
        graph = export_graph(net, torch.randn(shape))
    except Exception:  # noqa: BLE001 - a network that fixes its batch size: a sandbox child cannot export it
        batch = "static"
        graph = _static_export(net, torch.randn(shape))
    rebuilt = GraphNet(unpack(pack(graph, {"init": tensors, "const": graph.pop("constants")}), 1 << 31))
    carried = rebuilt.carried()
    began = time.perf_counter()
    runs = 2 if batch == "dynamic" else 1  # a graph exported at batch 2 runs at batch 2 only
    rebuilt.dry_run(2, 1 << 40, 256 if runs == 2 else 0)
    dry = time.perf_counter() - began
    bits = sum(carried.values())
    tensors_bits = sum(v for k, v in carried.items() if k.startswith(("buffer ", "constant ")))
    return {"group": group, "network": label, "input": list(shape[1:]), "batch": batch,
            "params": sum(p.numel() for p in net.parameters()),
            "nodes": {m: len(p.steps) for m, p in rebuilt.programs.items()},
            "bits": {"train graph": carried["the train graph"], "eval graph": carried["the eval graph"],
                     "tensor shapes": carried["tensor shapes"], "buffers and constants": tensors_bits},
            "total_bits": bits, "free_margin": round(FREE_BITS / bits, 2), "refused": bits > MAX_BITS,
            "counted_params": carried_parameters(bits),
            "largest_node_operands": max(max((_operands(s) for s in p.steps), default=0)
                                         for p in rebuilt.programs.values()),
            "cost": max(p.cost for p in rebuilt.programs.values()),
            "dry_run_seconds_per_unit": dry / (runs * rebuilt.cost),
            "seconds": round(time.perf_counter() - start, 2)}


class _Input(nn.Module):
    """`net` with its forward's argument named `x`, as `export_graph` names the batch dimension."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _static_export(net: nn.Module, example: torch.Tensor) -> dict:
    """`export_graph` at the example's batch size only: a network whose code fixes its batch (a
    view to `B` read as a Python int) has the same nodes, sizes and tensors at any batch, so about
    the same information; the survey counts it at this batch (its row says "static batch")."""
    graphs, constants = {}, {}
    for mode in ("train", "eval"):
        net.train(mode == "train")
        program = torch.export.export(net, (example,), strict=False)
        graphs[mode] = _graph_data(program)
        constants.update({k: v for k, v in program.constants.items() if isinstance(v, torch.Tensor)})
    return {"format": FORMAT, "input_shape": list(example.shape[1:]), **graphs, "constants": constants}


def _operands(step: tuple) -> int:
    """Leaves of one node's arguments (the parser's count, without the einsum weight)."""
    def leaves(value: object) -> int:
        if isinstance(value, list):
            return sum(map(leaves, value))
        if isinstance(value, dict):
            return sum(map(leaves, value.values()))
        return 1
    _, args, kwargs = step
    return leaves(args) + leaves(kwargs)


def _synthetic(nodes: list[dict]) -> GraphNet:
    """A network of `nodes` (both graphs), on a [3, 8, 8] input, returning the last node's value."""
    program = {"inputs": [{"kind": "USER_INPUT", "target": None}], "nodes": nodes,
               "outputs": [{"ref": len(nodes)}]}
    graph = {"format": FORMAT, "input_shape": [3, 8, 8], "train": program, "eval": program}
    return GraphNet(Artifact(graph, {"init": {}, "const": {}}))


def _node(op: str, *args: object) -> dict:
    return {"op": op, "args": list(args), "kwargs": {"map": {}}}


def worst_cases() -> list[dict]:
    """The dry run of graphs at the parser's caps, timed against the clock their parse sets."""
    x = {"ref": 0}
    einsum = "abcd" + ",abcd" * (MAX_EINSUM_OPERANDS - 1) + "->abcd"
    per_einsum = NODE_COST + 1 + MAX_EINSUM_OPERANDS * EINSUM_OPERAND_COST
    per_cat = NODE_COST + MAX_NODE_OPERANDS
    cases = {
        "relu nodes": [_node("aten.relu.default", {"ref": i}) for i in range(MAX_COST // (NODE_COST + 1) - 1)],
        f"einsums of {MAX_EINSUM_OPERANDS} tensors": [
            _node("aten.einsum.default", einsum, [x] * MAX_EINSUM_OPERANDS) for _ in range(MAX_COST // per_einsum - 1)],
        f"cats of {MAX_NODE_OPERANDS - 1:,} tensors": [
            _node("aten.cat.default", [x] * (MAX_NODE_OPERANDS - 1), 1) for _ in range(MAX_COST // per_cat - 1)],
    }
    out = []
    for name, nodes in cases.items():
        net = _synthetic(nodes)
        began = time.perf_counter()
        net.dry_run(2, 1 << 60, 256)
        seconds = time.perf_counter() - began
        clock = net.dry_run_seconds(256)
        out.append({"case": name, "nodes": len(nodes), "cost": net.cost, "seconds": round(seconds, 2),
                    "clock_seconds": round(clock, 1), "of_clock": round(seconds / clock, 3),
                    "seconds_per_unit": seconds / (2 * net.cost)})
        print(f"dry run, {name}: {seconds:.1f} s of its {clock:.0f} s clock", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one network per group, no torchvision")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "graph_information.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out, seen = [], set()
    for group, label, build, shape in rows(args.quick):
        if args.quick and group in seen:
            continue
        seen.add(group)
        out.append(measure(group, label, build, shape))
        r = out[-1]
        print(f"{group} {label}: {r['total_bits']:,} bits ({r['free_margin']}x under FREE_BITS), "
              f"a dry run's cost of {r['cost']:,}", flush=True)
    honest = max(r["total_bits"] for r in out if r["group"] != "torchvision")
    dry_run = worst_cases()
    result = {"benchmark": "graph_information", "free_bits": FREE_BITS, "max_bits": MAX_BITS,
              "max_node_operands": MAX_NODE_OPERANDS, "max_cost": MAX_COST,
              "largest_honest_bits": honest, "margin": round(FREE_BITS / honest, 2),
              "largest_node_operands": max(r["largest_node_operands"] for r in out),
              "largest_cost": max(r["cost"] for r in out),
              "dry_run": dry_run, "dry_run_seconds_per_unit": max(
                  [r["dry_run_seconds_per_unit"] for r in out] + [c["seconds_per_unit"] for c in dry_run]),
              "dry_run_clock_per_unit": DRY_RUN_SECONDS_PER_UNIT,
              "torch": torch.__version__, "torchvision": torchvision.__version__, "machine": platform.platform(),
              "rows": out}
    atomic_write_json(args.out, result)
    lines = ["| group | network | params | nodes (train / eval) | train graph | eval graph | tensor shapes "
             "| buffers, constants | total bits | under FREE_BITS | dry-run cost |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['group']} | {r['network']}{' (static batch)' * (r['batch'] == 'static')} | {r['params']:,} | {r['nodes']['train']} / {r['nodes']['eval']} "
              f"| {r['bits']['train graph']:,} | {r['bits']['eval graph']:,} | {r['bits']['tensor shapes']:,} "
              f"| {r['bits']['buffers and constants']:,} | {r['total_bits']:,}{' (refused)' * r['refused']} "
              f"| {r['free_margin']}x "
              f"| {r['cost']:,} |" for r in out]
    head = (f"FREE_BITS {FREE_BITS:,} (free), MAX_BITS {MAX_BITS:,} (refused past it). Largest honest network "
            f"(torchvision aside): {honest:,} bits, {result['margin']}x under FREE_BITS. Operands: at most "
            f"{result['largest_node_operands']:,} a node (cap {MAX_NODE_OPERANDS:,}), "
            f"a dry run's cost at most {result['largest_cost']:,} a graph (cap {MAX_COST:,}).\n\n")
    lines += ["", "| dry run at the caps | nodes | cost (both graphs) | seconds | its clock (s) | share of it |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {c['case']} | {c['nodes']:,} | {c['cost']:,} | {c['seconds']} | {c['clock_seconds']} "
              f"| {c['of_clock']} |" for c in dry_run]
    atomic_write_text(args.out.with_suffix(".md"), head + "\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

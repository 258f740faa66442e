"""What `GraphNet.carried` counts for models as people write them -> JSON + markdown table.

Each torchvision model (10 classes, 64x64 input) is exported as a sandbox child exports model
source (`export_graph`, train and eval graphs) and rebuilt here; the row gives its parameters, the
nodes of each graph, the values its nodes spell out ("literals in the graphs": numbers passed as
data, constant references laid out in lists), the elements of buffers and constants it carries
besides normalisation statistics, and what `count_params` adds past FREE_CARRIED. The point: a
model as written stays within the free allowance, so the count that closes the smuggling channel
does not change honest models' numbers.

    python benchmarks/graph_literals.py            # the models below, ~2 min on 2 cores
    python benchmarks/graph_literals.py --quick    # resnet18 only
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torchvision

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json, atomic_write_text  # noqa: E402
from nas.measure import count_params  # noqa: E402
from nas.sandbox.graph import FREE_CARRIED, GraphNet, export_graph, pack, unpack  # noqa: E402

MODELS = ("resnet18", "resnet50", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x1_0",
          "densenet121", "densenet201", "convnext_tiny", "swin_t")
LITERALS = "literals in the graphs"


def measure(name: str) -> dict:
    net = getattr(torchvision.models, name)(num_classes=10)
    start = time.perf_counter()
    tensors = {k: v.detach().clone() for k, v in [*net.named_parameters(), *net.named_buffers()]}
    graph = export_graph(net, torch.randn(2, 3, 64, 64))
    rebuilt = GraphNet(unpack(pack(graph, {"init": tensors, "const": graph.pop("constants")}), 1 << 31))
    carried = rebuilt.carried()
    params = sum(p.numel() for p in net.parameters())
    return {"model": name, "params": params, "nodes": {m: len(p.steps) for m, p in rebuilt.programs.items()},
            "literals": carried.get(LITERALS, [0])[0],
            "carried_tensors": sum(math.prod(s) for k, s in carried.items() if k != LITERALS),
            "counted_params": count_params(rebuilt), "added_by_carried": count_params(rebuilt) - params,
            "seconds": round(time.perf_counter() - start, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="resnet18 only")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "graph_literals.json")
    args = ap.parse_args()
    rows = []
    for name in MODELS[:1] if args.quick else MODELS:
        rows.append(measure(name))
        print(f"{name}: {rows[-1]['literals']} literals, +{rows[-1]['added_by_carried']} params", flush=True)
    result = {"benchmark": "graph_literals", "free_carried": FREE_CARRIED, "torch": torch.__version__,
              "torchvision": torchvision.__version__, "machine": platform.platform(), "rows": rows}
    atomic_write_json(args.out, result)
    lines = ["| model | params | nodes (train / eval) | literals | carried tensors | added to params |",
             "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['model']} | {r['params']:,} | {r['nodes']['train']} / {r['nodes']['eval']} | {r['literals']:,} "
              f"| {r['carried_tensors']:,} | {r['added_by_carried']:,} |" for r in rows]
    atomic_write_text(args.out.with_suffix(".md"), f"Free allowance: {FREE_CARRIED:,} values.\n\n"
                      + "\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

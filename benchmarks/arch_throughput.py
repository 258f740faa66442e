"""Throughput of the two architecture representations.

1. Block files validated (structure, arguments, shapes) and compiled to an
   nn.Module per second, over our test blocks and NADER's shared files.
2. Re-proposal detection: time to compute a block's canonical key and look it
   up in a history of N keys, for N from 10 to 1,000,000 — it should be flat.
3. Sandbox verification latency of a small model source (subprocess with
   limits: import, build, forward, backward, params/FLOPs), with and without
   the structural check against a parent.
4. The annos.json cross-check (when NADER's data is present).
Writes benchmarks/results/arch_throughput.json and a PNG of (2).

    python benchmarks/arch_throughput.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # support.crosscheck: a test helper, not in the wheel

import torch  # noqa: E402

from nas.core.arch import SeenIndex  # noqa: E402
from nas.io import atomic_write_bytes, atomic_write_json  # noqa: E402
from nas.sandbox import verify_model_source  # noqa: E402
from nas.spaces.nader.arch import BlockArch  # noqa: E402
from nas.spaces.nader.dag.canon import relabel  # noqa: E402
from nas.spaces.nader.dag.compile import BlockModule  # noqa: E402
from nas.spaces.nader.dag.macro import BlockSet, Skeleton, plan, search_width  # noqa: E402
from support.crosscheck import as_dicts, crosscheck  # noqa: E402

NADER = ROOT.parent / "shared" / "data" / "nader"
OUT = ROOT / "benchmarks" / "results"


def block_files() -> list[Path]:
    files = sorted((ROOT / "tests" / "data" / "blocks").glob("*.txt"))
    files += [p for d in ("blocks", "blocks-cifar", "darts") for p in sorted((NADER / d).glob("*.txt"))]
    return files


def validate_and_compile(files: list[Path], repeats: int) -> dict:
    """Per file: parse, width-search validation at every position, compile each distinct position."""
    texts = [(p, p.read_text()) for p in files]
    skeleton = Skeleton.nb201()
    times, blocks = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        blocks = 0
        for path, text in texts:
            bs = BlockSet.from_text(text, str(path))
            try:
                width = search_width(bs, skeleton).width
            except Exception:
                width = 128  # over budget at every valid width (ResNeXt-like): compile at a valid one
            for placement in plan(bs, skeleton, width).placements:
                BlockModule(placement.analysis)
                blocks += 1
        times.append(time.perf_counter() - start)
    best = min(times)
    return {"files": len(files), "blocks_compiled_per_pass": blocks, "seconds_per_pass_min": round(best, 4),
            "seconds_per_pass_median": round(statistics.median(times), 4),
            "files_per_second": round(len(files) / best, 1), "blocks_per_second": round(blocks / best, 1)}


def key_lookup(files: list[Path], sizes: list[int], queries: int) -> dict:
    """Key + exact membership test of renumbered re-proposals against histories of growing size."""
    archs = [BlockArch.from_text(p.read_text(), str(p)) for p in files]
    rows = []
    for n in sizes:
        history = SeenIndex()  # filler entries stand in for past proposals (random keys and forms)
        for _ in range(n):
            history.add_form(secrets.token_hex(8), secrets.token_hex(16))
        for a in archs:
            history.add(a)
        per_query = []
        for q in range(queries):
            base = archs[q % len(archs)]
            mapping = {idx: f"r{idx}" for idx in base.blocks.base.nodes}
            fresh = BlockArch(BlockSet(relabel(base.blocks.base, mapping), base.blocks.stem, base.blocks.downsample))
            start = time.perf_counter()
            hit = fresh in history
            per_query.append(time.perf_counter() - start)
            assert hit, "a renumbered re-proposal was not recognised"
        rows.append({"history": n, "median_ms": round(1000 * statistics.median(per_query), 3),
                     "p90_ms": round(1000 * sorted(per_query)[int(0.9 * len(per_query))], 3)})
    first, last = rows[0]["median_ms"], rows[-1]["median_ms"]
    return {"rows": rows, "largest_over_smallest_median": round(last / first, 3)}


def sandbox_latency(repeats: int) -> dict:
    models = ROOT / "tests" / "data" / "models"
    parent = (models / "cnn_parent.py").read_text()
    child = (models / "cnn_kernel5.py").read_text()
    alone, paired = [], []
    for _ in range(repeats):
        v = verify_model_source(parent)
        assert v.ok, v.error
        alone.append(v.wall_s)
        v = verify_model_source(child, parent_source=parent)
        assert v.ok and v.changed_layers == 1, v.error
        paired.append(v.wall_s)
    return {"model": "tests/data/models/cnn_parent.py", "params": v.params,
            "median_s": round(statistics.median(alone), 3), "min_s": round(min(alone), 3),
            "with_parent_median_s": round(statistics.median(paired), 3)}


def plot(lookup: dict, path: Path) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["history"] for r in lookup["rows"]]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(xs, [r["median_ms"] for r in lookup["rows"]], marker="o", label="median")
    ax.plot(xs, [r["p90_ms"] for r in lookup["rows"]], marker=".", ls="--", label="p90")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("history size (keys)")
    ax.set_ylabel("key + lookup (ms)")
    ax.set_title("Re-proposal detection vs history size")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=130)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    torch.set_num_threads(1)
    files = block_files()
    result = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": torch.get_num_threads()},
        "validate_compile": validate_and_compile(files, args.repeats),
        "key_lookup": key_lookup(files, [10, 1_000, 100_000, 1_000_000], args.queries),
        "sandbox": sandbox_latency(args.repeats),
    }
    if (NADER / "blocks-cifar" / "annos.json").exists():
        result["annos_crosscheck"] = as_dicts(crosscheck(NADER / "blocks-cifar"))
    OUT.mkdir(parents=True, exist_ok=True)
    plot(result["key_lookup"], OUT / "arch_key_lookup.png")
    atomic_write_json(OUT / "arch_throughput.json", result)
    vc, kl, sb = result["validate_compile"], result["key_lookup"], result["sandbox"]
    print(f"validate+compile: {vc['blocks_per_second']} blocks/s ({vc['files_per_second']} files/s)")
    print("key+lookup median ms by history size: "
          + ", ".join(f"{r['history']:,}: {r['median_ms']}" for r in kl["rows"]))
    print(f"sandbox: {sb['median_s']} s median ({sb['with_parent_median_s']} s with parent check)")
    print(f"wrote {OUT / 'arch_throughput.json'} and {OUT / 'arch_key_lookup.png'}")


if __name__ == "__main__":
    main()

"""LLM layer benchmark -> JSON: the embedded model's speed, and what the cache and
replay save on a re-run.

  python benchmarks/llm_layer.py [--quick] [--out benchmarks/results/llm_layer.json]

1. Local model: SmolLM2-135M-Instruct served by llama-cpp-python on 127.0.0.1
   (the `llm=local` path): completion tokens/s and prompt tokens/s over free-form
   and grammar-constrained calls.
2. A search-like workload of N calls (the tagger prompt over N ideas) run live
   with an empty cache and a transcript, re-run against the cache, and replayed
   from the transcript with no endpoint: wall time of each, cache hit rate of the
   re-run, replay speed-up over live, and whether all three histories match.
3. Client overhead per call through HTTP, against the scripted loopback server.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # support.scripted: a test helper, not in the wheel

from nas.io import atomic_write_json  # noqa: E402

IDEAS = [
    "Reweight channels with a gate computed from globally pooled features.",
    "Replace 3x3 convolutions with depthwise separable convolutions to cut FLOPs.",
    "Add a shortcut connection around every pair of convolutions.",
    "Use layer normalization before each attention layer.",
    "Split channels into groups processed by parallel branches and concatenate them.",
    "Scale depth, width and resolution together with one coefficient.",
    "Use GELU activations instead of ReLU in the block.",
    "Mix tokens with an MLP across spatial positions and channels alternately.",
    "Downsample features progressively over four stages with growing width.",
    "Use an inverted residual block with a narrow-wide-narrow shape.",
    "Compute attention within local windows and shift the windows between layers.",
    "Fuse features from several scales by upsampling and adding them.",
]


def run_workload(cfg: dict, run_dir: Path, ideas: list[str]) -> tuple[float, list[str], dict]:
    """The LLM tagger over `ideas`: one grammar-constrained call each (embeddings shortlist the leaves)."""
    from nas.knowledge.embed import default_embedder
    from nas.knowledge.tagger import EmbeddingTagger, LLMTagger
    from nas.knowledge.tree import AttributeTree
    from nas.llm import LLMClient

    tree = AttributeTree.builtin()
    fallback = EmbeddingTagger(tree, default_embedder())
    fallback.tag(ideas)  # embeddings warmed up: the timing below is the LLM path
    client = LLMClient(cfg, run_dir=run_dir)
    tagger = LLMTagger(tree, client, fallback)
    start = time.perf_counter()
    history = [t.path() for t in tagger.tag(ideas)]
    return time.perf_counter() - start, history, client.usage.to_dict()


def local_speed(server, n: int) -> dict:
    from openai import OpenAI

    sdk = OpenAI(base_url=server.base_url, api_key="local", max_retries=0)
    rows = []
    for i in range(n):
        t0 = time.perf_counter()
        r = sdk.chat.completions.create(
            model=server.alias, temperature=0.0, max_tokens=96,
            messages=[{"role": "user", "content": f"Describe design idea {i + 1} for a small image "
                                                  f"classifier block: {IDEAS[i % len(IDEAS)]}"}])
        rows.append((time.perf_counter() - t0, r.usage.prompt_tokens, r.usage.completion_tokens))
    wall = sum(r[0] for r in rows)
    completion = sum(r[2] for r in rows)
    return {"calls": n, "wall_s": wall, "completion_tokens": completion, "prompt_tokens": sum(r[1] for r in rows),
            "tokens_per_s": completion / wall, "mean_latency_s": wall / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few calls only (smoke test)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/llm_layer.json")
    args = parser.parse_args()
    from rich.console import Console

    from nas.llm.local import LocalServer
    from support.scripted import ScriptedServer

    console = Console(stderr=True)
    n_speed, n_work, n_overhead = (1, 2, 20) if args.quick else (8, len(IDEAS), 200)
    ideas = (IDEAS * 4)[:n_work]
    result: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                "platform": platform.platform()}, "quick": args.quick}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with console.status("starting the local model server"):
            t0 = time.perf_counter()
            server = LocalServer(log_path=tmp / "server.log")
            server.start()
            startup = time.perf_counter() - t0
        try:
            with console.status(f"local model: {n_speed} free-form calls"):
                result["local_model"] = {"startup_s": startup, **local_speed(server, n_speed)}
            base = {"backend": "openai", "base_url": server.base_url, "model": server.alias,
                    "structured": "grammar", "cache_dir": str(tmp / "cache"), "max_retries": 1}
            with console.status(f"workload: {n_work} tagger calls live"):
                live_s, live_hist, live_usage = run_workload(base, tmp / "live", ideas)
            with console.status("workload: re-run against the cache"):
                rerun_s, rerun_hist, rerun_usage = run_workload(base, tmp / "rerun", ideas)
        finally:
            server.stop()
        # The endpoint is gone: replay must not need it.
        replay_s, replay_hist, replay_usage = run_workload(
            {"backend": "replay", "replay_from": str(tmp / "live"), "cache": False}, tmp / "replay", ideas)
        total = live_usage["total"]
        result["workload"] = {
            "calls": n_work, "live_s": live_s, "rerun_cached_s": rerun_s, "replay_s": replay_s,
            "live_tokens_per_s": total["completion_tokens"] / max(total["latency_s"], 1e-9),
            "rerun_cache_hit_rate": rerun_usage["total"]["cache_hit_rate"],
            "replay_live_calls": replay_usage["total"]["live"],
            "replay_speedup": live_s / max(replay_s, 1e-9), "cache_speedup": live_s / max(rerun_s, 1e-9),
            "histories_identical": live_hist == rerun_hist == replay_hist,
            "live_usage": total,
        }
        with ScriptedServer(default="ok") as srv:
            from nas.llm import LLMClient

            client = LLMClient({"backend": "openai", "base_url": srv.base_url, "cache": False,
                                "api_key_env": "NASFLOW_BENCH_NO_KEY"})
            t0 = time.perf_counter()
            for i in range(n_overhead):
                client.complete("reader", f"call {i}")
            per_call = (time.perf_counter() - t0) / n_overhead
        result["client_overhead"] = {"calls": n_overhead, "ms_per_call": 1000 * per_call}
    atomic_write_json(args.out, result)
    w, lm = result["workload"], result["local_model"]
    print(f"local model: {lm['tokens_per_s']:.1f} completion tokens/s, {lm['mean_latency_s']:.2f} s/call, "
          f"startup {lm['startup_s']:.1f} s")
    print(f"workload ({w['calls']} calls): live {w['live_s']:.2f} s, cached re-run {w['rerun_cached_s']:.3f} s "
          f"(hit rate {w['rerun_cache_hit_rate']:.2f}), replay {w['replay_s']:.3f} s "
          f"({w['replay_speedup']:.0f}x, {w['replay_live_calls']} live calls); identical: {w['histories_identical']}")
    print(f"client overhead over loopback HTTP: {result['client_overhead']['ms_per_call']:.2f} ms/call")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

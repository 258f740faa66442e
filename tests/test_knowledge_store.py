"""Knowledge and experience stores on a real local Qdrant with the real
bundled embedding model (loaded once per module: it takes ~6 s)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from nas.errors import NasError
from nas.knowledge.embed import DEFAULT_DIM, Embedder, default_embedder
from nas.knowledge.idea import Idea, Tag
from nas.knowledge.store import (
    Experience,
    ExperienceStore,
    KnowledgeStore,
    close_client,
    holder_file,
    import_nader_experiences,
    open_client,
)

ROOT = Path(__file__).resolve().parents[1]
NADER = Path(__file__).resolve().parents[2] / "shared" / "data" / "nader"

AFR = "adaptive feature recalibration"
IDEAS = [
    ("Add a squeeze-and-excitation block that pools each channel globally and rescales the channels "
     "with learned sigmoid gates.", Tag("performance", "block", AFR, "channel attention (SE block)")),
    ("Apply efficient channel attention: a 1D convolution over pooled channel descriptors yields "
     "per-channel weights.", Tag("performance", "operation", AFR, "channel attention (SE block)")),
    ("Use CBAM-style spatial attention to highlight informative locations of the feature map.",
     Tag("performance", "block", AFR, "spatial attention")),
    ("Replace standard 3x3 convolutions with depthwise separable convolutions to cut FLOPs.",
     Tag("efficiency", "operation", "efficient convolution", "depthwise separable convolution")),
    ("Use group convolutions followed by a channel shuffle to reduce computation.",
     Tag("efficiency", "operation", "efficient convolution", "group convolution")),
    ("Insert batch normalization after every convolution to stabilise training.",
     Tag("performance", "operation", "normalization", "batch normalization")),
    ("Replace batch normalization with group normalization when batches are small.",
     Tag("performance", "operation", "normalization", "group normalization")),
    ("Swap ReLU for the smooth Swish activation to improve gradient flow.",
     Tag("performance", "operation", "activation", "smooth activation")),
    ("Use GELU activations inside the residual block.",
     Tag("performance", "operation", "activation", "smooth activation")),
    ("Scale depth, width and input resolution jointly with one compound coefficient.",
     Tag("efficiency", "network", "network-wise scaling", "compound scaling")),
    ("Widen the later stages of the network by doubling their channels.",
     Tag("performance", "network", "network-wise scaling", "width scaling")),
    ("Add identity shortcut connections around each pair of convolutions.",
     Tag("performance", "block", "skip connection")),
    ("Downsample with strided convolutions instead of max pooling.", None),
]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    emb = default_embedder()
    emb.model  # load now (~6 s), as setup rather than in whichever test encodes first
    return emb


@pytest.fixture
def qdrant_dir(tmp_path: Path):
    path = tmp_path / "qdrant"
    yield path
    close_client(path)


@pytest.fixture
def store(qdrant_dir: Path, embedder: Embedder) -> KnowledgeStore:
    return KnowledgeStore(path=qdrant_dir, embedder=embedder)


@pytest.fixture
def filled(store: KnowledgeStore) -> KnowledgeStore:
    ideas = [Idea(text, tag, source="builtin" if i % 2 else "handwritten")
             for i, (text, tag) in enumerate(IDEAS)]
    report = store.add_ideas(ideas)
    assert (report.added, report.duplicates) == (len(IDEAS), 0)
    return store


def test_embedder_shapes(embedder: Embedder) -> None:
    vecs = embedder.encode(["channel attention", "depthwise convolution"])
    assert embedder.dim == DEFAULT_DIM
    assert vecs.shape == (2, DEFAULT_DIM) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert embedder.encode([]).shape == (0, DEFAULT_DIM)


def test_add_search_round_trip(store: KnowledgeStore) -> None:
    assert store.search("anything") == [] and store.count() == 0 and store.category_counts() == {}
    idea = Idea("Use squeeze-and-excitation to reweight channels.",
                Tag("performance", "block", AFR, "channel attention (SE block)"),
                source="nader", paper_id="p1", paper_title="SENet", extra={"year": 2018})
    assert store.add_ideas([idea]).added == 1
    hits = store.search("squeeze and excitation channel reweighting", k=3)
    assert len(hits) == 1 and hits[0].score > 0.5
    assert hits[0].idea == idea and hits[0].idea.id == idea.id
    assert store.ideas() == [idea]


def test_channel_attention_query_ranks_recalibration_first(filled: KnowledgeStore) -> None:
    hits = filled.search("channel attention that reweights feature maps", k=5)
    assert hits[0].idea.tag is not None and hits[0].idea.tag.main == AFR
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


@pytest.mark.parametrize("field,value", [
    ("main", "normalization"), ("target", "efficiency"), ("granularity", "network"),
    ("sub", "smooth activation"), ("source", "builtin")])
def test_filters_restrict_results(filled: KnowledgeStore, field: str, value: str) -> None:
    hits = filled.search("channel attention that reweights feature maps", k=20, **{field: value})
    expected = [i for i in filled.ideas() if (i.source if field == "source" else
                                              getattr(i.tag, field, None)) == value]
    assert hits and len(hits) == len(expected) == filled.count(**{field: value})
    assert {h.idea.id for h in hits} == {i.id for i in expected}
    assert {i.id for i in filled.ideas(**{field: value})} == {i.id for i in expected}


def test_filters_combine_and_reject_unknown_keys(filled: KnowledgeStore) -> None:
    hits = filled.search("attention", k=20, main=AFR, granularity="operation")
    assert [h.idea.text for h in hits] == [IDEAS[1][0]]
    with pytest.raises(NasError, match="unknown knowledge filter"):
        filled.search_vector(np.zeros(DEFAULT_DIM), 3, colour="red")


def test_readding_same_text_is_idempotent(filled: KnowledgeStore) -> None:
    again = [Idea(text.upper().rstrip(".") + " ", tag) for text, tag in IDEAS[:4]]
    report = filled.add_ideas(again)
    assert (report.added, report.duplicates) == (0, 4)
    assert [kept for _, kept in report.duplicate_of] == [t for t, _ in IDEAS[:4]]
    assert filled.count() == len(IDEAS)


def test_near_duplicates_skipped_and_reported(store: KnowledgeStore) -> None:
    first, second = ("Use squeeze-and-excitation to reweight channels.",
                     "use squeeze and excitation to re-weight channels")
    # MiniLM puts this pair at cosine 0.888, below the conservative 0.95 default.
    report = store.add_ideas([Idea(first)], dedup_threshold=0.85)
    assert report.added == 1
    report = store.add_ideas([Idea(second), Idea("Replace ReLU with GELU.")], dedup_threshold=0.85)
    assert (report.added, report.duplicates) == (1, 1)
    assert report.duplicate_of == [(second, first)]
    # against an idea earlier in the same call, at the default threshold (cosine 0.974)
    prune = ["Prune channels with small batch-norm scale factors.",
             "Prune the channels with small batch-norm scale factors", "Prune filters with small L1 norms."]
    report = store.add_ideas([Idea(t) for t in prune])
    assert (report.added, report.duplicates) == (2, 1)
    assert report.duplicate_of == [(prune[1], prune[0])]
    assert store.count() == 4


def test_category_and_tag_counts(filled: KnowledgeStore) -> None:
    counts = filled.category_counts()
    assert counts[AFR] == {"channel attention (SE block)": 2, "spatial attention": 1}
    assert counts["skip connection"] == {"": 1}
    assert counts[""] == {"": 1}
    assert sum(n for subs in counts.values() for n in subs.values()) == len(IDEAS)
    tags = filled.tag_counts()
    assert tags["target"] == {"performance": 9, "efficiency": 3, "": 1}
    assert tags["granularity"]["network"] == 2
    assert sum(tags["source"].values()) == len(IDEAS)


def test_papers(store: KnowledgeStore) -> None:
    assert not store.has_paper("h1") and store.count_papers() == 0 and store.papers() == []
    store.add_paper("h1", "Squeeze-and-Excitation Networks", {"path": "se.pdf", "n_ideas": 3},
                    "Squeeze-and-Excitation Networks. We propose a channel attention unit.")
    store.add_paper("h1", "Squeeze-and-Excitation Networks", {"path": "se.pdf", "n_ideas": 3},
                    "Squeeze-and-Excitation Networks. We propose a channel attention unit.")
    assert store.has_paper("h1") and not store.has_paper("h2")
    assert store.count_papers() == 1
    assert store.papers() == [{"path": "se.pdf", "n_ideas": 3, "hash": "h1",
                               "title": "Squeeze-and-Excitation Networks"}]
    store.clear()
    assert store.count_papers() == 0 and not store.has_paper("h1")


def test_experience_store(qdrant_dir: Path, embedder: Embedder) -> None:
    exps = ExperienceStore(path=qdrant_dir, embedder=embedder)
    assert exps.retrieve("anything") == [] and exps.count() == 0
    tips = [
        Experience("Make out_channels a multiple of groups in grouped convolutions.", "tip",
                   error="out_channels must be divisible by groups", idea="use group convolutions"),
        Experience("Check tensor shapes match before an element-wise Add.", "tip",
                   error="Add shape error", idea="add a skip connection"),
        Experience("Keep the spatial size unchanged inside a block; downsample only in stems.", "tip",
                   error="output spatial size mismatch", idea="add pooling in the block"),
        Experience("Avoid pooling layers that halve the resolution inside residual blocks.",
                   "suggestion", idea="add pooling in the block", source="run-3"),
        Experience("Do not place softmax before an element-wise addition.", "suggestion",
                   idea="spatial attention", context={"delta": -1.2}),
    ]
    ids = exps.add_many(tips)
    assert len(set(ids)) == len(tips) and exps.count() == len(tips)
    assert exps.add(tips[0]) == ids[0] and exps.count() == len(tips)  # idempotent
    top = exps.retrieve("RuntimeError: out_channels must be divisible by groups", k=2)
    assert top[0][0] == tips[0] and top[0][1] > top[1][1]
    only = exps.retrieve("accuracy dropped after adding pooling", k=5, kind="suggestion")
    assert [e.kind for e, _ in only] == ["suggestion", "suggestion"]
    assert only[0][0] == tips[3]
    assert sorted(exps.all(), key=lambda e: e.text) == sorted(tips, key=lambda e: e.text)
    with pytest.raises(NasError, match="kind 'hint'"):
        exps.add(Experience("x", "hint"))


def test_stores_share_one_client_per_path(qdrant_dir: Path, embedder: Embedder) -> None:
    a = KnowledgeStore(path=qdrant_dir, embedder=embedder)
    b = ExperienceStore(path=qdrant_dir / "sub" / "..", embedder=embedder)
    assert a.client is b.client is open_client(qdrant_dir)


def test_locked_folder_gives_one_line_error_naming_the_holder(qdrant_dir: Path) -> None:
    open_client(qdrant_dir)  # this process holds the folder's lock
    code = ("import sys\nfrom pathlib import Path\nfrom nas.errors import NasError\n"
            "import nas.knowledge.store as store\nstore.LOCK_WAIT_S = 0.5\n"
            "try:\n    store.open_client(Path(sys.argv[1]))\n"
            "except NasError as err:\n    print(err)\n    sys.exit(2)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(qdrant_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    assert str(qdrant_dir.resolve()) in lines[0] and "knowledge.url=http://" in lines[0]
    assert f"held by pid {os.getpid()} (" in lines[0] and sys.argv[0] in lines[0]


def test_stores_hold_the_folder_only_while_they_read_or_write(qdrant_dir: Path, embedder: Embedder) -> None:
    """Another process opens the folder between two calls of a store that stays in use here."""
    store = KnowledgeStore(path=qdrant_dir, embedder=embedder)
    store.add_ideas([Idea("use depthwise separable convolutions to cut FLOPs")])
    holder = holder_file(qdrant_dir.resolve())
    assert json.loads(holder.read_text())["pid"] == os.getpid()  # open for the burst of calls, then let go
    code = ("import sys\nfrom pathlib import Path\nimport nas.knowledge.store as store\n"
            "print(store.KnowledgeStore(path=Path(sys.argv[1])).count())\n")
    proc = subprocess.run([sys.executable, "-c", code, str(qdrant_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr
    assert not holder.exists()  # removed with the folder's lock
    assert store.search("depthwise convolution", k=1)[0].idea.text.startswith("use depthwise")


def _nader_file(name: str) -> Path:
    path = NADER / name
    if not path.exists():
        pytest.skip(f"{path} is absent")
    return path


@pytest.mark.slow
def test_import_real_nader_experiences(qdrant_dir: Path, embedder: Embedder) -> None:
    tips = import_nader_experiences(_nader_file("develop_allfailed_240709_experience.json"))
    assert len(tips) == 153
    assert {e.kind for e in tips} == {"tip"} and {e.source for e in tips} == {"nader"}
    assert {e.context["section"] for e in tips} == {"base", "stem", "downsample"}
    assert all(e.text and e.error and e.idea and e.context["name"] for e in tips)
    suggestions = import_nader_experiences(_nader_file("research_fail_240807_experience.json"))
    assert suggestions and {e.kind for e in suggestions} == {"suggestion"}
    exps = ExperienceStore(path=qdrant_dir, embedder=embedder)
    exps.add_many(tips + suggestions)
    assert exps.count() == len({e.id for e in tips + suggestions}) < len(tips) + len(suggestions)
    top, _ = exps.retrieve("out_channels must be divisible by groups", k=1, kind="tip")[0]
    assert top.error == "out_channels must be divisible by groups"


@pytest.mark.parametrize("content,where", [
    ({"convnext_macro1": {"inspiration": "x", "base": [{"error": "e", "experience": "t"},
                                                        {"error": "e"}]}},
     "entry 'convnext_macro1'.base[1]: missing 'experience'"),
    ({"m": {"inspiration": "x", "stem": {"error": "e"}}}, "entry 'm'.stem: expected a list"),
    ({"m": {"inspiration": "x", "downsample": ["oops"]}}, "entry 'm'.downsample[0]: expected an object"),
    ({"an inspiration": ["ok", 3]}, "entry 'an inspiration'[1]: expected a non-empty string"),
    ({"m": 3}, "entry 'm': expected an object or a list"),
    ([1, 2], "expected an object of entries"),
])
def test_malformed_nader_file_names_the_place(tmp_path: Path, content: object, where: str) -> None:
    path = tmp_path / "exp.json"
    path.write_text(json.dumps(content))
    with pytest.raises(NasError) as err:
        import_nader_experiences(path)
    assert str(err.value).startswith(f"{path}: ") and where in str(err.value)
    assert "\n" not in str(err.value)


def test_unreadable_nader_file(tmp_path: Path) -> None:
    path = tmp_path / "exp.json"
    path.write_text("{not json")
    with pytest.raises(NasError, match="exp.json: not a JSON file"):
        import_nader_experiences(path)
    with pytest.raises(NasError, match="no such file"):
        import_nader_experiences(tmp_path / "missing.json")


def test_a_search_seeds_an_empty_idea_store_with_the_builtin_corpus(qdrant_dir: Path, embedder: Embedder,
                                                                   capsys) -> None:
    """Seeding (the embedding model's load, then the corpus) was NADER's and FairNAD's ~13 silent
    seconds before their first trial: it says what it does, once."""
    from nas.knowledge.config import KnowledgeConfig
    from nas.knowledge.papers import builtin_ideas

    off = KnowledgeConfig(path=str(qdrant_dir), seed_builtin=False).open_ideas(embedder)
    assert off.count() == 0
    seeded = KnowledgeConfig(path=str(qdrant_dir)).open_ideas(embedder)
    assert capsys.readouterr().err == f"seeding the idea store with {len(builtin_ideas())} built-in ideas " \
                                      "(the embedding model loads first) ...\n"
    n = seeded.count()
    assert 0.9 * len(builtin_ideas()) <= n <= len(builtin_ideas())
    assert all(i.tag is not None and i.source == "builtin" for i in seeded.ideas())
    seeded.add_ideas([Idea("a user's own idea about kernels", None, source="user")])
    assert KnowledgeConfig(path=str(qdrant_dir)).open_ideas(embedder).count() == n + 1  # not seeded twice


def test_a_knowledge_server_that_does_not_answer_is_one_line(recwarn):
    """Ours only: no qdrant_client warning ('Failed to obtain server version') before it."""
    import socket

    from nas.errors import NasError
    from nas.knowledge.store import KnowledgeStore, close_client

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    before = set(threading.enumerate())
    try:
        with pytest.raises(NasError, match=rf"knowledge server {url}: no answer .*; start it, or leave knowledge.url"):
            KnowledgeStore(url=url).count()
    finally:
        close_client(url=url)
    for thread in set(threading.enumerate()) - before:  # the client's version check runs in one
        thread.join(timeout=10)
    assert [str(w.message) for w in recwarn if "server version" in str(w.message)] == []


@pytest.mark.parametrize("limit", [0, 1, 3, None])
def test_a_limit_on_ideas_is_how_many_come_back_at_most(filled: KnowledgeStore, monkeypatch, limit) -> None:
    import nas.knowledge.store as store_module

    monkeypatch.setattr(store_module, "_PAGE", 2)  # pages of 2: a limit of 3 spans two of them
    got = filled.ideas(limit=limit)
    assert len(got) == (len(IDEAS) if limit is None else min(limit, len(IDEAS)))
    assert [i.id for i in got] == [i.id for i in filled.ideas()][:len(got)]  # the first ones, in order

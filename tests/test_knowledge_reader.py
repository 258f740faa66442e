"""The Reader end to end with a real Qdrant (local mode), the real embedder and a
scripted OpenAI-compatible server: screening, extraction, tagging, dedup,
caching per paper, bad files, replay, retrieval over the built-in corpus, and
the tree rebuild."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nas.knowledge.papers import BadFile, IdeaList, Paper, builtin_corpus, read_path
from nas.knowledge.reader import Reader, clean_idea, method_text
from nas.knowledge.store import KnowledgeStore
from nas.knowledge.tagger import EmbeddingTagger, LLMTagger
from nas.knowledge.tree import AttributeTree
from nas.llm import LLMClient
from support.scripted import ScriptedServer, Step

TREE = AttributeTree.builtin()
SE = "performance*block*adaptive feature recalibration*channel attention (SE block)"

PAPER_MD = """# Gated Channels for Small Networks

## Abstract
We reweight the channels of each convolutional block with a gate computed from
globally pooled features, improving accuracy at a small cost.

## 1 Introduction
Small networks waste capacity.

## 2 Method
Each block pools its output globally, sends the vector through two linear layers
with a bottleneck and a sigmoid, and multiplies the channels by the result.

## 3 Experiments
CIFAR-10 results.
"""

REJECT_MD = """# A Better Learning Rate Schedule

Abstract
We propose a cosine learning rate schedule with warm restarts for faster training.
"""


@pytest.fixture(scope="module")
def embedder():
    from nas.knowledge.embed import default_embedder

    return default_embedder()


@pytest.fixture
def store(tmp_path, embedder):
    from nas.knowledge.store import close_client

    s = KnowledgeStore(path=tmp_path / "qdrant", embedder=embedder)
    yield s
    close_client(path=tmp_path / "qdrant")


def scripted(body: dict) -> Step | str:
    """Answers by prompt: screening, extraction, tagging."""
    text = body["messages"][-1]["content"]
    if "Abstract:" in text:
        return "##response##no" if "learning rate" in text else f"##response##{SE}"
    if "Method text:" in text:
        return ("- Gate each block's channels with a sigmoid of two bottleneck linear layers over pooled features\n"
                "- Put the gate before the residual addition so the shortcut stays untouched\n")
    if "Idea:" in text:
        return SE
    return "?"


def make_client(srv, tmp_path, run=None, **kw):
    return LLMClient({"backend": "openai", "base_url": srv.base_url, "api_key_env": "NO_KEY_NEEDED",
                      "cache_dir": str(tmp_path / "llm-cache"), "structured": "grammar", "max_retries": 0, **kw},
                     run_dir=run, sleep=lambda s: None)


# -- reading files -----------------------------------------------------------------------------------------

def test_reads_markdown_jsonl_json_pdf_and_reports_bad_files(tmp_path):
    (tmp_path / "a.md").write_text(PAPER_MD)
    (tmp_path / "b.jsonl").write_text('{"title": "T", "abstract": "about a block design idea here"}\n'
                                      '{"title": "no abstract"}\nnot json\n')
    (tmp_path / "c.json").write_text(json.dumps([{"id": 1, "paper_id": 7, "inspiration": "use a gate"}]))
    (tmp_path / "d.pdf").write_bytes(b"%PDF-1.4 garbage that is not a pdf")
    (tmp_path / "e.txt").write_text("")
    (tmp_path / "f.docx").write_text("x")
    items = list(read_path(tmp_path))
    papers = [i for i in items if isinstance(i, Paper)]
    bad = {Path(b.path).name: b.reason for b in items if isinstance(b, BadFile)}
    lists = [i for i in items if isinstance(i, IdeaList)]
    assert [p.title for p in papers] == ["Gated Channels for Small Networks", "T"]
    assert papers[0].abstract.startswith("We reweight the channels")
    assert bad["b.jsonl:2"] == "missing 'abstract'" and bad["b.jsonl:3"].startswith("corrupt JSON line")
    assert bad["d.pdf"].startswith("unreadable PDF") and bad["e.txt"] == "empty file"
    assert "f.docx" not in bad  # directories only yield known suffixes
    assert lists[0].ideas[0] == {"text": "use a gate", "paper_id": "7", "id": 1}
    assert list(read_path(tmp_path / "f.docx"))[0].reason.startswith("unsupported file type '.docx'")
    assert list(read_path(tmp_path / "missing.md"))[0].reason == "no such file or directory"


def _write_pdf(path: Path, lines: list[str]) -> Path:
    """A one-page PDF with these lines of real text (matplotlib's PDF backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(8.5, 11))
    for i, line in enumerate(lines):
        fig.text(0.05, 0.95 - 0.03 * i, line, fontsize=9)
    fig.savefig(path)
    plt.close(fig)
    return path


def test_reads_a_real_pdf(tmp_path):
    (paper,) = list(read_path(_write_pdf(tmp_path / "paper.pdf", PAPER_MD.replace("#", "").splitlines())))
    assert isinstance(paper, Paper) and paper.title == "Gated Channels for Small Networks"
    assert "pools its output globally" in method_text(paper, 4000)
    assert "CIFAR-10 results" not in method_text(paper, 4000)


def test_clean_idea_enforces_the_output_rules():
    assert clean_idea("too short") is None
    long = " ".join(f"w{i}" for i in range(80))
    assert len(clean_idea(long).split()) == 50
    assert clean_idea("**Idea 1**: use a gate here please") == "Idea 1 use a gate here please"


# -- the Reader --------------------------------------------------------------------------------------------

def test_reader_screens_extracts_tags_and_caches(tmp_path, store, embedder, monkeypatch):
    monkeypatch.setattr("nas.knowledge.reader.ECHO_EVERY", 1)
    (tmp_path / "papers").mkdir()
    (tmp_path / "papers/good.md").write_text(PAPER_MD)
    (tmp_path / "papers/reject.md").write_text(REJECT_MD)
    with ScriptedServer(scripted) as srv:
        client = make_client(srv, tmp_path, run=tmp_path / "run")
        reader = Reader(store, TREE, EmbeddingTagger(TREE, embedder), client)
        lines: list[str] = []                     # without a TTY: periodic lines, the last at the end
        report = reader.ingest([tmp_path / "papers"], echo=lines.append)
        assert (report.papers, report.accepted, report.rejected, report.failed) == (2, 1, 1, 0)
        assert lines[-1].startswith("ingest: 2/2 items, 2 papers read, 2 ideas added, 0 failed, ")
        assert lines[0].startswith("ingest: 2 items to read") and lines[1].endswith(" s left")  # how long, first
        assert report.added == 2 and report.tagged == {"embed": 2}
        calls = len(srv.requests)
        assert calls == 3  # two screenings, one extraction
        again = reader.ingest([tmp_path / "papers"])
        assert again.cached == 2 and len(srv.requests) == calls
    assert srv.requests[0]["grammar"].startswith('root ::= "##response##" answer')
    ideas = store.ideas()
    assert all(i.paper_title == "Gated Channels for Small Networks" and i.tag for i in ideas)
    assert all(TREE.check(i.tag) == i.tag for i in ideas)
    summary = client.usage.to_dict()["roles"]["reader"]
    assert summary["calls"] == 3 and summary["completion_tokens"] > 0


def test_embedding_screen_needs_no_llm_for_stage_1(tmp_path, store, embedder):
    (tmp_path / "good.md").write_text(PAPER_MD)
    (tmp_path / "reject.md").write_text(REJECT_MD)
    with ScriptedServer(scripted) as srv:
        reader = Reader(store, TREE, EmbeddingTagger(TREE, embedder), make_client(srv, tmp_path), screen="embed")
        report = reader.ingest([tmp_path / "good.md", tmp_path / "reject.md"])
    assert (report.accepted, report.rejected) == (1, 1)
    assert len(srv.requests) == 1 and "Method text:" in srv.requests[0]["messages"][-1]["content"]


def test_garbage_replies_fail_one_paper_and_it_is_read_next_time(tmp_path, store, embedder):
    (tmp_path / "good.md").write_text(PAPER_MD)
    # Attempt 0 is prose (a reply, cached like any other); attempt 1 fails at HTTP level (not cached).
    with ScriptedServer(["I think this paper is great!", Step(fault="500")]) as srv:
        reader = Reader(store, TREE, EmbeddingTagger(TREE, embedder), make_client(srv, tmp_path))
        report = reader.ingest([tmp_path / "good.md"])
    assert report.failed == 1 and report.accepted == 0 and store.count() == 0
    assert "reader_filter: attempt 1: llm: server error (HTTP 500)" in report.failures[0]["error"]
    with ScriptedServer(scripted) as srv:
        reader = Reader(store, TREE, EmbeddingTagger(TREE, embedder), make_client(srv, tmp_path))
        report = reader.ingest([tmp_path / "good.md"])
    assert report.accepted == 1 and report.cached == 0 and store.count() == 2


def test_llm_tagger_chooses_among_the_nearest_leaves_and_falls_back(tmp_path, embedder):
    texts = ["Reweight channels with a sigmoid gate computed from globally pooled features.",
             "Replace 3x3 convolutions with depthwise separable convolutions to save FLOPs."]
    fallback = EmbeddingTagger(TREE, embedder)
    shortlists = fallback.candidates(texts, 5)
    second = shortlists[0][1]  # the LLM may overrule the embedding's first choice
    replies = [f"{second.main}*{second.sub}" if second.sub else second.main, "definitely a convolution thing"]
    with ScriptedServer(replies) as srv:
        tagger = LLMTagger(TREE, make_client(srv, tmp_path), fallback, k=5)
        tags = tagger.tag(texts)
    assert tags[0] == second
    assert tags[1] == shortlists[1][0]  # unusable reply: the embedding's choice
    assert (tagger.stats.llm, tagger.stats.fallback) == (1, 1)
    assert "is not one of the 5 candidates" in tagger.stats.errors[0]
    grammar = srv.requests[0]["grammar"]
    assert grammar.startswith("root ::= ") and grammar.count("|") == 4
    prompt = srv.requests[0]["messages"][-1]["content"]
    assert all(t.main in prompt for t in shortlists[0])


def test_replayed_ingest_is_identical_and_offline(tmp_path, embedder):
    from nas.knowledge.store import close_client

    (tmp_path / "good.md").write_text(PAPER_MD)
    with ScriptedServer(scripted) as srv:
        live = KnowledgeStore(path=tmp_path / "q1", embedder=embedder)
        Reader(live, TREE, EmbeddingTagger(TREE, embedder),
               make_client(srv, tmp_path, run=tmp_path / "run", cache=False)).ingest([tmp_path / "good.md"])
    replay = LLMClient({"backend": "replay", "replay_from": str(tmp_path / "run"), "cache": False})
    again = KnowledgeStore(path=tmp_path / "q2", embedder=embedder)
    report = Reader(again, TREE, EmbeddingTagger(TREE, embedder), replay).ingest([tmp_path / "good.md"])
    assert report.accepted == 1
    assert sorted(i.to_dict()["text"] for i in again.ideas()) == sorted(i.text for i in live.ideas())
    assert replay.usage.to_dict()["total"]["replayed"] == 2
    close_client(path=tmp_path / "q1")
    close_client(path=tmp_path / "q2")


# -- the built-in corpus and retrieval --------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory, embedder):
    from nas.knowledge.store import close_client

    path = tmp_path_factory.mktemp("corpus") / "qdrant"
    s = KnowledgeStore(path=path, embedder=embedder)
    report = Reader(s, TREE, EmbeddingTagger(TREE, embedder), client=None).ingest([builtin_corpus()])
    assert report.failed == 0 and report.accepted >= 40 and report.bad_files == []
    yield s
    close_client(path=path)


@pytest.mark.parametrize("query,main", [
    ("channel attention that reweights feature maps", "adaptive feature recalibration"),
    ("depthwise separable convolution to reduce computation", "efficient convolution"),
    ("densely connect every layer to all earlier layers to reuse features", "dense connectivity for feature reuse"),
    ("scale depth, width and resolution together", "network-wise scaling"),
])
def test_retrieval_returns_ideas_of_the_right_category(corpus_store, query, main):
    hits = corpus_store.search(query, k=3)
    assert hits[0].idea.tag.main == main, [(h.idea.text, h.idea.tag.main) for h in hits]


def test_filtered_search_and_builtin_ingest_is_idempotent(corpus_store, embedder):
    hits = corpus_store.search("attention", k=5, main="normalization")
    assert hits and all(h.idea.tag.main == "normalization" for h in hits)
    before = corpus_store.count()
    again = Reader(corpus_store, TREE, EmbeddingTagger(TREE, embedder)).ingest([builtin_corpus()])
    assert again.cached == again.papers and corpus_store.count() == before


def test_idea_list_import_tags_every_idea(tmp_path, store, embedder):
    ideas = [{"id": i, "paper_id": i // 2, "inspiration": text} for i, text in enumerate([
        "Use squeeze and excitation to recalibrate channel responses adaptively.",
        "Adopt depthwise separable convolutions to reduce parameters and computation.",
        "Apply layer normalization before the multi-head self-attention layer.",
    ])]
    (tmp_path / "insp.json").write_text(json.dumps(ideas))
    # progress=True: `nas knowledge ingest` on a terminal (its tagging bar once lacked the bar's `llm` field)
    report = Reader(store, TREE, EmbeddingTagger(TREE, embedder)).ingest([tmp_path / "insp.json"], progress=True)
    assert (report.idea_lists, report.added, report.tagged) == (1, 3, {"embed": 3})
    mains = {i.text[:10]: i.tag.main for i in store.ideas()}
    assert mains["Use squeez"] == "adaptive feature recalibration"
    assert mains["Adopt dept"] == "efficient convolution"


def test_experience_files_go_to_the_experience_store(tmp_path, store, embedder):
    from nas.knowledge.store import ExperienceStore

    good = {"resnet_macro": {"inspiration": "add a gate", "base": [
        {"error": "out_channels must be divisible by groups", "experience": "Keep out_channels divisible by groups."}]}}
    (tmp_path / "exp.json").write_text(json.dumps(good))
    (tmp_path / "bad_exp.json").write_text(json.dumps({"x": {"inspiration": "i", "base": [{"error": "e"}]}}))
    experiences = ExperienceStore(store.client, embedder=embedder)
    report = Reader(store, TREE, EmbeddingTagger(TREE, embedder), experiences=experiences).ingest(
        [tmp_path / "exp.json", tmp_path / "bad_exp.json"])
    assert report.experiences == 1 and experiences.count() == 1
    assert report.bad_files == [{"path": str(tmp_path / "bad_exp.json"),
                                 "reason": "entry 'x'.base[0]: missing 'experience'"}]
    (tip, _), = experiences.retrieve("grouped convolution channel error", k=1)
    assert tip.kind == "tip" and tip.error.startswith("out_channels")


# -- tree rebuild ------------------------------------------------------------------------------------------

def test_tree_build_from_reference_models(tmp_path):
    from nas.knowledge.tree_build import build_tree

    def reply(body: dict) -> str:
        text = body["messages"][-1]["content"]
        main = "efficient convolution" if "Target: efficiency" in text else "feature extraction operators"
        return json.dumps({"attributes": [{"main": main, "sub": "Depthwise Conv*"}, {"main": "bogus", "sub": "x y"},
                                          {"main": main, "sub": "<a short general attribute name>"},
                                          {"main": main, "sub": "Efficient Convolution"}, {"main": main, "sub": "3"}]})

    models = {"MobileNetV2": ("timm.models._efficientnet_blocks", ("InvertedResidual",))}
    with ScriptedServer(reply) as srv:
        tree, report = build_tree(make_client(srv, tmp_path, structured="json_schema"), models=models)
    assert report["calls"] == 2 and report["failed"] == 0
    assert tree.subs("efficient convolution") == ["depthwise conv"]
    assert tree.subs("normalization") == [] and tree.size() == (15, 2)
    sent = srv.requests[0]
    assert "class InvertedResidual" in sent["messages"][-1]["content"]
    assert sent["response_format"]["json_schema"]["schema"]["properties"]["attributes"]["maxItems"] == 8


@pytest.mark.parametrize("words, scanned", [(29, True), (30, False), (31, False)])
def test_a_pdf_under_thirty_words_of_text_is_taken_for_scanned_images(tmp_path, words, scanned):
    text = ["Gated Channels", " ".join(f"w{i}" for i in range(words - 2))]
    (read,) = list(read_path(_write_pdf(tmp_path / "p.pdf", text)))
    is_scanned = isinstance(read, BadFile) and read.reason == "PDF has no extractable text (scanned images?)"
    assert is_scanned == scanned, read


def test_a_reference_model_the_analyst_fails_on_is_reported_with_its_last_error(tmp_path):
    from nas.knowledge.tree_build import build_tree

    replies = iter(["I cannot answer that.", json.dumps({"items": []})] * 2)  # each job: two tries, two errors
    models = {"MobileNetV2": ("timm.models._efficientnet_blocks", ("InvertedResidual",))}
    with ScriptedServer(lambda body: next(replies)) as srv:
        tree, report = build_tree(make_client(srv, tmp_path), models=models)
    assert report["calls"] == 4 and report["failed"] == 2 and report["found"] == {}
    assert len(report["errors"]) == 2
    assert all(e.startswith("MobileNetV2/") and e.endswith("reply has no 'attributes' list") for e in report["errors"])
    assert tree.size() == (15, 0)  # the built-in mains, no sub found

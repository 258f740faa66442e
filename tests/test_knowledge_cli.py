"""`nas knowledge` end to end: the real CLI in a subprocess, a fresh NASFLOW_HOME,
the built-in corpus offline, papers read through a scripted loopback server,
and the same ingest replayed without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import seed_prefect_db
from support.scripted import ScriptedServer

pytestmark = pytest.mark.slow

SE = "performance*block*adaptive feature recalibration*channel attention (SE block)"
PAPER = """# Gated Channels for Small Networks

## Abstract
We reweight the channels of each convolutional block with a gate computed from
globally pooled features, improving accuracy at a small cost.

## 2 Method
Each block pools its output globally, sends the vector through two linear layers
with a bottleneck and a sigmoid, and multiplies the channels by the result.
"""


def nas(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NASFLOW_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "nas.cli.main", "knowledge", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    out = nas(home, "ingest", "--out", str(home / "record"))
    assert out.returncode == 0, out.stderr
    assert "added 107" in out.stdout or "added" in out.stdout
    return home


def test_builtin_ingest_then_cached(home):
    summary = json.loads((home / "record/summary.json").read_text())
    assert summary["report"]["accepted"] >= 40 and summary["report"]["failed"] == 0
    assert summary["llm"]["total"]["calls"] == 0  # ready-made ideas need no LLM
    again = nas(home, "ingest")
    assert again.returncode == 0 and "cached 71" in again.stdout


def test_search_stats_tree(home, tmp_path):
    out = nas(home, "search", "channel attention that reweights feature maps", "-k", "3", "--json")
    assert out.returncode == 0, out.stderr
    hits = json.loads(out.stdout)
    assert "searching the idea store" in out.stderr  # the embedding model's seconds of loading are not silent
    assert len(hits) == 3 and hits[0]["tag"]["main"] == "adaptive feature recalibration"
    filtered = nas(home, "search", "attention", "--main-category", "efficient convolution")
    assert filtered.returncode == 0 and "efficient convolution" in filtered.stdout
    stats = nas(home, "stats", "--json", "--plot", str(tmp_path / "stats.png"))
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    assert data["ideas"] == sum(r["ideas"] for r in data["by_main"]) and len(data["by_main"]) == 15
    assert (tmp_path / "stats.png").read_bytes()[:4] == b"\x89PNG"
    tree = nas(home, "tree")
    assert tree.returncode == 0 and "15 main categories, 55 sub-categories" in tree.stdout


@pytest.mark.parametrize("args,code,message", [
    (["search", "x", "--main-category", "bogus"], 2, "unknown main category 'bogus'"),
    (["ingest", "nowhere.md"], 2, "nowhere.md: no such file or directory"),
    (["search", "x", "llm.backend=gpt"], 2, "llm.backend must be one of"),
    (["search", "x", "llm=gpt"], 2, "unknown llm 'gpt'"),
    (["stats", "knowledge.tagger=magic"], 2, "knowledge.tagger must be one of"),
])
def test_bad_input_is_one_line(tmp_path, args, code, message):
    out = nas(tmp_path, *args)
    assert out.returncode == code and message in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_papers_through_an_endpoint_then_replayed(tmp_path):
    papers = tmp_path / "papers"
    papers.mkdir()
    (papers / "gate.md").write_text(PAPER)
    (papers / "broken.pdf").write_bytes(b"not a pdf")

    def reply(body: dict) -> str:
        text = body["messages"][-1]["content"]
        if "Abstract:" in text:
            return f"##response##{SE}"
        return "- Gate the channels with a sigmoid over two bottleneck linear layers of pooled features\n"

    with ScriptedServer(reply) as srv:
        live = nas(tmp_path / "h1", "ingest", str(papers), "--out", str(tmp_path / "rec"), "llm=openai",
                   f"llm.base_url={srv.base_url}", "llm.api_key_env=NASFLOW_NO_KEY", "llm.structured=grammar")
    assert live.returncode == 0, live.stderr
    assert "accepted 1" in live.stdout and "skipped" in live.stderr and "broken.pdf" in live.stderr
    assert len(srv.requests) == 2 and "grammar" in srv.requests[0]
    summary = json.loads((tmp_path / "rec/summary.json").read_text())
    assert summary["llm"]["roles"]["reader"]["live"] == 2
    replay = nas(tmp_path / "h2", "ingest", str(papers), "--out", str(tmp_path / "rec2"), "llm=replay",
                 f"llm.replay_from={tmp_path / 'rec'}")
    assert replay.returncode == 0, replay.stderr
    assert "accepted 1" in replay.stdout
    replayed = json.loads((tmp_path / "rec2/summary.json").read_text())
    assert replayed["llm"]["total"]["replayed"] == 2 and replayed["llm"]["total"]["live"] == 0
    assert replayed["report"]["added"] == summary["report"]["added"]


def test_ingest_as_a_prefect_flow(tmp_path):
    from nas.knowledge.papers import builtin_corpus

    (tmp_path / "bad.jsonl").write_text("not json\n")
    seed_prefect_db(tmp_path / "home" / "prefect")
    out = nas(tmp_path / "home", "ingest", str(builtin_corpus()), str(tmp_path / "bad.jsonl"), "--prefect",
              "--out", str(tmp_path / "rec"))
    assert out.returncode == 0, out.stderr
    assert "accepted 71" in out.stdout and "bad.jsonl:1: corrupt JSON line" in out.stderr
    assert "starting Prefect's temporary server ...\ningesting as a Prefect flow" in out.stderr  # never silent
    summary = json.loads((tmp_path / "rec/summary.json").read_text())
    assert summary["report"]["papers"] == 71 and summary["ideas_in_store"] == summary["report"]["added"]

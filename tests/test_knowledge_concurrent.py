"""`nas knowledge search` while a NADER search is running on the same local store: the real
CLI in two processes, a real Qdrant folder and a scripted LLM server that holds the search
mid-trial (inside its first LLM call, after it has read the store) until the query is done.
Qdrant local mode admits one process per folder; the search holds it only per read or write."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "nas/spaces/nader/dag/bases/resnet_basic.txt").read_text().split("##Residual_stem##")[0]
EXTRA_BN = BASE.replace("8->1", "8->9\n9->1").replace("8:ReLU", "8:ReLU\n9:BN")
BN_IDEA = "Normalise the block output with batch normalization."


class HeldDesigner:
    """Blocks the first request until `release`; then answers as a cooperative designer."""

    def __init__(self) -> None:
        self.inside, self.release = threading.Event(), threading.Event()

    def __call__(self, body: dict) -> str:
        if not self.inside.is_set():
            self.inside.set()
            self.release.wait(timeout=300)
        system = body["messages"][0]["content"]
        if system.startswith("You lead the design"):
            return "<response>1</response>"
        if system.startswith("You are an expert in deep network architecture"):
            return f"Here is the block:\n```block\n{EXTRA_BN}```\n"
        if system.startswith("You review rejected designs"):
            return "<tip>Every Add node needs two inputs of the same shape.</tip>"
        return "<suggestion>Keep 3x3 kernels in small blocks.</suggestion>"


@pytest.mark.timeout(1800)  # two trainings and three embedding-model loads: ~8 min at a load of 17
def test_knowledge_search_succeeds_while_a_search_is_running(tmp_path):
    from nas.knowledge.embed import default_embedder
    from nas.knowledge.idea import Idea, Tag
    from nas.knowledge.store import KnowledgeStore, close_client

    store_dir = tmp_path / "qdrant"
    tag = Tag("performance", "operation", "normalization", "batch normalization")
    KnowledgeStore(path=store_dir, embedder=default_embedder()).add_ideas([Idea(BN_IDEA, tag, source="test")])
    close_client(path=store_dir)
    env = {**os.environ, "NASFLOW_HOME": str(tmp_path / "home"), "NASFLOW_NO_KEY": ""}
    designer = HeldDesigner()
    with ScriptedServer(designer) as srv:
        search = subprocess.Popen(
            [sys.executable, "-m", "nas.cli.main", "search", "space=nader", "strategy=nader", "evaluator=train",
             "data=digits", "recipe.epochs=1", "evaluator.cells_per_stage=1", "budget.trials=2", "runner=local",
             "progress=false", "llm=openai", f"llm.base_url={srv.base_url}", "llm.api_key_env=NASFLOW_NO_KEY",
             "llm.structured=none", f"knowledge.path={store_dir}", f"hydra.run.dir={tmp_path / 'run'}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            while not designer.inside.wait(timeout=5) and search.poll() is None:
                pass  # the root trains first: minutes on 2 busy cores
            assert designer.inside.is_set(), "the search ended before its first LLM call"
            query = subprocess.run(
                [sys.executable, "-m", "nas.cli.main", "knowledge", "search", "batch normalization", "-k", "1",
                 "--json", f"knowledge.path={store_dir}"], capture_output=True, text=True, env=env, timeout=300)
            assert search.poll() is None
        finally:
            designer.release.set()
            out, err = search.communicate(timeout=600)
    assert query.returncode == 0, query.stderr
    assert [hit["text"] for hit in json.loads(query.stdout)] == [BN_IDEA]
    assert search.returncode == 0, err[-3000:]
    history = (tmp_path / "run" / "history.jsonl").read_text().splitlines()
    assert len(history) == 2 and json.loads(history[1])["strategy"]["stage"] == "modify"

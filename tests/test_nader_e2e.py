"""`nas search strategy=nader` end to end with the real CLI, a real Qdrant
store, real training on digits and a scripted OpenAI-compatible server: an
invalid block is fixed on retry (LIF, with the verifier's error in the prompt),
a duplicate is skipped without training, tips and suggestions reach the
experience store, and the history and summary carry the design metrics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.scripted import ScriptedServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "nas/spaces/nader/dag/bases/resnet_basic.txt").read_text().split("##Residual_stem##")[0]
EXTRA_BN = BASE.replace("8->1", "8->9\n9->1").replace("8:ReLU", "8:ReLU\n9:BN")
KERNEL5 = BASE.replace("5:Conv2d(out_channels=C,kernel_size=3,stride=1)", "5:Conv2d(out_channels=C,kernel_size=5,stride=1)")
NO_SHORTCUT = BASE.replace("0->7\n", "")


def fenced(block: str) -> str:
    return f"Here is the block:\n```block\n{block}```\n"


class Designer:
    """Answers by agent: the Modifier's replies come in order; a retry must carry the error."""

    def __init__(self) -> None:
        self.modifier = [fenced(NO_SHORTCUT), fenced(EXTRA_BN), fenced(EXTRA_BN), fenced(KERNEL5)]
        self.errors_seen: list[str] = []

    def __call__(self, body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You lead the design"):
            return "<response>2, 1</response>"
        if system.startswith("You are an expert in deep network architecture"):
            if "Add takes at least 2 inputs" in user:
                self.errors_seen.append("lif")
            return self.modifier.pop(0) if self.modifier else "I cannot help with that."
        if system.startswith("You review rejected designs"):
            return "<tip>Every Add node needs two inputs of the same shape.</tip>"
        if system.startswith("You analyse why"):
            return "<suggestion>Keep 3x3 kernels in small blocks.</suggestion>"
        return "?"


def search(tmp_path: Path, run: Path, store_dir: Path, *llm: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NASFLOW_HOME": str(tmp_path / "home"), "NASFLOW_NO_KEY": ""}
    return subprocess.run(
        [sys.executable, "-m", "nas.cli.main", "search", "space=nader", "strategy=nader", "evaluator=train",
         "data=digits", "recipe.epochs=1", "recipe.train_subset=256", "recipe.valid_subset=128",
         "recipe.test_subset=128", "evaluator.cells_per_stage=1", "budget.trials=4", "runner=local",
         "progress=false", *llm, f"knowledge.path={store_dir}", f"hydra.run.dir={run}"],
        capture_output=True, text=True, env=env, timeout=600)


def test_nader_search_end_to_end(tmp_path):
    from nas.knowledge.embed import default_embedder
    from nas.knowledge.idea import Idea, Tag
    from nas.knowledge.store import KnowledgeStore, close_client

    store_dir = tmp_path / "qdrant"
    store = KnowledgeStore(path=store_dir, embedder=default_embedder())
    tag = Tag("performance", "operation", "normalization", "batch normalization")
    store.add_ideas([Idea("Normalise the block output with batch normalization.", tag, source="test"),
                     Idea("Use a larger 5x5 kernel in the second convolution.", tag, source="test")])
    close_client(path=store_dir)  # the search process opens it (Qdrant local mode: one process)
    shutil.copytree(store_dir, tmp_path / "qdrant-before")  # the replay starts from the same knowledge

    designer = Designer()
    run = tmp_path / "run"
    with ScriptedServer(designer) as srv:
        out = search(tmp_path, run, store_dir, "llm=openai", f"llm.base_url={srv.base_url}",
                     "llm.api_key_env=NASFLOW_NO_KEY", "llm.structured=none")
    assert out.returncode == 0, out.stderr[-3000:]
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    stages = [h["strategy"]["stage"] for h in history]
    assert stages == ["root", "modify", "modify", "modify"]
    root, fixed, duplicate, kernel5 = history
    assert root["accuracy"] is not None
    # LIF: the first draft failed the parse check, the retry (with the error in its prompt) passed.
    attempts = fixed["strategy"]["attempts"]
    assert [a["ok"] for a in attempts] == [False, True] and designer.errors_seen == ["lif"]
    assert attempts[0]["checks"][0]["name"] == "parse" and "node 7" in attempts[0]["checks"][0]["error"]
    assert fixed["strategy"]["idea"] in {"Normalise the block output with batch normalization.",
                                         "Use a larger 5x5 kernel in the second convolution."}
    assert len(fixed["strategy"]["ideas"]) == 2  # both retrieved, ranked by the Proposer
    assert fixed["accuracy"] is not None and fixed["strategy"]["tokens"] > 0
    # The same block again: skipped, not trained.
    assert duplicate["strategy"]["duplicate"] and duplicate["error"].startswith("duplicate of node")
    assert duplicate["cost_seconds"] == 0
    assert kernel5["accuracy"] is not None and kernel5["key"] != fixed["key"]
    summary = json.loads((run / "summary.json").read_text())
    design = summary["design"]
    assert design["proposals"] == 3 and design["valid"] == 2 and design["duplicates"] == 1
    assert design["executability"] == 1.0 and 0.0 <= design["success_rate"] <= 1.0
    assert summary["llm"]["roles"]["modifier"]["calls"] == 4 and summary["llm"]["total"]["live"] > 0
    assert (run / "llm/transcripts.jsonl").is_file()
    # The Reflector's tip (after the failed draft) is in the experience store.
    from nas.knowledge.store import ExperienceStore

    experiences = ExperienceStore(path=store_dir, embedder=default_embedder())
    kinds = {e.kind for e in experiences.all()}
    assert "tip" in kinds
    close_client(path=store_dir)

    # llm=replay: the same search from the transcripts, the server gone: zero live calls, the same history.
    again = tmp_path / "replayed"
    out = search(tmp_path, again, tmp_path / "qdrant-before", "llm=replay", f"llm.replay_from={run}")
    assert out.returncode == 0, out.stderr[-3000:]
    replayed = [json.loads(line) for line in (again / "history.jsonl").read_text().splitlines()]
    assert [(h["key"], h["strategy"], h["error"]) for h in replayed] == \
        [(h["key"], h["strategy"], h["error"]) for h in history]
    usage = json.loads((again / "summary.json").read_text())["llm"]["total"]
    assert usage["live"] == 0 and usage["replayed"] == summary["llm"]["total"]["calls"]

"""Both LLM design strategies go through the `DesignStrategy` base, each against a scripted
LLM server: the base design is trial 0 (no LLM call), a draft the verifier chain refuses is
revised until it passes, and a design proposed again is a duplicate, rejected without a retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from nas.core.trial import EvalResult, Trial
from nas.design.base import DesignStrategy
from nas.spaces import SPACES
from nas.strategies import STRATEGIES
from support.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
BLOCK = (ROOT / "nas/spaces/nader/dag/bases/resnet_basic.txt").read_text().split("##Residual_stem##")[0]
KERNEL5 = BLOCK.replace("5:Conv2d(out_channels=C,kernel_size=3,stride=1)", "5:Conv2d(out_channels=C,kernel_size=5,stride=1)")
ONE_CONV = "##Residual##\n0:input\n1:output\n2:Conv2d(out_channels=C,kernel_size=3)\n0->2\n2->1\n"
DATA = ROOT / "tests/data/models"
PARENT, KERNEL5_MODEL = (DATA / "cnn_parent.py").read_text(), (DATA / "cnn_kernel5.py").read_text()
BROKEN = PARENT.replace("ConvBlock(32, 64, stride=2)", "ConvBlock(48, 64, stride=2)")  # channels disagree


def block(text: str) -> str:
    return f"```block\n{text}```"


def model(text: str) -> str:
    return f"```python\n{text}```"


CASES = {
    # NADER: a collapsed block (keeps_parent) is sent back, then a 5x5 kernel passes; the next design,
    # from that child, gives back the root: a duplicate of node 0.
    "nader": ({"space": "nader", "use_knowledge": False, "lde": False, "cells_per_stage": 1},
              [block(ONE_CONV), block(KERNEL5), block(BLOCK)], "keeps_parent", "duplicate of node 0"),
    # FairNAD: a draft that fails in the sandbox is debugged into a 5x5 kernel; the next child is that again.
    "fairnad": ({"space": "source", "use_knowledge": False, "init": 2, "sandbox": {"wall_s": 60}},
                [model(BROKEN), model(KERNEL5_MODEL), model(KERNEL5_MODEL)], "execute",
                "duplicate of model 1"),
}


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-design")


@pytest.mark.parametrize("name", sorted(CASES))
def test_design_strategies_share_the_base(name, tmp_path):
    params, replies, first_failure, duplicate = CASES[name]
    params = dict(params)
    space = SPACES.create(params.pop("space"), {"base": str(DATA / "cnn_parent.py")} if name == "fairnad" else {})
    with ScriptedServer(replies) as srv:
        llm = {"backend": "openai", "base_url": srv.base_url, "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
               "max_retries": 0, "structured": "none", "cache": False}
        strategy = STRATEGIES.create(name, {"llm": llm, **params}, space=space, seed=0)
        assert isinstance(strategy, DesignStrategy)
        with pytest.raises(RuntimeError, match="attach"):
            strategy.ask(1)
        strategy.attach(tmp_path / "run")
        [root] = strategy.ask(1)
        assert root.arch == space.base and root.info["stage"] == "root" and not srv.requests
        strategy.tell([Trial.of(0, root, EvalResult(accuracy=50.0, params=1e5, flops=1e7))])

        [designed] = strategy.ask(1)
        attempts = designed.info["attempts"]
        assert designed.rejected is None and designed.info["valid"] and len(attempts) == 2
        assert [c["name"] for c in attempts[0]["checks"] if not c["ok"]] == [first_failure]
        assert attempts[1]["ok"] and len(srv.requests) == 2
        strategy.tell([Trial.of(1, designed, EvalResult(accuracy=60.0, params=1e5, flops=1e7))])

        [again] = strategy.ask(1)
        assert again.info["duplicate"] and again.rejected.endswith(f"{duplicate} (same canonical architecture)")
        assert len(again.info["attempts"]) == 1 and len(srv.requests) == 3  # a duplicate is not retried

    state = strategy.state_dict()
    assert "seen" not in state  # the seen designs are rebuilt from the strategy's tree / models
    resumed = STRATEGIES.create(name, {"llm": llm, **params}, space=space, seed=0)
    resumed.load_state_dict(state)
    assert len(resumed.seen) == len(strategy.seen) and resumed.seen.where(designed.arch.key()) is not None
    report = strategy.report([])
    assert report["design"]["proposals"] == 0 and report["llm"]["total"]["calls"] == 3


class EmptyIdeaStore:
    """An idea store that is still empty: `open_ideas` seeds it (with the embedding model's ~10 s, here none)."""

    def count(self) -> int:
        return 0

    def add_ideas(self, ideas, dedup_threshold: float) -> None:
        pass

    def ideas(self) -> list:
        return []


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("progress", [False, True])
def test_seeding_the_idea_store_says_so_only_with_progress(name, progress, tmp_path, monkeypatch, capsys):
    """progress=false printed the seeding line anyway: `open_ideas` did not know the search's setting."""
    from nas.knowledge.config import KnowledgeConfig

    monkeypatch.setattr(KnowledgeConfig, "open_store", lambda self, embedder=None: EmptyIdeaStore())
    monkeypatch.setattr("nas.knowledge.config.builtin_ideas", lambda: ["an idea"])
    params = {**CASES[name][0], "use_knowledge": True}
    space = SPACES.create(params.pop("space"), {"base": str(DATA / "cnn_parent.py")} if name == "fairnad" else {})
    strategy = STRATEGIES.create(name, params, space=space, seed=0)
    strategy.attach(tmp_path / "run", progress=progress)
    said = "seeding the idea store with 1 built-in ideas (the embedding model loads first) ...\n"
    assert capsys.readouterr().err == (said if progress else "")

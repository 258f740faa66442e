"""NADER's strategy against scripted Modifier replies: a design that drops the parent's
structure, or gives the parent back unchanged, goes back to the Modifier with a named error
(within lif_tries); one that never recovers is a rejected candidate, never trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from nas.agents.nader.strategy import NaderStrategy
from nas.core.trial import EvalResult, Trial
from nas.spaces.nader.space import BlockSpace
from support.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
BASE = (ROOT / "nas/spaces/nader/dag/bases/resnet_basic.txt").read_text().split("##Residual_stem##")[0]
KERNEL5 = BASE.replace("5:Conv2d(out_channels=C,kernel_size=3,stride=1)", "5:Conv2d(out_channels=C,kernel_size=5,stride=1)")
ONE_CONV = "##Residual##\n0:input\n1:output\n2:Conv2d(out_channels=C,kernel_size=3)\n0->2\n2->1\n"


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-nader")


def design(tmp_path, replies: list[str], lif_tries: int = 5) -> tuple:
    """The root, scored; then one design from the scripted Modifier replies."""
    with ScriptedServer([f"```block\n{r}```" for r in replies]) as srv:
        strategy = NaderStrategy(BlockSpace(), 0, use_knowledge=False, lde=False, lif_tries=lif_tries,
                                 cells_per_stage=1, llm={"backend": "openai", "base_url": srv.base_url,
                                                         "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
                                                         "max_retries": 0, "structured": "none", "cache": False})
        strategy.attach(tmp_path / "run")
        [root] = strategy.ask(1)
        strategy.tell([Trial.of(0, root, EvalResult(accuracy=50.0))])
        [cand] = strategy.ask(1)
    return cand, [r["messages"][-1]["content"] for r in srv.requests]


def test_collapsed_and_unchanged_designs_are_sent_back_with_their_error(tmp_path):
    cand, prompts = design(tmp_path, [ONE_CONV, BASE, KERNEL5])
    assert cand.rejected is None and cand.info["valid"] and cand.info["retries"] == 2
    failed = [next(c for c in a["checks"] if not c["ok"]) for a in cand.info["attempts"][:2]]
    assert [c["name"] for c in failed] == ["keeps_parent", "unchanged"]
    assert failed[0]["error"].startswith("dropped the parent's structure: base block 'Residual' has 1 operation(s) "
                                         "(Conv2d), the parent's 7 (Conv2d, BN, ReLU, Add)")
    assert "dropped the parent's structure" in prompts[1]                  # back to the Modifier to fix
    assert "duplicate of the parent (node 0): the block is unchanged" in prompts[2]
    assert cand.arch.blocks.base.nodes["5"].args["kernel_size"] == "5"


def test_a_design_that_never_keeps_the_parent_is_a_named_rejection(tmp_path):
    cand, prompts = design(tmp_path, [ONE_CONV, ONE_CONV], lif_tries=2)
    assert cand.rejected.startswith("dropped the parent's structure") and not cand.info["valid"]
    assert "duplicate" not in cand.info and cand.info["node"] == 1  # a tree node, not a duplicate
    assert len(prompts) == 2


def test_an_unchanged_parent_to_the_end_is_a_duplicate_not_a_tree_node(tmp_path):
    cand, _ = design(tmp_path, [BASE, BASE], lif_tries=2)
    assert cand.info["duplicate"] and cand.rejected.startswith("duplicate of the parent")
    assert "node" not in cand.info


DEAD_TAIL = "\n9:ReLU\n10:Sigmoid\n4->9\n9->10\n"  # computed from node 4, used by nothing


def test_nodes_whose_result_reaches_no_output_are_dropped_and_the_rest_is_the_design(tmp_path):
    cand, prompts = design(tmp_path, [KERNEL5 + DEAD_TAIL])
    assert cand.rejected is None and cand.info["retries"] == 0
    assert cand.info["attempts"][0]["checks"][0]["detail"] == {"dropped": {"base": ["9", "10"]}}
    base = cand.arch.blocks.base
    assert "9" not in base.nodes and "10" not in base.nodes and all("9" not in e for e in base.edges)
    assert cand.arch.blocks.base.nodes["5"].args["kernel_size"] == "5"


def test_the_modifier_is_told_which_dead_nodes_were_dropped_before_the_error(tmp_path):
    cand, prompts = design(tmp_path, [BASE + DEAD_TAIL, KERNEL5])
    assert cand.rejected is None and cand.info["retries"] == 1
    assert "duplicate of the parent (node 0): the block is unchanged" in prompts[1]
    assert "(checked without the nodes whose result reaches no output, base block: nodes 9, 10)" in prompts[1]


def test_an_edge_listed_twice_counts_once_and_the_modifier_is_told_when_it_retries(tmp_path):
    cand, _ = design(tmp_path, [KERNEL5.replace("0->7\n", "0->7\n6->7\n")])
    assert cand.rejected is None and cand.info["retries"] == 0
    assert cand.info["attempts"][0]["checks"][0]["detail"] == {"repeated": {"base": ["6->7"]}}
    assert cand.arch.blocks.base.edges.count(("6", "7")) == 1
    cand, prompts = design(tmp_path, [BASE.replace("0->7\n", "0->7\n0->7\n") + DEAD_TAIL, KERNEL5])
    assert cand.rejected is None and cand.info["retries"] == 1
    assert ("(checked with each edge once, base block: 0->7 listed twice and without the nodes whose result "
            "reaches no output, base block: nodes 9, 10)") in prompts[1]


def test_a_draft_repeating_an_earlier_try_is_sent_back_saying_so(tmp_path):
    """The same draft and error would make the same retry prompt, which the small model mostly
    answers with the same draft: the prompt says the draft repeats, so it differs."""
    cand, prompts = design(tmp_path, [ONE_CONV, ONE_CONV, ONE_CONV, KERNEL5], lif_tries=4)
    assert cand.rejected is None and cand.info["retries"] == 3
    assert "this same draft" not in prompts[1]
    assert "(you wrote this same draft in try 1 too: change what the checker names)" in prompts[2]
    assert "(you wrote this same draft in try 1 and 2 too: change what the checker names)" in prompts[3]


def test_a_tip_is_reflected_from_a_design_that_failed_to_the_end_not_from_one_a_retry_fixed(tmp_path, monkeypatch):
    reflected = []
    monkeypatch.setattr(NaderStrategy, "_reflect_tip", lambda self, idea, errors: reflected.append(errors))
    cand, _ = design(tmp_path / "fixed", [ONE_CONV, KERNEL5])
    assert cand.rejected is None and cand.info["retries"] == 1 and reflected == []
    cand, _ = design(tmp_path / "failed", [ONE_CONV, ONE_CONV], lif_tries=2)
    assert cand.rejected is not None and len(reflected) == 1 and len(reflected[0]) == 2
    assert all(e.startswith("dropped the parent's structure") for e in reflected[0])

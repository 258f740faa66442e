"""The agent strategies' own logic case by case (issue 52, the library mutation run), with the
LLM agents replaced by stand-ins: NADER's idea choice, experiences, reflections and tell; the
Modifier's error texts; its state. Each boundary at and either side, each check both ways."""

from __future__ import annotations

import types

import pytest

from nas.agents.nader import strategy as nader
from nas.core.trial import Candidate, EvalResult, Trial
from nas.errors import ConfigError, RunDirError
from nas.spaces.nader.space import BlockSpace

LLM = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
       "max_retries": 0, "structured": "none", "cache": False}


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test")


def answer(value=None, errors=()):
    return types.SimpleNamespace(ok=value is not None, value=value, errors=list(errors))


CLIENT = object()  # the agents are stand-ins: they are handed it, never call it


def make(**kwargs) -> nader.NaderStrategy:
    s = nader.NaderStrategy(BlockSpace(), 0, llm=LLM, **{"use_knowledge": False, "lde": False, "cells_per_stage": 1,
                                                         **kwargs})
    s.client = CLIENT  # type: ignore[assignment]
    return s


class Store:
    """The idea store's search and the experience store's retrieve and add, recorded."""

    def __init__(self, texts=()):
        self.texts, self.asked, self.added = list(texts), [], []

    def search(self, query, k):
        self.asked.append((query, k))
        return [types.SimpleNamespace(idea=types.SimpleNamespace(text=t)) for t in self.texts[:k]]

    def retrieve(self, idea, k):
        self.asked.append((idea, k))
        return [(types.SimpleNamespace(text=t), 0.5) for t in self.texts[:k]]

    def add(self, experience):
        self.added.append(experience)


def scored_tree(s: nader.NaderStrategy, root: float = 50.0) -> None:
    s.tree.record(0, root)


# ---------------------------------------------------------------- settings

def test_nader_s_defaults():
    s = nader.NaderStrategy(BlockSpace(), 0, llm=LLM)
    assert (s.ideas_k, s.lif_tries, s.lif, s.lde, s.experiences_k, s.use_knowledge) == (5, 5, True, True, 5, True)
    assert (s.tree.policy, s.tree.max_children, s.tree.max_depth) == ("dfs", 3, 8)
    assert (s.root_asked, s.store, s.experience_store) == (False, None, None)
    assert len(s.tree) == 1 and s.tree.node(0).key in s.seen


@pytest.mark.parametrize("kwargs, ok", [({"lif_tries": 1}, True), ({"lif_tries": 0}, False), ({"ideas": 1}, True),
                                        ({"ideas": 0}, False), ({"experiences": 0}, True),
                                        ({"experiences": -1}, False)])
def test_nader_s_counts_at_and_below_their_least(kwargs, ok):
    if ok:
        make(**kwargs)
    else:
        with pytest.raises(ConfigError, match="^strategy 'nader': lif_tries and ideas must be >= 1, experiences >= 0$"):
            make(**kwargs)


def test_the_root_is_asked_once_first():
    s = make()
    assert s._root_pending()
    root = s._root()
    assert root.info == {"stage": "root", "node": 0} and root.arch is s.space.base and not s._root_pending()


# ---------------------------------------------------------------- the idea

def test_without_a_knowledge_store_the_idea_is_the_generic_one():
    s = make()
    assert s._propose(s.tree.node(0), []) == (nader.GENERIC_IDEA, [], None)


def test_the_proposer_chooses_among_the_retrieved_ideas_not_yet_tried(monkeypatch):
    s = make(ideas=2)
    scored_tree(s, 60.0)
    s.store = Store(["a", "b", "c", "d"])
    asked = []
    monkeypatch.setattr(nader, "propose", lambda client, text, score, parent, tried, ideas:
                        asked.append((score, parent, tried, ideas)) or answer([1]))
    root = s.tree.node(0)
    assert s._propose(root, [("a", "failed")]) == ("c", ["b", "c"], None)
    assert s.store.asked == [("improve a residual convolution block for image classification", 3)]  # 2 + 1 tried
    assert asked == [(60.0, None, [("a", "failed")], ["b", "c"])]
    child = s.tree.add_child(0, "k1", "text", "widen it")
    s.tree.record(child.id, 55.0)
    s.store.asked.clear()
    assert s._propose(child, [])[0] == "b"
    assert s.store.asked == [("widen it", 2)] and asked[-1][:2] == (55.0, 60.0)  # its parent's score


@pytest.mark.parametrize("reply, error", [(answer(errors=["bad ranking", "still bad"]), "still bad"),
                                          (answer(), "no reply"), (answer([]), "no reply")])
def test_a_failed_ranking_takes_the_retrieval_order_and_says_why(monkeypatch, reply, error):
    s = make()
    scored_tree(s)
    s.store = Store(["a", "b"])
    monkeypatch.setattr(nader, "propose", lambda *a: reply)
    assert s._propose(s.tree.node(0), []) == ("a", ["a", "b"], error)


def test_a_store_with_no_untried_idea_falls_back_to_the_generic_one(monkeypatch):
    s = make()
    scored_tree(s)
    s.store = Store(["a"])
    monkeypatch.setattr(nader, "propose", lambda *a: pytest.fail("nothing to rank"))
    assert s._propose(s.tree.node(0), [("a", "evaluated")]) == (nader.GENERIC_IDEA, [],
                                                                 "knowledge store has no untried idea")


def test_experiences_are_retrieved_only_with_a_store_and_a_count():
    s = make(experiences=2)
    assert s._experiences("idea") == []
    s.experience_store = Store(["t1", "t2", "t3"])
    assert s._experiences("idea") == ["t1", "t2"] and s.experience_store.asked == [("idea", 2)]
    s.experiences_k = 0
    assert s._experiences("idea") == []


# ---------------------------------------------------------------- reflections and tell

def test_a_tip_is_stored_only_when_the_reflector_answers(monkeypatch):
    s = make()
    s._reflect_tip("idea", ["e1", "e2"])  # no experience store: nothing asked
    s.experience_store = Store()
    monkeypatch.setattr(nader, "reflect_tip", lambda client, idea, errors: answer("use padding"))
    s._reflect_tip("idea", ["e1", "e2"])
    [tip] = s.experience_store.added
    assert (tip.text, tip.kind, tip.error, tip.idea, tip.source) == ("use padding", "tip", "e2", "idea", "nader-run")
    monkeypatch.setattr(nader, "reflect_tip", lambda client, idea, errors: answer(errors=["x"]))
    s._reflect_tip("idea", ["e1"])
    assert len(s.experience_store.added) == 1


def _told(s, node_id, result):
    s.tell([Trial.of(node_id, Candidate(s.space.base, {"node": node_id}), result)])


@pytest.mark.parametrize("child_score, suggested", [(49.0, True), (50.0, False), (51.0, False)])
def test_a_suggestion_follows_a_child_scoring_below_its_parent_only(monkeypatch, child_score, suggested):
    s = make()
    s.experience_store = Store()
    asked = []
    monkeypatch.setattr(nader, "reflect_suggestion", lambda client, idea, ptext, ctext, pscore, cscore:
                        asked.append((idea, pscore, cscore)) or answer("keep the skip"))
    _told(s, 0, EvalResult(accuracy=50.0))  # the root has no parent: no suggestion
    child = s.tree.add_child(0, "k1", "text", "deeper")
    _told(s, child.id, EvalResult(accuracy=child_score))
    assert s.tree.node(child.id).score == child_score
    assert asked == ([("deeper", 50.0, child_score)] if suggested else [])
    assert [(e.text, e.kind, e.idea, e.source) for e in s.experience_store.added] == (
        [("keep the skip", "suggestion", "deeper", "nader-run")] if suggested else [])


def test_no_suggestion_without_an_experience_store_or_an_answer_or_a_scored_parent(monkeypatch):
    s = make()
    monkeypatch.setattr(nader, "reflect_suggestion", lambda *a: answer(errors=["no"]))
    _told(s, 0, EvalResult(accuracy=50.0))
    child = s.tree.add_child(0, "k1", "text", "deeper")
    _told(s, child.id, EvalResult(accuracy=10.0))  # no store: nothing asked
    s.experience_store = Store()
    other = s.tree.add_child(0, "k2", "text", "wider")
    _told(s, other.id, EvalResult(accuracy=10.0))
    assert s.experience_store.added == []


def test_tell_records_scores_and_failures_once_and_skips_what_is_not_in_the_tree():
    s = make()
    s.tell([Trial.of(0, Candidate(s.space.base, {"duplicate": True}), EvalResult(accuracy=1.0))])
    assert s.tree.node(0).status == "pending"
    _told(s, 0, EvalResult(accuracy=50.0))
    _told(s, 0, EvalResult(accuracy=70.0))  # told again: kept
    assert s.tree.node(0).score == 50.0
    a, b = s.tree.add_child(0, "k1", "t", "i"), s.tree.add_child(0, "k2", "t", "i")
    _told(s, a.id, EvalResult.failure("boom"))
    _told(s, b.id, EvalResult(accuracy=None))
    assert [s.tree.node(n).status for n in (a.id, b.id)] == ["failed", "failed"]


def test_nader_s_state_round_trips_and_a_broken_one_is_one_line():
    s = make()
    s._root()
    scored_tree(s)
    s._add_child(0, "k1", "text", "idea", {})
    state = s.state_dict()
    again = make()
    again.load_state_dict(state)
    assert again.root_asked is True and len(again.tree) == 2 and "k1" in again.seen
    for bad in ({k: v for k, v in state.items() if k != "tree"}, {**state, "tree": {"nodes": "x"}}):
        with pytest.raises(RunDirError, match="^strategy 'nader' state: "):
            make().load_state_dict(bad)
    assert s._report([]) == {"tree": s.tree.to_dict()}


# ---------------------------------------------------------------- the Modifier's error texts

def checks(detail):
    return types.SimpleNamespace(checks=[types.SimpleNamespace(detail=detail)])


@pytest.mark.parametrize("outcome, error, text", [
    (None, "bad", "bad"),
    (checks({}), "bad", "bad"),
    (types.SimpleNamespace(checks=[]), "bad", "bad"),
    (checks({"repeated": {"base": ["0->2", "2->1"]}}), None, None),
    (checks({"repeated": {"base": ["0->2", "2->1"]}}), "bad",
     "bad (checked with each edge once, base block: 0->2, 2->1 listed twice)"),
    (checks({"dropped": {"base": ["9", "10"], "stem": ["4"]}}), "bad",
     "bad (checked without the nodes whose result reaches no output, base block: nodes 9, 10; stem block: nodes 4)"),
    (checks({"repeated": {"stem": ["0->1"]}, "dropped": {"base": ["9"]}}), "bad",
     "bad (checked with each edge once, stem block: 0->1 listed twice and without the nodes whose result reaches "
     "no output, base block: nodes 9)"),
])
def test_the_modifier_is_told_what_the_parse_changed(outcome, error, text):
    assert nader._with_parse_changes(outcome, error) == text


@pytest.mark.parametrize("before, text", [([0], "try 1"), ([0, 2], "try 1 and 3")])
def test_a_repeated_draft_names_the_tries_that_wrote_it_from_one(before, text):
    assert nader._repeated("bad", before) == f"bad (you wrote this same draft in {text} too: change what the checker names)"


@pytest.mark.parametrize("attempt, error", [
    ({"checks": [{"ok": True, "error": None}, {"ok": False, "error": "second"}, {"ok": False, "error": "third"}]},
     "second"),
    ({"checks": [{"ok": True, "error": None}]}, "failed"), ({}, "failed")])
def test_an_attempt_s_error_is_its_first_failed_check_s(attempt, error):
    assert nader._first_error(attempt) == error

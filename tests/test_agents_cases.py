"""The agent strategies' own logic case by case (issue 52, the library mutation run), with the
LLM agents replaced by stand-ins: NADER's idea choice, experiences, reflections and tell; the
Modifier's error texts; its state. Each boundary at and either side, each check both ways."""

from __future__ import annotations

import types

import pytest

from nas.agents.collm import strategy as collm
from nas.agents.fairnad import strategy as fairnad
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


# the agents are stand-ins: they are handed the client, never call it; only its token count is read
_NO_TOKENS = types.SimpleNamespace(prompt_tokens=0, completion_tokens=0)
USAGE = CLIENT = types.SimpleNamespace(usage=types.SimpleNamespace(total=lambda: _NO_TOKENS))


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


def built_or_refused(build, kwargs, ok, message):
    """A strategy built with `kwargs`, or (not `ok`) refused with a ConfigError matching `message`."""
    if ok:
        build(**kwargs)
    else:
        with pytest.raises(ConfigError, match=message):
            build(**kwargs)


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
    built_or_refused(make, kwargs, ok, "^strategy 'nader': lif_tries and ideas must be >= 1, experiences >= 0$")


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


# ================================================================ FairNAD

FAIR_LLM = LLM


def fair(**kwargs) -> fairnad.FairNADStrategy:
    from nas.spaces.source.space import SourceSpace

    s = fairnad.FairNADStrategy(SourceSpace(), 0, llm=FAIR_LLM, **kwargs)
    s.client = USAGE  # type: ignore[assignment]
    return s


def model(i, parent=None, status="evaluated", accuracy=None, params=None, flops=None, idea="i"):
    return fairnad.Model(i, parent, f"# model {i}\n", "fair", idea, status, accuracy, params, flops)


def test_fairnad_s_defaults():
    s = fair()
    assert s.counts == {"init": 8, "fair_parents": 8, "pareto_parents": 8, "iterative_parents": 4,
                        "iterative_steps": 2}
    assert (s.sampling, s.use_knowledge, s.max_debug, s.max_downscale, s.structure, s.underused_ratio) == (
        "main", True, 2, 4, True, 0.9)
    assert (s.stage_order, s.width_multiple, s.check_cache, s.next_stage, s.generation) == (
        ["fair", "pareto", "iterative"], fairnad.WIDTH_MULTIPLE, True, "init", 0)
    assert (s.input_size, s.num_classes, s.models, s.queue, s.pool, s.attributes) == (32, 10, [], [], [], "")


@pytest.mark.parametrize("kwargs, problem", [
    ({"init": 0, "fair_parents": 0, "max_debug": 0, "max_downscale": 0}, None),
    ({"init": -1}, "counts must be integers >= 0 (init=-1)"),
    ({"iterative_steps": 1.0}, "(iterative_steps=1.0)"),
    ({"max_debug": -1, "max_downscale": -2}, "(max_debug=-1, max_downscale=-2)"),
    ({"sampling": "sub"}, None), ({"sampling": "idea"}, None),
    ({"sampling": "all"}, "strategy.sampling must be one of main, sub, idea, got 'all'"),
    ({"stages": {"fair": False, "pareto": False, "iterative": False}}, "every stage is switched off"),
    ({"stages": {"pareto": False}}, None), ({"stages": {"genetic": True}}, "strategy.stages"),
    ({"width_multiple": 1}, None), ({"width_multiple": 0}, "width_multiple must be an integer >= 1, got 0"),
    ({"width_multiple": True}, "got True"),
    ({"underused": 1}, None), ({"underused": 0.01}, None), ({"underused": 0}, "underused must be in (0, 1], got 0"),
    ({"underused": 1.01}, "got 1.01"),
])
def test_fairnad_s_settings_at_and_beyond_their_limits(kwargs, problem):
    if problem is None:
        fair(**kwargs)
    else:
        with pytest.raises(ConfigError) as err:
            fair(**kwargs)
        assert problem in str(err.value)


def test_a_switched_off_stage_is_left_out_of_the_order():
    assert fair(stages={"pareto": False}).stage_order == ["fair", "iterative"]


def test_a_model_has_a_score_and_size_only_once_measured():
    with pytest.raises(ValueError, match="^fairnad: model 3 is pending, it has no accuracy$"):
        model(3, status="pending").score
    with pytest.raises(ValueError, match="^fairnad: model 3 has no measured params/FLOPs$"):
        model(3, params=1.0).size
    with pytest.raises(ValueError, match="no measured"):
        model(3, flops=1.0).size
    assert model(3, accuracy=91.5, params=2.0, flops=3.0).score == 91.5 and model(3, params=2.0, flops=3.0).size == (
        2.0, 3.0)


@pytest.mark.parametrize("items, k, cycled", [([], 3, []), ([5], 3, [5, 5, 5]), ([1, 2], 3, [1, 2, 1]),
                                              ([1, 2, 3], 2, [1, 2]), ([1], 0, [])])
def test_k_parents_cycle_through_fewer(items, k, cycled):
    assert fairnad._cycle(items, k) == cycled


def test_labels_and_measured_sizes():
    assert fairnad._label(model(0)) == "model 0 (the base)" and fairnad._label(model(2)) == "model 2"
    check = types.SimpleNamespace
    outcome = check(checks=[check(name="parse", detail={}), check(name="budget", detail={"params": 5, "flops": 7})])
    assert fairnad._measured(outcome) == (5, 7)
    assert fairnad._measured(check(checks=[check(name="parse", detail={})])) == (None, None)


def test_parents_are_ranked_by_accuracy_then_id_evaluated_only():
    s = fair()
    s.models = [model(0, accuracy=50.0), model(1, accuracy=60.0), model(2, status="failed"),
                model(3, accuracy=60.0), model(4, status="pending")]
    assert s._ranked() == [1, 3, 0]


def test_pareto_parents_need_measured_models_and_a_count(monkeypatch):
    s = fair()
    s.models = [model(0, accuracy=50.0), model(1, accuracy=60.0, params=1.0, flops=2.0),
                model(2, accuracy=70.0, params=3.0, flops=4.0)]
    asked = []
    monkeypatch.setattr(fairnad, "nsga2_select", lambda points, maximize, k: asked.append((points, maximize, k)) or [1])
    assert s._pareto_parents(0) == [] and asked == []
    assert s._pareto_parents(3) == [2, 2, 2]
    assert asked == [([[60.0, 1.0, 2.0], [70.0, 3.0, 4.0]], [o.maximize for o in fairnad.FAIRNAD_OBJECTIVES], 2)]
    s.models = [model(0, accuracy=50.0)]
    assert s._pareto_parents(3) == []


def pool(s, ideas):
    s.pool = [fairnad.PoolIdea(text, "block", main, sub) for text, main, sub in ideas]


def test_an_empty_pool_exhausts_the_search():
    from nas.core.trial import SearchExhausted

    with pytest.raises(SearchExhausted, match="the idea pool is empty"):
        fair()._sample_idea()


@pytest.mark.parametrize("sampling, share", [("main", 0.5), ("sub", 1 / 3), ("idea", 0.1)])
def test_fair_sampling_is_uniform_over_categories_then_ideas(sampling, share):
    s = fair(sampling=sampling)
    # main A: 9 ideas in subs a1 (8) and a2 (1); main B: 1 idea
    pool(s, [(f"a1-{i}", "A", "a1") for i in range(8)] + [("a2-0", "A", "a2"), ("b-0", "B", "b")])
    picks = [s._sample_idea().text for _ in range(3000)]
    assert picks.count("b-0") / 3000 == pytest.approx(share, abs=0.04)
    assert set(picks) == {i.text for i in s.pool}


def test_ideas_without_categories_are_sampled_one_by_one():
    s = fair(sampling="main")
    pool(s, [("x", "", ""), ("y", "", "")])
    assert {s._sample_idea().text for _ in range(50)} == {"x", "y"}
    pool(s, [("x", "", ""), ("y", "M", "")])  # only ideas with a category are in the groups
    assert {s._sample_idea().text for _ in range(50)} == {"y"}


def test_a_fair_job_carries_the_idea_s_tag():
    s = fair()
    pool(s, [("x", "M", "S")])
    assert s._fair_job("init", 3) == fairnad.Job("init", 3, "x", {"granularity": "block", "main": "M", "sub": "S"})


@pytest.mark.parametrize("small, ideas, refinement", [(True, "UPSCALE_IDEAS", "upscale"),
                                                      (False, "HYPER_IDEAS", "hyper-parameter")])
def test_a_pareto_job_upscales_an_underused_model_else_tunes_it(monkeypatch, small, ideas, refinement):
    s = fair(underused=0.5)
    s.models = [model(0, accuracy=50.0, params=10.0, flops=20.0)]
    asked = []
    monkeypatch.setattr(fairnad, "underused", lambda *a: asked.append(a) or small)
    job = s._pareto_job(0)
    assert job.stage == "pareto" and job.parent == 0 and job.tag == {"refinement": refinement}
    assert job.idea in getattr(fairnad, ideas)
    assert asked == [(10.0, 20.0, *fairnad.budget_limits(s.budget), 0.5)]


def test_the_mutation_request_by_stage_and_granularity():
    s = fair()
    assert s._request(fairnad.Job("pareto", 0, "widen it")) == ("widen it", "refinement")
    network = fairnad.Job("fair", 0, "add  a\nstage", {"granularity": "network"})
    assert s._request(network) == (fairnad.TARGETS["network"].format(idea="add a stage"), "network")
    block = fairnad.Job("fair", 0, "use SE", {"granularity": "block"})
    seen = {s._request(block) for _ in range(40)} | {s._request(fairnad.Job("fair", 0, "use SE")) for _ in range(40)}
    assert seen == {(fairnad.TARGETS[t].format(idea="use SE"), t) for t in ("new", "modify")}


def test_the_plan_runs_init_once_then_each_stage_per_generation():
    s = fair(init=2, fair_parents=1, pareto_parents=0, iterative_parents=2, iterative_steps=1)
    pool(s, [("x", "M", "S")])
    s._plan()
    assert s.queue == []  # no evaluated model yet
    s.models = [model(0, accuracy=50.0), model(1, accuracy=60.0)]
    s._plan()
    assert [(j.stage, j.parent) for j in s.queue] == [("init", 0), ("init", 0)] and s.next_stage == "fair"
    assert s.generation == 0
    s.queue = []
    s._plan()
    assert [(j.stage, j.parent) for j in s.queue] == [("fair", 1)] and s.generation == 1
    s.queue = []
    s._plan()  # pareto has no parent (none measured, and 0 asked): skipped to iterative
    assert [(j.stage, j.parent, j.step, j.chain) for j in s.queue] == [("iterative", 1, 1, 1), ("iterative", 0, 1, 0)]
    assert s.next_stage == "fair" and s.generation == 1
    s.queue = []
    s._plan()
    assert s.generation == 2 and [j.stage for j in s.queue] == ["fair"]


def test_no_init_goes_straight_to_the_first_stage_and_no_steps_means_no_iterative_jobs():
    s = fair(init=0, fair_parents=0, pareto_parents=0, iterative_parents=2, iterative_steps=0)
    s.models = [model(0, accuracy=50.0)]
    s._plan()
    assert s.queue == [] and s.generation == 1
    assert s._next_job() is None


def told(s, node, result, **info):
    return Trial.of(0, Candidate(s.space.base, {"node": node, **info}), result)


def test_tell_scores_a_pending_model_keeping_sizes_it_does_not_report():
    s = fair()
    s.models = [model(0, status="pending", params=5.0, flops=6.0), model(1, status="pending"),
                model(2, status="failed")]
    s.tell([told(s, 0, EvalResult(accuracy=70.0, flops=9)), told(s, 1, EvalResult.failure("boom")),
            told(s, 2, EvalResult(accuracy=80.0)), told(s, None, EvalResult(accuracy=1.0))])
    assert [(m.status, m.accuracy, m.params, m.flops) for m in s.models] == [
        ("evaluated", 70.0, 5.0, 9), ("failed", None, None, None), ("failed", None, None, None)]
    s.models.append(model(3, status="pending"))
    s.tell([told(s, 3, EvalResult(accuracy=None))])
    assert s.models[3].status == "failed"


@pytest.mark.parametrize("step, node_ok, queued", [(1, True, [("iterative", 1, 2, 0)]),
                                                   (1, False, [("iterative", 0, 2, 0)]), (2, True, [])])
def test_an_iterative_chain_goes_on_from_the_new_model_or_its_parent_until_its_steps(step, node_ok, queued):
    s = fair(iterative_steps=2)
    s.models = [model(0, accuracy=50.0), model(1, status="pending")]
    result = EvalResult(accuracy=60.0) if node_ok else EvalResult.failure("x")
    s.tell([told(s, 1, result, stage="iterative", step=step, chain=0, chain_from=0)])
    assert [(j.stage, j.parent, j.step, j.chain) for j in s.queue] == queued


def test_an_iterative_step_without_a_model_retries_from_its_parent():
    s = fair(iterative_steps=3)
    s.models = [model(0, accuracy=50.0)]
    s.tell([told(s, None, EvalResult.failure("x"), stage="iterative", step=2, chain=0, chain_from=0)])
    assert [(j.parent, j.step) for j in s.queue] == [(0, 3)]


def test_an_iterative_job_from_the_base_takes_a_fresh_idea_and_keeps_one_it_has(monkeypatch):
    s = fair()
    pool(s, [("fresh idea", "M", "S")])
    s.models = [model(0, accuracy=50.0)]
    requests = []
    monkeypatch.setattr(fairnad, "mutate", lambda client, source, request: requests.append(request) or answer(
        errors=["no draft"]))

    def feedback(first, parent, request, attempts):
        attempts.append({"action": "mutate", "error": first.error})
        return None, first.text

    monkeypatch.setattr(s, "_feedback", feedback)
    cand = s._design(fairnad.Job("iterative", 0, step=1, chain=0))
    assert cand.info["idea"] == "fresh idea" and cand.info["tag"] == {"granularity": "block", "main": "M", "sub": "S"}
    assert cand.rejected == "mutate: no draft" and cand.info["chain_from"] == 0 and cand.info["step"] == 1
    cand = s._design(fairnad.Job("iterative", 0, "kept idea", step=1, chain=0))
    assert cand.info["idea"] == "kept idea"


def test_fairnad_s_state_round_trips_and_a_broken_one_is_one_line():
    s = fair()
    s._root()
    s.queue = [fairnad.Job("fair", 0, "x")]
    s.next_stage, s.generation = "pareto", 3
    again = fair()
    again.load_state_dict(s.state_dict())
    assert again.models == s.models and again.queue == s.queue and (again.next_stage, again.generation) == ("pareto", 3)
    assert s.space.base.key() in again.seen
    for bad in ({"models": []}, {**s.state_dict(), "generation": "x"}, {**s.state_dict(), "queue": [{"x": 1}]}):
        with pytest.raises(RunDirError, match="^strategy 'fairnad' state: "):
            fair().load_state_dict(bad)


# ================================================================ CoLLM

def collm_strategy(**kwargs) -> collm.CoLLMStrategy:
    from nas.spaces.nb201.space import NB201Space

    s = collm.CoLLMStrategy(NB201Space(), 0, llm=LLM, **kwargs)
    s.client = types.SimpleNamespace(usage=USAGE.usage, prompt_budget=lambda role, tokens=None: None)  # type: ignore
    return s


def cell(i: int):
    import numpy as np

    from nas.spaces.nb201.space import NB201Space

    return NB201Space().sample(np.random.default_rng(i))


def rec(values, accuracy, flops=None, params=None, error=None, iteration=1):
    return collm.Record(values, values, accuracy, flops, params, error, iteration)


def test_collm_s_defaults():
    from nas.spaces.nb201.space import NB201Space

    s = collm.CoLLMStrategy(NB201Space(), 0)
    assert (s.k, s.max_iterations, s.target, s.temperature, s.navigator_memory, s.generator_memory, s.single_llm) == (
        5, None, None, 0.6, True, False, False)
    assert (s.memory_turns, s.max_retries, s.shown_visited, s.shown_best, s.max_attempts) == (2, 2, 20, 5, 1000)
    assert (s.client, s.iteration, s.queue, s.reported, s.strategy_text, s.counts) == (None, 0, [], [0, 0], None,
                                                                                      collm.Counts())
    assert collm.CoLLMStrategy.random_moves is False


@pytest.mark.parametrize("kwargs, ok", [
    ({"candidates_per_iteration": 1}, True), ({"candidates_per_iteration": 0}, False),
    ({"max_retries": 0}, True), ({"max_retries": -1}, False),
    ({"max_iterations": 1}, True), ({"max_iterations": 0}, False), ({"max_iterations": None}, True),
    ({"memory_turns": 0}, True), ({"memory_turns": -1}, False), ({"memory_turns": None}, True)])
def test_collm_s_counts_at_and_below_their_least(kwargs, ok):
    built_or_refused(collm_strategy, kwargs, ok, "^strategy 'collm': candidates_per_iteration and max_iterations")


def test_collm_needs_a_categorical_space():
    with pytest.raises(ConfigError, match="^strategy 'collm' needs a categorical space .*not 'nader'$"):
        collm.CoLLMStrategy(BlockSpace(), 0)


@pytest.mark.parametrize("target, accuracies, reached", [
    (None, [99.0], None), (90.0, [], None), (90.0, [89.9, None], None),
    (90.0, [90.0], "reached target accuracy 90 (best 90)"), (90.0, [80.0, 95.25], "reached target accuracy 90 (best 95.25)")])
def test_the_target_is_reached_at_or_above_it(target, accuracies, reached):
    s = collm_strategy(target_accuracy=target)
    s.records = [rec(f"v{i}", a) for i, a in enumerate(accuracies)]
    assert s._target_reached() == reached


def test_ask_serves_the_queue_and_stops_at_max_iterations():
    from nas.core.trial import SearchExhausted

    s = collm_strategy(max_iterations=1)
    s.client = None
    with pytest.raises(RuntimeError, match="attach"):
        s.ask(1)
    s = collm_strategy(max_iterations=1)
    s.iteration = 1
    a, b = cell(1), cell(2)
    s.queue = [(a.encode(), {"origin": "llm"}), (b.encode(), {"origin": "random_fill"})]
    got = s.ask(3)  # two queued, then the limit: what it has
    assert [c.arch.key() for c in got] == [a.key(), b.key()] and [c.info["origin"] for c in got] == ["llm", "random_fill"]
    with pytest.raises(SearchExhausted, match=r"^collm: reached max_iterations \(1\)$"):
        s.ask(1)
    s = collm_strategy(target_accuracy=50.0)
    s.records = [rec("v", 60.0)]
    s.queue = [(a.encode(), {})]
    with pytest.raises(SearchExhausted, match="reached target accuracy 50"):
        s.ask(1)


def proposal(arch=None, text="t", error=None):
    return types.SimpleNamespace(arch=arch, text=text, error=error)


def test_the_coordinator_keeps_legal_unvisited_feasible_proposals_up_to_the_need():
    from nas.core.constraint import Constraint

    s = collm_strategy()
    s.iteration = 2
    seen, good, big = cell(1), cell(2), cell(3)
    s.seen.add(seen)
    s.constraint = types.SimpleNamespace(violation=lambda space, a: "too big" if a.key() == big.key() else None)
    got = s._screen([proposal(None, "x", "no such op"), proposal(None, "y"), proposal(seen, "s"), proposal(big, "b"),
                     proposal(good, "g"), proposal(cell(4), "surplus")], need=1)
    assert [a.key() for a in got] == [good.key()] and good in s.seen
    assert [(r.iteration, r.kind, r.text, r.reason) for r in s.rejections] == [
        (2, "illegal", "x", "no such op"), (2, "illegal", "y", "not an architecture of the space"),
        (2, "duplicate", "s", "already evaluated or proposed"), (2, "infeasible", "b", "too big")]
    c = s.counts
    assert (c.proposals, c.accepted, c.illegal, c.duplicate, c.infeasible) == (5, 1, 2, 1, 1)
    assert Constraint().violation(s.space, good) is None


def test_one_iteration_asks_again_for_the_shortfall_then_fills_at_random(monkeypatch):
    s = collm_strategy(candidates_per_iteration=3, max_retries=1)
    replies = [types.SimpleNamespace(text="reply")]
    monkeypatch.setattr(collm, "navigate", lambda *a, **k: types.SimpleNamespace(ok=True, value="explore", errors=[],
                                                                                  replies=replies))
    asked = []

    def generate(client, space, messages, template, k, attempt):
        asked.append((k, attempt))
        if attempt == 0:
            return types.SimpleNamespace(ok=True, value=[proposal(cell(1)), proposal(cell(1))], errors=[],
                                         replies=replies)
        return types.SimpleNamespace(ok=False, value=None, errors=["bad json"], replies=replies)

    monkeypatch.setattr(collm, "generate", generate)
    s._iterate()
    assert asked == [(3, 0), (2, 1)] and s.strategy_text == "explore" and s.iteration == 1
    assert [info["origin"] for _, info in s.queue] == ["llm", "random_fill", "random_fill"]
    assert (s.counts.accepted, s.counts.duplicate, s.counts.random_fill, s.counts.generator_failures) == (1, 1, 2, 1)
    assert s.errors == [{"iteration": 1, "role": "generator", "error": "bad json"}]
    assert s.nav_log[-1] == {"role": "assistant", "content": "reply"} and s.gen_log == []  # generator_memory off
    assert s.reported == [0, 0]  # the Navigator's strategy saw no rejection yet


def test_a_failed_navigator_costs_its_turn_and_is_counted(monkeypatch):
    s = collm_strategy()
    monkeypatch.setattr(collm, "navigate", lambda *a, **k: types.SimpleNamespace(ok=False, value=None, errors=[]))
    s._navigate()
    assert s.counts.navigator_failures == 1 and s.strategy_text is None
    assert s.errors == [{"iteration": 0, "role": "navigator", "error": "no reply"}] and s.nav_log == []


@pytest.mark.parametrize("turns, kept", [(None, 6), (0, 0), (1, 2), (2, 4), (3, 6), (5, 6)])
def test_memory_keeps_the_last_exchanges_or_all_there_are(turns, kept):
    s = collm_strategy(memory_turns=turns)
    log = [{"role": "user", "content": str(i)} for i in range(6)]  # three exchanges
    assert s._window(log) == log[6 - kept:]


def test_the_oldest_remembered_exchanges_go_first_when_the_prompt_is_too_long():
    s = collm_strategy()
    s.client = types.SimpleNamespace(prompt_budget=lambda role, tokens=None: 4,
                                     prompt_tokens=lambda messages: len(messages))
    history = [{"content": str(i)} for i in range(6)]
    got = s._fit("navigator", {"content": "s"}, history, {"content": "u"})
    assert got == [{"content": "s"}, {"content": "4"}, {"content": "5"}, {"content": "u"}] and s.counts.trimmed_turns == 2
    s.client = types.SimpleNamespace(prompt_budget=lambda role, tokens=None: None)
    assert len(s._fit("navigator", {"content": "s"}, history, {"content": "u"})) == 8


@pytest.mark.parametrize("flops, params, text", [(None, None, "none"), (200e6, None, "at most 200 MFLOPs"),
                                                 (None, 1.5e6, "at most 1.5 M parameters"),
                                                 (2e6, 3e5, "at most 2 MFLOPs and at most 0.3 M parameters")])
def test_the_constraint_as_the_llms_read_it(flops, params, text):
    from nas.core.constraint import Constraint

    s = collm_strategy()
    s.constraint = Constraint(flops, params)
    assert s._constraint_text() == text


@pytest.mark.parametrize("target, text", [(None, "the highest accuracy you can find"),
                                          (93.5, "an accuracy of at least 93.5%")])
def test_the_target_as_the_llms_read_it(target, text):
    values = collm_strategy(target_accuracy=target)._space_values()
    assert values["target"] == text and values["n"] == 6


def test_the_best_and_the_visited_as_the_llms_read_them():
    s = collm_strategy(shown_visited=2)
    assert s._visited_text() == "none yet"
    s.records = [rec("a", 50.0), rec("b", None, error="x")]
    assert s._visited_text() == "a\nb"  # at the limit: all
    s.records.append(rec("c", 70.0))
    assert s._visited_text() == "c\na\n(and 1 lower-scoring ones)"
    s.records.append(rec("d", 60.0))
    assert [r.values for r in s._best(2)] == ["c", "d"] and [r.values for r in s._best(9)] == ["c", "d", "a"]


def test_result_lines_give_accuracy_and_costs_or_the_failure():
    lines = collm.CoLLMStrategy._lines
    assert lines([]) == "none"
    assert lines([rec("a", 91.234, flops=12.34e6, params=0.1234e6), rec("b", 50.0), rec("c", None, error="boom"),
                  rec("d", None)]) == (
        "- a -> accuracy 91.23, 12.3 MFLOPs, 0.123 M params\n- b -> accuracy 50.00\n- c -> failed: boom\n"
        "- d -> failed: no accuracy")


def test_refinement_shows_the_results_and_rejections_since_the_last_strategy():
    s = collm_strategy()
    s.records = [rec("old", 10.0), rec("new", 20.0)]
    s.rejections = [collm.Rejection(1, "illegal", f"r{i}", "why") for i in range(12)]
    s.reported = [1, 1]
    values = s._refine_values()
    assert values["results"] == "- new -> accuracy 20.00" and values["evaluated"] == 2
    assert values["rejected"].splitlines() == [f"- r{i}: illegal, why" for i in range(2, 12)]  # the last 10
    s.reported = [2, 12]
    assert (s._refine_values()["results"], s._refine_values()["rejected"]) == ("none", "none")


def test_tell_records_each_trial_as_the_llms_are_shown_it():
    s = collm_strategy()
    a, b = cell(1), cell(2)
    s.tell([Trial.of(0, Candidate(a, {"iteration": 3}), EvalResult(accuracy=91.0)),
            Trial.of(1, Candidate(b, {}), EvalResult.failure("out of memory\ntraceback"))])
    cost = s.space.cost(a)
    assert s.records[0] == collm.Record(collm.values_text(s.space, a), a.key(), 91.0, float(cost.flops),
                                        float(cost.params), None, 3)
    assert (s.records[1].accuracy, s.records[1].error, s.records[1].iteration) == (None, "out of memory", None)
    assert a in s.seen and b in s.seen


def test_collm_s_state_round_trips_an_older_state_lacks_later_counts_and_a_broken_one_is_one_line():
    s = collm_strategy()
    s.iteration, s.strategy_text, s.reported = 2, "go", [1, 0]
    s.records = [rec("a", 1.0)]
    s.counts.trimmed_turns = 3
    state = s.state_dict()
    again = collm_strategy()
    again.load_state_dict(state)
    assert (again.iteration, again.strategy_text, again.records, again.counts) == (2, "go", s.records, s.counts)
    older = {**state, "counts": {k: v for k, v in state["counts"].items() if k != "trimmed_turns"}}
    again.load_state_dict(older)
    assert again.counts.trimmed_turns == 0
    for bad in ({**state, "reported": [1]}, {**state, "strategy_text": 3},
                {**state, "counts": {k: v for k, v in state["counts"].items() if k != "accepted"}}):
        with pytest.raises(RunDirError, match="^strategy 'collm' state: "):
            collm_strategy().load_state_dict(bad)
    s.client = None
    report = s.report([])["collm"]
    assert (report["iterations"], report["trimmed_turns"], report["strategy"]) == (2, 3, "go")


# ---------------------------------------------------------------- CoLLM's agents: what they are shown and read

def decisions_space(*decisions):
    from nas.core.space import Decision

    return types.SimpleNamespace(decisions=lambda: [Decision(n, c) for n, c in decisions])


def test_the_decision_table_groups_runs_of_the_same_choices():
    from nas.agents.collm.agents import decision_table

    space = decisions_space(("op", ("a", "b")), ("k1", (3, 5)), ("k2", (3, 5)), ("w", (1,)))
    assert decision_table(space) == ("- position 1 (op): one of \"a\", \"b\"\n"
                                     "- positions 2-3 (k1, k2): each one of 3, 5\n- position 4 (w): one of 1")
    many = decisions_space(*[(f"k{i}", (3, 5)) for i in range(9)])
    assert decision_table(many) == "- positions 1-9 (k0 .. k8): each one of 3, 5"
    eight = decisions_space(*[(f"k{i}", (3, 5)) for i in range(8)])
    assert decision_table(eight) == f"- positions 1-8 ({', '.join(f'k{i}' for i in range(8))}): each one of 3, 5"


def test_the_candidates_grammar_asks_for_exactly_k_arrays_of_legal_values():
    from nas.agents.collm.agents import candidates_grammar

    space = decisions_space(("op", ("a", "b")), ("k", (3, 5)), ("j", (3, 5)))
    assert candidates_grammar(space, 1) == ('root ::= "[\\n" cand "\\n]"\ncand ::= "[" v0 ", " v1 ", " v1 "]"\n'
                                            'v0 ::= "\\"a\\"" | "\\"b\\""\nv1 ::= "3" | "5"\n')
    assert candidates_grammar(space, 3).splitlines()[0] == 'root ::= "[\\n" cand ("," "\\n" cand){2} "\\n]"'


def test_the_strategy_grammar_has_a_direction_per_decision_up_to_eight():
    from nas.agents.collm.agents import strategy_grammar

    eight = strategy_grammar(decisions_space(*[(f"d{i}", (1, 2)) for i in range(8)]))
    assert eight.splitlines()[0].count("phrase") == 8 and "bullet{1,8}" not in eight
    nine = strategy_grammar(decisions_space(*[(f"d{i}", (1, 2)) for i in range(9)]))
    assert nine.splitlines()[0].endswith('"# DIRECTIONS\\n" bullet{1,8}') and "phrase \"" not in nine


def test_a_strategy_is_the_text_before_the_candidates_cut_at_its_limit():
    from nas.agents.collm.agents import CANDIDATES_HEADER, parse_strategy
    from nas.llm.parse import ParseError

    assert parse_strategy(f"  go wide \n{CANDIDATES_HEADER}\n[1]") == "go wide"
    assert parse_strategy("abcdef", limit=4) == "abcd"
    with pytest.raises(ParseError, match="empty strategy"):
        parse_strategy(f" \n{CANDIDATES_HEADER}[1]")


@pytest.mark.parametrize("choice, value, same", [("a", "a", True), (4, 4.0, True), (3, "3", True), (3, 4, False),
                                                 (True, 1, False), (1, True, False), ("a", "b", False)])
def test_a_written_value_names_a_choice(choice, value, same):
    from nas.agents.collm.agents import _same

    assert _same(choice, value) is same


# ---------------------------------------------------------------- FairNAD's feedback loop

def failure(name, error="bad", retry=None, **detail):
    return types.SimpleNamespace(failure=types.SimpleNamespace(name=name, error=error, retry=retry, detail=detail))


def feedback_revise(monkeypatch, s):
    """`_feedback`'s revise, with the chain and the loop stood in: the revise function it hands the loop."""
    got = {}
    monkeypatch.setattr(fairnad, "source_chain", lambda *a, **k: "chain")
    monkeypatch.setattr(fairnad, "verify_and_retry", lambda chain, first, revise, attempts, retry_no_reply:
                        got.update(revise=revise, retry_no_reply=retry_no_reply) or (None, ""))
    s._feedback(fairnad.Try({"action": "mutate"}, "code"), model(0), "request", [])
    assert got["retry_no_reply"] is False
    return got["revise"]


def test_parse_and_execution_errors_are_debugged_up_to_max_debug(monkeypatch):
    s = fair(max_debug=2)
    asked = []
    monkeypatch.setattr(fairnad, "debug", lambda client, code, parent, request, error, trace, attempt:
                        asked.append((code, error, trace, attempt)) or answer("fixed"))
    revise = feedback_revise(monkeypatch, s)
    first = revise(failure("parse", "syntax", traceback="tb"), "e", "code1")
    assert (first.label, first.text, first.extra) == ({"action": "debug"}, "fixed", {})
    assert revise(failure("execute", "boom"), "e", "code2").text == "fixed"
    assert revise(failure("parse", "syntax"), "e", "code3") is None  # the third: past max_debug
    assert asked == [("code1", "syntax", "tb", 0), ("code2", "boom", None, 1)]


@pytest.mark.parametrize("outcome, code", [(None, "c"), (failure("parse", None), "c"), (failure("parse"), None),
                                           (failure("dedup"), "c"), (failure("budget", retry=None), "c")])
def test_no_retry_without_a_checked_draft_or_for_a_failure_that_none_fixes(monkeypatch, outcome, code):
    s = fair()
    monkeypatch.setattr(fairnad, "debug", lambda *a, **k: pytest.fail("no debug"))
    assert feedback_revise(monkeypatch, s)(outcome, "e", code) is None


@pytest.mark.parametrize("params, flops, once", [(1.0, 1.0, False), (1.5, 1.0, False), (1.51, 1.0, True),
                                                 (1.0, 1.51, True)])
def test_a_model_over_budget_is_downscaled_once_over_1_5_times_else_shrunk(monkeypatch, params, flops, once):
    s = fair(max_downscale=1, width_multiple=8)
    max_params, max_flops = fairnad.budget_limits(s.budget)
    asked = []
    monkeypatch.setattr(fairnad, "downscale", lambda client, code, parent, request, over, how, attempt, multiple:
                        asked.append((over, how, attempt, multiple)) or answer("class Net: width = 20"))
    monkeypatch.setattr(fairnad, "off_multiple", lambda source, multiple: ["line 1: 20"] * 10)
    revise = feedback_revise(monkeypatch, s)
    over = failure("budget", "budget: 2 M params > 1.5 M", retry="downscale", params=params * max_params,
                   flops=flops * max_flops)
    got = revise(over, "e", "code")
    assert (got.label, got.text, got.extra) == ({"action": "downscale"}, "class Net: width = 20",
                                                {"off_multiple": ["line 1: 20"] * 8})
    [(text, how, attempt, multiple)] = asked
    assert (text, attempt, multiple) == ("2 M params > 1.5 M", 0, 8)
    assert (how == fairnad.DOWNSCALE_ONCE) is once and (how in fairnad.DOWNSCALE_SHRINK) is not once
    assert revise(over, "e", "code") is None  # past max_downscale


def test_a_retry_without_a_reply_says_why(monkeypatch):
    s = fair()
    monkeypatch.setattr(fairnad, "debug", lambda *a, **k: answer(errors=["timeout", "refused"]))
    revise = feedback_revise(monkeypatch, s)
    got = revise(failure("parse"), "e", "code")
    assert (got.label, got.text, got.error) == ({"action": "debug"}, None, "refused")
    monkeypatch.setattr(fairnad, "debug", lambda *a, **k: answer())
    assert revise(failure("parse"), "e", "code").error == "no reply"


def test_a_verified_child_becomes_a_model_with_its_measured_size(monkeypatch):
    s = fair()
    s.models = [model(0, accuracy=50.0)]
    pool(s, [("x", "M", "S")])
    monkeypatch.setattr(fairnad, "mutate", lambda client, source, request: answer("class Net: pass\n"))
    from nas.spaces.source.arch import SourceArch

    arch = SourceArch("class Net: pass\n")
    checks = [types.SimpleNamespace(name="budget", detail={"params": 5.0, "flops": 6.0})]
    outcome = types.SimpleNamespace(ok=True, arch=arch, checks=checks, failure=None)
    monkeypatch.setattr(s, "_feedback", lambda first, parent, request, attempts: attempts.append(
        {"action": "debug"}) or (outcome, "class Net: pass\n"))
    cand = s._design(s._fair_job("fair", 0))
    assert cand.rejected is None and cand.info["node"] == 1 and cand.info["valid"] is True
    assert (cand.info["debug_retries"], cand.info["downscale_retries"]) == (1, 0)
    m = s.models[1]
    assert (m.id, m.parent, m.stage, m.idea, m.params, m.flops, m.status) == (1, 0, "fair", "x", 5.0, 6.0, "pending")
    assert arch.key() in s.seen
    dup = types.SimpleNamespace(ok=False, arch=None, checks=[], failure=types.SimpleNamespace(name="dedup",
                                                                                            error="seen at model 1"))
    monkeypatch.setattr(s, "_feedback", lambda first, parent, request, attempts: (dup, "class Net: pass\n"))
    cand = s._design(s._fair_job("fair", 0))
    assert cand.rejected == "dedup: seen at model 1" and cand.info["duplicate"] is True and len(s.models) == 2


@pytest.mark.parametrize("grand, parent, variant, base", [(50.0, 60.0, "improved", 1), (60.0, 50.0, "degraded", 0),
                                                          (60.0, 60.0, "degraded", 0), (None, 60.0, "degraded", 0)])
def test_an_iterative_step_refines_an_improvement_and_rewrites_a_degradation_s_grandparent(
        monkeypatch, grand, parent, variant, base):
    s = fair()
    s.models = [model(0, accuracy=grand), model(1, parent=0, accuracy=parent, idea="add SE")]
    asked = []
    design = types.SimpleNamespace(idea="", source="class Net: pass\n")
    monkeypatch.setattr(fairnad, "iterate", lambda client, gsrc, psrc, idea, gacc, pacc, attrs:
                        asked.append((idea, gacc, pacc)) or answer(design))
    monkeypatch.setattr(s, "_feedback", lambda first, parent, request, attempts: attempts.append(
        {"action": "mutate", "error": "no"}) or (None, first.text))
    cand = s._design(fairnad.Job("iterative", 1, step=1, chain=1))
    assert cand.info["variant"] == variant and cand.info["parent"] == base and cand.info["target"] == "iterative"
    assert cand.info["idea"] == "refine the model after the mutation 'add SE'" and asked == [("add SE", grand, parent)]


@pytest.mark.parametrize("temperature, roles", [
    (0.6, {"navigator": {"temperature": 0.6}, "generator": {"temperature": 0.6, "max_tokens": 9}, "x": {}}),
    (None, {"generator": {"max_tokens": 9}, "x": {}})])
def test_attach_sets_both_roles_temperature_unless_it_is_null(monkeypatch, tmp_path, temperature, roles):
    from nas.spaces.nb201.space import NB201Space

    made = []
    monkeypatch.setattr(collm, "LLMClient", lambda settings, run_dir, calls: made.append(settings) or "client")
    s = collm.CoLLMStrategy(NB201Space(), 0, llm={**LLM, "roles": {"generator": {"max_tokens": 9}, "x": None}}, temperature=temperature)
    s.attach(tmp_path)
    assert made[0]["roles"] == roles and s.client == "client" and made[0]["model"] == "m"


def test_sillm_writes_strategy_and_candidates_in_one_call_remembering_only_its_first_try(monkeypatch):
    s = collm_strategy(single_llm=True, candidates_per_iteration=2, max_retries=2)
    s.client.config = types.SimpleNamespace(role=lambda r: types.SimpleNamespace(max_tokens=100))
    replies = [types.SimpleNamespace(text="strategy + candidates")]
    asked = []

    def single(client, space, messages, template, k, attempt):
        asked.append((k, attempt, template.split("#")[1]))
        return types.SimpleNamespace(ok=True, value=(f"plan {attempt}", [proposal(cell(attempt))]), errors=[],
                                     replies=replies)

    monkeypatch.setattr(collm, "single", single)
    monkeypatch.setattr(collm, "navigate", lambda *a, **k: pytest.fail("SiLLM has no Navigator call"))
    s._iterate()
    assert asked == [(2, 0, "seed=0"), (1, 1, "seed=0")] and s.strategy_text == "plan 1"
    assert len(s.nav_log) == 2 and [info["origin"] for _, info in s.queue] == ["llm", "llm"]
    s._iterate()  # a refinement: tries 0 and 1 propose what it has; try 2 a new one; one exchange remembered
    assert s.strategy_text == "plan 2" and len(s.nav_log) == 4 and s.counts.duplicate == 2


def test_a_refinement_turn_carries_the_remembered_exchanges_and_the_new_results():
    s = collm_strategy(memory_turns=1)
    opening = s._stateful("collm_navigator", "collm_navigator_refine", s._refine_values())
    assert len(opening.messages) == 2 and opening.user == opening.messages[1]
    s.strategy_text = "go"
    s.nav_log = [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
                 {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}]
    s.records = [rec("[1]", 55.5)]
    turn = s._stateful("collm_navigator", "collm_navigator_refine", s._refine_values())
    assert turn.messages[1:3] == s.nav_log[2:] and turn.messages[-1] is turn.user and len(turn.messages) == 4
    assert "- [1] -> accuracy 55.50" in turn.user["content"] and turn.template.endswith("#seed=0")
    s.navigator_memory = False
    assert len(s._stateful("collm_navigator", "collm_navigator_refine", s._refine_values()).messages) == 2


def test_the_generator_is_told_this_iteration_s_rejections_when_it_retries():
    s = collm_strategy()
    s.iteration = 2
    s.rejections = [collm.Rejection(1, "illegal", "old", "x"), collm.Rejection(2, "duplicate", "[1]", "seen")]
    retry = s._generator_turn(3, retry=True).user["content"]
    assert "Your last candidates were rejected" in retry and "- [1]: duplicate, seen" in retry and "old" not in retry
    assert "Your last candidates were rejected" not in s._generator_turn(3, retry=False).user["content"]


def test_ask_stops_when_an_iteration_finds_nothing_left():
    from nas.core.trial import SearchExhausted

    s = collm_strategy()
    s._iterate = lambda: None  # type: ignore[method-assign]
    with pytest.raises(SearchExhausted, match="^collm: no unvisited feasible architecture left$"):
        s.ask(1)


def test_the_idea_pool_is_the_store_s_ideas_sorted_or_with_knowledge_off_the_tree_s_leaves():
    ns = types.SimpleNamespace
    leaves = [ns(granularity="network", main="M", sub="S"), ns(granularity="block", main="N", sub="T")]
    tree = ns(tags=lambda: leaves, describe=lambda t: f"about {t.main}", targets=["a", "b"],
              render=lambda t: f"<{t}>")
    ideas = [ns(text="zeta", tag=ns(granularity="block", main="M", sub="S")), ns(text="alpha", tag=None)]
    kcfg = ns(load_tree=lambda: tree, open_ideas=lambda progress: ns(ideas=lambda: ideas))
    off = fair(use_knowledge=False)
    off._open_knowledge(kcfg, progress=False)
    assert off.attributes == "<a>\n<b>"
    assert off.pool == [fairnad.PoolIdea("about M", "network", "M", "S"), fairnad.PoolIdea("about N", "block", "N", "T")]
    on = fair()
    on._open_knowledge(kcfg, progress=False)
    assert on.pool == [fairnad.PoolIdea("alpha"), fairnad.PoolIdea("zeta", "block", "M", "S")]

"""FairNAD's planning without an LLM: fair sampling, the stage schedule,
Pareto parents with upscale vs hyper-parameter ideas, iterative chains,
config errors and a state round trip."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import pytest

from nas.agents.fairnad.agents import HYPER_IDEAS, UPSCALE_IDEAS, parse_design_reply, parse_model_reply
from nas.agents.fairnad.strategy import Model, PoolIdea
from nas.core.trial import Candidate, EvalResult, Trial
from nas.errors import ConfigError
from nas.llm.parse import ParseError
from nas.spaces import SPACES
from nas.spaces.source.bases import base_source
from nas.strategies import STRATEGIES


def make(**params):
    return STRATEGIES.create("fairnad", {"space": SPACES.create("source", {}), "seed": 0, **params})


def pool() -> list[PoolIdea]:
    # One main category holds 9 of the 10 ideas: uniform over ideas would pick it 90 % of the time.
    ideas = [PoolIdea(f"attention idea {i}", "operation", "feature extraction operators", "attention")
             for i in range(9)]
    return ideas + [PoolIdea("stack stages", "network", "network structural patterns", "multi-stage")]


def evaluated(strategy, accs_params: list[tuple[float, float]]) -> None:
    """The base plus children of it, all evaluated; above 1M params, FLOPs near the budget too."""
    strategy.models = [Model(i, None if i == 0 else 0, base_source("resnet32"), "root" if i == 0 else "init",
                             f"idea {i}", "evaluated", acc, params, 1.9e8 if params > 1e6 else 7e7)
                       for i, (acc, params) in enumerate(accs_params)]


def test_fair_sampling_is_uniform_over_main_categories():
    fair, flat = make(sampling="main"), make(sampling="idea")
    fair.pool = flat.pool = pool()
    mains = Counter(fair._sample_idea().main for _ in range(2000))
    assert 0.45 < mains["network structural patterns"] / 2000 < 0.55
    flat_mains = Counter(flat._sample_idea().main for _ in range(2000))
    assert flat_mains["network structural patterns"] / 2000 < 0.15


def test_stage_schedule_and_parent_selection():
    s = make(init=2, fair_parents=3, pareto_parents=2, iterative_parents=2, iterative_steps=2)
    s.pool = pool()
    evaluated(s, [(50.0, 0.47e6)])
    s._plan()
    assert [(j.stage, j.parent) for j in s.queue] == [("init", 0), ("init", 0)]
    s.queue = []
    # Three evaluated models: one compact and good, one large and better, one large and worse;
    # the compact one is under 0.9 of both budgets, the large ones of neither.
    evaluated(s, [(50.0, 0.47e6), (60.0, 1.45e6), (40.0, 1.46e6)])
    s._plan()
    assert s.generation == 1 and [(j.stage, j.parent) for j in s.queue] == [("fair", 1), ("fair", 0), ("fair", 2)]
    s.queue = []
    s._plan()  # NSGA-II: the two non-dominated models, not the top-2 by accuracy
    assert sorted(j.parent for j in s.queue) == [0, 1]
    for job in s.queue:
        small = job.parent == 0
        assert job.idea in (UPSCALE_IDEAS if small else HYPER_IDEAS)
        assert job.tag == {"refinement": "upscale" if small else "hyper-parameter"}
    s.queue = []
    s._plan()
    assert [(j.stage, j.parent, j.step) for j in s.queue] == [("iterative", 1, 1), ("iterative", 0, 1)]
    s.queue = []
    s._plan()  # the next generation starts with stage I again
    assert s.generation == 2 and s.queue[0].stage == "fair"


def test_switched_off_stages_are_skipped():
    s = make(init=0, stages={"fair": False, "iterative": False}, pareto_parents=1)
    s.pool = pool()
    evaluated(s, [(50.0, 0.47e6)])
    s._plan()
    assert [j.stage for j in s.queue] == ["pareto"]


def test_iterative_chain_goes_on_from_the_new_model_or_the_same_parent():
    s = make(iterative_steps=2)
    evaluated(s, [(50.0, 0.47e6), (60.0, 0.5e6)])
    s.models.append(Model(2, 1, "", "iterative", "deeper", "pending"))
    info = {"stage": "iterative", "step": 1, "chain": 1, "chain_from": 1, "node": 2, "valid": True}
    s.tell([Trial.of(0, Candidate(s.space.base, info), EvalResult(accuracy=61.0, params=5e5, flops=7e7))])
    assert s.models[2].status == "evaluated" and (s.queue[-1].parent, s.queue[-1].step) == (2, 2)
    rejected = {**info, "node": None, "valid": False}
    s.tell([Trial.of(1, Candidate(s.space.base, rejected, rejected="dedup"), EvalResult.failure("dedup"))])
    assert (s.queue[-1].parent, s.queue[-1].step) == (1, 2)
    last = {**info, "step": 2, "node": None}
    s.tell([Trial.of(2, Candidate(s.space.base, last), EvalResult.failure("x"))])
    assert len(s.queue) == 2  # step 2 of 2 ends the chain


@pytest.mark.parametrize("trust", [False, True])
def test_a_self_reported_score_is_a_failed_model_unless_trusted(trust):
    """A model that trained inside the sandbox claims 99.9 % with 1 param and 1 FLOP: told as the
    search loop tells it (`TrialRecord.as_told`), it is ranked and Pareto-dominant only if trusted."""
    s = make(pareto_parents=2)
    evaluated(s, [(50.0, 0.47e6), (60.0, 0.5e6)])
    s.models.append(Model(2, 1, "", "fair", "forged", "pending"))
    forged = Trial.of(2, Candidate(s.space.base, {"stage": "fair", "node": 2, "valid": True}),
                      EvalResult(accuracy=99.9, params=1, flops=1, metrics={"self_reported": 1.0}))
    s.tell([Trial(forged.candidate, forged.record.as_told(trust))])
    assert s.models[2].status == ("evaluated" if trust else "failed")
    assert (s._ranked()[0] == 2) is trust and (2 in s._pareto_parents(2)) is trust


def test_state_round_trip():
    s = make(init=3)
    s.pool = pool()
    evaluated(s, [(50.0, 0.47e6)])
    s._plan()
    state = json.loads(json.dumps(s.state_dict()))
    t = make(init=3)
    t.load_state_dict(state)
    assert t.queue == s.queue and t.models == s.models and t.next_stage == s.next_stage
    assert t.rng.integers(1 << 30) == s.rng.integers(1 << 30)


@pytest.mark.parametrize("params, message", [
    ({"sampling": "tags"}, "strategy.sampling must be one of main, sub, idea"),
    ({"stages": {"fair": False, "pareto": False, "iterative": False}}, "every stage is switched off"),
    ({"stages": {"crossover": True}}, "strategy.stages: unknown stage 'crossover' (valid: "),
    ({"max_debug": -1}, "max_debug=-1"),
    ({"underused": 1.5}, "strategy.underused must be in (0, 1]"),
])
def test_bad_settings_fail_in_one_line(params, message):
    with pytest.raises(ConfigError) as err:
        make(**params)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_fairnad_needs_the_source_space():
    with pytest.raises(ConfigError, match="use space=source"):
        STRATEGIES.create("fairnad", {"space": SPACES.create("nader", {}), "seed": 0})


def test_model_reply_parsing():
    good = "Plan: widen.\n```python\nimport torch\nclass Network(torch.nn.Module):\n    pass\n```"
    assert parse_model_reply(good).startswith("import torch")
    with pytest.raises(ParseError, match="no top-level class Network"):
        parse_model_reply("```python\nclass Net:\n    pass\n```")
    with pytest.raises(ParseError, match="does not parse: line 1"):
        parse_model_reply("```python\nclass Network(:\n```")
    design = parse_design_reply("<idea>Use  a 5x5 kernel.</idea>\n" + good)
    assert design.idea == "Use a 5x5 kernel." and "class Network" in design.source


def test_downscale_asks_for_channel_multiples_and_records_those_not_kept(tmp_path, monkeypatch):
    from nas.agents.fairnad.agents import DOWNSCALE_SHRINK, downscale, off_multiple
    from nas.llm import LLMClient
    from support.scripted import ScriptedServer

    smaller = ("```python\nfrom torch import nn\nclass Network(nn.Module):\n    def __init__(self):\n"
               "        super().__init__()\n        self.a = nn.Conv2d(3, 20, 3)\n"
               "        self.b = nn.BatchNorm2d(num_features=20)\n"
               "        self.c = nn.Conv2d(in_channels=20, out_channels=32, kernel_size=3)\n```")
    monkeypatch.setenv("NASFLOW_TEST_KEY", "k")
    with ScriptedServer([smaller]) as srv:
        client = LLMClient({"backend": "openai", "base_url": srv.base_url, "model": "m", "api_key_env":
                            "NASFLOW_TEST_KEY", "cache_dir": str(tmp_path / "cache"), "structured": "none"})
        answer = downscale(client, base_source("resnet32"), base_source("resnet32"), "add attention",
                           "params 2.1e6 > 1.5e6", DOWNSCALE_SHRINK[2], multiple=16)
    assert "Keep every channel count a multiple of 16" in srv.requests[0]["messages"][-1]["content"]
    assert off_multiple(answer.value, 8) == ["line 5: Conv2d out_channels=20", "line 6: BatchNorm2d num_features=20",
                                             "line 7: Conv2d in_channels=20"]
    assert off_multiple(base_source("resnet32"), 8) == []  # the base model's widths are multiples of 8
    with pytest.raises(ConfigError, match="strategy.width_multiple must be an integer >= 1, got 0"):
        make(width_multiple=0)


def test_check_cache_must_be_a_boolean():
    with pytest.raises(ConfigError, match="parameter 'check_cache' must be bool, got 'yes'"):
        make(check_cache="yes")
    assert make(check_cache=False).check_cache is False


def test_an_iterative_step_from_a_model_without_a_mutation_draws_a_fair_idea_and_keeps_a_given_one(monkeypatch):
    """A chain from the base (no grand-parent: no mutation to learn from) mutates the base with a
    fairly drawn idea when its job has none, and with the job's own idea when it has one."""
    from nas.agents.fairnad.strategy import Job

    class Asked(Exception):
        pass

    def request(job):
        raise Asked(job.idea)

    s = make()
    s.pool = pool()
    evaluated(s, [(50.0, 0.47e6)])
    s.client = SimpleNamespace(usage=SimpleNamespace(total=lambda: 0))  # no LLM is asked: `_request` stops first
    monkeypatch.setattr(s, "_request", request)
    for idea, asked in [("", {i.text for i in s.pool}), ("use a deeper stem", {"use a deeper stem"})]:
        with pytest.raises(Asked) as got:
            s._design(Job("iterative", 0, idea, None, 1, 0))
        assert got.value.args[0] in asked

"""CoLLM-NAS against the scripted loopback server: who remembers what, what the
Coordinator filters and why, stopping, SiLLM, resume, garbage; the grammars
checked by llama.cpp's own engine; the tolerant parser."""

from __future__ import annotations

import hashlib
import itertools
import json
import re

import numpy as np
import pytest

from nas.agents.collm.agents import (
    candidates_grammar,
    decision_table,
    parse_candidates,
    single_grammar,
    strategy_grammar,
    values_text,
)
from nas.agents.collm.strategy import CoLLMStrategy
from nas.core.constraint import Constraint
from nas.core.space import CategoricalSpace, Decision
from nas.core.trial import SearchExhausted, Trial
from nas.errors import ConfigError, RunDirError
from nas.evaluators.table import TableEvaluator
from nas.llm.parse import ParseError
from nas.spaces.nb201.arch import OPS, NB201Cell
from nas.spaces.nb201.space import NB201Space
from nas.strategies import STRATEGIES
from support.scripted import ScriptedServer, Step

SPACE = NB201Space()
ALL_CELLS = [NB201Cell(ops) for ops in itertools.product(OPS, repeat=6)]
STRATEGY = "# SUMMARY\nConvolutions help.\n# KEY PATTERNS\n- 3x3 convs score best\n# DIRECTIONS\n" + \
    "".join(f"{d.name}: prefer nor_conv_3x3\n" for d in SPACE.decisions())


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-collm")


@pytest.fixture(scope="module")
def table() -> TableEvaluator:
    return TableEvaluator(SPACE)


def llm(server: ScriptedServer, tmp_path, **overrides) -> dict:
    return {"backend": "openai", "base_url": server.base_url, "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
            "timeout_s": 5, "max_retries": 0, "cache_dir": str(tmp_path / "cache"), "structured": "grammar",
            **overrides}


def make(server, tmp_path, seed: int = 0, **params) -> CoLLMStrategy:
    strategy = CoLLMStrategy(SPACE, seed, llm=llm(server, tmp_path), **params)
    strategy.attach(tmp_path / "run")
    return strategy


def kind(request: dict) -> str:
    system = request["messages"][0]["content"]
    return "navigator" if "You are the Navigator" in system else "generator" if "You are the Generator" in system \
        else "single"


def k_asked(request: dict) -> int:
    return int(re.findall(r"(\d+)\s+(?:new\s+)?candidates", request["messages"][-1]["content"])[-1])


def cells_reply(cells: list[NB201Cell]) -> str:
    return "[\n" + ",\n".join(values_text(SPACE, c) for c in cells) + "\n]"


def scripted(request: dict) -> str:
    """A pure function of the request: navigator → STRATEGY; generator/single → cells picked by a hash."""
    if kind(request) == "navigator":
        return STRATEGY
    digest = int(hashlib.sha256(json.dumps(request["messages"]).encode()).hexdigest(), 16)
    cells = [ALL_CELLS[(digest + 977 * i) % len(ALL_CELLS)] for i in range(k_asked(request))]
    return (STRATEGY + "# CANDIDATES\n" if kind(request) == "single" else "") + cells_reply(cells)


def iterate(strategy, table, n: int, start: int = 0, told: list | None = None) -> list:
    """One ask/tell of `n`; the told trials are appended to `told` (the history)."""
    cands = strategy.ask(n)
    trials = [Trial.of(start + i, c, table.evaluate(c.arch)) for i, c in enumerate(cands)]
    strategy.tell(trials)
    if told is not None:
        told += trials
    return cands


# -- memory ---------------------------------------------------------------------------------------------

def test_navigator_keeps_its_conversation_and_the_generator_none(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        strategy = make(srv, tmp_path)
        first = iterate(strategy, table, 5)
        iterate(strategy, table, 5, start=5)
    nav = [r for r in srv.requests if kind(r) == "navigator"]
    gen = [r for r in srv.requests if kind(r) == "generator"]
    assert len(nav) == 2 and len(gen) == 2
    assert [m["role"] for m in nav[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert nav[1]["messages"][2]["content"] == STRATEGY                      # its own first reply
    assert "Nothing has been evaluated yet" in nav[1]["messages"][1]["content"]
    results = nav[1]["messages"][3]["content"]
    for c in first:                                                          # the newest results, with costs
        assert values_text(SPACE, c.arch) in results
    assert "MFLOPs" in results and "accuracy" in results
    assert all([m["role"] for m in r["messages"]] == ["system", "user"] for r in gen)
    assert STRATEGY.strip() in gen[0]["messages"][1]["content"]
    assert all("grammar" in r for r in srv.requests)                         # constrained decoding asked for
    assert all(r["temperature"] == 0.6 for r in srv.requests)


def test_generator_memory_and_no_navigator_memory(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        strategy = make(srv, tmp_path, generator_memory=True, navigator_memory=False)
        for i in range(3):
            iterate(strategy, table, 5, start=5 * i)
    nav = [r for r in srv.requests if kind(r) == "navigator"]
    gen = [r for r in srv.requests if kind(r) == "generator"]
    assert [len(r["messages"]) for r in nav] == [2, 2, 2]
    assert [len(r["messages"]) for r in gen] == [2, 4, 6]                  # memory_turns=2 exchanges
    assert gen[1]["messages"][2]["role"] == "assistant"
    assert gen[1]["messages"][2]["content"].startswith("[\n[")


def test_navigator_memory_is_trimmed_to_fit_the_context_oldest_first(tmp_path, table):
    """Memory kept whole (memory_turns: null) would overflow a 4,096-token context within a few
    iterations; the oldest exchanges are left out so that prompt + max_tokens always fits."""
    from nas.llm.tokens import estimate_tokens

    context, reply = 4096, 384
    with ScriptedServer(scripted) as srv:
        strategy = CoLLMStrategy(SPACE, 0, llm=llm(srv, tmp_path, context=context,
                                                  roles={"navigator": {"max_tokens": reply}}), memory_turns=None)
        strategy.attach(tmp_path / "run")
        for i in range(7):
            iterate(strategy, table, 5, start=5 * i)
    nav = [r for r in srv.requests if kind(r) == "navigator"]
    assert len(nav) == 7
    for i, request in enumerate(nav):
        assert estimate_tokens(request["messages"], 2.0) + reply + 64 <= context
        history = request["messages"][1:-1]
        assert history == strategy.nav_log[2 * i - len(history): 2 * i]     # what is kept is the newest
    kept = [len(r["messages"]) - 2 for r in nav]
    assert kept[1] == 2 and max(kept) < 2 * (len(nav) - 1) and strategy.counts.trimmed_turns > 0
    assert strategy.report([])["collm"]["trimmed_turns"] == strategy.counts.trimmed_turns


def test_memory_window_bounds_the_context(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        strategy = make(srv, tmp_path, memory_turns=1)
        for i in range(4):
            iterate(strategy, table, 5, start=5 * i)
    nav = [r for r in srv.requests if kind(r) == "navigator"]
    assert [len(r["messages"]) for r in nav] == [2, 4, 4, 4]
    assert len(strategy.nav_log) == 8                                       # all of it kept for resume


# -- the Coordinator ------------------------------------------------------------------------------------

def test_illegal_duplicate_infeasible_are_filtered_with_reasons(tmp_path, table):
    small, big = NB201Cell(("none",) * 6), NB201Cell(("nor_conv_3x3",) * 6)
    limit = (SPACE.cost(small).flops + SPACE.cost(big).flops) / 2
    good = [NB201Cell(("skip_connect",) * 5 + (op,)) for op in OPS]
    bad = '[\n["conv_5x5", "none", "none", "none", "none", "none"],\n' + \
        values_text(SPACE, good[0]) + ",\n" + values_text(SPACE, good[0]) + ",\n" + values_text(SPACE, big) + \
        ",\n" + values_text(SPACE, good[1]) + "\n]"
    more = [NB201Cell(("nor_conv_1x1",) * 5 + (op,)) for op in OPS[:4]]
    script = [STRATEGY, bad, cells_reply(good[2:5]), STRATEGY, cells_reply(good[:1] + more)]
    with ScriptedServer(script) as srv:
        strategy = make(srv, tmp_path)
        strategy.constrain(Constraint(flops=limit))
        cands = iterate(strategy, table, 5)
        assert [c.arch for c in cands] == [good[0], good[1], good[2], good[3], good[4]]
        assert all(c.info == {"origin": "llm", "iteration": 1} for c in cands)
        kinds = {r.kind: r.reason for r in strategy.rejections}
        assert "conv_5x5" in kinds["illegal"] and "is not one of" in kinds["illegal"]
        assert kinds["duplicate"] == "already evaluated or proposed"
        assert "exceeds the limit" in kinds["infeasible"]
        retry = srv.requests[2]["messages"][-1]["content"]
        assert "rejected" in retry and "conv_5x5" in retry and "Write 3 new candidates" in retry
        second = iterate(strategy, table, 5, start=5)       # a duplicate; the script runs out: one random fill
        assert [c.arch for c in second[:4]] == more and second[4].info["origin"] == "random_fill"
    nav2 = srv.requests[3]["messages"][-1]["content"]
    assert "infeasible" in nav2 and "exceeds the limit" in nav2 and "illegal" in nav2
    c = strategy.counts
    assert (c.illegal, c.duplicate, c.infeasible) == (1, 2, 1)
    assert c.duplicate + c.illegal + c.infeasible + c.accepted == c.proposals
    report = strategy.report([])["collm"]
    assert report["infeasible"] == 1 and report["rejections"]["illegal"][0]["kind"] == "illegal"
    assert all(strategy.constraint.violation(SPACE, a) is None for a in [c.arch for c in cands])


def test_garbage_replies_fill_randomly_without_crashing(tmp_path, table):
    script = [Step(fault="500")] + ["I am not sure what you mean."] * 3 + [STRATEGY] + ["no idea"] * 3
    with ScriptedServer(script) as srv:
        strategy = make(srv, tmp_path, max_retries=2)
        cands = iterate(strategy, table, 5)
        assert [c.info["origin"] for c in cands] == ["random_fill"] * 5
        assert strategy.counts.navigator_failures == 1 and strategy.counts.generator_failures == 3
        assert strategy.strategy_text is None
        assert "no candidate" in strategy.errors[-1]["error"]
        again = iterate(strategy, table, 5, start=5)
    assert len({c.arch.key() for c in cands + again}) == 10
    assert strategy.counts.random_fill == 10
    assert len(srv.requests) == 8


def test_target_accuracy_stops_the_search(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        strategy = make(srv, tmp_path, target_accuracy=10.0)
        iterate(strategy, table, 2)
        with pytest.raises(SearchExhausted, match="reached target accuracy 10"):
            strategy.ask(1)


def test_max_iterations_stops_the_search(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        strategy = make(srv, tmp_path, max_iterations=2, candidates_per_iteration=3)
        assert len(iterate(strategy, table, 4)) == 4
        assert len(strategy.ask(5)) == 2                                    # the rest of iteration 2, no more
        with pytest.raises(SearchExhausted, match="max_iterations"):
            strategy.ask(1)


# -- SiLLM ----------------------------------------------------------------------------------------------

def test_single_llm_makes_one_call_per_iteration(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        strategy = make(srv, tmp_path, single_llm=True)
        for i in range(3):
            cands = iterate(strategy, table, 5, start=5 * i)
            assert all(c.info["origin"] == "llm" for c in cands)
    assert [kind(r) for r in srv.requests] == ["single"] * 3
    assert strategy.strategy_text == STRATEGY.strip()
    assert [m["role"] for m in srv.requests[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert "Results of your last candidates" in srv.requests[1]["messages"][-1]["content"]


# -- resume ---------------------------------------------------------------------------------------------

def test_state_dict_round_trip_resumes_identically(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        a = make(srv, tmp_path / "a", seed=3)
        told: list = []
        iterate(a, table, 5, told=told)
        iterate(a, table, 3, start=5, told=told)                              # mid-iteration: 2 left in the queue
        state = json.loads(json.dumps(a.state_dict()))
        b = make(srv, tmp_path / "b", seed=999)
        b.load_state_dict(state)
        b.restore([t.record for t in told])
        assert json.loads(json.dumps(b.state_dict())) == state
        n = len(srv.requests)
        next_a = [c.arch.key() for i in range(4) for c in iterate(a, table, 3, start=8 + 3 * i)]
        requests_a = srv.requests[n:]
        n = len(srv.requests)
        next_b = [c.arch.key() for i in range(4) for c in iterate(b, table, 3, start=8 + 3 * i)]
        requests_b = srv.requests[n:]
    assert next_a == next_b and len(set(next_a)) == 12
    assert [r["messages"] for r in requests_a] == [r["messages"] for r in requests_b]


@pytest.mark.parametrize("state", [{}, {"rng": None}, "x"])
def test_garbage_state_raises_rundir_error(tmp_path, state):
    with ScriptedServer([]) as srv:
        with pytest.raises(RunDirError, match="strategy 'collm' state"):
            make(srv, tmp_path).load_state_dict(state)


def test_truncated_state_raises_rundir_error(tmp_path, table):
    with ScriptedServer(scripted) as srv:
        strategy = make(srv, tmp_path)
        iterate(strategy, table, 5)
        state = strategy.state_dict()
    del state["counts"]["illegal"]
    with pytest.raises(RunDirError, match="strategy 'collm' state"):
        CoLLMStrategy(SPACE, 0).load_state_dict(state)


# -- configuration --------------------------------------------------------------------------------------

def test_registered_and_checked(tmp_path):
    from nas.spaces import SPACES

    assert STRATEGIES.get("collm") is CoLLMStrategy
    with pytest.raises(ConfigError, match="needs a categorical space"):
        CoLLMStrategy(SPACES.create("nader", {}), 0)
    with pytest.raises(ConfigError, match="candidates_per_iteration"):
        CoLLMStrategy(SPACE, 0, candidates_per_iteration=0)
    with pytest.raises(RuntimeError, match="attach"):
        CoLLMStrategy(SPACE, 0).ask(1)


def test_search_loop_end_to_end_reports_usage_and_counts(tmp_path):
    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.spec import Component, SearchSpec

    with ScriptedServer(scripted) as srv:
        spec = SearchSpec(space=Component("nb201"), strategy=Component("collm", {"llm": llm(srv, tmp_path)}),
                          evaluator=Component("table"), seed=0, trials=12)
        space = spec.build_space()
        summary = SearchLoop(spec, tmp_path / "run", LocalExecutor(spec.build_evaluator(space), None),
                             progress=False).run_search()
    assert summary["trials"] == 12 and summary["collm"]["iterations"] == 3
    assert summary["collm"]["proposals"] >= 15 and summary["llm"]
    assert (tmp_path / "run" / "llm" / "transcripts.jsonl").is_file()


# -- grammars and parsing -------------------------------------------------------------------------------

class Numeric(CategoricalSpace):
    """A small numeric space (OFA-like values) for the parser."""

    name = "numeric"

    def decisions(self):
        return [Decision("r", (160, 192, 224)), Decision("k1", (3, 5, 7)), Decision("k2", (3, 5, 7)),
                Decision("ratio", (3.0, 3.5, 4.0))]

    def from_values(self, values):
        return NB201Cell(tuple(OPS[self.decisions()[i].choices.index(v)] for i, v in enumerate(values))
                         + ("none", "none"))

    def to_values(self, arch):
        return [d.choices[OPS.index(op)] for d, op in zip(self.decisions(), arch.ops)]

    def decode(self, encoding):
        if not isinstance(encoding, dict) or set(encoding) != {"r", "k", "ratio"}:
            raise ConfigError("not an encoding")
        return self.from_values([encoding["r"], *encoding["k"], encoding["ratio"]])


def test_parse_candidates_is_tolerant():
    space = Numeric()
    text = ('Sure! ```json\n{"candidates": [[160, 3, "7", 4], [224, 5, 5, 3.5], {"r": 192, "k": [3, 3], '
            '"ratio": 3.0}, [161, 3, 3, 3.0]]}\n```')
    props = parse_candidates(text, space)
    assert [space.to_values(p.arch) if p.arch else p.error for p in props] == [
        [160, 3, 7, 4.0], [224, 5, 5, 3.5], [192, 3, 3, 3.0], "r: 161 is not one of 160, 192, 224"]
    lines = parse_candidates("1. [160, 3, 3, 3.0]\n2. [192, 5, 5, 4.0]", space)
    assert [p.arch is not None for p in lines] == [True, True]
    with pytest.raises(ParseError, match="no candidate"):
        parse_candidates("no idea", space)
    assert "positions 2-3 (k1, k2): each one of 3, 5, 7" in decision_table(space)


@pytest.fixture(scope="module")
def gbnf():
    from test_nader_agents import Gbnf

    g = Gbnf()
    yield g
    g.close()


def test_grammars_admit_exactly_k_legal_candidates(gbnf):
    rng = np.random.default_rng(0)
    cells = [SPACE.sample(rng) for _ in range(3)]
    g = candidates_grammar(SPACE, 3)
    assert gbnf.valid(g) and gbnf.accepts(g, cells_reply(cells))
    assert not gbnf.accepts(g, cells_reply(cells[:2]))
    assert not gbnf.accepts(g, cells_reply(cells).replace('"none"', '"conv_5x5"', 1) if '"none"' in
                            cells_reply(cells) else cells_reply(cells).replace('"', "'", 1))
    assert not gbnf.accepts(g, cells_reply(cells).replace(", ", ", \"none\", ", 1))   # 7 values
    assert gbnf.accepts(candidates_grammar(SPACE, 1), cells_reply(cells[:1]))
    s = strategy_grammar(SPACE)
    assert gbnf.valid(s) and gbnf.accepts(s, STRATEGY)
    assert not gbnf.accepts(s, STRATEGY.replace("# KEY PATTERNS", "# PATTERNS"))
    assert gbnf.accepts(single_grammar(SPACE, 3), STRATEGY + "# CANDIDATES\n" + cells_reply(cells))
    numeric = candidates_grammar(Numeric(), 2)
    assert gbnf.accepts(numeric, "[\n[160, 3, 7, 4.0],\n[224, 5, 5, 3.5]\n]")
    assert not gbnf.accepts(numeric, "[\n[160, 3, 7, 4],\n[224, 5, 5, 3.5]\n]")
    many = Numeric()
    many.decisions = lambda: [Decision(f"k{i}", (3, 5, 7)) for i in range(20)]
    assert gbnf.valid(strategy_grammar(many))


def test_surplus_candidates_are_neither_used_nor_counted(tmp_path, table):
    cells = ALL_CELLS[100:108]
    with ScriptedServer([STRATEGY, cells_reply(cells)]) as srv:
        strategy = make(srv, tmp_path)
        assert [c.arch for c in strategy.ask(5)] == cells[:5]
    assert strategy.counts.proposals == strategy.counts.accepted == 5


@pytest.mark.slow
def test_local_model_writes_legal_candidates(tmp_path, monkeypatch, table):
    """SmolLM2-135M under the grammars: one iteration of Navigator and Generator (about a minute on 2 cores)."""
    pytest.importorskip("llama_cpp")
    import yaml

    from nas.agents.collm.strategy import CoLLMStrategy as C

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    cfg = yaml.safe_load(open("conf/llm/local.yaml"))
    cfg = {**cfg, "cache": False, "timeout_s": 600, "local": {**cfg["local"], "n_threads": 1}}  # 1 thread: shared cores
    strategy = C(SPACE, 0, llm=cfg, max_retries=0, navigator_memory=False)
    strategy.attach(tmp_path / "run")
    cands = iterate(strategy, table, 5)
    assert strategy.strategy_text is not None and strategy.strategy_text.startswith("# SUMMARY")
    assert strategy.counts.illegal == 0 and strategy.counts.generator_failures == 0
    llm = [c for c in cands if c.info["origin"] == "llm"]
    assert len(llm) == 5 - strategy.counts.random_fill and strategy.counts.proposals == 5


def categorical_spaces() -> list[str]:
    from nas.spaces import SPACES

    return [n for n in SPACES.names() if issubclass(SPACES.get(n), CategoricalSpace)]


@pytest.mark.parametrize("name", categorical_spaces())
def test_every_categorical_space_round_trips_through_the_reply_format(name):
    from nas.spaces import SPACES

    space = SPACES.create(name, {})
    rng = np.random.default_rng(0)
    archs = [space.sample(rng) for _ in range(4)]
    as_values = "[\n" + ",\n".join(values_text(space, a) for a in archs) + "\n]"
    as_native = json.dumps([a.encode() for a in archs])
    for text in (as_values, as_native):
        assert [p.arch.key() for p in parse_candidates(text, space)] == [a.key() for a in archs]
    assert candidates_grammar(space, 3).count("::=") >= 3 and strategy_grammar(space).startswith("root ::=")

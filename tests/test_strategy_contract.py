"""The contract every registered strategy keeps, checked on each one's natural small space (the
LLM strategies through the scripted OpenAI-compatible server, replies a pure function of the
request): what the search loop relies on for asking, telling, resuming and reporting, so a new
strategy is tested by adding one row to SETUPS."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from nas.agents.collm.agents import values_text
from nas.core.constraint import Constraint
from nas.core.space import SearchSpace
from nas.core.trial import Candidate, EvalResult, SearchExhausted, Trial, TrialRecord
from nas.evaluators.table import TableEvaluator
from nas.spaces import SPACES
from nas.spaces.nb201.arch import OPS, NB201Cell
from nas.strategies import STRATEGIES, Strategy
from support.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
NB201 = SPACES.create("nb201", {})
TABLE = TableEvaluator(NB201)

# NADER: the Modifier's block, one of three kernel sizes picked by a hash of the request.
BLOCK = (ROOT / "nas/spaces/nader/dag/bases/resnet_basic.txt").read_text().split("##Residual_stem##")[0]
BLOCKS = [BLOCK.replace("5:Conv2d(out_channels=C,kernel_size=3,stride=1)",
                        f"5:Conv2d(out_channels=C,kernel_size={k},stride=1)") for k in (1, 5, 7)]
# FairNAD: the parent with a 5x5 kernel (one sandbox run per design).
MODELS = ROOT / "tests/data/models"
KERNEL5_MODEL = (MODELS / "cnn_kernel5.py").read_text()

# CoLLM: the Navigator's strategy text, then cells picked by a hash of the request.
ALL_CELLS = [NB201Cell(ops) for ops in itertools.product(OPS, repeat=6)]
NAVIGATION = "# SUMMARY\nConvolutions help.\n# KEY PATTERNS\n- 3x3 convs score best\n# DIRECTIONS\n" + \
    "".join(f"{d.name}: prefer nor_conv_3x3\n" for d in NB201.decisions())


def digest(request: dict[str, Any]) -> int:
    return int(hashlib.sha256(json.dumps(request["messages"]).encode()).hexdigest(), 16)


def collm_reply(request: dict[str, Any]) -> str:
    system = request["messages"][0]["content"]
    if "You are the Navigator" in system:
        return NAVIGATION
    k = int(re.findall(r"(\d+)\s+(?:new\s+)?candidates", request["messages"][-1]["content"])[-1])
    cells = [ALL_CELLS[(digest(request) + 977 * i) % len(ALL_CELLS)] for i in range(k)]
    head = "" if "You are the Generator" in system else NAVIGATION + "# CANDIDATES\n"
    return head + "[\n" + ",\n".join(values_text(NB201, c) for c in cells) + "\n]"


def nader_reply(request: dict[str, Any]) -> str:
    return f"```block\n{BLOCKS[digest(request) % len(BLOCKS)]}```"


def fairnad_reply(request: dict[str, Any]) -> str:
    return f"```python\n{KERNEL5_MODEL}```"


@dataclass(frozen=True)
class Setup:
    """A strategy on its natural small space: params, batch size, and the scripted LLM (None: no LLM)."""

    space: str
    space_params: dict[str, Any]
    params: dict[str, Any]
    n: int
    reply: Callable[[dict[str, Any]], str] | None = None


CLASSIC = Setup("nb201", {}, {}, 3)
SETUPS = {
    "bananas": Setup("nb201", {}, {"n_init": 3, "pool": 20, "epochs": 50}, 3),  # the predictor from its 2nd ask
    "optuna": Setup("nb201", {}, {"sampler_params": {"n_startup_trials": 3}}, 3),  # TPE's model from its 2nd ask
    "collm": Setup("nb201", {}, {}, 3, collm_reply),
    "nader": Setup("nader", {}, {"use_knowledge": False, "lde": False, "cells_per_stage": 1}, 1, nader_reply),
    "fairnad": Setup("source", {"base": str(MODELS / "cnn_parent.py")},
                     {"use_knowledge": False, "init": 2, "sandbox": {"wall_s": 60}}, 1, fairnad_reply),
}
# Per parameter (MARKERS in conftest.py names whole tests): the LLM ones are `llm`, FairNAD's runs the sandbox.
MARKS = {"collm": (pytest.mark.llm,), "nader": (pytest.mark.llm,), "fairnad": (pytest.mark.llm, pytest.mark.sandbox)}
NAMES = [pytest.param(n, marks=MARKS.get(n, ())) for n in STRATEGIES.names()]


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-contract")


class Harness:
    """Makes strategies of one setup, all talking to one scripted server, and scores their candidates."""

    def __init__(self, name: str, setup: Setup, base_url: str | None, tmp_path: Path) -> None:
        self.name, self.setup, self.tmp_path = name, setup, tmp_path
        self.space: SearchSpace = NB201 if setup.space == "nb201" else SPACES.create(setup.space, setup.space_params)
        self.llm = None if base_url is None else {
            "backend": "openai", "base_url": base_url, "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
            "max_retries": 0, "structured": "grammar" if name == "collm" else "none", "cache": False}
        self.made = 0

    def make(self, seed: int, attach: bool = True) -> Strategy:
        params = dict(self.setup.params) | ({} if self.llm is None else {"llm": self.llm})
        strategy = STRATEGIES.create(self.name, params, space=self.space, seed=seed)
        if attach:
            self.attach(strategy)
        return strategy

    def attach(self, strategy: Strategy) -> None:
        self.made += 1
        strategy.attach(self.tmp_path / f"run{self.made}")

    def ask(self, strategy: Strategy) -> list[Candidate]:
        """`ask(n)`: n candidates of the space (a rejected draft has a key but no encoding to decode)."""
        n = self.setup.n
        try:
            cands = strategy.ask(n)
        except SearchExhausted:
            pytest.fail(f"{self.name} exhausted {self.space.name} at once")
        assert len(cands) == n and all(isinstance(c, Candidate) for c in cands)
        for c in cands:
            json.dumps(c.info)  # recorded in history.jsonl
            if c.rejected is None:
                assert self.space.decode(json.loads(json.dumps(c.arch.encode()))) == c.arch
        return cands

    def result(self, cand: Candidate) -> EvalResult:
        if cand.rejected is not None:  # what the loop records for a draft that failed verification
            return EvalResult.failure(cand.rejected)
        if self.space is NB201:
            return TABLE.evaluate(cand.arch)
        return EvalResult(accuracy=50.0 + int(cand.arch.key()[:4], 16) % 400 / 10, params=1e5, flops=1e7)

    def step(self, strategy: Strategy, history: list[Trial]) -> list[Candidate]:
        cands = self.ask(strategy)
        trials = [Trial.of(len(history) + i, c, self.result(c)) for i, c in enumerate(cands)]
        strategy.tell(trials)
        history += trials
        return cands


@contextmanager
def harness(name: str, tmp_path: Path) -> Iterator[Harness]:
    setup = SETUPS.get(name, CLASSIC)
    if setup.reply is None:
        yield Harness(name, setup, None, tmp_path)
        return
    with ScriptedServer(setup.reply) as srv:
        yield Harness(name, setup, srv.base_url, tmp_path)


def keys(cands: list[Candidate]) -> list[str]:
    return [c.arch.key() for c in cands]


def test_every_setup_names_a_registered_strategy():
    assert set(SETUPS) <= set(STRATEGIES.names())


@pytest.mark.parametrize("name", NAMES)
def test_ask_tell_resume_and_report(name, tmp_path):
    """Asks give n decodable candidates and `tell` takes their trials; the state is JSON, and a
    strategy of another seed given it and the history asks what the original asks next; the
    report is JSON; the same seed asks the same first candidates."""
    with harness(name, tmp_path) as h:
        a = h.make(seed=3)
        history: list[Trial] = []
        first = h.step(a, history)
        rounds = 1 if name == "fairnad" else 2  # FairNAD's designs each run in the sandbox
        for _ in range(rounds - 1):
            h.step(a, history)
        state = json.loads(json.dumps(a.state_dict()))
        b = h.make(seed=999, attach=False)  # the loop's order on resume: state, history, then attach
        b.load_state_dict(state)
        b.restore([t.record for t in history])
        h.attach(b)
        assert keys(h.ask(a)) == keys(h.ask(b))
        assert keys(h.ask(h.make(seed=3))) == keys(first)
        records = [t.record for t in history]
        report = a.report(records)
        assert isinstance(report, dict) and json.loads(json.dumps(report)) == report


# --- every path that proposes, fills, repairs or retries keeps the main path's rules -----------------------

# 14 % of NB201 (the cells with at most one 1x1 convolution and no 3x3): most draws, mutations and LLM
# proposals break it, so each strategy's fill-ins and restarts are taken, and must check it too.
TIGHT = Constraint(flops=12_096_128)


@dataclass(frozen=True)
class Fallback:
    """A strategy set up so that one of its fallback paths runs: `taken(index, info)` says which asked
    candidates came from it (None: the variant only checks the rules, e.g. `unique: false`)."""

    strategy: str
    params: dict[str, Any]
    taken: Callable[[int, dict[str, Any]], bool] | None
    unique: bool = True
    reply: Callable[[dict[str, Any]], str] | None = None  # the scripted LLM, if not the strategy's SETUPS one


def feasible_cells(constraint: Constraint) -> list[NB201Cell]:
    return [c for c in ALL_CELLS if constraint.violation(NB201, c) is None]


def collm_repeating(request: dict[str, Any]) -> str:
    """CoLLM's Generator proposing the same cells every time, most over TIGHT: the Coordinator
    rejects them (infeasible, then also duplicates) and the random fill makes up the rest."""
    if "You are the Navigator" in request["messages"][0]["content"]:
        return NAVIGATION
    k = int(re.findall(r"(\d+)\s+(?:new\s+)?candidates", request["messages"][-1]["content"])[-1])
    fits = feasible_cells(TIGHT)[:2]
    cells = [*fits, *(c for c in ALL_CELLS[::997] if TIGHT.violation(NB201, c))][:max(k, 3)]
    head = "" if "You are the Generator" in request["messages"][0]["content"] else NAVIGATION + "# CANDIDATES\n"
    return head + "[\n" + ",\n".join(values_text(NB201, c) for c in cells) + "\n]"


PATHS = {
    "random": Fallback("random", {}, None),
    "random-repeats": Fallback("random", {"unique": False}, None, unique=False),
    "rea-restart": Fallback("rea", {"population_size": 3, "sample_size": 2, "max_attempts": 4},
                         lambda i, info: info["origin"] == "random"),  # a used-up neighbourhood restarts at random
    "rea-repeats": Fallback("rea", {"population_size": 3, "sample_size": 2, "unique": False}, None, unique=False),
    "evolution-random-child": Fallback("evolution", {"population_size": 4, "max_attempts": 4},
                                    lambda i, info: info["origin"] == "random" and info["generation"] > 0),
    "evolution-repeats": Fallback("evolution", {"population_size": 4, "unique": False}, None, unique=False),
    "reinforce-uniform": Fallback("reinforce", {"max_attempts": 4}, lambda i, info: info["origin"] == "random"),
    "reinforce-repeats": Fallback("reinforce", {"max_attempts": 4, "unique": False}, None, unique=False),
    "bananas-fill": Fallback("bananas", {"n_init": 3, "pool": 2, "members": 2, "epochs": 5},  # 2 neighbours for 3
                          lambda i, info: i >= 3 and info["origin"] == "random"),
    "optuna-fill": Fallback("optuna", {"max_repeats": 1, "sampler_params": {"n_startup_trials": 3}},
                         lambda i, info: info["origin"] == "random"),
    "collm-random-fill": Fallback("collm", {}, lambda i, info: info["origin"] == "random_fill", reply=collm_repeating),
}
# Strategies whose spaces have no cost model before evaluation, so no search constraint can be set on
# them (`Constraint.validate`): their drafts are verified against the evaluator's budget instead.
UNCONSTRAINABLE = {"nader": "NADER's block files are sized to the evaluator's budget (tests/test_design_*)",
                   "fairnad": "FairNAD's model source is measured in the sandbox (tests/test_design_*)"}
PATH_MARKS = {"collm-random-fill": (pytest.mark.llm,)}
ROUNDS = 8


def test_every_strategy_has_its_fallback_paths_listed():
    assert set(STRATEGIES.names()) == {p.strategy for p in PATHS.values()} | set(UNCONSTRAINABLE)


@pytest.mark.parametrize("path", [pytest.param(p, marks=PATH_MARKS.get(p, ())) for p in PATHS])
def test_every_path_keeps_the_constraint_the_budget_and_never_repeats(path, tmp_path):
    """Rounds of ask(3) and tell under TIGHT: every candidate meets the constraint, each ask gives
    exactly what was asked, no key is asked twice (unique strategies), and the fallback ran."""
    p = PATHS[path]
    with fallback_harness(p, tmp_path) as h:
        strategy = h.make(seed=5, attach=False)
        strategy.constrain(TIGHT)
        h.attach(strategy)
        history: list[Trial] = []
        asked: list[Candidate] = []
        for _ in range(ROUNDS):
            asked += h.step(strategy, history)
    broken = [(c.arch.key(), TIGHT.violation(NB201, c.arch)) for c in asked if TIGHT.violation(NB201, c.arch)]
    assert not broken, f"{path}: {len(broken)} of {len(asked)} candidates break the constraint, e.g. {broken[0]}"
    if p.unique:
        assert len(set(keys(asked))) == len(asked), f"{path}: a key was asked twice"
    if p.taken is not None:
        assert any(p.taken(i, c.info) for i, c in enumerate(asked)), f"{path}: the fallback never ran"


@contextmanager
def fallback_harness(p: Fallback, tmp_path: Path) -> Iterator[Harness]:
    setup = replace(SETUPS.get(p.strategy, CLASSIC), params=p.params, reply=p.reply or SETUPS.get(p.strategy, CLASSIC).reply)
    if setup.reply is None:
        yield Harness(p.strategy, setup, None, tmp_path)
        return
    with ScriptedServer(setup.reply) as srv:
        yield Harness(p.strategy, setup, srv.base_url, tmp_path)


# No 3x3 or 1x1 convolution: 729 cells of NB201's 15,625.
TIGHTEST = Constraint(flops=7_877_248)


@pytest.mark.parametrize("path", [pytest.param(p, marks=PATH_MARKS.get(p, ())) for p in PATHS if PATHS[p].unique])
def test_near_the_end_of_the_space_every_path_asks_only_unseen_feasible_cells(path, tmp_path):
    """Resumed after 600 of the 729 cells under TIGHTEST: most draws, mutations and proposals are
    seen or infeasible, so every fill-in and restart meets both, and its candidates are new."""
    p = PATHS[path]
    cells = feasible_cells(TIGHTEST)
    seen = [TrialRecord(trial=i, key=c.key(), encoding=c.encode(), accuracy=TABLE.evaluate(c).accuracy)
            for i, c in enumerate(cells[:600])]
    if "max_attempts" in p.params:  # enough draws to find the few cells left
        p = replace(p, params={**p.params, "max_attempts": 400})
    with fallback_harness(p, tmp_path) as h:
        strategy = h.make(seed=5, attach=False)
        strategy.constrain(TIGHTEST)
        strategy.load_state_dict(json.loads(json.dumps(strategy.state_dict())))
        strategy.restore(seen)
        h.attach(strategy)
        history: list[Trial] = []
        asked = [c for _ in range(3) for c in h.step(strategy, history)]
    old = {r.key for r in seen}
    assert all(TIGHTEST.violation(NB201, c.arch) is None for c in asked), path
    assert not old & set(keys(asked)) and len(set(keys(asked))) == len(asked), f"{path}: a seen key was asked"


def test_a_screened_ask_that_finds_nothing_asks_again_for_the_batch_alone():
    """Screening over-asks (factor x n); when that finds nothing (here: 20 random draws under TIGHTEST
    all over it) the screen asks again for n alone, unscreened, and gets exactly n."""
    from nas.search.screen import Screen, ScreenSettings

    history = [TrialRecord(trial=i, key=c.key(), encoding=c.encode(), accuracy=TABLE.evaluate(c).accuracy)
               for i, c in enumerate(feasible_cells(TIGHTEST)[:5])]
    screen = Screen(ScreenSettings(factor=2, min_history=3, params={"members": 2, "epochs": 5}), NB201, 0)
    for seed in range(40):
        strategy = STRATEGIES.create("random", {"max_attempts": 20}, space=NB201, seed=seed)
        strategy.constrain(TIGHTEST)
        strategy.restore(history)
        try:
            picks = screen.ask(strategy, 3, history)
        except SearchExhausted:
            continue
        if all(pick.score is None for pick in picks):  # the second ask's: unscreened
            assert len(picks) == 3 and all(pick.kept for pick in picks)
            assert all(TIGHTEST.violation(NB201, pick.candidate.arch) is None for pick in picks)
            return
    pytest.fail("no seed of 40 took the screen's second ask")


@pytest.mark.parametrize("name", ["random", "rea", "evolution", "reinforce", "bananas", "optuna"])
def test_the_search_loop_screening_and_resume_keep_the_constraint(name, tmp_path):
    """The loop's own paths (screening over-asks and keeps the best; a resume restores what was seen):
    every evaluated trial meets the constraint, none repeats, and the budget is spent exactly."""
    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.screen import ScreenSettings
    from nas.search.spec import Component, SearchSpec

    params = {"bananas": {"n_init": 3, "members": 2, "epochs": 5}, "rea": {"population_size": 4},
              "evolution": {"population_size": 4}, "optuna": {"sampler_params": {"n_startup_trials": 3}}}
    spec = SearchSpec(space=Component("nb201"), strategy=Component(name, params.get(name, {})),
                      evaluator=Component("table"), seed=2, trials=9, batch_size=3, constraint=TIGHT,
                      screen=ScreenSettings(factor=2, min_history=3, params={"members": 2, "epochs": 5}))
    SearchLoop(spec, tmp_path, LocalExecutor(TABLE, None), progress=False).run_search()
    more = replace(spec, trials=15)  # resumed with a larger budget
    summary = SearchLoop(more, tmp_path, LocalExecutor(TABLE, None), progress=False).run_search()
    lines = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    evaluated = [r for r in lines if not r.get("screened")]
    assert len(evaluated) == summary["trials"] == 15 and any(r.get("screened") for r in lines)
    assert len({r["key"] for r in lines}) == len(lines)
    assert all(TIGHT.violation(NB201, NB201.decode(r["encoding"])) is None for r in lines)

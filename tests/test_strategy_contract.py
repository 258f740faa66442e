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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nas.agents.collm.agents import values_text
from nas.core.space import SearchSpace
from nas.core.trial import Candidate, EvalResult, SearchExhausted, Trial
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

"""Contract tests: every registered space and strategy, then REA/random specifics."""

from __future__ import annotations

import inspect
import json
from typing import Any

import numpy as np
import pytest

from nas.core.arch import Architecture
from nas.core.space import CategoricalSpace, Decision
from nas.core.trial import Candidate, EvalResult, SearchExhausted, Trial
from nas.errors import ConfigError, RunDirError
from nas.evaluators.table import TableEvaluator
from nas.spaces import SPACES, SearchSpace
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell
from nas.spaces.nb201.space import NB201Space
from nas.strategies import STRATEGIES, Strategy
from nas.strategies.random_search import RandomSearch
from nas.strategies.rea import RegularizedEvolution

SPACE_NAMES = SPACES.names()
RANDOM_SPACES = [n for n in SPACE_NAMES if not SPACES.get(n).open_ended]
OPEN_SPACES = [n for n in SPACE_NAMES if SPACES.get(n).open_ended]
STRATEGY_NAMES = [n for n in STRATEGIES.names() if STRATEGIES.get(n).random_moves]  # the contract below


def test_registries_hold_the_builtin_components():
    assert {"nb201", "nader", "source"} <= set(SPACE_NAMES) and set(OPEN_SPACES) == {"nader", "source"}
    assert {"random", "rea"} <= set(STRATEGY_NAMES)
    assert STRATEGIES.get("random") is RandomSearch
    assert STRATEGIES.get("rea") is RegularizedEvolution


def test_unknown_strategy_lists_valid_names():
    with pytest.raises(ConfigError) as info:
        STRATEGIES.get("bayes")
    assert "'bayes'" in str(info.value)
    assert "valid: " + ", ".join(STRATEGIES.names()) in str(info.value)


# --- spaces ------------------------------------------------------------------

@pytest.fixture(params=RANDOM_SPACES)
def space(request) -> SearchSpace:
    return SPACES.create(request.param, {})


@pytest.mark.parametrize("name", OPEN_SPACES)
def test_open_ended_spaces_have_a_base_and_no_random_moves(name):
    space = SPACES.create(name, {})
    back = space.decode(json.loads(json.dumps(space.base.encode())))
    assert back.space == name and back.key() == space.base.key()
    with pytest.raises(ConfigError, match="no random samples"):
        space.sample(np.random.default_rng(0))
    with pytest.raises(ConfigError, match="no random moves"):
        space.mutate(space.base, np.random.default_rng(0))
    for strategy in ("random", "rea"):
        with pytest.raises(ConfigError, match=f"strategy '{strategy}' samples and mutates at random"):
            STRATEGIES.create(strategy, {}, space=space, seed=0)


@pytest.mark.parametrize("name,bad", [("nader", "nope"), ("source", "nope")])
def test_open_ended_space_base_errors(name, bad, tmp_path):
    with pytest.raises(ConfigError, match="base 'nope': not a packaged one"):
        SPACES.create(name, {"base": bad})
    model = tmp_path / "m.py"
    model.write_text("def broken(:\n")
    if name == "source":
        from nas.errors import EncodingError

        with pytest.raises(EncodingError, match="m.py:1"):
            SPACES.create(name, {"base": str(model)})


def test_space_sample_decode_round_trip(space):
    rng = np.random.default_rng(0)
    for _ in range(100):
        arch = space.sample(rng)
        assert isinstance(arch, Architecture)
        assert arch.space == space.name
        enc = json.loads(json.dumps(arch.encode()))  # survives history.jsonl
        back = space.decode(enc)
        assert back == arch
        assert back.key() == arch.key()
        assert back.canonical() == arch.canonical()


def test_space_mutate_gives_a_different_decodable_neighbour(space):
    rng = np.random.default_rng(1)
    for _ in range(100):
        arch = space.sample(rng)
        before = arch.canonical()
        child = space.mutate(arch, rng)
        assert arch.canonical() == before  # parent untouched
        assert child != arch
        assert child.key() != arch.key()
        assert space.decode(child.encode()) == child


def test_space_sampling_is_seeded(space):
    ra, rb, rc = (np.random.default_rng(s) for s in (7, 7, 8))
    seq_a = [space.sample(ra).key() for _ in range(20)]
    seq_b = [space.sample(rb).key() for _ in range(20)]
    seq_c = [space.sample(rc).key() for _ in range(20)]
    assert seq_a == seq_b
    assert seq_a != seq_c
    assert len(set(seq_a)) > 1


def test_space_size_is_positive_or_unknown(space):
    size = space.size()
    assert size is None or (isinstance(size, int) and size > 0)


def test_nb201_space_size_and_uniformity():
    space = NB201Space()
    assert space.size() == 5 ** 6 == 15625
    rng = np.random.default_rng(0)
    counts = np.zeros((len(EDGES), len(OPS)))
    n = 5000
    for _ in range(n):
        cell = space.sample(rng)
        for e, op in enumerate(cell.ops):
            counts[e, OPS.index(op)] += 1
    # each op on each edge ~ 1000 of 5000 (binomial std ~ 28)
    assert np.all(np.abs(counts - n / 5) < 150), counts


def test_nb201_mutate_changes_exactly_one_edge_and_reaches_all_neighbours():
    space = NB201Space()
    rng = np.random.default_rng(3)
    cell = NB201Cell.from_anb_tuple((2, 2, 0, 2, 3, 2))
    neighbours = set()
    for _ in range(2000):
        child = space.mutate(cell, rng)
        diff = [i for i, (a, b) in enumerate(zip(cell.ops, child.ops)) if a != b]
        assert len(diff) == 1
        neighbours.add(child.key())
    assert len(neighbours) == len(EDGES) * (len(OPS) - 1) == 24


def test_nb201_decode_rejects_garbage():
    from nas.errors import EncodingError

    with pytest.raises(EncodingError):
        NB201Space().decode("|none~0|")
    with pytest.raises(EncodingError):
        NB201Space().decode(None)


# --- strategies: shared contract ---------------------------------------------------

@pytest.fixture(scope="module")
def evaluator() -> TableEvaluator:
    return TableEvaluator(NB201Space())


# The contract (uniqueness, determinism, resume) does not depend on how well a predictor fits:
# BANANAS' ensemble is trained smaller here (its default of 5 x 300 epochs took minutes of CI).
# Optuna's TPE models from its 6th trial (10 by default), so the contract sees its model's asks.
CONTRACT_PARAMS: dict[str, dict[str, Any]] = {"bananas": {"members": 2, "epochs": 60},
                                              "optuna": {"sampler_params": {"n_startup_trials": 5}}}


def make(name: str, seed: int = 0, **params: Any) -> Strategy:
    return STRATEGIES.create(name, {**CONTRACT_PARAMS.get(name, {}), **params}, space=NB201Space(), seed=seed)


def step(strategy: Strategy, evaluator, n: int = 1, start: int = 0,
         told: list[Trial] | None = None) -> list[Candidate]:
    cands = strategy.ask(n)
    trials = [Trial.of(start + i, c, evaluator.evaluate(c.arch)) for i, c in enumerate(cands)]
    strategy.tell(trials)
    if told is not None:
        told += trials
    return cands


def run(strategy: Strategy, evaluator, steps: int, n: int = 1, told: list[Trial] | None = None) -> list[Candidate]:
    """`steps` ask/tell rounds of `n`; the trials told are appended to `told` (the search's history)."""
    out: list[Candidate] = []
    for _ in range(steps):
        out += step(strategy, evaluator, n, start=len(out), told=told)
    return out


def fingerprint(cands: list[Candidate]) -> list[tuple[str, str]]:
    return [(c.arch.key(), json.dumps(c.info, sort_keys=True)) for c in cands]


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("n", [1, 5, 8])
def test_ask_returns_n_nb201_candidates(name, n, evaluator):
    strategy = make(name)
    for _ in range(3):
        cands = step(strategy, evaluator, n)
        assert len(cands) == n
        for c in cands:
            assert isinstance(c, Candidate)
            assert isinstance(c.arch, NB201Cell)
            assert isinstance(c.info, dict) and isinstance(c.info.get("origin"), str)
            json.dumps(c.info)  # recorded in history.jsonl


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("n", [1, 4])
def test_unique_never_repeats_a_key(name, n, evaluator):
    # strategies with a `unique` switch turn it on; the others (bananas) never repeat by design
    accepts = "unique" in inspect.signature(STRATEGIES.get(name)).parameters
    strategy = make(name, **({"unique": True} if accepts else {}))
    cands = run(strategy, evaluator, 200 // n, n)
    keys = [c.arch.key() for c in cands]
    assert len(keys) == 200
    assert len(set(keys)) == 200


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_same_seed_same_sequence(name, evaluator):
    a = fingerprint(run(make(name, seed=11), evaluator, 60))
    b = fingerprint(run(make(name, seed=11), evaluator, 60))
    c = fingerprint(run(make(name, seed=12), evaluator, 60))
    assert a == b
    assert a != c


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("k", [3, 20, 45])
def test_state_dict_round_trip_reproduces_next_asks(name, k, evaluator):
    a = make(name, seed=5)
    told: list[Trial] = []
    run(a, evaluator, k, told=told)
    state = json.loads(json.dumps(a.state_dict()))
    assert "visited" not in state  # the seen architectures come from the history, not the state
    b = make(name, seed=999)  # a different seed: everything must come from the state and the history
    b.load_state_dict(state)
    b.restore([t.record for t in told])
    assert json.loads(json.dumps(b.state_dict())) == state
    next_a = fingerprint(run(a, evaluator, 25, n=2))
    next_b = fingerprint(run(b, evaluator, 25, n=2))
    assert next_a == next_b
    assert len(set(k for k, _ in next_a)) == 50


GARBAGE_STATES = [
    {},
    None,
    [],
    "state",
    {"rng": None},
    {"rng": "x"},
    {"rng": {"bit_generator": "MT19937", "state": {"key": [], "pos": 0}}},
    {"rng": {"bit_generator": "PCG64"}},
]


@pytest.mark.parametrize("name", STRATEGY_NAMES)
@pytest.mark.parametrize("state", GARBAGE_STATES, ids=lambda s: repr(s)[:40])
def test_load_garbage_state_raises_rundir_error(name, state):
    with pytest.raises(RunDirError, match=f"strategy '{name}' state"):
        make(name).load_state_dict(state)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_state_of_older_versions_with_visited_loads(name, evaluator):
    strategy = make(name)
    run(strategy, evaluator, 3)
    state = {**strategy.state_dict(), "visited": ["0123456789abcdef"]}  # what run dirs before SeenIndex hold
    again = make(name)
    again.load_state_dict(state)
    assert json.loads(json.dumps(again.state_dict())) == json.loads(json.dumps(strategy.state_dict()))


class TinySpace(CategoricalSpace):
    """Three NB201 cells: small enough to exhaust (one decision, for categorical strategies)."""

    name = "tiny"
    CELLS = [NB201Cell((op,) * 6) for op in ("none", "skip_connect", "nor_conv_1x1")]

    def decisions(self):
        return [Decision("cell", tuple(c.ops[0] for c in self.CELLS))]

    def from_values(self, values):
        return NB201Cell((values[0],) * 6)

    def to_values(self, arch):
        return [arch.ops[0]]

    def sample(self, rng):
        return self.CELLS[int(rng.integers(len(self.CELLS)))]

    def mutate(self, arch, rng):
        others = [c for c in self.CELLS if c != arch]
        return others[int(rng.integers(len(others)))]

    def decode(self, encoding):
        return NB201Cell.decode(encoding)

    def size(self):
        return len(self.CELLS)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_exhausted_space_raises_search_exhausted(name, evaluator):
    strategy = STRATEGIES.get(name)(TinySpace(), seed=0)
    seen: list[str] = []
    with pytest.raises(SearchExhausted):
        for _ in range(10):
            seen += [c.arch.key() for c in step(strategy, evaluator, 1, start=len(seen))]
    assert sorted(seen) == sorted(c.key() for c in TinySpace.CELLS)


# --- random search ---------------------------------------------------------------

def test_random_batch_returns_fewer_when_space_runs_out(evaluator):
    strategy = RandomSearch(TinySpace(), seed=0)
    cands = strategy.ask(5)
    assert sorted(c.arch.key() for c in cands) == sorted(c.key() for c in TinySpace.CELLS)
    assert all(c.info == {"origin": "random"} for c in cands)
    with pytest.raises(SearchExhausted, match="no unvisited"):
        strategy.ask(1)


def test_random_skips_architectures_told_from_elsewhere(evaluator):
    strategy = RandomSearch(TinySpace(), seed=0)
    told = TinySpace.CELLS[0]
    strategy.tell([Trial.of(0, Candidate(told), evaluator.evaluate(told))])
    keys = [c.arch.key() for c in strategy.ask(5)]
    assert told.key() not in keys
    assert len(keys) == 2


def test_random_non_unique_can_repeat():
    strategy = RandomSearch(TinySpace(), seed=0, unique=False)
    keys = [c.arch.key() for c in strategy.ask(30)]
    assert len(keys) == 30
    assert len(set(keys)) == 3


def test_random_matches_space_sampling():
    # random search is exactly the space's sampler driven by the seeded rng (unique aside)
    strategy = make("random", seed=4, unique=False)
    rng = np.random.default_rng(4)
    space = NB201Space()
    assert [c.arch.key() for c in strategy.ask(20)] == [space.sample(rng).key() for _ in range(20)]


# --- regularised evolution -------------------------------------------------------

def test_rea_rejects_bad_sizes():
    with pytest.raises(ConfigError, match="population_size"):
        make("rea", population_size=0)
    with pytest.raises(ConfigError, match="sample_size"):
        make("rea", sample_size=0)


def test_rea_first_population_size_asks_are_random_init(evaluator):
    strategy = make("rea", population_size=8)
    cands = run(strategy, evaluator, 8)
    assert [c.info["origin"] for c in cands] == ["init"] * 8
    assert len(strategy.population) == 8
    nxt = step(strategy, evaluator)
    assert nxt[0].info["origin"] == "mutation"


def test_rea_init_batch_does_not_overshoot(evaluator):
    strategy = make("rea", population_size=6)
    first = strategy.ask(4)
    assert strategy.pending_init == 4
    second = strategy.ask(2)  # pending asks count towards the population
    assert [c.info["origin"] for c in first + second] == ["init"] * 6
    assert strategy.pending_init == 6
    strategy.tell([Trial.of(i, c, evaluator.evaluate(c.arch)) for i, c in enumerate(first + second)])
    assert strategy.pending_init == 0
    assert len(strategy.population) == 6
    assert [c.info["origin"] for c in strategy.ask(3)] == ["mutation"] * 3


def test_rea_batch_larger_than_population(evaluator):
    strategy = make("rea", population_size=5)
    cands = strategy.ask(8)
    assert len(cands) == 8


def test_rea_population_bounded_and_fifo(evaluator):
    P = 5
    strategy = make("rea", seed=2, population_size=P, sample_size=2)
    told: list[tuple[str, float]] = []
    for i in range(80):
        cands = step(strategy, evaluator, 1, start=i)
        told.append((cands[0].arch.key(), evaluator.evaluate(cands[0].arch).accuracy))
        assert len(strategy.population) == min(P, len(told))
        # oldest first, exactly the last P told (all succeeded)
        assert [(key, acc) for _, key, acc in strategy.population] == told[-P:]
    for enc, key, _ in strategy.population:
        assert NB201Cell.decode(enc).key() == key


def test_rea_children_mutate_one_edge_of_a_population_member(evaluator):
    strategy = make("rea", seed=9, population_size=10, sample_size=3)
    run(strategy, evaluator, 10)
    mutations = 0
    for i in range(60):
        members = {key: NB201Cell.decode(enc) for enc, key, _ in strategy.population}
        cand = step(strategy, evaluator, 1, start=10 + i)[0]
        if cand.info["origin"] != "mutation":
            assert cand.info["origin"] == "random"  # neighbourhood exhausted: restart
            continue
        mutations += 1
        assert cand.info["parent"] in members
        parent = members[cand.info["parent"]]
        assert sum(a != b for a, b in zip(parent.ops, cand.arch.ops)) == 1
    assert mutations >= 55


def test_rea_tournament_picks_the_best_member(evaluator):
    # with a huge tournament (sampled with replacement) the winner is the best member
    strategy = make("rea", seed=1, population_size=6, sample_size=500)
    run(strategy, evaluator, 6)
    for _ in range(20):
        best_key = max(strategy.population, key=lambda m: m[2])[1]
        cand = step(strategy, evaluator)[0]
        assert cand.info == {"origin": "mutation", "parent": best_key}


def test_rea_failed_results_are_not_added(evaluator):
    strategy = make("rea", seed=0, population_size=4)
    init = strategy.ask(4)
    results = [EvalResult.failure("boom"), evaluator.evaluate(init[1].arch),
               EvalResult.failure("boom"), evaluator.evaluate(init[3].arch)]
    strategy.tell([Trial.of(i, c, r) for i, (c, r) in enumerate(zip(init, results))])
    assert [key for _, key, _ in strategy.population] == [init[1].arch.key(), init[3].arch.key()]
    assert strategy.pending_init == 0
    assert init[0].arch in strategy.seen  # failed cells are still not re-proposed
    # two slots are still free, so the next two asks are new random members
    again = strategy.ask(2)
    assert [c.info["origin"] for c in again] == ["init", "init"]
    keys = {c.arch.key() for c in init}
    assert not keys & {c.arch.key() for c in again}
    strategy.tell([Trial.of(4 + i, c, evaluator.evaluate(c.arch)) for i, c in enumerate(again)])
    assert len(strategy.population) == 4
    # a failed child leaves the population untouched
    before = list(strategy.population)
    child = strategy.ask(1)[0]
    assert child.info["origin"] == "mutation"
    strategy.tell([Trial.of(6, child, EvalResult.failure("boom"))])
    assert list(strategy.population) == before


def test_rea_failed_result_with_accuracy_none_only():
    r = EvalResult(accuracy=None)
    assert not r.ok
    strategy = make("rea", population_size=2)
    c = strategy.ask(1)[0]
    strategy.tell([Trial.of(0, c, r)])
    assert len(strategy.population) == 0


def test_rea_state_dict_contains_population(evaluator):
    strategy = make("rea", population_size=5)
    run(strategy, evaluator, 7)
    state = json.loads(json.dumps(strategy.state_dict()))
    assert len(state["population"]) == 5
    assert state["pending_init"] == 0
    assert len(strategy.seen) == 7
    b = make("rea", population_size=5, seed=3)
    b.load_state_dict(state)
    assert list(b.population) == list(strategy.population)


@pytest.mark.parametrize("population", [5, [[1]], [["enc", "key", "not-a-float"]], [[1, 2, None]]])
def test_rea_malformed_population_raises_rundir_error(population, evaluator):
    strategy = make("rea")
    run(strategy, evaluator, 2)
    state = json.loads(json.dumps(strategy.state_dict()))
    state["population"] = population
    with pytest.raises(RunDirError, match="malformed population"):
        make("rea").load_state_dict(state)


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_resume_rebuilds_seen_from_the_history(name, evaluator):
    """The state holds no seen set: `restore` rebuilds it from the history (and queued
    proposals), so a resumed strategy asks what the uninterrupted one asks."""
    a = STRATEGIES.get(name)(TinySpace(), seed=0)
    told: list[Trial] = []
    step(a, evaluator, 2, told=told)
    b = STRATEGIES.get(name)(TinySpace(), seed=0)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert len(b.seen) == 0
    b.restore([t.record for t in told])
    assert all(t.candidate.arch in b.seen for t in told) and len(b.seen) == len(a.seen)
    assert fingerprint(b.ask(1)) == fingerprint(a.ask(1))  # the one cell not yet seen


def test_restore_names_the_trial_that_does_not_decode():
    from nas.core.trial import TrialRecord

    with pytest.raises(RunDirError, match=r"^trial 0: "):
        make("random").restore([TrialRecord(0, "k", "not a cell", 50.0)])

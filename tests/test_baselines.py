"""REINFORCE and OFA-style evolution beyond the shared strategy contract
(tests/test_strategies.py): the constraint holds for every proposal, the
policy learns, OFA's generation structure, resume mid-generation, and the
categorical-space requirement."""

from __future__ import annotations

import json

import numpy as np
import pytest

from nas.core.constraint import Constraint
from nas.core.trial import Candidate, EvalResult, Trial
from nas.errors import ConfigError
from nas.evaluators.table import TableEvaluator
from nas.spaces import SearchSpace
from nas.spaces.nb201.space import NB201Space
from nas.strategies import STRATEGIES
from nas.strategies.evolution import Evolution
from nas.strategies.reinforce import Reinforce

SPACE = NB201Space()


@pytest.fixture(scope="module")
def table() -> TableEvaluator:
    return TableEvaluator(SPACE)


def drive(strategy, table, trials: int, n: int = 1, told: list | None = None) -> list:
    """Ask/tell until `trials` candidates; the told trials are appended to `told` (the history)."""
    out = []
    while len(out) < trials:
        cands = strategy.ask(n)
        trials_told = [Trial.of(len(out) + i, c, table.evaluate(c.arch)) for i, c in enumerate(cands)]
        strategy.tell(trials_told)
        if told is not None:
            told += trials_told
        out += cands
    return out


def tight() -> Constraint:
    """A FLOPs limit that roughly a quarter of NB201's cells meet."""
    rng = np.random.default_rng(0)
    flops = sorted(SPACE.cost(SPACE.sample(rng)).flops for _ in range(400))
    return Constraint(flops=flops[len(flops) // 4])


@pytest.mark.parametrize("name", ["reinforce", "evolution"])
def test_every_proposal_meets_a_tight_constraint(name, table):
    strategy = STRATEGIES.create(name, {}, space=SPACE, seed=1)
    strategy.constrain(tight())
    cands = drive(strategy, table, 120, n=4)
    assert all(strategy.constraint.violation(SPACE, c.arch) is None for c in cands)
    assert len({c.arch.key() for c in cands}) == 120


class Listed(SearchSpace):
    """Samples, mutates and decodes, but has no decisions."""

    name = "listed"

    def sample(self, rng):
        return SPACE.sample(rng)

    def mutate(self, arch, rng):
        return SPACE.mutate(arch, rng)

    def decode(self, encoding):
        return SPACE.decode(encoding)


@pytest.mark.parametrize("name", ["reinforce", "evolution", "collm"])
def test_needs_a_categorical_space(name):
    with pytest.raises(ConfigError, match=f"strategy '{name}' needs a categorical space"):
        STRATEGIES.create(name, {}, space=Listed(), seed=0)


def test_reinforce_policy_moves_towards_reward(table):
    strategy = Reinforce(SPACE, seed=0, learning_rate=0.05)
    before = [p.copy() for p in strategy.probs()]
    drive(strategy, table, 150)
    after = strategy.probs()
    none = SPACE.decisions()[0].choices.index("none")
    conv = SPACE.decisions()[0].choices.index("nor_conv_3x3")
    # 'none' on every edge kills accuracy on NB201; 3x3 convolutions carry it
    assert np.mean([p[none] for p in after]) < np.mean([p[none] for p in before]) - 0.03
    assert np.mean([p[conv] for p in after]) > np.mean([p[conv] for p in before])


def test_reinforce_mean_reward_beats_random(table):
    def mean_reward(name: str, seed: int) -> float:
        cands = drive(STRATEGIES.create(name, {}, space=SPACE, seed=seed), table, 200)
        return float(np.mean([table.evaluate(c.arch).accuracy for c in cands[100:]]))

    gains = [mean_reward("reinforce", s) - mean_reward("random", s) for s in range(3)]
    assert np.mean(gains) > 1.0, gains


def test_reinforce_update_matches_torch_adam():
    torch = pytest.importorskip("torch")
    strategy = Reinforce(SPACE, seed=0, learning_rate=0.01)
    logits = torch.nn.Parameter(torch.tensor(np.array(strategy.logits), dtype=torch.float64))
    opt = torch.optim.Adam([logits], lr=0.01)
    rng = np.random.default_rng(5)
    ema = [0.0, 0.0]
    for _ in range(20):
        arch = SPACE.sample(rng)
        reward = float(rng.uniform(80, 94))
        ema = [0.9 * ema[0] + 0.1 * reward, 0.9 * ema[1] + 0.1]
        idx = torch.tensor(SPACE.to_indices(arch))
        loss = -(torch.log_softmax(logits, -1)[torch.arange(6), idx].sum() * (reward - ema[0] / ema[1]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        strategy.tell([Trial.of(0, Candidate(arch, {"origin": "policy"}), EvalResult(accuracy=reward))])
    assert np.allclose(np.array(strategy.logits), logits.detach().numpy(), atol=1e-9)


def test_reinforce_skips_failures(table):
    strategy = Reinforce(SPACE, seed=0)
    before = json.dumps(strategy.state_dict()["logits"])
    cand = strategy.ask(1)[0]
    strategy.tell([Trial.of(0, cand, EvalResult.failure("boom"))])
    assert json.dumps(strategy.state_dict()["logits"]) == before and strategy.adam.step_count == 0


def test_evolution_generations_follow_ofa(table):
    strategy = Evolution(SPACE, seed=0, population_size=8, parent_ratio=0.5, mutation_ratio=0.5)
    first = drive(strategy, table, 8)
    assert [c.info["origin"] for c in first] == ["random"] * 8
    second = drive(strategy, table, 8)
    origins = [c.info["origin"] for c in second]
    # mutation_ratio 0.5; a crossover of a parent with itself only redraws, then falls back to random
    assert origins[:4] == ["mutation"] * 4 and origins.count("crossover") >= 2
    assert set(origins[4:]) <= {"crossover", "random"}
    best = sorted(((table.evaluate(c.arch).accuracy, c.arch.key()) for c in first), reverse=True)[:4]
    parents = {k for _, k in best}                                               # parent_ratio 0.5 of 8
    for c in second:
        if c.info["origin"] == "random":
            continue
        used = {c.info["parent"]} if c.info["origin"] == "mutation" else set(c.info["parents"])
        assert used <= parents
        assert c.info["generation"] == 1
    assert len(strategy.population) == 4 + 8                                     # parents + evaluated children


def test_evolution_resume_mid_generation(table):
    a = Evolution(SPACE, seed=4, population_size=10)
    told: list = []
    drive(a, table, 14, told=told)
    state = json.loads(json.dumps(a.state_dict()))
    assert len(state["queue"]) == 6
    b = Evolution(SPACE, seed=77, population_size=10)
    b.load_state_dict(state)
    b.restore([t.record for t in told])  # the seen cells: the history's and the queued generation's
    assert [c.arch.key() for c in drive(a, table, 30, n=3)] == [c.arch.key() for c in drive(b, table, 30, n=3)]


def categorical_spaces() -> list[str]:
    from nas.core.space import CategoricalSpace
    from nas.spaces import SPACES

    return [n for n in SPACES.names() if issubclass(SPACES.get(n), CategoricalSpace)]


@pytest.mark.parametrize("space_name", categorical_spaces())
@pytest.mark.parametrize("name", ["reinforce", "evolution"])
def test_runs_on_every_categorical_space(name, space_name):
    from nas.spaces import SPACES

    space = SPACES.create(space_name, {})
    strategy = STRATEGIES.create(name, {}, space=space, seed=0)
    rng = np.random.default_rng(0)
    keys = []
    for i in range(10):
        cands = strategy.ask(3)
        strategy.tell([Trial.of(i, c, EvalResult(accuracy=float(rng.uniform(50, 80)))) for c in cands])
        keys += [c.arch.key() for c in cands]
    assert len(set(keys)) == 30
    json.dumps(strategy.state_dict())

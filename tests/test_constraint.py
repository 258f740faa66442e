"""Hardware constraints: config errors, the reason a candidate breaks one, and the spec carrying it."""

from __future__ import annotations

import numpy as np
import pytest

from nas.core.constraint import Constraint
from nas.errors import ConfigError
from nas.search.spec import SearchSpec
from nas.spaces import SPACES
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import NB201Space
from nas.spaces.source.space import SourceSpace

CONV = NB201Cell(("nor_conv_3x3",) * 6)
NONE = NB201Cell(("none",) * 6)


@pytest.mark.parametrize("node, message", [
    ({"flops": -1}, "constraint.flops must be a positive number or null, got -1"),
    ({"params": "many"}, "constraint.params must be a positive number or null, got 'many'"),
    ({"latency": 3}, "constraint: unknown key 'latency' (valid: flops, params)"),
    ([1, 2], "constraint must be a mapping with flops/params, got [1, 2]"),
])
def test_bad_constraints_are_one_line_errors(node, message):
    with pytest.raises(ConfigError) as info:
        Constraint.from_config(node)
    assert str(info.value) == message


def test_one_constraint_for_every_budget():
    """A design strategy's budget is the evaluator's, its open limits NB201's; errors name the key."""
    assert Constraint.from_config({"params": 2e5}, "evaluator.budget").filled(Constraint.nb201(16)) == Constraint(
        flops=0.05e9, params=2e5)
    assert Constraint(params=2e5).fits(2e5, 1e12) and not Constraint(params=2e5).fits(2e5 + 1, 0)
    with pytest.raises(ConfigError, match=r"^evaluator.budget.flops must be a positive number or null, got 0$"):
        Constraint.from_config({"flops": 0}, "evaluator.budget")
    for name, space in (("nader", "nader"), ("fairnad", "source")):
        spec = SearchSpec.from_config({"space": space, "evaluator": "train",
                                       "strategy": {"name": name, "budget": {"flops": 3e7}}})
        assert spec.build_strategy(SPACES.create(space, {})).budget == Constraint(flops=3e7, params=1.5e6)


def test_violation_names_the_measure_and_the_limit():
    space = NB201Space()
    conv, none = space.cost(CONV), space.cost(NONE)
    assert conv.flops > none.flops and conv.params > none.params
    limit = Constraint(flops=(conv.flops + none.flops) / 2)
    assert limit.violation(space, NONE) is None
    assert limit.violation(space, CONV) == (f"{conv.flops / 1e6:.2f} MFLOPs exceeds the limit of "
                                            f"{limit.flops / 1e6:.2f} MFLOPs")
    assert "M params exceeds" in Constraint(params=none.params + 1).violation(space, CONV)
    assert Constraint().violation(space, CONV) is None


def test_spec_carries_the_constraint_and_strategies_meet_it():
    cfg = {"space": "nb201", "strategy": "random", "evaluator": "table", "constraint": {"flops": 2.0e7}}
    spec = SearchSpec.from_config(cfg)
    assert SearchSpec.from_dict(spec.to_dict()) == spec
    unconstrained = SearchSpec.from_config({**cfg, "constraint": None})
    assert spec.identity() != unconstrained.identity()
    space = spec.build_space()
    strategy = spec.build_strategy(space)
    assert all(space.cost(c.arch).flops <= 2.0e7 for c in strategy.ask(30))


def test_a_space_without_a_cost_model_refuses_a_constraint():
    with pytest.raises(ConfigError, match="cannot measure FLOPs/params before evaluation"):
        Constraint(flops=1e6).validate(SourceSpace(), SourceSpace().base)
    assert np.isfinite(NB201Space().cost(NONE).flops)


TRAIN = {"data": {"name": "digits", "root": None, "split_file": None}, "channels": 16, "cells_per_stage": 5}


@pytest.mark.parametrize("evaluator, differ", [
    (TRAIN, "data=digits"),
    ({**TRAIN, "data": {"name": "cifar10"}, "cells_per_stage": 1}, "cells_per_stage=1"),
    ({**TRAIN, "channels": 8}, "data=digits, channels=8"),
    ({**TRAIN, "data": {"name": "cifar10"}}, None),
    ({"metric": "baseline_accuracy", "num_classes": 10, "resolution": 32}, None),  # the table at the space's costs
    ({"metric": "baseline_accuracy", "num_classes": 100, "resolution": 16}, "resolution=16, num_classes=100"),
])
def test_nb201_names_what_its_cost_does_not_price(evaluator, differ):
    why = NB201Space().cost_mismatch(evaluator)
    assert why == (None if differ is None else
                   "constraint: space nb201 prices its cifar10 network (32 px, 10 classes, channels=16, "
                   f"cells_per_stage=5), but the evaluator scores one with {differ}: the limits apply to another "
                   "network")


def test_a_constrained_search_warns_once_when_its_cost_prices_another_network(tmp_path, caplog):
    """The loop says so when it starts; unconstrained runs, whose cost filters nothing, stay quiet."""
    from nas.core.trial import EvalResult
    from nas.search.loop import SearchLoop

    class Stub:
        def evaluate(self, candidates):
            return [(EvalResult(accuracy=50.0), False, 0.0) for _ in candidates]

    base = {"space": "nb201", "strategy": "random", "evaluator": {"name": "train", **TRAIN},
            "budget": {"trials": 2}}
    for constraint, warned in ((None, 0), ({"flops": 1e9}, 1)):
        caplog.clear()
        spec = SearchSpec.from_config({**base, "constraint": constraint})
        SearchLoop(spec, tmp_path / str(warned), Stub(), progress=False).run_search()
        assert sum("prices its cifar10 network" in r.message for r in caplog.records) == warned


@pytest.mark.parametrize("strategy", ["random", "rea", "bananas"])
def test_a_constraint_no_architecture_meets_is_named_when_the_search_stops(strategy):
    """Not 'no unvisited architecture': the space is not exhausted, the constraint excludes it all."""
    from nas.core.trial import SearchExhausted

    spec = SearchSpec.from_config({"space": "nb201", "strategy": strategy, "evaluator": "table",
                                   "constraint": {"params": 1}})
    strategy_ = spec.build_strategy(spec.build_space())
    with pytest.raises(SearchExhausted, match=rf"{strategy}: none of \d+ sampled architectures meets the constraint "
                                              r"\(e.g. [\d.]+ M params exceeds the limit of 0.000 M\); loosen"):
        strategy_.ask(1)


def test_a_cost_exactly_at_the_limit_meets_it():
    """The limit is inclusive: `>` in `violation`, the same as `fits`."""
    space = NB201Space()
    cost = space.cost(CONV)
    assert Constraint(flops=cost.flops).violation(space, CONV) is None
    assert Constraint(params=cost.params).violation(space, CONV) is None
    assert Constraint(flops=cost.flops, params=cost.params).violation(space, CONV) is None


def test_a_cost_is_a_frozen_value():
    import dataclasses

    from nas.core.space import Cost

    cost = NB201Space().cost(CONV)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cost.flops = 0  # type: ignore[misc]
    assert {cost: 1}[Cost(params=cost.params, flops=cost.flops)] == 1


def test_a_steady_state_search_a_constraint_stops_says_why_in_its_summary(tmp_path):
    """budget.in_flight > 1 runs the steady-state loop: its exhaustion reason reaches the summary too."""
    from nas.evaluators.simulated import SimulatedClock, SimulatedEvaluator
    from nas.search.loop import SearchLoop

    spec = SearchSpec.from_config({"space": "nb201", "strategy": "random", "evaluator": "table",
                                   "constraint": {"params": 1}, "budget": {"trials": 3, "in_flight": 2}})
    clock = SimulatedClock(SimulatedEvaluator(NB201Space(), median_seconds=1.0, sigma=1.0), workers=2)
    summary = SearchLoop(spec, tmp_path, clock, progress=False).run_search()
    assert "meets the constraint" in summary["exhausted"]


@pytest.mark.parametrize("seen_first, says", [
    (False, "none of 3 sampled architectures meets the constraint"),  # every draw broke it
    (True, "no unvisited architecture in 3 samples"),  # one was only seen: not the constraint's doing alone
])
def test_a_search_says_the_constraint_excluded_everything_only_when_every_draw_broke_it(seen_first, says):
    from nas.core.trial import SearchExhausted

    spec = SearchSpec.from_config({"space": "nb201", "strategy": "random", "evaluator": "table",
                                   "constraint": {"params": 1}})
    space = spec.build_space()
    strategy = spec.build_strategy(space)
    rng = np.random.default_rng(0)
    draws = [space.sample(rng) for _ in range(3)]
    if seen_first:
        strategy.seen.add(draws[0])
    made = iter(draws)
    assert strategy._fresh(lambda: next(made), 3) is None
    err = strategy._none_fresh("random", 3)
    assert isinstance(err, SearchExhausted) and str(err).startswith(f"random: {says}")

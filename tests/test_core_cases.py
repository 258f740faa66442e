"""nas/core case by case (issue 52, the library mutation run): the hash and the seen index, each
constraint bound at, below and above it, the dotted names, the registry's checks with their whole
messages, a categorical space's indices, features, sampling and mutation on a scripted generator,
and a trial record's fields read, written and judged for best. In-process, on a toy space."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from nas.core import dotted
from nas.core.arch import Architecture, SeenIndex, stable_hash
from nas.core.constraint import Constraint
from nas.core.registry import Registry, check_count, check_keys, check_params
from nas.core.space import SPACES, CategoricalSpace, Cost, Decision, OpenEndedSpace, SearchSpace
from nas.core.trial import (
    UNSCORED,
    Candidate,
    Draft,
    EvalResult,
    Trial,
    TrialRecord,
    best_record,
    best_so_far,
    evaluated,
    record_at,
)
from nas.errors import ConfigError, EncodingError, EvaluationError, RunDirError


class Pair(Architecture):
    space = "toy"

    def __init__(self, *values: Any) -> None:
        self.values = values

    def canonical(self) -> str:
        return "-".join(map(str, self.values))

    def encode(self) -> Any:
        return list(self.values)

    @classmethod
    def decode(cls, data: Any) -> Pair:
        return cls(*data)


class Other(Pair):
    space = "other"


class Toy(CategoricalSpace[Pair]):
    name = "toy"

    def __init__(self, decisions: list[Decision] | None = None, cost: Cost | None = None) -> None:
        self._decisions = decisions or [Decision("a", (1, 2, 3)), Decision("b", ("x", "y"))]
        self._cost = cost

    def decisions(self) -> list[Decision]:
        return self._decisions

    def from_values(self, values: list[Any]) -> Pair:
        return Pair(*values)

    def to_values(self, arch: Pair) -> list[Any]:
        return list(arch.values)

    def decode(self, encoding: Any) -> Pair:
        return Pair(*encoding)

    def cost(self, arch: Pair) -> Cost | None:
        return self._cost


class Rng:
    """np.random.Generator.integers as a script: the readings in order, each call's bound kept."""

    def __init__(self, *readings: int) -> None:
        self.readings, self.bounds = list(readings), []

    def integers(self, bound: int) -> int:
        self.bounds.append(bound)
        return self.readings.pop(0)


# ---------------------------------------------------------------- arch

def test_stable_hash_is_sha256_of_the_sorted_compact_json_cut_to_sixteen_or_the_length_asked():
    full = hashlib.sha256(b'["a",{"x":1,"y":2}]').hexdigest()
    assert stable_hash("a", {"y": 2, "x": 1}) == full[:16]
    assert stable_hash("a", {"y": 2, "x": 1}, length=40) == full[:40]
    assert Pair(1, "x").key() == stable_hash("toy", "1-x")


def test_architectures_are_equal_by_space_and_canonical_form_only():
    assert Pair(1, "x") == Pair(1, "x") and hash(Pair(1, "x")) == hash(Pair(1, "x"))
    assert Pair(1, "x") != Pair(1, "y")
    assert Pair(1, "x") != Other(1, "x")  # the same form in another space
    assert Pair(1, "x") != "1-x"
    assert repr(Pair(1, "x")) == "Pair('1-x')"


def test_the_seen_index_counts_forms_labels_them_and_matches_a_key_alone_by_key():
    seen = SeenIndex()
    assert len(seen) == 0 and Pair(1) not in seen and Pair(1).key() not in seen
    assert seen.add(Pair(1), "node 1") is True
    assert seen.add(Pair(1), "node 9") is False  # the first label stays
    assert Pair(1) in seen and Pair(1).key() in seen and Pair(2) not in seen
    assert seen.where(Pair(1)) == "node 1" and seen.where(Pair(1).key()) == "node 1"
    assert seen.where(Pair(2)) is None and seen.where("nokey") is None
    assert seen.add_form(Pair(1).key(), "collision", "node 2") is True  # same key, another form: two entries
    assert len(seen) == 2 and seen.where(Pair(1)) == "node 1"
    assert seen.add_key("k", "state") is True and seen.add_key("k", "again") is False
    assert seen.add_key(Pair(1).key()) is False
    assert len(seen) == 3 and "k" in seen and seen.where("k") == "state"


# ---------------------------------------------------------------- constraint

@pytest.mark.parametrize("size, flops", [(15, 0.05e9), (16, 0.05e9), (17, 0.2e9), (32, 0.2e9)])
def test_nb201_limits_are_the_imagenet16_ones_up_to_16_pixels(size, flops):
    assert Constraint.nb201(size) == Constraint(flops=flops, params=1.5e6)


def test_filled_takes_only_the_open_limits_from_the_default():
    default = Constraint(flops=5.0, params=7.0)
    assert Constraint().filled(default) == default
    assert Constraint(flops=1.0).filled(default) == Constraint(flops=1.0, params=7.0)
    assert Constraint(params=2.0).filled(default) == Constraint(flops=5.0, params=2.0)
    assert Constraint(1.0, 2.0).filled(default) == Constraint(1.0, 2.0)
    assert Constraint(params=3.0).to_dict() == {"flops": None, "params": 3.0}


@pytest.mark.parametrize("c, active", [(Constraint(), False), (Constraint(flops=1), True),
                                       (Constraint(params=1), True), (Constraint(1, 1), True)])
def test_a_constraint_is_active_when_either_limit_is_set(c, active):
    assert c.active is active


@pytest.mark.parametrize("c, params, flops, fits", [
    (Constraint(flops=10, params=5), 5, 10, True),    # both at their limits
    (Constraint(flops=10, params=5), 4, 9, True),
    (Constraint(flops=10, params=5), 6, 10, False),
    (Constraint(flops=10, params=5), 5, 11, False),
    (Constraint(params=5), 5, 1e30, True),
    (Constraint(flops=10), 1e30, 10, True),
    (Constraint(), 1e30, 1e30, True),
])
def test_fits_takes_each_limit_inclusively(c, params, flops, fits):
    assert c.fits(params, flops) is fits


@pytest.mark.parametrize("c, cost, why", [
    (Constraint(flops=2e6), Cost(params=10, flops=2_000_001), "2.00 MFLOPs exceeds the limit of 2.00 MFLOPs"),
    (Constraint(flops=2e6), Cost(params=10, flops=2_000_000), None),
    (Constraint(params=1e6), Cost(params=1_000_001, flops=0), "1.000 M params exceeds the limit of 1.000 M"),
    (Constraint(params=1e6), Cost(params=1_000_000, flops=0), None),
    (Constraint(flops=1e6, params=1e6), Cost(params=3e6, flops=2e6), "2.00 MFLOPs exceeds the limit of 1.00 MFLOPs"),
    (Constraint(), Cost(params=3e9, flops=3e9), None),
])
def test_a_violation_names_the_first_limit_broken(c, cost, why):
    assert c.violation(Toy(cost=cost), Pair(1, "x")) == why


def test_a_space_that_cannot_price_meets_any_constraint_but_refuses_one_at_set_up():
    assert Constraint(flops=1).violation(Toy(), Pair(1, "x")) is None
    Constraint().validate(Toy(), Pair(1, "x"))
    Constraint(flops=1).validate(Toy(cost=Cost(1, 1)), Pair(1, "x"))
    with pytest.raises(ConfigError) as info:
        Constraint(params=1).validate(Toy(), Pair(1, "x"))
    assert str(info.value) == ("constraint: space 'toy' cannot measure FLOPs/params before evaluation; "
                               "drop the constraint or use a space with a cost model")


@pytest.mark.parametrize("node, message", [
    ({"flops": 0}, "c.flops must be a positive number or null, got 0"),
    ({"params": -0.5}, "c.params must be a positive number or null, got -0.5"),
    ({"params": True}, "c.params must be a positive number or null, got True"),
    ({"flops": "1e9"}, "c.flops must be a positive number or null, got '1e9'"),
    ("1e9", "c must be a mapping with flops/params, got '1e9'"),
])
def test_a_limit_must_be_a_positive_number(node, message):
    with pytest.raises(ConfigError) as info:
        Constraint.from_config(node, "c")
    assert str(info.value) == message


def test_the_smallest_limits_and_none_are_accepted():
    assert Constraint.from_config(None) == Constraint()
    assert Constraint.from_config({"flops": 1, "params": 0.5}) == Constraint(1, 0.5)
    assert Constraint.from_config({"flops": None}) == Constraint()
    with pytest.raises(ConfigError, match=r"^constraint\.flops must be a positive number or null, got 0$"):
        Constraint(flops=0)


# ---------------------------------------------------------------- dotted

def test_flatten_names_each_leaf_by_its_path_and_an_empty_mapping_has_none():
    assert dotted.flatten({"a": {"b": 1, "c": {"d": [2]}}, "e": None, "f": {}, 3: "x"}) == {
        "a.b": 1, "a.c.d": [2], "e": None, "3": "x"}
    assert dotted.flatten({"b": 1}, "top") == {"top.b": 1}


@pytest.mark.parametrize("name, neutral", [
    ("evaluator.sandbox", True), ("evaluator.sandbox.memory_mb", True), ("evaluator.params.sandbox.cpus", True),
    ("evaluator.sandboxes", False), ("evaluator", False), ("strategy.llm.timeout_s", True),
    ("strategy.llm.model", False), ("evaluator.data.root", True), ("evaluator.data.name", False),
])
def test_result_neutral_settings_are_the_listed_names_and_what_they_hold(name, neutral):
    assert dotted.result_neutral(name) is neutral


# ---------------------------------------------------------------- registry

def test_a_registry_names_its_entries_sorted_refuses_a_second_and_says_what_is_valid():
    reg: Registry[Any] = Registry("widget", "nasflow.test-no-such-group")
    assert reg.names() == []
    with pytest.raises(ConfigError) as info:
        reg.get("a")
    assert str(info.value) == "unknown widget 'a' (valid: none registered)"

    @reg.register("b")
    class B:
        def __init__(self, space: Any, size: int = 1, rate: float = 0.5, on: bool = False, tag: str = "") -> None:
            self.space, self.size, self.rate, self.on, self.tag = space, size, rate, on, tag

    @reg.register("a")
    class A:
        pass

    assert reg.names() == ["a", "b"] and reg.get("b") is B and B.name == "b"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"^widget 'a' registered twice$"):
        reg.register("a")(A)
    with pytest.raises(ConfigError) as info:
        reg.get("c")
    assert str(info.value) == "unknown widget 'c' (valid: a, b)"
    made = reg.create("b", {"size": 3, "rate": 2}, space="s")
    assert (made.space, made.size, made.rate) == ("s", 3, 2)
    with pytest.raises(ConfigError) as info:
        reg.create("b", {"space": 1}, space="s")  # a context name is not a parameter
    assert str(info.value) == "widget 'b': unknown parameter 'space' (accepted: on, rate, size, tag)"


def fn(self, a: int, b: float, c: bool, d: str, e: list, f: int = 0, *, g: int | None = None) -> None:
    """A constructor's signature (its annotations strings, as `from __future__ import annotations` leaves them)."""


def rest(self, a: int = 0, **others: Any) -> None:
    """Takes any other key, for itself to check."""


@pytest.mark.parametrize("params, message", [
    ({"a": 1, "b": 1.5, "c": True, "d": "x", "e": [1], "f": 2, "g": "any"}, None),
    ({"b": 2, "a": None}, None),                     # an int where a float is taken; None for anything
    ({"a": True}, "w: parameter 'a' must be int, got True"),
    ({"a": 1.0}, "w: parameter 'a' must be int, got 1.0"),
    ({"b": True}, "w: parameter 'b' must be float, got True"),
    ({"b": "1"}, "w: parameter 'b' must be float, got '1'"),
    ({"c": 1}, "w: parameter 'c' must be bool, got 1"),
    ({"d": 1}, "w: parameter 'd' must be str, got 1"),
    ({"f": "2"}, "w: parameter 'f' must be int, got '2'"),
    ({"z": 1}, "w: unknown parameter 'z' (accepted: a, b, c, d, e, f, g)"),
])
def test_check_params_refuses_unknown_keys_and_scalars_of_the_wrong_type(params, message):
    if message is None:
        check_params("w", fn, params, skip=set())
        return
    with pytest.raises(ConfigError) as info:
        check_params("w", fn, params, skip=set())
    assert str(info.value) == message


def test_check_params_leaves_other_keys_to_a_rest_parameter_and_skips_context_names():
    check_params("w", rest, {"a": 1, "other": "x"}, skip=set())
    with pytest.raises(ConfigError, match=r"^w: parameter 'a' must be int, got 'x'$"):
        check_params("w", rest, {"a": "x"}, skip=set())
    with pytest.raises(ConfigError, match=r"^w: unknown parameter 'a' \(accepted: none\)$"):
        check_params("w", lambda self, a=0: None, {"a": 1}, skip={"a"})


@pytest.mark.parametrize("value, ok", [(1, True), (7, True), (0, False), (-1, False), (True, False), (1.0, False)])
def test_a_count_is_an_integer_of_at_least_one(value, ok):
    if ok:
        check_count("w", value)
        return
    with pytest.raises(ConfigError) as info:
        check_count("w", value)
    assert str(info.value) == f"w must be an integer >= 1, got {value!r}"


@pytest.mark.parametrize("data, valid, message", [
    ({"a": 1}, ("a", "b"), None),
    ({}, (), None),
    ({"z": 1}, ("b", "a"), "w: unknown key 'z' (valid: b, a)"),
    ({"z": 1, "y": 2, "a": 0}, ("a",), "w: unknown keys 'y', 'z' (valid: a)"),
    ({1: 1}, (), "w: unknown key '1' (valid: none)"),
])
def test_check_keys_names_every_unknown_key_and_every_valid_one_in_order(data, valid, message):
    if message is None:
        check_keys("w", data, valid)
        return
    with pytest.raises(ConfigError) as info:
        check_keys("w", data, valid)
    assert str(info.value) == message


def test_check_keys_raises_the_error_asked_for_and_names_the_thing():
    with pytest.raises(EncodingError, match=r"^e: unknown field 'q' \(valid: p\)$"):
        check_keys("e", {"q": 0}, ["p"], what="field", error=EncodingError)


# ---------------------------------------------------------------- space

def test_indices_features_and_size_follow_the_decisions():
    toy = Toy()
    assert toy.from_indices([2, 0]) == Pair(3, "x") and toy.to_indices(Pair(3, "y")) == [2, 1]
    assert toy.features(Pair(2, "y")) == [0.0, 1.0, 0.0, 0.0, 1.0]
    assert toy.size() == 6
    with pytest.raises(ValueError):
        toy.from_indices([0])  # one index short


def test_to_indices_refuses_a_space_whose_values_are_one_short():
    class Short(Toy):
        def to_values(self, arch: Pair) -> list[Any]:
            return list(arch.values)[:1]

    with pytest.raises(ValueError):
        Short().to_indices(Pair(1, "x"))


def test_sample_draws_one_index_per_decision_from_its_choices():
    rng = Rng(2, 1)
    assert Toy().sample(rng) == Pair(3, "y") and rng.bounds == [3, 2]  # type: ignore[arg-type]


def test_mutate_changes_the_drawn_decision_to_another_of_its_values():
    toy = Toy([Decision("a", (1, 2, 3)), Decision("b", ("x", "y")), Decision("c", (True, False))])
    rng = Rng(0, 1)  # decision a; of its others (1, 3) the second
    assert toy.mutate(Pair(2, "x", True), rng) == Pair(3, "x", True) and rng.bounds == [3, 2]  # type: ignore[arg-type]
    rng = Rng(1, 0)
    assert toy.mutate(Pair(2, "x", True), rng) == Pair(2, "y", True) and rng.bounds == [3, 1]  # type: ignore[arg-type]


def test_mutate_redraws_a_move_that_changes_nothing_and_samples_after_a_hundred():
    class Canonical(Toy):  # b is inactive: every value of it makes the same network
        def from_values(self, values: list[Any]) -> Pair:
            return Pair(values[0], "x")

    rng = Rng(1, 0, 0, 0)  # b (no change), then a's first other value
    assert Canonical().mutate(Pair(1, "x"), rng) == Pair(2, "x") and rng.bounds == [2, 1, 2, 2]  # type: ignore[arg-type]
    fixed = Toy([Decision("a", (1,)), Decision("b", ("x",))])
    rng = Rng(*[0] * 100, 0, 0)
    assert fixed.mutate(Pair(1, "x"), rng) == Pair(1, "x")  # type: ignore[arg-type]
    assert rng.bounds == [2] * 100 + [1, 1]  # a hundred draws of a decision, then the sample's two


def test_a_space_s_class_defaults_are_a_trusted_closed_untrainable_space_without_a_table():
    assert (SearchSpace.open_ended, SearchSpace.trusted, SearchSpace.source_trusted, SearchSpace.trainable,
            SearchSpace.tabular, SearchSpace.sizing, SearchSpace.file_suffix) == (False, True, True, False, False,
                                                                                 None, None)
    assert OpenEndedSpace.open_ended is True and CategoricalSpace.open_ended is False


def test_a_decision_and_a_cost_are_frozen_values():
    import dataclasses

    for value, name in ((Decision("a", (1,)), "name"), (Cost(1, 2), "params")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, name, 0)
    assert Decision("a", (1, 2)) == Decision("a", (1, 2)) and hash(Decision("a", (1,))) == hash(Decision("a", (1,)))


def test_a_space_s_defaults_say_what_it_lacks():
    toy = Toy()
    assert SearchSpace.cost(toy, Pair(1)) is None and toy.cost_mismatch({}) is None
    assert toy.input_size(Pair(1)) is None and toy.describe() == "search space 'toy'"
    assert SearchSpace.size(toy) is None and toy.read("[1, 2]", "f") == Pair("[", "1", ",", " ", "2", "]")
    with pytest.raises(ConfigError, match=r"^space 'toy' has no benchmark table \(evaluator=table needs one\)$"):
        toy.benchmark(None, "acc", 10, 32)


def test_a_space_s_params_are_its_constructor_settings_kept_as_attributes():
    class Sized(Toy):
        def __init__(self, width: int = 4, depth: int = 2, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            self.width = width

    assert Sized(8).params() == {"width": 8}  # depth is not kept: left out


def test_an_unbuildable_architecture_is_named_and_untrusted_source_is_sandbox_only():
    class Nb(Pair):
        space = "nb201"

    class Src(Pair):
        space = "source"

    toy = Toy()
    with pytest.raises(EvaluationError) as info:
        toy.build(Nb(1), 10)
    assert str(info.value) == f"space 'toy' builds no network of a nb201 architecture (Nb {Nb(1).key()})"
    sandbox = ("model source runs only in the sandbox, never in-process (space 'toy'): "
               "use space=source with evaluator=train, which trains each model file in its sandbox")
    assert str(toy.unbuildable(Src(1))) == sandbox
    toy.trusted = False  # type: ignore[misc]
    assert str(toy.unbuildable(Nb(1))) == sandbox


def test_the_default_source_rebuilds_through_nasflow():
    class Bare(Toy):
        def __init__(self) -> None:
            super().__init__()

    text = Bare().source(Pair(1, "x"), 10, 1, 28)
    assert "SPACE = 'toy'\nPARAMS = {}\nENCODING = [1, 'x']\n" in text
    assert "def Network(num_classes=10, in_channels=1, input_size=28):" in text
    assert "def Network(num_classes=5, in_channels=3, input_size=32):" in Bare().source(Pair(1, "x"), 5)


def test_sizing_options_accept_only_the_sizing_keys_and_every_trainable_space_s_when_asked():
    nb201 = SPACES.get("nb201")

    class Takes:
        def __init__(self, space: Any, epochs: int = 1, **sizing: Any) -> None:
            pass

    assert nb201.sizing_options({}, "e", Takes) == nb201.build_options({})
    with pytest.raises(ConfigError) as info:
        nb201.sizing_options({"skeleton": "x"}, "e", Takes)  # nader's, not nb201's
    assert str(info.value).startswith("e: unknown parameter 'skeleton' (accepted: ")
    assert "epochs" in str(info.value) and "skeleton" not in str(info.value).split("accepted: ")[1]
    with pytest.raises(ConfigError) as info:
        nb201.sizing_options({"zz": 1}, "e", Takes, every_space=True)
    accepted = str(info.value).split("accepted: ")[1].rstrip(")").split(", ")
    known = {f for s in ("nb201", "nader") for f in SPACES.get(s).sizing.__dataclass_fields__}
    assert accepted == sorted({"epochs", *known})
    assert SPACES.get("spos").build_options({"width": 3}) == {}


def test_an_open_ended_space_has_no_random_moves_and_reads_its_base_by_name_or_path(tmp_path):
    class Open(OpenEndedSpace[Pair]):
        name = "open"

        def decode(self, encoding: Any) -> Pair:
            return Pair(encoding)

    with pytest.raises(ConfigError, match=r"^space 'open' has no random samples; use an LLM design strategy$"):
        Open().sample(Rng())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^space 'open' has no random moves; use an LLM design strategy$"):
        Open().mutate(Pair(1), Rng())  # type: ignore[arg-type]
    assert OpenEndedSpace.read_base("p", ("p", "q"), str.upper, "block") == "P"
    (tmp_path / "b.txt").write_text("mine", encoding="utf-8")
    assert OpenEndedSpace.read_base(str(tmp_path / "b.txt"), ("p",), str.upper, "block") == "mine"
    with pytest.raises(ConfigError) as info:
        OpenEndedSpace.read_base(str(tmp_path), ("p", "q"), str.upper, "block")
    assert str(info.value) == f"block base {str(tmp_path)!r}: not a packaged one (p, q) nor an existing file"


# ---------------------------------------------------------------- trial

def record(**fields: Any) -> dict[str, Any]:
    return {"trial": 0, "key": "k", "encoding": [1], "accuracy": 50.0, "metrics": {}, "params": None,
            "flops": None, "error": None, **fields}


def test_a_result_is_ok_with_an_accuracy_and_no_error_and_round_trips():
    assert EvalResult(1.0).ok and not EvalResult(None).ok and not EvalResult(1.0, error="e").ok
    fail = EvalResult.failure("boom", 2.5)
    assert (fail.accuracy, fail.error, fail.cost_seconds, fail.ok) == (None, "boom", 2.5, False)
    assert EvalResult.failure("boom").cost_seconds == 0.0
    r = EvalResult(9.0, {"m": 1.0}, 3, 4, 1.5, None, [0.5])
    assert EvalResult.from_dict(r.to_dict()) == r and r.to_dict()["curve"] == [0.5]


def test_a_trial_rounds_its_seconds_to_six_places_and_keeps_the_candidate_s_info():
    t = Trial.of(4, Candidate(Pair(1, "x"), {"origin": "random"}), EvalResult(9.0, cost_seconds=1.23456789),
                 cached=True, wall_seconds=2.0000004)
    assert t.index == 4 and t.record.to_json() == {
        "trial": 4, "key": Pair(1, "x").key(), "encoding": [1, "x"], "accuracy": 9.0, "metrics": {},
        "params": None, "flops": None, "error": None, "cost_seconds": 1.234568, "wall_seconds": 2.0,
        "cached": True, "strategy": {"origin": "random"}}
    assert Trial.of(0, Candidate(Pair(1)), EvalResult(1.0)).record.cached is False


def test_the_optional_fields_are_written_only_when_set():
    r = TrialRecord.from_json(record(curve=[1.0], ask=0, screened=True, score=0.0), "h:1")
    out = r.to_json()
    assert (out["curve"], out["ask"], out["screened"], out["score"]) == ([1.0], 0, True, 0.0)
    plain = TrialRecord.from_json(record(), "h:1").to_json()
    assert not {"curve", "ask", "screened", "score"} & set(plain)
    assert json.loads(json.dumps(out)) == out


@pytest.mark.parametrize("line, message", [
    ([], "h:3: not a JSON object"),
    ({k: v for k, v in record().items() if k != "metrics"}, "h:3: field 'metrics' missing"),
    (record(trial=True), "h:3: field 'trial' must be an integer, got True"),
    (record(key=1), "h:3: field 'key' must be a string, got 1"),
    (record(encoding=None), "h:3: field 'encoding' must be not null, got None"),
    (record(accuracy=float("nan")), "h:3: field 'accuracy' must be null or a finite number, got nan"),
    (record(accuracy=True), "h:3: field 'accuracy' must be null or a finite number, got True"),
    (record(params="1"), "h:3: field 'params' must be null or a number, got '1'"),
    (record(error=1), "h:3: field 'error' must be null or a string, got 1"),
    (record(cost_seconds=None), "h:3: field 'cost_seconds' must be a number, got None"),
    (record(cached=0), "h:3: field 'cached' must be true or false, got 0"),
    (record(strategy=[]), "h:3: field 'strategy' must be an object, got []"),
    (record(curve=[1, "2"]), "h:3: field 'curve' must be a list of numbers, got [1, '2']"),
    (record(ask=1.0), "h:3: field 'ask' must be an integer, got 1.0"),
    (record(screened=None), "h:3: field 'screened' must be true or false, got None"),
    (record(score=float("inf")), "h:3: field 'score' must be null or a finite number, got inf"),
    (record(error="e"), "h:3: fields 'error' and 'accuracy' are both set; a failed trial has no accuracy"),
    (record(encoding="x" * 39), None),
    (record(key=["x" * 40]), "h:3: field 'key' must be a string, got ['" + "x" * 37 + "…"),
    (record(key=[1, 22, 333, 4444, 55555, 666666, 7777]), "h:3: field 'key' must be a string, got "
                                                          "[1, 22, 333, 4444, 55555, 666666, 7777]"),
])
def test_each_field_of_a_history_line_is_checked_with_a_one_line_error(line, message):
    if message is None:
        assert TrialRecord.from_json(line, "h:3").encoding == "x" * 39
        return
    with pytest.raises(RunDirError) as info:
        TrialRecord.from_json(line, "h:3")
    assert str(info.value) == message


def test_a_record_is_read_at_its_own_line_only(tmp_path):
    assert record_at(tmp_path / "h", 0, record()).trial == 0
    with pytest.raises(RunDirError) as info:
        record_at(tmp_path / "h", 2, record(trial=1))
    assert str(info.value) == f"{tmp_path / 'h'}:3: field 'trial' is 1 but line 3 holds trial 2"
    failed = TrialRecord.from_json(record(accuracy=None, error="e", score=None), "h:1")
    assert (failed.ok, failed.score) == (False, None) and TrialRecord.from_json(record(), "h:1").ok


def rec(i: int, acc: float | None, forged: bool = False, screened: bool = False) -> TrialRecord:
    return TrialRecord(i, f"k{i}", [i], acc, {"self_reported": True} if forged else {}, params=1, flops=2,
                       error=None if acc is not None else "e", screened=screened)


def test_a_self_reported_success_counts_for_best_only_when_trusted_and_is_told_unscored():
    forged, plain, failed = rec(0, 90.0, forged=True), rec(1, 50.0), rec(2, None)
    assert forged.self_reported and not plain.self_reported
    assert forged.counts_for_best(True) and not forged.counts_for_best(False)
    assert plain.counts_for_best(False) and not failed.counts_for_best(True)
    told = forged.as_told(False)
    assert (told.accuracy, told.params, told.flops, told.error, told.ok) == (None, None, None, UNSCORED, False)
    assert forged.as_told(True) is forged and plain.as_told(False) is plain and failed.as_told(False) is failed


def test_best_is_the_first_of_the_highest_that_count_and_the_curve_skips_the_screened():
    history = [rec(0, None), rec(1, 60.0), rec(2, 99.0, forged=True), rec(3, 70.0, screened=True),
               rec(4, 60.0), rec(5, 65.0)]
    assert best_record(history, False) is history[3]
    assert best_record([rec(0, 5.0), rec(1, 5.0)], False).trial == 0  # type: ignore[union-attr]
    assert best_record(history, True) is history[2] and best_record([rec(0, None)], True) is None
    assert evaluated(history) == [history[i] for i in (0, 1, 2, 4, 5)]
    assert best_so_far(history) == [None, 60.0, 60.0, 60.0, 65.0]
    assert best_so_far(history, True) == [None, 60.0, 99.0, 99.0, 99.0]


def test_a_draft_is_its_text_and_cannot_be_decoded():
    d = Draft("bad text", "nader")
    assert (d.canonical(), d.encode(), d.space) == ("bad text", "bad text", "nader")
    assert d.key() == stable_hash("nader", "bad text")
    with pytest.raises(EncodingError, match=r"^a rejected draft cannot be decoded into an architecture$"):
        Draft.decode("bad text")

"""Behaviours that are a set or a boundary, tested as tables of cases rather than one example:
which HTTP statuses the LLM client retries (the scripted server sends each one), the summary's
and `nas compare`'s trial counts at, below and above each listed value, and checks that must
fail both ways (a score that dropped and one that rose, a graph's output above and below the
network's, two lessons of different kinds with the same text)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from nas.compare import MIN_PAIRS, aggregate, beyond_warning, paired_tests
from nas.core.trial import TrialRecord
from nas.export import ExportError
from nas.export.graph import GRAPH_TOLERANCE, output_diff
from nas.knowledge.idea import Idea
from nas.knowledge.store import EXPERIENCE_KINDS, Experience
from nas.llm import LLMClient, LLMError
from nas.search.loop import summarise
from nas.search.spec import Component, SearchSpec
from support.scripted import ScriptedServer, Step

# --- the LLM client's retry set, status by status --------------------------------------------------

# A status the endpoint may answer again differently (timeout, conflict, rate limit, server trouble)
# is retried; one that says the request itself is wrong (or not allowed) is final.
RETRIED = (408, 409, 429, 500, 502, 503, 504)
FINAL = (400, 401, 403, 404, 422)
MAX_RETRIES = 2


def client_for(server: ScriptedServer, tmp_path, sleeps: list[float]) -> LLMClient:
    return LLMClient({"backend": "openai", "base_url": server.base_url, "model": "m",
                      "api_key_env": "NASFLOW_TEST_KEY", "timeout_s": 5, "max_retries": MAX_RETRIES,
                      "backoff_s": 0.01, "cache": False, "structured": "none"}, sleep=sleeps.append)


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-case-tables")


# Beside the listed statuses, the edges of the rule (`nas/llm/client.py`: below 500 final but 408, 409
# and 429): the neighbours of its exceptions, the last 4xx, and the 5xx no list above names.
EDGE_RETRIED = (501, 505, 507, 599)
EDGE_FINAL = (405, 407, 410, 428, 430, 499)


@pytest.mark.parametrize("status", RETRIED + FINAL)
def test_each_http_status_is_retried_or_final(status, tmp_path):
    """Always failing: a retried status is asked max_retries + 1 times, then one LLMError saying it
    gave up; a final status is asked once, with no wait, and the error names the status."""
    retried_or_final(status, status in RETRIED, tmp_path)


@pytest.mark.parametrize("status", EDGE_RETRIED + EDGE_FINAL)
def test_each_status_at_the_edges_of_the_retry_set_is_retried_or_final(status, tmp_path):
    """Every 5xx is retried, not only the common ones; the 4xx next to 408, 409 and 429 are final."""
    retried_or_final(status, status in EDGE_RETRIED, tmp_path)


def retried_or_final(status: int, retried: bool, tmp_path) -> None:
    sleeps: list[float] = []
    with ScriptedServer([Step(fault=str(status))] * (MAX_RETRIES + 1)) as srv:
        client = client_for(srv, tmp_path, sleeps)
        with pytest.raises(LLMError) as info:
            client.complete("proposer", "x")
        asked = len(srv.requests)
    usage = client.usage.to_dict()["roles"]["proposer"]
    if retried:
        assert asked == MAX_RETRIES + 1 and len(sleeps) == MAX_RETRIES
        assert f"gave up after {MAX_RETRIES + 1} tries" in str(info.value)
        assert usage["retries"] == MAX_RETRIES
    else:
        assert asked == 1 and sleeps == [] and usage["retries"] == 0
        assert f"endpoint refused the request (HTTP {status})" in str(info.value)


@pytest.mark.parametrize("status", RETRIED)
def test_a_retried_status_then_a_reply_is_that_reply(status, tmp_path):
    sleeps: list[float] = []
    with ScriptedServer([Step(fault=str(status)), "fine"]) as srv:
        reply = client_for(srv, tmp_path, sleeps).complete("proposer", "x")
        assert len(srv.requests) == 2
    assert reply.text == "fine" and len(sleeps) == 1


def test_the_statuses_tabled_are_the_ones_the_issue_lists():
    assert sorted(RETRIED + FINAL) == [400, 401, 403, 404, 408, 409, 422, 429, 500, 502, 503, 504]


# --- budgets: at, below and above each listed trial count ---------------------------------------------

CHECKPOINTS = (10, 25, 50, 100, 200, 500)  # summary.json's best_at (nas/search/loop.py `summarise`)
SPEC = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"),
                  seed=0, trials=600)


def records(n: int, start: float = 0.0) -> list[TrialRecord]:
    """n successful trials whose accuracy rises by one each: best-so-far at trial t is start + t - 1."""
    return [TrialRecord(trial=i, key=f"k{i}", encoding=i, accuracy=start + i) for i in range(n)]


@pytest.mark.parametrize("length", sorted({m for n in CHECKPOINTS for m in (n - 1, n, n + 1)}))
def test_summary_best_at_holds_each_checkpoint_the_run_reached(length):
    best_at = summarise(SPEC, records(length), 1.0, resumed=0, runner="local", exhausted=None)["best_at"]
    assert best_at == {str(n): float(n - 1) for n in CHECKPOINTS if n <= length}


def runs(lengths: list[int], offset: float = 0.0) -> list[dict]:
    return [{"seed": seed, "curve": [offset + t for t in range(n)], "run": f"r{seed}", "setting": "nb201/table", "space": "nb201",
             "evaluator": "table", "strategy": "s"} for seed, n in enumerate(lengths)]


AT = (1, 5, 10, 25, 50)  # `nas compare --at` values tried


@pytest.mark.parametrize("n", AT)
def test_compare_counts_a_run_at_n_only_when_it_reached_n(n):
    """Runs of n - 1, n and n + 1 trials: two count at n (each with its n-th best), and the
    warning names n as beyond the shortest; at n - 1 all three count and no warning."""
    group = {"g": runs([n - 1, n, n + 1])}
    cell = aggregate(group, [n])["g"]["at"][str(n)]
    assert cell["n"] == 2 and cell["mean"] == n - 1
    warning = beyond_warning(group, [n])
    assert warning is not None and warning.startswith(f"--at {n}:")
    if n > 1:
        assert aggregate(group, [n - 1])["g"]["at"][str(n - 1)]["n"] == 3 and beyond_warning(group, [n - 1]) is None


@pytest.mark.parametrize("n", AT)
def test_paired_tests_pair_only_runs_that_reached_n(n):
    lengths = [n - 1] + [n] * MIN_PAIRS + [n + 1]
    groups = {"base": [{**r, "strategy": "random"} for r in runs(lengths)],
              "other": [{**r, "strategy": "rea"} for r in runs(lengths, offset=1.0)]}
    cell = paired_tests(groups, "random", [n])["other"]["at"][str(n)]
    assert cell["pairs"] == MIN_PAIRS + 1 and cell["better"] == MIN_PAIRS + 1


@pytest.mark.parametrize("pairs", [MIN_PAIRS - 1, MIN_PAIRS, MIN_PAIRS + 1])
def test_a_p_value_needs_min_pairs(pairs):
    groups = {"base": [{**r, "strategy": "random"} for r in runs([3] * pairs)],
              "other": [{**r, "strategy": "rea"} for r in runs([3] * pairs, offset=1.0)]}
    cell = paired_tests(groups, "random", [3])["other"]["at"]["3"]
    assert cell["pairs"] == pairs
    assert (cell["p_value"] is not None) == (pairs >= MIN_PAIRS)
    assert (cell["reason"] is None) == (pairs >= MIN_PAIRS)


# --- checks that must fail both ways ------------------------------------------------------------------

@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("size, passed", [(0.0, True), (0.5, True), (0.999, True), (1.001, False), (3.0, False)])
def test_graph_output_check_fails_above_and_below_the_networks(sign, size, passed):
    """Off by `size` tolerances (at scale max(1, |ref|) = 2), up or down."""
    ref = torch.tensor([[2.0, -1.0, 0.5]])
    out = ref.clone()
    out[0, 1] += sign * size * GRAPH_TOLERANCE * 2.0
    assert output_diff("m", out, ref)["passed"] is passed


def test_graph_output_of_another_shape_fails():
    assert output_diff("m", torch.zeros(1, 3), torch.zeros(1, 4)) == {"method": "m", "max_abs_diff": None,
                                                                       "passed": False}


@pytest.fixture(scope="module")
def supernet_ev(tmp_path_factory):
    """A supernet evaluator of the `_small` AutoFormer preset, trained one epoch on 64 digits."""
    from conftest import space_preset
    from nas.search.spec import build_evaluator
    from nas.spaces import SPACES
    from supernets.train import SupernetSettings, train_supernet

    params = space_preset("autoformer_small")
    space = SPACES.create(params.pop("name"), params)
    settings = SupernetSettings(epochs=1, batch_size=64, train_subset=64, val_subset=50, recal_batches=1)
    path = train_supernet({"name": space.name, **space.params()}, {}, {"name": "digits"}, settings, seed=0,
                          out_dir=tmp_path_factory.mktemp("supernet"), progress=False).path
    return build_evaluator(Component("supernet", {"checkpoint": str(path), "recal_batches": 1, "batch_size": 64,
                                                   "val_subset": 50}), space)


@pytest.mark.parametrize("delta, refused", [(0.0, False), (0.9, False), (-0.9, False), (1.2, True), (-1.2, True),
                                            (30.0, True), (-30.0, True)])
def test_export_refuses_a_weights_score_that_dropped_or_rose(supernet_ev, delta, refused):
    """The search recorded `valid + delta`: the rescored weights are refused when they now score
    more than a point below it, or more than a point above it."""
    from nas.export.trusted import from_weights

    ev = supernet_ev
    arch = ev.space.sample(np.random.default_rng(0))
    sub = ev.weights(arch)
    valid, _ = ev.rescore(sub, arch)
    record = TrialRecord(trial=0, key=arch.key(), encoding=arch.encode(), accuracy=valid + delta)
    if refused:
        with pytest.raises(ExportError, match="its weights or the data changed since"):
            from_weights(ev, sub, ev.provenance(arch), ev.space, arch, record, lambda _: None)
    else:
        built = from_weights(ev, sub, ev.provenance(arch), ev.space, arch, record, lambda _: None)
        assert built.weights["valid_accuracy"] == round(valid, 4)


@pytest.mark.parametrize("a, b, same", [
    (("Use a 5x5 kernel.", "tip"), ("Use a 5x5 kernel.", "suggestion"), False),
    (("Use a 5x5 kernel.", "suggestion"), ("Use a 5x5 kernel.", "tip"), False),
    (("Use a 5x5 kernel.", "tip"), ("use a  5x5 KERNEL", "tip"), True),     # the same lesson, spelt apart
    (("Use a 5x5 kernel.", "tip"), ("Use a 3x3 kernel.", "tip"), False),
    (("Use a 5x5 kernel.", "suggestion"), ("Use a 3x3 kernel.", "suggestion"), False),
])
def test_experiences_are_one_record_only_with_the_same_kind_and_text(a, b, same):
    """The store replaces a record by id: a tip and a suggestion of one text are two records."""
    assert set(EXPERIENCE_KINDS) == {"tip", "suggestion"}
    first, second = Experience(text=a[0], kind=a[1]), Experience(text=b[0], kind=b[1])
    assert (first.id == second.id) is same


@pytest.mark.parametrize("a, b, same", [
    ("Add a squeeze-excite gate.", "add a squeeze-excite gate", True),
    ("Add a squeeze-excite gate.", "Add a squeeze-excite gate after the stem.", False),
    ("Add a squeeze-excite gate after the stem.", "Add a squeeze-excite gate.", False),
])
def test_ideas_are_one_record_only_with_the_same_text(a, b, same):
    assert (Idea(a).id == Idea(b).id) is same
    assert Idea(a, source="x").id == Idea(a, source="y").id  # where it was read says nothing of what it is



# --- the sandbox's limits: each at, below and just above its bound ----------------------------------

def limit_case(field: str, value: object, taken: bool, refusal: str) -> None:
    """`Limits(field=value)` keeps the value when `taken`, else is refused in one line matching `refusal`."""
    from nas.errors import ConfigError
    from nas.sandbox.limits import Limits

    if taken:
        assert getattr(Limits(**{field: value}), field) == value
    else:
        with pytest.raises(ConfigError, match=refusal):
            Limits(**{field: value})


@pytest.mark.parametrize("field", ["wall_s", "cpu_s", "memory_mb", "file_mb", "tmp_mb"])
@pytest.mark.parametrize("value, taken", [(-1, False), (0, False), (float("nan"), False), (1, True)])
def test_each_sandbox_limit_must_be_positive(field, value, taken):
    """A limit of zero, below it or NaN (which no comparison passes) is refused in one line naming it;
    NaN in a whole-number field is refused as not whole, in wall_s as not > 0."""
    limit_case(field, value, taken, rf"^Limits\.{field} must be (> 0|a whole number), got ")


@pytest.mark.parametrize("field", ["cpu_s", "memory_mb", "file_mb", "tmp_mb", "nprocs"])
@pytest.mark.parametrize("value", [0.5, 512.0, "512", True, None])
def test_each_rlimit_must_be_a_whole_number(field, value):
    """The rlimits take whole numbers: a float that passed `> 0` raised a TypeError inside every child."""
    limit_case(field, value, False, rf"^Limits\.{field} must be a whole number, got ")


@pytest.mark.parametrize("value, taken", [(2.5, True), (7, True), ("60", False), (True, False)])
def test_the_wall_clock_may_be_fractional_but_must_be_a_number(value, taken):
    limit_case("wall_s", value, taken, r"^Limits\.wall_s must be a number, got ")


@pytest.mark.parametrize("value, taken", [(-1, False), (0, True), (1, True)])
def test_the_process_headroom_may_be_zero_but_not_below(value, taken):
    limit_case("nprocs", value, taken, r"^Limits\.nprocs must be >= 0, got -1$")

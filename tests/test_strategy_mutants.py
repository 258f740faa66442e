"""Small checks of nas/strategies and tasks/ that a mutation run (benchmarks/mutation.py) found
untested: documented defaults, bananas' neighbour draws, Optuna's resume with echoes in flight,
and the Prefect tasks' failure, cache and log handling."""

from __future__ import annotations

import inspect
import json
import logging
import uuid

import numpy as np
import optuna  # the `test` extra installs it (nasflow[optuna])
import pytest
import yaml
from pydantic import ValidationError

from conftest import ROOT
from nas.core.space import CategoricalSpace, Decision
from nas.core.trial import Candidate, EvalResult, SearchExhausted, Trial
from nas.errors import ConfigError
from nas.evaluators.table import TableEvaluator
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import NB201Space
from nas.strategies import STRATEGIES
from nas.strategies.optuna_sampler import OptunaSampler

SPACE = NB201Space()
RUNNING, COMPLETE, FAIL = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE,
                           optuna.trial.TrialState.FAIL)


@pytest.fixture(scope="module")
def table() -> TableEvaluator:
    return TableEvaluator(SPACE)


# --- defaults ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted((ROOT / "conf" / "strategy").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_strategy_built_in_python_has_the_defaults_its_config_documents(path):
    """`Bananas(space, seed)` from a script must search as `strategy=bananas` does: every plain value
    of conf/strategy/<name>.yaml (interpolations aside) is the constructor's default."""
    conf = yaml.safe_load(path.read_text())
    params = inspect.signature(STRATEGIES.get(conf.pop("name")).__init__).parameters
    documented = {k: v for k, v in conf.items() if not (isinstance(v, str) and v.startswith("${"))}
    defaults = {k: params[k].default for k in documented if k in params}
    assert set(defaults) == set(documented), f"config keys the constructor does not take: {set(documented) - set(defaults)}"
    differ = {k: (defaults[k], v) for k, v in documented.items()
              if defaults[k] != v and not (defaults[k] is None and isinstance(v, dict))}  # a mapping: filled in
    assert differ == {}, "(constructor default, documented value)"


def test_bananas_takes_one_as_the_smallest_start_pool_and_parent_count():
    strategy = STRATEGIES.create("bananas", {"n_init": 1, "pool": 1, "parents": 1, "members": 1, "epochs": 1},
                                 space=SPACE, seed=0)
    assert (strategy.n_init, strategy.pool, strategy.parents) == (1, 1, 1)
    for name in ("n_init", "pool", "parents"):
        with pytest.raises(ConfigError, match=f"{name} must be an integer >= 1, got 0"):
            STRATEGIES.create("bananas", {name: 0}, space=SPACE, seed=0)


def test_only_a_strategy_with_a_random_start_is_called_random_search_in_disguise():
    from nas.strategies.base import random_only_note

    for name in ("random", "reinforce", "optuna"):  # no random start: one trial is already the strategy's
        assert STRATEGIES.get(name).random_start({}) == 0 and random_only_note(name, {}, 1) is None, name
    assert "random search in disguise" in random_only_note("rea", {}, 20)


# --- bananas' neighbours -----------------------------------------------------------------------------------

def test_every_neighbour_bananas_draws_is_one_decision_away_so_one_draw_is_enough(table):
    """Each draw of a neighbourhood round changes one decision to *another* of its choices: with
    one draw a round (pool 1, max_attempts 10) BANANAS proposes a predicted neighbour of its best
    candidate every time, never falling back to a random one for a draw that changed nothing."""
    for seed in range(40):
        strategy = STRATEGIES.create("bananas", {"n_init": 2, "pool": 1, "parents": 1, "members": 1, "epochs": 1,
                                                 "steps": 1, "max_attempts": 10}, space=SPACE, seed=seed)
        start = strategy.ask(2)
        strategy.tell([Trial.of(i, c, table.evaluate(c.arch)) for i, c in enumerate(start)])
        [cand] = strategy.ask(1)
        assert cand.info["origin"] == "predicted", f"seed {seed}: {cand.info}"
        best = max(start, key=lambda c: table.evaluate(c.arch).accuracy or 0.0)
        assert cand.info["parent"] == best.arch.key()
        changed = [a != b for a, b in zip(SPACE.to_values(cand.arch), SPACE.to_values(best.arch), strict=True)]
        assert sum(changed) == 1, f"seed {seed}"


class TwoOpCells(NB201Space):
    """NB201 cells with two ops per edge: every decision is binary."""

    OPS = ("nor_conv_3x3", "skip_connect")

    def decisions(self) -> list[Decision]:
        return [Decision(d.name, self.OPS) for d in super().decisions()]

    def sample(self, rng: np.random.Generator) -> NB201Cell:
        return CategoricalSpace.sample(self, rng)


def test_bananas_mutates_binary_decisions_too():
    """A decision of two choices has a neighbour (its other choice): BANANAS proposes predicted
    neighbours in a space of binary decisions, not random candidates for want of any."""
    space = TwoOpCells()
    strategy = STRATEGIES.create("bananas", {"n_init": 2, "members": 1, "epochs": 1, "steps": 1}, space=space, seed=0)
    start = strategy.ask(2)
    strategy.tell([Trial.of(i, c, EvalResult(accuracy=50.0 + i)) for i, c in enumerate(start)])
    proposed = strategy.ask(3)
    assert [c.info["origin"] for c in proposed] == ["predicted"] * 3


def test_bananas_scores_at_most_pool_neighbours_and_fills_the_rest_at_random(table):
    strategy = STRATEGIES.create("bananas", {"n_init": 2, "pool": 1, "members": 1, "epochs": 1, "steps": 1},
                                 space=SPACE, seed=0)
    start = strategy.ask(2)
    strategy.tell([Trial.of(i, c, table.evaluate(c.arch)) for i, c in enumerate(start)])
    assert [c.info["origin"] for c in strategy.ask(2)] == ["predicted", "random"]


def test_bananas_gives_up_after_as_many_draws_as_its_error_says():
    class Counted(TwoOpCells):
        draws = 0

        def sample(self, rng: np.random.Generator) -> NB201Cell:
            self.draws += 1
            return super().sample(rng)

    space = Counted()
    strategy = STRATEGIES.create("bananas", {"n_init": 2, "max_attempts": 2}, space=space, seed=0)
    every = [space.from_indices([(i >> b) & 1 for b in range(6)]) for i in range(64)]
    strategy.tell([Trial.of(i, Candidate(a), EvalResult(accuracy=float(i))) for i, a in enumerate(every)])
    space.draws = 0
    with pytest.raises(SearchExhausted, match="no unvisited architecture in 20 samples"):
        strategy.ask(1)
    assert space.draws == 20


def test_a_restored_bananas_learns_from_the_trials_it_was_told_and_no_failed_one(table):
    """A failed trial that still carries an accuracy (history.jsonl lines are read as they are) is
    left out on resume as it is when told: the resumed predictor fits what the uninterrupted one did."""
    told = STRATEGIES.create("bananas", {"n_init": 2}, space=SPACE, seed=0)
    cands = told.ask(3)
    results = [table.evaluate(c.arch) for c in cands]
    results[1] = EvalResult(accuracy=99.0, error="evaluator crashed: RuntimeError: after the score")
    trials = [Trial.of(i, c, r) for i, (c, r) in enumerate(zip(cands, results, strict=True))]
    told.tell(trials)
    restored = STRATEGIES.create("bananas", {"n_init": 2}, space=SPACE, seed=0)
    restored.restore([t.record for t in trials])
    assert [r.key for r in restored.history] == [r.key for r in told.history] == [cands[0].arch.key(),
                                                                                  cands[2].arch.key()]


# --- Optuna: resume with echoes in flight ---------------------------------------------------------------

def _crashed_with_an_echo(table) -> tuple[OptunaSampler, list[Candidate], Candidate, Candidate, dict]:
    """A search stopped with two candidates in flight (trials 4 and 6) and trial 5 an echo: Optuna
    proposed candidate 4 again while it was being evaluated."""
    a = STRATEGIES.create("optuna", {"sampler_params": {"n_startup_trials": 3}}, space=SPACE, seed=3)
    told = a.ask(4)
    a.tell([Trial.of(i, c, table.evaluate(c.arch)) for i, c in enumerate(told)])
    [x] = a.ask(1)
    a.study.enqueue_trial(a._params(x.arch))
    [y] = a.ask(1)
    assert (x.info["optuna_trial"], y.info["optuna_trial"]) == (4, 6)
    return a, told, x, y, json.loads(json.dumps(a.state_dict()))


def _resumed(table, told: list[Candidate], state: dict, in_flight: list[Candidate]) -> OptunaSampler:
    b = STRATEGIES.create("optuna", {"sampler_params": {"n_startup_trials": 3}}, space=SPACE, seed=99)
    b.load_state_dict(state)
    b.restore([Trial.of(i, c, table.evaluate(c.arch)).record for i, c in enumerate(told)])
    b.reclaim(in_flight)
    return b


def test_an_echo_of_a_reclaimed_candidate_runs_again_and_is_told_with_it(table):
    a, told, x, y, state = _crashed_with_an_echo(table)
    b = _resumed(table, told, state, [x, y])
    assert [c.arch.key() for c in b.ask(2)] == [c.arch.key() for c in a.ask(2)]
    assert [t.state for t in b.study.get_trials(deepcopy=False)[4:7]] == [RUNNING] * 3
    b.tell([Trial.of(4, x, table.evaluate(x.arch))])
    echo = b.study.get_trials(deepcopy=False)[5]
    assert echo.state == COMPLETE and echo.value == pytest.approx(table.evaluate(x.arch).accuracy)


def test_a_candidate_not_requeued_and_its_echo_are_failed_trials_on_resume(table):
    """Resumed with fewer trials, only candidate 6 is evaluated again: trial 4 and its echo are lost."""
    a, told, x, y, state = _crashed_with_an_echo(table)
    b = _resumed(table, told, state, [y])
    b.ask(1)
    assert [t.state for t in b.study.get_trials(deepcopy=False)[4:7]] == [FAIL, FAIL, RUNNING]


# --- tasks/llm.py and tasks/records.py ----------------------------------------------------------------------

def test_only_llm_task_failures_lose_their_traceback_record():
    import tasks.llm  # noqa: F401  (installs the filter on Prefect's task-run logger)

    runs = logging.getLogger("prefect.task_runs")

    def kept(task_run_name: str) -> bool:
        record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1,
                                   "Task run failed with exception: RuntimeError('boom')", None, None)
        record.task_run_name = task_run_name
        return bool(runs.filter(record))

    assert not kept("llm-mutator")
    assert kept("evaluate-0abc") and kept("train-supernet")


def test_an_llm_call_record_from_the_model_or_the_reply_cache_is_read_and_one_from_elsewhere_is_not():
    from tasks.llm import call_shape

    reply = {"reply": "ok", "finish_reason": "stop", "prompt_tokens": 3, "completion_tokens": 1, "latency_s": 0.2}
    assert call_shape([reply, 0, "live"]) is None and call_shape([reply, 2, "cache"]) is None
    assert call_shape([reply, 0, "elsewhere"]) == "bad retries or source"
    for retries in (-1, True, 1.0):  # a count is a non-negative int, never a bool
        assert call_shape([reply, retries, "live"]) == "bad retries or source", retries


def test_the_shared_serializer_cannot_be_switched_to_another_type():
    """A record names its serializer, and Prefect decodes it with that one: the shared plain-JSON
    serializer stays plain JSON (never 'pickle') whatever code holds it."""
    from tasks.records import SERIALIZER, SERIALIZER_TYPE

    with pytest.raises(ValidationError):
        SERIALIZER.type = "pickle"
    assert SERIALIZER.type == SERIALIZER_TYPE


@pytest.fixture
def counted_fetch():
    """A fetch that counts its calls and reports 2 retries (what the client had to do live)."""
    calls: list[int] = []
    reply = {"reply": "a block", "finish_reason": "stop", "prompt_tokens": 5, "completion_tokens": 2,
             "latency_s": 0.1}

    def fetch():
        calls.append(1)
        return reply, 2, "live"

    return fetch, calls, reply


def test_llm_calls_as_prefect_tasks_cache_hits_say_so_and_uncached_calls_leave_nothing(prefect_home, counted_fetch):
    from prefect import flow

    from tasks.llm import prefect_calls

    fetch, calls, reply = counted_fetch
    cached_key, uncached_key = uuid.uuid4().hex, uuid.uuid4().hex

    @flow(persist_result=False)
    def calls_in_a_flow() -> list:
        return [prefect_calls("mutator", cached_key, fetch, True), prefect_calls("mutator", cached_key, fetch, True),
                prefect_calls("mutator", uncached_key, fetch, False),
                prefect_calls("mutator", uncached_key, fetch, True),
                prefect_calls("mutator", cached_key, fetch, False)]

    first, hit, uncached, after, stored_but_uncached = calls_in_a_flow()
    assert first == (reply, 2, "live")
    assert hit == (reply, 0, "cache")            # the model was not asked, so nothing was retried
    assert uncached == (reply, 2, "live")
    assert after == (reply, 2, "live")           # llm.cache=false left no record to answer from
    assert stored_but_uncached == (reply, 2, "live")  # ... nor reads the record a cached call left
    assert len(calls) == 4


@pytest.mark.parametrize("cached, rejected, options", [
    (True, False, {}),  # Prefect's store answers when it can
    (True, True, {"refresh_cache": True}),  # a refused record: asked again, the new reply kept
    (False, False, {"refresh_cache": True, "persist_result": False}),  # neither read nor kept
])
def test_an_llm_calls_task_reads_and_keeps_replies_only_when_cached(cached, rejected, options):
    from tasks.llm import call_options

    assert call_options(cached, rejected) == options


def test_an_evaluation_task_that_raised_is_a_failed_trial_saying_why(prefect_home):
    from prefect import flow, task

    from tasks.evaluate import outcome

    @task(persist_result=False)
    def crashes() -> dict:
        raise RuntimeError("out of memory")

    @flow(persist_result=False)
    def evaluate() -> tuple[EvalResult, bool]:
        return outcome(crashes.submit())

    result, cached = evaluate()
    assert result.error == "evaluator crashed: RuntimeError: out of memory" and result.accuracy is None
    assert cached is False


def test_reinforce_s_first_reward_is_its_own_baseline_so_one_trial_moves_nothing():
    """The baseline is the bias-corrected moving average of the rewards (NB201's reinforce.py):
    after one trial it is that reward, the advantage is zero and the policy stays uniform."""
    strategy = STRATEGIES.create("reinforce", {}, space=SPACE, seed=0)
    before = [p.copy() for p in strategy.probs()]
    [cand] = strategy.ask(1)
    strategy.tell([Trial.of(0, cand, EvalResult(accuracy=70.0))])
    assert all(np.allclose(a, b) for a, b in zip(strategy.probs(), before, strict=True))
    [second] = strategy.ask(1)
    strategy.tell([Trial.of(1, second, EvalResult(accuracy=90.0))])  # above the baseline: made likelier
    probs = strategy.probs()
    assert all(p[a] > 1 / len(p) for p, a in zip(probs, second.info["actions"], strict=True))


def test_reinforce_learns_from_a_candidate_it_did_not_draw():
    """A trial told without the policy's actions (a candidate from elsewhere) is learned from
    by its decisions' indices."""
    strategy = STRATEGIES.create("reinforce", {}, space=SPACE, seed=0)
    rng = np.random.default_rng(1)
    first, second = SPACE.sample(rng), SPACE.sample(rng)
    strategy.tell([Trial.of(0, Candidate(first), EvalResult(accuracy=70.0))])
    strategy.tell([Trial.of(1, Candidate(second), EvalResult(accuracy=90.0))])
    probs = strategy.probs()
    assert all(p[a] > 1 / len(p) for p, a in zip(probs, SPACE.to_indices(second), strict=True))


def test_evaluations_as_prefect_tasks_come_back_by_ticket_and_a_ticket_runs_once(prefect_home, table):
    from prefect import flow

    from nas.search.spec import Component, SearchSpec
    from tasks.evaluate import PrefectExecutor

    spec = SearchSpec(space=Component("nb201"), evaluator=Component("table"), strategy=Component("random"),
                      seed=0, trials=2)
    rng = np.random.default_rng(0)
    cands = [Candidate(SPACE.sample(rng)) for _ in range(2)]

    @flow(persist_result=False)
    def evaluate() -> tuple[list, str]:
        executor = PrefectExecutor(spec, spec.build_evaluator(spec.build_space()), retries=0, cached=False)
        outcomes = executor.evaluate(cands)
        executor.submit(7, cands[0])
        with pytest.raises(ValueError) as twice:
            executor.submit(7, cands[1])
        executor.close()
        return [r.accuracy for r, _, _ in outcomes], str(twice.value)

    accuracies, refusal = evaluate()
    assert accuracies == [table.evaluate(c.arch).accuracy for c in cands]
    assert refusal == "ticket 7 is already running"


def test_a_termination_s_crash_line_is_dropped_as_an_interrupt_s_is():
    """`nas search` says in one line what a Ctrl-C or a SIGTERM stopped: Prefect's crash line for
    either is dropped, on flow and task runs, and nothing else is."""
    from tasks.env import configure_prefect_env, quiet_termination

    loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    saved = [list(log.filters) for log in loggers]
    try:
        configure_prefect_env()  # the interrupt's filter first, as every process has it
        quiet_termination()
        for log in loggers:
            for line, kept in (("Crash detected! Execution was aborted by an interrupt signal.", False),
                               ("Crash detected! Execution was aborted by a termination signal.", False),
                               ("Finished in state Failed('boom')", True)):
                record = logging.LogRecord(log.name, logging.ERROR, __file__, 1, line, None, None)
                assert bool(log.filter(record)) is kept, (log.name, line)
    finally:
        for log, filters in zip(loggers, saved, strict=True):
            log.filters[:] = filters


def test_prefect_s_ephemeral_server_is_started_under_the_guard():
    """The server module's `subprocess` is a shim whose Popen starts it under nas/llm/guard.py,
    so it stops when the process that started it dies (conftest configured Prefect as `nas` does)."""
    import subprocess

    import prefect.server.api.server as server

    assert server.subprocess is not subprocess and server.subprocess.Popen is not subprocess.Popen
    assert issubclass(server.subprocess.Popen, subprocess.Popen)

"""strategy=optuna (nas/strategies/optuna_sampler.py): Optuna's samplers through ask-and-tell.
Its share of the strategy contract is in tests/test_strategies.py and tests/test_strategy_contract.py;
here: its one-line errors, repeats answered from the history, the journal replayed on resume so a
killed search continues as if uninterrupted (in-process and through the real CLI), and the constraint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna  # the `test` extra installs it (nasflow[optuna])
import pytest

from conftest import NAS, ROOT
from nas.core.constraint import Constraint
from nas.core.trial import Candidate, EvalResult, Trial, read_history
from nas.errors import ConfigError
from nas.evaluators.table import TableEvaluator
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.rundir import RunDir
from nas.search.spec import Component, SearchSpec
from nas.spaces.nb201.space import NB201Space
from nas.strategies import STRATEGIES
from nas.strategies.optuna_sampler import JOURNAL, OptunaSampler

SPACE = NB201Space()


@pytest.fixture(scope="module")
def table() -> TableEvaluator:
    return TableEvaluator(SPACE)


def make(seed: int = 0, **params: Any) -> OptunaSampler:
    strategy = STRATEGIES.create("optuna", params, space=SPACE, seed=seed)
    assert isinstance(strategy, OptunaSampler)
    return strategy


def tell(strategy: OptunaSampler, cands: list[Candidate], table: TableEvaluator, start: int) -> None:
    strategy.tell([Trial.of(start + i, c, table.evaluate(c.arch)) for i, c in enumerate(cands)])


# --- one-line errors -------------------------------------------------------------------------------------

def test_unknown_sampler_is_one_line_listing_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        make(sampler="bohb")
    assert str(info.value) == ("strategy 'optuna': unknown sampler 'bohb' "
                               "(valid: tpe, gp, nsga2, random, cmaes, qmc)")


def test_sampler_params_reach_the_constructor_and_bad_ones_are_one_line():
    assert make(sampler_params={"n_startup_trials": 3}).sampler._n_startup_trials == 3
    assert make(sampler_params={"multivariate": False}).sampler._multivariate is False
    with pytest.raises(ConfigError, match=r"^strategy 'optuna': sampler 'tpe' \(TPESampler\): .*'n_startup'$"):
        make(sampler_params={"n_startup": 3})
    with pytest.raises(ConfigError, match=r"^strategy 'optuna': sampler_params.seed is not taken; the search's seed"):
        make(sampler_params={"seed": 1})
    with pytest.raises(ConfigError, match=r"^strategy 'optuna': max_repeats must be an integer >= 1, got 0$"):
        make(max_repeats=0)


def test_without_optuna_installed_the_error_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` raises ImportError
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value) == "strategy 'optuna' needs Optuna: pip install 'nasflow[optuna]'"


def test_importing_the_registry_does_not_import_optuna():
    code = "import sys; import nas.strategies, nas.strategies.rea; print('optuna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


# --- repeats ---------------------------------------------------------------------------------------------

def test_a_repeat_is_told_its_known_accuracy_and_never_proposed(table):
    """Optuna made to propose an evaluated architecture again (enqueued): that trial is told the
    accuracy the history has, and the candidate asked is another architecture."""
    s = make(seed=1)
    first = s.ask(2)
    tell(s, first, table, 0)
    s.study.enqueue_trial(s._params(first[0].arch))
    [cand] = s.ask(1)
    assert cand.arch not in {c.arch for c in first}
    repeat = s.study.get_trials(deepcopy=False)[2]
    assert s._arch(repeat.params) == first[0].arch
    assert repeat.state == optuna.trial.TrialState.COMPLETE
    assert repeat.value == pytest.approx(table.evaluate(first[0].arch).accuracy)
    assert cand.info == {"origin": "optuna", "optuna_trial": 3}
    assert s.report([])["optuna"]["repeats_answered"] == 1


def test_a_proposal_of_a_candidate_being_evaluated_is_told_with_it(table):
    s = make(seed=1)
    [a] = s.ask(1)
    s.study.enqueue_trial(s._params(a.arch))
    [b] = s.ask(1)
    assert b.arch != a.arch
    echo = s.study.get_trials(deepcopy=False)[1]
    assert echo.state == optuna.trial.TrialState.RUNNING
    tell(s, [a, b], table, 0)
    echo = s.study.get_trials(deepcopy=False)[1]
    assert echo.state == optuna.trial.TrialState.COMPLETE
    assert echo.value == pytest.approx(table.evaluate(a.arch).accuracy)


def test_when_optuna_only_repeats_a_random_unvisited_architecture_is_enqueued(table):
    s = make(seed=2, max_repeats=1)
    [a] = s.ask(1)
    tell(s, [a], table, 0)
    s.study.enqueue_trial(s._params(a.arch))  # the next proposal repeats a: one repeat is all it may
    [b] = s.ask(1)
    assert b.info["origin"] == "random" and b.arch != a.arch
    assert s._arch(s.study.get_trials(deepcopy=False)[b.info["optuna_trial"]].params) == b.arch


# --- resume ----------------------------------------------------------------------------------------------

def spec_of(trials: int, constraint: Constraint = Constraint(), **params: Any) -> SearchSpec:
    return SearchSpec(space=Component("nb201"), seed=4, trials=trials, evaluator=Component("table"),
                      strategy=Component("optuna", {"sampler_params": {"n_startup_trials": 5}, **params}),
                      constraint=constraint)


class Interrupting(LocalExecutor):
    """Raises KeyboardInterrupt at its `at`-th evaluation: a search stopped with a candidate asked,
    its Optuna trial running in the journal but in no saved state."""

    def __init__(self, spec: SearchSpec, at: int) -> None:
        super().__init__(spec.build_evaluator(spec.build_space()), None)
        self.at, self.done = at, 0

    def evaluate(self, candidates):
        self.done += len(candidates)
        if self.done >= self.at:
            raise KeyboardInterrupt
        return super().evaluate(candidates)


def search(spec: SearchSpec, run_dir: Path, executor: LocalExecutor | None = None) -> list[str]:
    executor = executor or LocalExecutor(spec.build_evaluator(spec.build_space()), None)
    SearchLoop(spec, run_dir, executor, progress=False).run_search()
    return [r.key for r in read_history(run_dir / "history.jsonl")]


@pytest.mark.parametrize("constraint", [Constraint(), Constraint(flops=45e6)], ids=["free", "flops"])
def test_a_stopped_search_resumes_as_if_uninterrupted(tmp_path, constraint):
    """Stopped mid-evaluation (the journal holds a trial the state does not count), then resumed:
    the same candidates in the same order as an uninterrupted search, none twice; the journal is
    Optuna's format and holds the whole study (with the constraint: infeasible trials replayed too)."""
    spec = spec_of(40, constraint)
    reference = search(spec, tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        search(spec, tmp_path / "b", Interrupting(spec, at=23))
    assert RunDir(tmp_path / "b").saved_trials() == 22
    resumed = search(spec, tmp_path / "b")
    assert resumed == reference and len(set(resumed)) == 40
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "b" / JOURNAL)))
    study = optuna.load_study(study_name="nasflow", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert len(study.trials) == len(done) == summary["optuna"]["study_trials"] >= 40
    feasible = [t for t in done if all(v <= 0 for v in t.constraints.values())]
    assert {SPACE.from_values([t.params[d.name] for d in SPACE.decisions()]).key() for t in feasible} == set(resumed)
    assert len(done) - len(feasible) == summary["optuna"]["infeasible"]
    assert (summary["optuna"]["infeasible"] > 0) == constraint.active


def test_a_lost_journal_is_rebuilt_from_the_history_and_the_state(tmp_path):
    spec = spec_of(30)
    reference = search(spec, tmp_path / "a")
    search(spec_of(18), tmp_path / "b")
    (tmp_path / "b" / JOURNAL).unlink()
    resumed = search(spec, tmp_path / "b")  # budget raised: the same search, extended
    assert resumed == reference


def test_in_flight_candidates_are_reclaimed_as_running_trials(table):
    a = make(seed=3, sampler_params={"n_startup_trials": 3})
    told = a.ask(4)
    tell(a, told, table, 0)
    running = a.ask(2)  # being evaluated at the "crash"
    history = [Trial.of(i, c, table.evaluate(c.arch)).record for i, c in enumerate(told)]
    b = make(seed=99, sampler_params={"n_startup_trials": 3})
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    b.restore(history)
    b.reclaim(running)
    assert [c.arch.key() for c in b.ask(3)] == [c.arch.key() for c in a.ask(3)]
    states = [t.state for t in b.study.get_trials(deepcopy=False)]
    assert states[4:6] == [optuna.trial.TrialState.RUNNING] * 2
    tell(b, running, table, 4)
    assert b.study.get_trials(deepcopy=False)[4].state == optuna.trial.TrialState.COMPLETE


# --- constraint ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_over_the_limit_proposals_are_never_candidates(sampler, table):
    """Infeasible proposals are told as complete trials whose constraint values mark them (TPE models them)."""
    limit = Constraint(flops=40e6)
    s = make(seed=0, sampler=sampler, sampler_params={"n_startup_trials": 5} if sampler == "tpe" else {})
    s.constrain(limit)
    cands: list[Candidate] = []
    for _ in range(25):
        batch = s.ask(1)
        tell(s, batch, table, len(cands))
        cands += batch
    assert all(limit.violation(SPACE, c.arch) is None for c in cands)
    assert len({c.arch.key() for c in cands}) == 25
    report = s.report([])["optuna"]
    assert report["infeasible"] > 0
    over = [t for t in s.study.get_trials(deepcopy=False)
            if limit.violation(SPACE, s._arch(t.params)) is not None]
    assert len(over) == report["infeasible"]
    assert all(t.state == optuna.trial.TrialState.COMPLETE and t.constraints["flops"] > 0 for t in over)
    assert all(t.constraints["flops"] <= 0 for t in s.study.get_trials(deepcopy=False) if t not in over)


# --- the real CLI ----------------------------------------------------------------------------------------

def test_cli_kill_9_then_the_same_command_resumes_with_no_repeat_to_the_budget(tmp_path, nas_env):
    """`nas search strategy=optuna` on the table, killed (SIGKILL) after some trials, then the same
    command: the budget is reached with distinct candidates, the very ones of an uninterrupted run."""
    args = ["search", "space=nb201", "evaluator=table", "strategy=optuna", "budget.trials=30", "seed=2",
            "+strategy.sampler_params.n_startup_trials=5", "evaluator.simulated_cost_seconds=0.1",
            "runner=local", "progress=false"]
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    proc = subprocess.Popen([*NAS, *args, f"hydra.run.dir={run_dir}"], env=nas_env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 180
    while RunDir(run_dir).saved_trials() < 8:
        assert proc.poll() is None and time.monotonic() < deadline, "the search ended before the kill"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(read_history(run_dir / "history.jsonl"))
    assert 8 <= killed_at < 30

    resumed = subprocess.run([*NAS, *args, f"hydra.run.dir={run_dir}"], env=nas_env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    reference = subprocess.run([*NAS, *args, f"hydra.run.dir={ref_dir}"], env=nas_env, cwd=ROOT,
                               capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-2000:]

    keys = [r.key for r in read_history(run_dir / "history.jsonl")]
    assert len(keys) == len(set(keys)) == 30
    assert keys == [r.key for r in read_history(ref_dir / "history.jsonl")]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["trials"] == 30 and summary["resumed_trials"] >= 8 and summary["optuna"]["sampler"] == "tpe"


def test_failed_evaluations_are_told_as_failed_trials():
    s = make(seed=0)
    [c] = s.ask(1)
    s.tell([Trial.of(0, c, EvalResult.failure("out of memory"))])
    assert s.study.get_trials(deepcopy=False)[0].state == optuna.trial.TrialState.FAIL
    assert c.arch in s.seen


# --- benchmarks/peers.py ---------------------------------------------------------------------------------

def test_peers_benchmark_small_run_pairs_the_default_with_each_method(tmp_path):
    out = tmp_path / "peers.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--seeds", "3", "--trials", "30",
                        "--no-process", "--gp-timeout", "0", "--long-trials", "120", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["default_strategy"] == "bananas" and result["budgets"] == [25]
    others = {"random", "rea", "evolution", "optuna_tpe", "optuna_tpe_independent", "optuna_random"}
    assert set(result["methods"]) == others | {"bananas"}
    assert set(result["tests"]) == {f"bananas (default) vs {m}" for m in others}
    for m in result["methods"].values():
        assert m["seeds"] == [0, 1, 2] and 90 < m["best_at"]["25"]["mean"] <= result["table_optimum"]
        assert 0 < m["loop_seconds"]["cpu_mean"] and m["loop_seconds"]["to_100_mean"] is None  # 30 trials
    assert result["methods"]["optuna_tpe_independent"]["params"]["sampler_params"] == {"multivariate": False}
    test = result["tests"]["bananas (default) vs optuna_tpe"]
    assert test["seeds_paired"] == 3 and {"mean_diff", "wilcoxon_p", "mann_whitney_p", "verdict"} <= set(test["25"])
    for long in result["long"]["methods"].values():  # the long rows: loop seconds at 100 and at the end
        assert set(long["loop_cpu_seconds_at"]) == {"100", "120"} and set(long["cpu_seconds_per_100"]) == {"100-120"}
    assert (tmp_path / "peers.png").stat().st_size > 10_000


@pytest.mark.parametrize("number, kept", [(4, True), (0, True), (None, False), (True, False), ("4", False)])
def test_only_an_in_flight_candidate_with_a_trial_number_is_reclaimed_as_that_trial(table, number, kept):
    """A candidate's `optuna_trial` comes from the state file: only an integer (not a bool) names a trial."""
    import numpy as np

    s = make(seed=3, sampler_params={"n_startup_trials": 3})
    arch = SPACE.sample(np.random.default_rng(0))
    assert arch not in s.seen
    s.reclaim([Candidate(arch, info={"optuna_trial": number})])
    assert arch in s.seen  # seen either way: never proposed again
    assert s.reclaimed == ({number: arch} if kept else {})

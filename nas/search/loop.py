"""The ask → evaluate → tell loop. Executors decide *how* a batch is
evaluated (in-process here; as cached Prefect tasks in `tasks/`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from nas import __version__
from nas.core.trial import (
    Candidate,
    EvalResult,
    Outcome,
    SearchExhausted,
    Trial,
    TrialRecord,
    best_record,
    best_so_far,
    evaluated,
)
from nas.errors import ConfigError, EncodingError, RunDirError
from nas.evaluators.base import Evaluator, evaluate_safely
from nas.search.rundir import Resume, RunDir
from nas.search.screen import Screen
from nas.search.session import Session
from nas.search.spec import SearchSpec
from nas.strategies.base import random_only_note

log = logging.getLogger(__name__)
progress_log = logging.getLogger("nas.progress")  # search.log only under `nas search` (conf/config.yaml)
start_log = logging.getLogger("nas.start")  # the console's line under `nas search`, once the checks passed


class Executor(Protocol):
    def evaluate(self, candidates: list[Candidate]) -> list[Outcome]:
        """Evaluate a batch → (result, served_from_cache, wall_seconds) per candidate."""


@runtime_checkable
class AsyncExecutor(Protocol):
    """Keeps several evaluations running at once (`budget.in_flight`): the asynchronous loop
    submits a candidate whenever one finishes, instead of waiting for a whole batch."""

    def submit(self, ticket: int, candidate: Candidate) -> None:
        """Start evaluating `candidate`; `ticket` (its ask index) comes back with its outcome."""

    def next_done(self) -> tuple[int, Outcome]:
        """Block until one submitted evaluation finishes → (ticket, (result, cached, wall_seconds))."""

    def close(self) -> None:
        """Stop every worker; evaluations still running are abandoned (resume re-queues them)."""


class LocalExecutor:
    """Plain in-process evaluation: `nas/` without Prefect."""

    def __init__(self, evaluator: Evaluator, seed: int | None) -> None:
        self.evaluator = evaluator
        self.seed = seed

    def evaluate(self, candidates: list[Candidate]) -> list[Outcome]:
        if len(candidates) > 1 and self.evaluator.batched:  # e.g. several candidates on one GPU at once
            start = time.perf_counter()
            try:
                results = self.evaluator.evaluate_batch([c.arch for c in candidates], self.seed)
            except Exception as err:
                log.warning("evaluation of a batch of %d crashed: %s", len(candidates), err)
                results = [EvalResult.failure(f"evaluator crashed: {type(err).__name__}: {err}")] * len(candidates)
            wall = (time.perf_counter() - start) / len(candidates)
            return [(r, False, wall) for r in results]
        out = []
        for cand in candidates:
            start = time.perf_counter()
            try:
                result = evaluate_safely(self.evaluator, cand.arch, self.seed)
            except Exception as err:  # a crash of one candidate must not end the search
                log.warning("evaluation of %s crashed: %s", cand.arch.key(), err)
                result = EvalResult.failure(f"evaluator crashed: {type(err).__name__}: {err}")
            out.append((result, False, time.perf_counter() - start))
        return out


class SearchLoop:
    def __init__(self, spec: SearchSpec, run_dir: Path, executor: Executor, *,
                 progress: bool = True, runner: str = "local", llm_calls=None,
                 on_batch: Callable[[list[TrialRecord]], None] | None = None,
                 evaluator_fingerprint: str | None = None, session: Session | None = None) -> None:
        self.spec = spec
        self.evaluator_fingerprint = evaluator_fingerprint  # in summary.json: which table/data/recipe scored
        self.session = session
        self.run = session.run if session is not None else RunDir(run_dir)
        self.executor = executor
        self.progress = progress
        self.runner = runner
        self.llm_calls = llm_calls  # how LLM strategies' calls run (Prefect tasks under the flow)
        self.on_batch = on_batch  # sees the history after each batch is saved (the flow's progress artifact)
        # `session`: the run dir held and read, and the parts built (execute, the flow); a library
        # caller may leave it out, and the loop then builds and opens them itself
        search = session.search if session is not None else None
        self.space = search.space if search is not None else spec.build_space()
        self.strategy = search.strategy if search is not None else spec.build_strategy(self.space)
        self.history: list[TrialRecord] = []
        self._bar: tuple[Any, Any] = (None, None)
        self.screen = Screen(spec.screen, self.space, spec.seed)
        self.trust = trusts_self_reported(spec)  # what strategies learn from, as what counts for best

    @classmethod
    def of(cls, session: Session, executor: Executor, **options: Any) -> SearchLoop:
        """The loop of an opened session (`options`: `__init__`'s keywords)."""
        return cls(session.search.spec, session.run.path, executor, session=session, **options)

    def run_search(self) -> dict[str, Any]:
        """Search and save summary.json; the caller writes the human-facing report (nas.report)."""
        if self.spec.in_flight > 1 and not isinstance(self.executor, AsyncExecutor):
            raise ConfigError(f"budget.in_flight={self.spec.in_flight}: runner={self.runner} evaluates in "
                              f"batches only; use budget.in_flight=1 with it")
        if self.session is not None:  # its opener holds the lock until the search ends
            return self._search(self.session.resume)
        with self.run.lock():  # the whole search: nobody else appends or cuts history meanwhile
            return self._search(self.run.prepare(self.spec.identity_fields(), self.spec.batch_lines))

    def _search(self, resume: Resume | None) -> dict[str, Any]:
        self._fields = self.spec.identity_fields()
        self.history = []
        elapsed_before = 0.0
        if resume is not None:
            try:
                self.strategy.load_state_dict(resume.strategy_state)
            except RunDirError as err:
                raise RunDirError(f"{self.run.state_path}: {err}") from None
            try:
                self.strategy.restore(self._told(resume.history))
            except RunDirError as err:
                raise RunDirError(f"{self.run.history_path}: {err}") from None
            self.history = resume.history
            elapsed_before = resume.elapsed_seconds
            if resume.changed:  # the next saved state records them
                progress_log.info("resuming with changed settings that change no result: %s",
                                  "; ".join(resume.changed))
        resumed = check_budget(self.run.path, self.history, self.spec.trials)
        note = random_only_note(self.spec.strategy.name, self.spec.strategy.params, self.spec.trials)
        if note is not None:
            log.warning(note)
        mismatch = self.space.cost_mismatch(self.spec.evaluator.params) if self.spec.constraint.active else None
        if mismatch is not None:
            log.warning(mismatch)
        # before attach: an LLM strategy's one-off work (seeding the idea store) takes a while
        start_log.info("run dir: %s%s", self.run.path,
                       f" (resuming after {resumed} trial{'s' * (resumed != 1)})" if resumed else "")
        self.strategy.attach(self.run.path, self.llm_calls, self.progress)
        steady = self.spec.in_flight > 1
        self._elapsed_before, self._start = elapsed_before, time.perf_counter()
        if resume is None:  # before the first history line: a crash never leaves history without state
            self._save(**({"in_flight": [], "asked": 0} if steady else {}))
        progress_log.info("%s on %s: %d trials%s", self.spec.strategy.name, self.spec.space.name, self.spec.trials,
                          f", resuming after {resumed}" if resumed else "")
        with self._progress(resumed) as (bar, task):
            self._bar = (bar, task)
            client = self.strategy.client
            if bar is not None and client is not None:  # LLM calls on the bar
                client.on_status = lambda text: bar.update(task, llm=text)
            exhausted = self._steady(resume) if steady else self._batches()
        self.run.sync()  # the last trials' lines and state, as a lost machine would need them
        history = self.history
        if exhausted is not None:
            progress_log.warning("search ended after %d of %d trials: %s", len(evaluated(history)),
                                 self.spec.trials, exhausted)
        summary = summarise(self.spec, history, self._elapsed(),
                            resumed=resumed, runner=self.runner, exhausted=exhausted)
        if self.evaluator_fingerprint is not None:
            summary["evaluator_fingerprint"] = self.evaluator_fingerprint
        summary.update(self.strategy.report(history))
        self.run.save_summary(summary)
        return summary

    def _batches(self) -> str | None:
        """Ask a batch (screened when `screen.factor` > 1), evaluate the kept candidates whole,
        tell them all; returns why the strategy stopped early, if it did."""
        history = self.history
        while (done := len(evaluated(history))) < self.spec.trials:
            n = min(self.spec.batch_size, self.spec.trials - done)
            try:
                picks = self.screen.ask(self.strategy, n, self._told(history))
            except SearchExhausted as err:
                return str(err)
            outcomes = self._evaluate([p.candidate for p in picks if p.kept])
            self._record(self.screen.trials(picks, outcomes, len(history)))
        return None

    def _steady(self, resume: Resume | None) -> str | None:
        """Keep `budget.in_flight` evaluations running: as each finishes, record and tell it
        (history in completion order, each record with its ask index) and ask one more.
        The state saved with each step lists the candidates running, which a resume re-queues."""
        executor = self.executor
        assert isinstance(executor, AsyncExecutor)  # checked before the run dir was touched
        running: dict[int, Candidate] = {}
        asked = 0 if resume is None else resume.asked
        if resume is not None and resume.in_flight:
            try:
                running = {e["ask"]: Candidate(self.space.decode(e["encoding"]), e["info"]) for e in resume.in_flight}
            except EncodingError as err:
                raise RunDirError(f"{self.run.state_path}: in-flight candidate: {err}") from None
            room = max(self.spec.trials - len(self.history), 0)  # budget.trials may have been lowered
            if len(running) > room:
                log.info("budget.trials=%d leaves room for %d of the %d candidates in flight: the last asked "
                         "are dropped", self.spec.trials, room, len(running))
                running = {t: running[t] for t in sorted(running)[:room]}
            self.strategy.reclaim(list(running.values()))
            log.info("re-queued %d candidates that were being evaluated", len(running))
            for ticket, cand in running.items():
                executor.submit(ticket, cand)
        exhausted = None
        while True:
            fresh: dict[int, Candidate] = {}
            while exhausted is None and len(running) + len(fresh) < self.spec.in_flight and \
                    len(self.history) + len(running) + len(fresh) < self.spec.trials:
                try:
                    [fresh[asked]] = self.strategy.ask(1)
                except SearchExhausted as err:
                    exhausted = str(err)
                    break
                asked += 1
            running.update(fresh)
            if fresh:  # saved before they start: a crash from here on re-queues them
                self._save(in_flight=_entries(running), asked=asked)
            for ticket, cand in fresh.items():
                executor.submit(ticket, cand)
            if not running:
                return exhausted
            ticket, (result, cached, wall) = executor.next_done()
            trial = Trial.of(len(self.history), running.pop(ticket), result, cached, wall)
            trial.record.ask = ticket
            self._record([trial], in_flight=_entries(running), asked=asked)

    def _record(self, trials: list[Trial], **extra: Any) -> None:
        """Append, tell, then save the state: a crash in between leaves lines the state does not
        count, which resume cuts (their candidates are asked or re-queued again)."""
        records = [t.record for t in trials]
        self.run.append(records, sync=False)  # fsynced with a state, before one that counts them
        self.history.extend(records)
        self.strategy.tell([Trial(t.candidate, t.record.as_told(self.trust)) for t in trials])
        self._save(**extra)
        history = self.history
        best = best_record(history, self.trust)
        done = len(evaluated(history))
        progress_log.info("trial %d/%d, best %s, elapsed %.1fs", done, self.spec.trials,
                          "-" if best is None else f"{best.accuracy:.2f}", self._elapsed())
        if self.on_batch is not None:
            self.on_batch(history)
        bar, task = self._bar
        if bar is not None:
            bar.update(task, completed=done, best="-" if best is None else f"{best.accuracy:.2f}")

    def _told(self, history: list[TrialRecord]) -> list[TrialRecord]:
        """The history as the strategy and the screen's predictor learn from it (`TrialRecord.as_told`)."""
        return [r.as_told(self.trust) for r in history]

    def _elapsed(self) -> float:
        return self._elapsed_before + time.perf_counter() - self._start

    def _save(self, **extra: Any) -> None:
        self.run.save_state(self._fields, len(self.history), self.strategy.state_dict(), self._elapsed(), **extra)

    def _evaluate(self, candidates: list[Candidate]) -> list[Outcome]:
        """Rejected drafts become failed trials without reaching the evaluator."""
        valid = [c for c in candidates if c.rejected is None]
        results = iter(self.executor.evaluate(valid) if valid else [])
        return [(EvalResult.failure(c.rejected), False, 0.0) if c.rejected is not None else next(results)
                for c in candidates]

    def _progress(self, done: int):
        if not self.progress:
            return _NullProgress()
        from nas.search.console import search_progress  # lazy: loads rich (start-up time)

        progress = search_progress(f"[bold]{self.spec.strategy.name}[/] on {self.spec.space.name}", self.spec.trials)
        return _ProgressCtx(progress, self.spec.trials, done)


class _ProgressCtx:
    """The bar, with the console's log lines printed above it (`logs_above`) while it is live."""

    def __init__(self, progress: Any, total: int, done: int) -> None:
        self.progress, self.total, self.done = progress, total, done
        self.stack = ExitStack()

    def __enter__(self):
        from nas.search.console import logs_above  # lazy: loads rich (start-up time)

        self.stack.enter_context(self.progress)
        self.stack.enter_context(logs_above(self.progress))
        task = self.progress.add_task("search", total=self.total, completed=self.done, best="-", llm="")
        return self.progress, task

    def __exit__(self, *exc):
        return self.stack.__exit__(*exc)


class _NullProgress:
    def __enter__(self):
        return None, None

    def __exit__(self, *exc):
        return False


def _entries(running: dict[int, Candidate]) -> list[dict[str, Any]]:
    return [{"ask": t, "encoding": c.arch.encode(), "info": c.info} for t, c in sorted(running.items())]


def check_budget(path: Path, history: list[TrialRecord], trials: int) -> int:
    """The trials a resume keeps, refused when more than `trials`: rewriting summary.json with
    the lower budget would misreport the run."""
    resumed = len(evaluated(history))
    if resumed > trials:
        raise RunDirError(f"{path} already holds {resumed} trials, more than budget.trials={trials}: "
                          "raise budget.trials to extend it, or use a new hydra.run.dir")
    return resumed


def trusts_self_reported(spec: SearchSpec | dict[str, Any]) -> bool:
    """`evaluator.trust_self_reported` of a spec (or its `to_dict()`, as summary.json holds it)."""
    params = spec.evaluator.params if isinstance(spec, SearchSpec) else \
        ((spec.get("evaluator") or {}).get("params") or {})
    return params.get("trust_self_reported") is True


def summarise(spec: SearchSpec, history: list[TrialRecord], wall: float, *, resumed: int,
              runner: str, exhausted: str | None) -> dict[str, Any]:
    trials = evaluated(history)
    ok = [r for r in trials if r.accuracy is not None]
    trust = trusts_self_reported(spec)
    best = best_record(history, trust)
    curve = best_so_far(history, trust)
    checkpoints = {str(n): curve[n - 1] for n in (10, 25, 50, 100, 200, 500) if n <= len(curve)}
    return {
        "best": None if best is None else {
            k: getattr(best, k) for k in ("accuracy", "key", "encoding", "trial", "params", "flops")
        },
        "trials": len(trials), "failed": len(trials) - len(ok),
        **({"screened": len(history) - len(trials)} if spec.screen.active else {}),
        "self_reported": sum(1 for r in history if r.self_reported),
        "cache_hits": sum(1 for r in history if r.cached),
        "resumed_trials": resumed, "best_at": checkpoints,
        "strategy": spec.strategy.name, "space": spec.space.name,
        "evaluator": spec.evaluator.name, "seed": spec.seed, "runner": runner,
        "wall_seconds": round(wall, 3), "exhausted": exhausted,
        "spec": spec.to_dict(), "nasflow_version": __version__,
    }

"""Evaluation as a Prefect task, cached by its inputs across runs.

The cache key is (space config, evaluator config + fingerprint, encoding,
seed where the evaluator depends on it): an identical search replays from the
cache, and a resumed search never re-evaluates a finished candidate.
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS
from prefect.futures import PrefectFuture
from prefect.results import ResultRecord

from nas.core.trial import Candidate, EvalResult, Outcome
from nas.evaluators.base import Evaluator, evaluate_safely
from nas.search.spec import Component, SearchSpec, build_evaluator, build_space
from nas.secrets import install_log_scrubbing
from tasks.records import SERIALIZER, check_fields, is_number, read_record

log = logging.getLogger(__name__)


def _number_or_none(value: Any) -> bool:
    return value is None or is_number(value)


# The shape of `EvalResult.to_dict()`: a cached record is used only if it has it.
RESULT_FIELDS = {"accuracy": _number_or_none, "params": _number_or_none, "flops": _number_or_none,
                 "cost_seconds": is_number, "error": lambda v: v is None or isinstance(v, str),
                 "metrics": lambda v: isinstance(v, dict) and all(map(_number_or_none, v.values())),
                 "curve": lambda v: isinstance(v, list) and all(map(is_number, v))}


# The submitting search's own evaluator ((space, evaluator) configs as JSON, evaluator), set around
# each submission: a task run in this process (runner=prefect's threads, which copy the submitting
# context) uses it, as built by the flow already; one elsewhere builds its own (`_built`).
_OWN: ContextVar[tuple[str, str, Evaluator] | None] = ContextVar("nas_search_evaluator", default=None)


def _evaluator(space_json: str, evaluator_json: str) -> Evaluator:
    own = _OWN.get()
    if own is not None and own[:2] == (space_json, evaluator_json):
        return own[2]
    return _built(space_json, evaluator_json)


@lru_cache(maxsize=16)
def _built(space_json: str, evaluator_json: str) -> Evaluator:
    space_c, eval_c = Component(**json.loads(space_json)), Component(**json.loads(evaluator_json))
    return build_evaluator(eval_c, build_space(space_c, eval_c))


@task(cache_policy=INPUTS, persist_result=True, result_serializer=SERIALIZER, retries=1,
      retry_delay_seconds=1, task_run_name="evaluate-{key}")
def evaluate_task(space: dict[str, Any], evaluator: dict[str, Any], fingerprint: str,
                  encoding: Any, key: str, seed: int | None) -> dict[str, Any]:
    """Returns `EvalResult.to_dict()`; deterministic failures are results (cached),
    crashes raise (retried, never cached)."""
    install_log_scrubbing()  # in task worker processes too (runner=processes, dask, ray): they skip the CLI's
    ev = _evaluator(json.dumps(space, sort_keys=True), json.dumps(evaluator, sort_keys=True))
    arch = ev.space.decode(encoding)
    return evaluate_safely(ev, arch, seed).to_dict()


class PrefectExecutor:
    """Evaluations as concurrent task runs on the flow's task runner: a whole batch
    (`evaluate`) or one at a time as slots free up (`submit` / `next_done`, the `AsyncExecutor`
    protocol). `placement` wraps each submission (a cluster's GPU share and re-runs);
    `cached=False` runs every evaluation instead of reading Prefect's cache."""

    def __init__(self, spec: SearchSpec, evaluator: Evaluator, retries: int,
                 placement: Callable[[], AbstractContextManager[Any]] = nullcontext, cached: bool = True) -> None:
        self.space = {"name": spec.space.name, "params": dict(spec.space.params)}
        self.evaluator = {"name": spec.evaluator.name, "params": dict(spec.evaluator.params)}
        self.fingerprint = evaluator.fingerprint()
        self.own = (json.dumps(self.space, sort_keys=True), json.dumps(self.evaluator, sort_keys=True), evaluator)
        self.seed = spec.seed if evaluator.uses_seed else None
        self.refresh = evaluate_task.with_options(retries=retries, refresh_cache=True)
        self.task = evaluate_task.with_options(retries=retries) if cached else self.refresh
        self.placement = placement
        self._running: dict[int, tuple[PrefectFuture[Any], float]] = {}
        self._done: queue.SimpleQueue[int] = queue.SimpleQueue()  # tickets, in the order they finish

    def evaluate(self, candidates: list[Candidate]) -> list[Outcome]:
        first = max(self._running, default=-1) + 1
        for i, cand in enumerate(candidates):
            self.submit(first + i, cand)
        outcomes = dict(self.next_done() for _ in candidates)
        return [outcomes[first + i] for i in range(len(candidates))]

    def inputs(self, candidate: Candidate) -> dict[str, Any]:
        """`evaluate_task`'s arguments for `candidate`: what its cache key is made of."""
        return {"space": self.space, "evaluator": self.evaluator, "fingerprint": self.fingerprint,
                "encoding": candidate.arch.encode(), "key": candidate.arch.key(), "seed": self.seed}

    def submit(self, ticket: int, candidate: Candidate) -> None:
        if ticket in self._running:
            raise ValueError(f"ticket {ticket} is already running")
        inputs = self.inputs(candidate)
        task = self.task if check_cache_entry(inputs) else self.refresh
        with self.placement(), self.sharing():
            future = task.submit(**inputs)
        self._running[ticket] = (future, time.perf_counter())
        done = self._done  # a late callback after `close` goes to the queue it was registered with
        future.add_done_callback(lambda _: done.put(ticket))

    @contextmanager
    def sharing(self) -> Iterator[None]:
        """This search's evaluator for the task runs submitted in the block (`_evaluator`)."""
        token = _OWN.set(self.own)
        try:
            yield
        finally:
            _OWN.reset(token)

    def next_done(self) -> tuple[int, Outcome]:
        if not self._running:
            raise RuntimeError("next_done: nothing was submitted")
        ticket = self._done.get()
        future, start = self._running.pop(ticket)
        return ticket, (*outcome(future), time.perf_counter() - start)

    def close(self) -> None:
        """Cancels what is still running (`cancel`) and forgets it: the search stopped (an interrupt,
        an error), so no slot, GPU or cluster worker keeps evaluating for it; a resumed search
        re-queues those candidates."""
        for future, _ in self._running.values():
            cancel(future)
        self._running.clear()
        self._done = queue.SimpleQueue()


def cancel(future: PrefectFuture[Any]) -> None:
    """Ask the engine under `future` to stop it: a Dask future is cancelled running or not, a Ray
    task is cancelled (`ray.cancel`), a thread or process pool's future that has not started never
    starts (one already running in a thread cannot be stopped: it ends on its own, its result unread)."""
    wrapped = getattr(future, "wrapped_future", None)
    if wrapped is None:
        return
    ray = sys.modules.get("ray")  # a Ray future exists only where Ray is imported already
    if ray is not None and isinstance(wrapped, ray.ObjectRef):
        try:
            ray.cancel(wrapped)
        except Exception as err:  # a task that already finished, or a cluster gone: nothing left to stop
            log.debug("ray.cancel: %s", err)
    elif callable(getattr(wrapped, "cancel", None)):
        wrapped.cancel()


def outcome(future: PrefectFuture[Any]) -> tuple[EvalResult, bool]:
    """(result, served from the cache). A task that raised, or whose worker died more often than
    the engine re-runs it (Dask `KilledWorker`, Ray `WorkerCrashedError`), is a failed trial saying why."""
    try:
        value = _result(future)
    except Exception as err:
        return EvalResult.failure(f"evaluator crashed: {type(err).__name__}: {err}"), False
    return EvalResult.from_dict(value), future.state.name == "Cached"


def _result(future: PrefectFuture[Any]) -> Any:
    """`future.result()`, read straight from a completed state that holds its result in memory (a
    thread's task run: what Prefect's own read returns then, without its hop to an event loop thread,
    2 ms a trial); anything else (a failure, a result in storage) the way Prefect reads it."""
    future.wait()
    state = future.state
    if state.is_completed() and isinstance(state.data, ResultRecord):
        return state.data.result
    return future.result(raise_on_failure=True)


def cache_key(inputs: dict[str, Any]) -> str:
    """The key `evaluate_task` caches `inputs`' result under (its own cache policy's)."""
    return evaluate_task.cache_policy.compute_key(None, inputs, {})  # type: ignore[union-attr,arg-type]


def check_cache_entry(inputs: dict[str, Any]) -> bool:
    """Whether Prefect may read the candidate's cache record (absent, or plain JSON
    of an `EvalResult`). A refused record is reported in one line and removed, and
    the candidate re-evaluated without reading it (see tasks/records.py)."""
    _, rejected = read_record(cache_key(inputs), lambda data: check_fields(data, RESULT_FIELDS, exact=True),
                              f"candidate {inputs['key']}", "re-evaluating it")
    return not rejected

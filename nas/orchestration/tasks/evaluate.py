"""Evaluation as a Prefect task, cached by its inputs across runs.

The cache key is (space config, evaluator config + fingerprint, encoding,
seed where the evaluator depends on it): an identical search replays from the
cache, and a resumed search never re-evaluates a finished candidate.
"""

from __future__ import annotations

import json
import time
from functools import lru_cache
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS

from nas.evaluators.base import EvalResult, Evaluator, evaluate_safely
from nas.search.spec import Component, SearchSpec, build_evaluator
from nas.spaces import SPACES
from nas.strategies.base import Candidate
from nas.orchestration.tasks.records import SERIALIZER, check_fields, is_number, read_record


def _number_or_none(value: Any) -> bool:
    return value is None or is_number(value)


# The shape of `EvalResult.to_dict()`: a cached record is used only if it has it.
RESULT_FIELDS = {"accuracy": _number_or_none, "params": _number_or_none, "flops": _number_or_none,
                 "cost_seconds": is_number, "error": lambda v: v is None or isinstance(v, str),
                 "metrics": lambda v: isinstance(v, dict) and all(map(_number_or_none, v.values())),
                 "curve": lambda v: isinstance(v, list) and all(map(is_number, v))}


@lru_cache(maxsize=16)
def _evaluator(space_json: str, evaluator_json: str) -> Evaluator:
    space_c, eval_c = Component(**json.loads(space_json)), Component(**json.loads(evaluator_json))
    return build_evaluator(eval_c, SPACES.create(space_c.name, space_c.params))


@task(cache_policy=INPUTS, persist_result=True, result_serializer=SERIALIZER, retries=1,
      retry_delay_seconds=1, task_run_name="evaluate-{key}")
def evaluate_task(space: dict[str, Any], evaluator: dict[str, Any], fingerprint: str,
                  encoding: Any, key: str, seed: int | None) -> dict[str, Any]:
    """Returns `EvalResult.to_dict()`; deterministic failures are results (cached),
    crashes raise (retried, never cached)."""
    ev = _evaluator(json.dumps(space, sort_keys=True), json.dumps(evaluator, sort_keys=True))
    arch = ev.space.decode(encoding)
    return evaluate_safely(ev, arch, seed).to_dict()


class PrefectExecutor:
    """Submits a batch as concurrent task runs on the flow's task runner."""

    def __init__(self, spec: SearchSpec, evaluator: Evaluator, retries: int) -> None:
        self.space = {"name": spec.space.name, "params": dict(spec.space.params)}
        self.evaluator = {"name": spec.evaluator.name, "params": dict(spec.evaluator.params)}
        self.fingerprint = evaluator.fingerprint()
        self.seed = spec.seed if evaluator.uses_seed else None
        self.task = evaluate_task.with_options(retries=retries)
        self.refresh = evaluate_task.with_options(retries=retries, refresh_cache=True)

    def evaluate(self, candidates: list[Candidate]) -> list[tuple[EvalResult, bool, float]]:
        start = time.perf_counter()
        futures = []
        for c in candidates:
            inputs = {"space": self.space, "evaluator": self.evaluator, "fingerprint": self.fingerprint,
                      "encoding": c.arch.encode(), "key": c.arch.key(), "seed": self.seed}
            task = self.task if check_cache_entry(inputs) else self.refresh
            futures.append(task.submit(**inputs))
        out = []
        for fut in futures:
            fut.wait()
            state = fut.state
            if state.is_completed():
                result = EvalResult.from_dict(fut.result())
            else:
                err = fut.result(raise_on_failure=False)
                result = EvalResult.failure(f"evaluator crashed: {type(err).__name__}: {err}")
            out.append((result, state.name == "Cached", time.perf_counter() - start))
        return out


def check_cache_entry(inputs: dict[str, Any]) -> bool:
    """Whether Prefect may read the candidate's cache record (absent, or plain JSON
    of an `EvalResult`). A refused record is reported in one line and removed, and
    the candidate re-evaluated without reading it (see nas/orchestration/tasks/records.py)."""
    key = INPUTS.compute_key(None, inputs, {})  # type: ignore[arg-type]
    _, rejected = read_record(key, lambda data: check_fields(data, RESULT_FIELDS, exact=True),
                              f"candidate {inputs['key']}", "re-evaluating it")
    return not rejected

"""Evaluation as a Prefect task, cached by its inputs across runs.

The cache key is (space config, evaluator config + fingerprint, encoding,
seed where the evaluator depends on it): an identical search replays from the
cache, and a resumed search never re-evaluates a finished candidate.
"""

from __future__ import annotations

import json
import logging
import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS
from prefect.results import ResultRecord

from nas.evaluators.base import EvalResult, Evaluator, evaluate_safely
from nas.search.spec import Component, SearchSpec, build_evaluator
from nas.spaces import SPACES
from nas.strategies.base import Candidate


log = logging.getLogger(__name__)


@lru_cache(maxsize=16)
def _evaluator(space_json: str, evaluator_json: str) -> Evaluator:
    space_c, eval_c = Component(**json.loads(space_json)), Component(**json.loads(evaluator_json))
    return build_evaluator(eval_c, SPACES.create(space_c.name, space_c.params))


@task(cache_policy=INPUTS, persist_result=True, retries=1, retry_delay_seconds=1,
      task_run_name="evaluate-{key}")
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

    def evaluate(self, candidates: list[Candidate]) -> list[tuple[EvalResult, bool, float]]:
        start = time.perf_counter()
        futures = []
        for c in candidates:
            inputs = {"space": self.space, "evaluator": self.evaluator, "fingerprint": self.fingerprint,
                      "encoding": c.arch.encode(), "key": c.arch.key(), "seed": self.seed}
            check_cache_entry(inputs)
            futures.append(self.task.submit(**inputs))
        out = []
        for cand, fut in zip(candidates, futures):
            fut.wait()
            state = fut.state
            if state.is_completed():
                result = EvalResult.from_dict(fut.result())
            else:
                err = fut.result(raise_on_failure=False)
                result = EvalResult.failure(f"evaluator crashed: {type(err).__name__}: {err}")
            out.append((result, state.name == "Cached", time.perf_counter() - start))
        return out


def check_cache_entry(inputs: dict[str, Any]) -> None:
    """Prefect treats an unreadable cache record as a miss and silently
    re-runs; say so in one line, since it means the cache store is damaged."""
    key = INPUTS.compute_key(None, inputs, {})
    path = Path(os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"]) / key
    if not path.exists():
        return
    try:
        ResultRecord.deserialize(path.read_bytes()).result  # noqa: B018 (decodes the payload)
    except Exception as err:
        log.warning("corrupt cache entry %s for candidate %s (%s: %s); re-evaluating it",
                    path, inputs["key"], type(err).__name__, str(err).splitlines()[0][:120])

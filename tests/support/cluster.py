"""Helpers shared by the Dask and Ray cluster tests: a slow tabular search's pieces,
and a flow that runs a body under a given task runner (so one cluster serves a module)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from prefect import flow

from nas.core.trial import Candidate
from nas.search.spec import Component, SearchSpec

SLEEP_S = 3.0  # per evaluation: long enough to kill its worker in the middle of it


def slow_spec() -> SearchSpec:
    return SearchSpec(Component("nb201"), Component("random"),
                      Component("table", {"simulated_cost_seconds": SLEEP_S}), seed=0, trials=8)


def candidates(spec: SearchSpec, n: int, seed: int) -> list[Candidate]:
    """`n` distinct cells (so no evaluation is served from another's cache entry)."""
    space, rng, out = spec.build_space(), np.random.default_rng(seed), {}
    while len(out) < n:
        arch = space.sample(rng)
        out[arch.key()] = Candidate(arch)
    return list(out.values())


@flow(name="cluster-test", persist_result=False, validate_parameters=False)
def inside_flow(body: Callable[[], Any]) -> Any:
    return body()


def wait_for(condition: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Polls `condition` until it returns something truthy (then returns it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {condition.__name__}")

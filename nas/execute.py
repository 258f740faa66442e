"""Running one search's `Session` (its run dir held and read, its parts built): the loop in this
process (runner=local) or as a Prefect flow (prefect, processes, dask, ray). A runner is one
choice of the `runner` config group (where a search runs; Prefect's task runners are another
thing, flows/task_runners.py). The flow runners are found through `RUNNERS`' entry points, by
name, so the library never imports Prefect and `nas search runner=local` never loads it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nas.core.registry import Registry, check_keys
from nas.pool import WorkerPool
from nas.report import write_run_report
from nas.status import status

if TYPE_CHECKING:
    from nas.search.session import Session
    from nas.search.spec import SearchSpec


class SearchRunner:
    """Where a search's loop and evaluations run; `settings` is the `runner` config group."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def run(self, session: Session, progress: bool) -> dict[str, Any]:
        raise NotImplementedError


RUNNERS: Registry[SearchRunner] = Registry("runner", "nasflow.runners")


@RUNNERS.register("local")
class LocalRunner(SearchRunner):
    """No Prefect: in this process, evaluations one after another (or one batch at a time), or
    on a pool of worker processes (nas/pool.py) with `workers` > 1 or `budget.in_flight` > 1."""

    KEYS = ("name", "workers", "per_gpu", "max_attempts")

    def run(self, session: Session, progress: bool) -> dict[str, Any]:
        from nas.search.loop import LocalExecutor, SearchLoop  # lazy: loads numpy (start-up time)

        spec, evaluator = session.search.spec, session.search.evaluator
        check_keys("runner=local", self.settings, self.KEYS)

        def loop(executor: Any) -> SearchLoop:
            return SearchLoop.of(session, executor, progress=progress, runner="local",
                                 evaluator_fingerprint=evaluator.fingerprint())

        if spec.in_flight > 1 or self.settings.get("workers") not in (None, 1):  # a bad value: assign_slots says

            # each worker imports and builds the evaluator before the first trial: seconds each, in parallel
            with status("starting the worker pool", show=progress):
                pool = WorkerPool.from_settings(spec.to_dict(), self.settings, spec.in_flight)
            try:
                summary = loop(pool).run_search()
            except BaseException:  # Ctrl-C or an error: what is running is evaluated again on resume
                pool.close(grace=0.0)
                raise
            pool.close()
        else:
            executor = LocalExecutor(evaluator, spec.seed if evaluator.uses_seed else None)
            summary = loop(executor).run_search()
        write_run_report(session.run.path, summary)  # the loop returns the summary; its caller writes the report
        return summary


def execute(spec: SearchSpec, run_dir: Path, runner: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Run one search with the configured runner, for a caller that holds nothing yet (a probe, a
    test): its parts built, its run dir locked and read here; returns the loop's summary."""
    from nas.search.session import Session  # lazy: loads numpy (start-up time)

    spec.check_pairing()
    search = spec.build()
    with Session.open(search, run_dir) as session:
        return run_session(session, runner, progress)


def run_session(session: Session, runner: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Run an opened session with the configured runner (whoever opened it holds its lock
    throughout, the flow's run included: it runs in this process); returns the loop's summary."""
    # One INFO line per Prefect API call (httpx) or LLM call (httpx2, the openai SDK's), and model loading.
    for noisy in ("httpx", "httpx2", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    session.search.evaluator.prepare(progress)  # its one-off work says what it is, before the bar
    return RUNNERS.get(runner.get("name", "prefect"))(runner).run(session, progress)

"""Running one composed search: the checks, the run dir's preparation, then the loop,
in this process (runner=local) or as a Prefect flow (prefect, processes, dask, ray).
The flow runners are found through `RUNNERS`' entry points, by name, so the library
never imports Prefect and `nas search runner=local` never loads it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nas.core.registry import Registry
from nas.errors import ConfigError
from nas.pool import WorkerPool
from nas.report import write_run_report
from nas.search.rundir import RunDir
from nas.status import status

if TYPE_CHECKING:
    from nas.search.spec import Search, SearchSpec


class SearchRunner:
    """Where a search's loop and evaluations run; `settings` is the `runner` config group."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings

    def run(self, search: Search, run_dir: Path, progress: bool) -> dict[str, Any]:
        raise NotImplementedError


RUNNERS: Registry[SearchRunner] = Registry("runner", "nasflow.runners")


@RUNNERS.register("local")
class LocalRunner(SearchRunner):
    """No Prefect: in this process, evaluations one after another (or one batch at a time), or
    on a pool of worker processes (nas/pool.py) with `workers` > 1 or `budget.in_flight` > 1."""

    KEYS = ("name", "workers", "per_gpu", "max_attempts")

    def run(self, search: Search, run_dir: Path, progress: bool) -> dict[str, Any]:
        from nas.search.loop import LocalExecutor, SearchLoop  # lazy: loads numpy (start-up time)

        spec, evaluator = search.spec, search.evaluator
        unknown = sorted(set(self.settings) - set(self.KEYS))
        if unknown:
            raise ConfigError(f"unknown key 'runner.{unknown[0]}' (valid keys of runner=local: "
                              f"{', '.join(self.KEYS[1:])})")
        if spec.in_flight > 1 or self.settings.get("workers") not in (None, 1):  # a bad value: assign_slots says

            # each worker imports and builds the evaluator before the first trial: seconds each, in parallel
            with status("starting the worker pool", show=progress):
                pool = WorkerPool.from_settings(spec.to_dict(), self.settings, spec.in_flight)
            try:
                summary = SearchLoop(spec, run_dir, pool, progress=progress, runner="local",
                                     evaluator_fingerprint=evaluator.fingerprint(), search=search).run_search()
            except BaseException:  # Ctrl-C or an error: what is running is evaluated again on resume
                pool.close(grace=0.0)
                raise
            pool.close()
        else:
            executor = LocalExecutor(evaluator, spec.seed if evaluator.uses_seed else None)
            summary = SearchLoop(spec, run_dir, executor, progress=progress, runner="local",
                                 evaluator_fingerprint=evaluator.fingerprint(), search=search).run_search()
        write_run_report(run_dir, summary)  # the loop returns the summary; its caller writes the report
        return summary


def execute(spec: SearchSpec, run_dir: Path, runner: dict[str, Any], progress: bool) -> dict[str, Any]:
    """Run one search with the configured runner; returns the loop's summary. Its parts are the
    ones the command's checks built (`Search.of`), else built here."""
    from nas.search.spec import Search  # lazy: loads numpy (start-up time)

    # One INFO line per Prefect API call (httpx) or LLM call (httpx2, the openai SDK's), and model loading.
    for noisy in ("httpx", "httpx2", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    try:
        spec.check_pairing()
        search = Search.of(spec)
        run = RunDir(run_dir)
        with run.lock():  # held by this process (the flow runs in it) until the search ends
            run.prepare(spec.identity_fields(), spec.batch_lines)  # a bad run dir fails before Prefect
            search.evaluator.prepare(progress)  # its one-off work says what it is, before the bar
            return RUNNERS.get(runner.get("name", "prefect"))(runner).run(search, run_dir, progress)
    finally:
        Search.forget(spec)

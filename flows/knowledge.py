"""Knowledge ingestion as a Prefect flow: one task per file, retried on failure,
visible in the UI; the Reader, store and LLM client are shared by the tasks
(threads of one process, as Qdrant local mode requires)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from nas.knowledge.ingest import Ingest, run_ingest
from nas.knowledge.papers import files
from nas.knowledge.reader import IngestReport, Reader


@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1, task_run_name="read-{name}")
def read_task(reader: Reader, path: str, name: str) -> dict[str, Any]:
    """Papers already read are skipped by content hash, so a retry repeats no work."""
    return reader.ingest([Path(path)]).to_dict()


@flow(name="nas-knowledge-ingest", persist_result=False, validate_parameters=False,
      task_runner=ThreadPoolTaskRunner(max_workers=2))
def ingest_flow(settings: dict[str, Any], paths: list[str], out: str | None = None) -> dict[str, Any]:
    def read(job: Ingest) -> IngestReport:
        start = time.perf_counter()
        todo = [f for p in job.paths for f in files(p)]
        futures = [read_task.submit(job.reader, str(f), f.name) for f in todo]
        return IngestReport.merged([IngestReport(**f.result()) for f in futures], time.perf_counter() - start)

    job, summary = run_ingest(settings, [Path(p) for p in paths], Path(out) if out else None, read=read)
    return {**summary, "record": str(job.out)}

"""An LLM call that fails after its retries, run as a Prefect task (runner=prefect): a counted,
one-line failure in the log, never a traceback, and never cached."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow   # an ephemeral Prefect server


def test_failed_llm_task_logs_one_line_and_is_not_cached(prefect_home):
    import logging

    from prefect import flow

    from nas.llm import LLMClient, LLMError
    from support.scripted import ScriptedServer, Step
    from tasks.llm import prefect_calls

    @flow(persist_result=False)
    def ask(base_url: str) -> tuple[str, str, dict]:
        client = LLMClient({"backend": "openai", "base_url": base_url, "model": "scripted",
                            "cache_dir": str(prefect_home / "llm-cache"), "api_key_env": "NASFLOW_NO_KEY",
                            "max_retries": 0}, prefect_home / "run", calls=prefect_calls)
        try:
            client.complete("navigator", "a call that fails once")
        except LLMError as err:
            failure = str(err)
        reply = client.complete("navigator", "a call that fails once")   # the same key: asked again
        return failure, reply.text, client.usage.to_dict()["roles"]["navigator"]

    class Records(logging.Handler):
        def __init__(self) -> None:
            super().__init__(logging.DEBUG)
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    seen = Records()   # on Prefect's logger itself: it does not propagate to pytest's handlers
    runs = logging.getLogger("prefect.task_runs")
    runs.addHandler(seen)
    try:
        with ScriptedServer([Step(fault="500"), "fine"]) as srv:
            failure, text, usage = ask(srv.base_url)
    finally:
        runs.removeHandler(seen)
    assert failure == "llm: server error (HTTP 500); gave up after 1 tries"
    assert text == "fine" and usage["failures"] == 1 and usage["live"] == 1
    errors = [r for r in seen.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in errors if "Finished in state Failed" in r.getMessage()] != []
    assert all("gave up after 1 tries" in r.getMessage() and r.exc_info is None for r in errors), \
        [r.getMessage() for r in errors]   # one line: no traceback, no "corrupt cache entry" (nothing cached)
    assert not any(r.getMessage().startswith("Task run failed with") for r in seen.records)

"""Agent LLM calls as Prefect tasks, cached by the call's key (model, messages,
parameters, prompt template version, attempt): under `runner=prefect` every
Proposer/Modifier/Mutator/... call is a task run in the UI, and a repeated
search answers from Prefect's result store without calling the model
(with `llm.cache=false` the task neither reads nor writes that store)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from prefect import task

from nas.llm.client import Fetched, LLMError
from nas.secrets import install_log_scrubbing
from tasks.records import SERIALIZER, check_fields, is_count, is_number, read_record

# What `fetch()` returns as its result (a reply-cache hit adds the call's fields).
REPLY_FIELDS = {"reply": lambda v: isinstance(v, str), "finish_reason": lambda v: isinstance(v, str),
                "prompt_tokens": is_count, "completion_tokens": is_count, "latency_s": is_number}


class _OneLineFailures(logging.Filter):
    """An LLM call that failed after its retries ends its task Failed with one line ("Finished in
    state Failed(... LLMError: llm: ...)"); Prefect's "Task run failed with exception" record and
    its traceback go (the failure is handled and counted by the client), and so does the note that
    the error could not be stored as a result (a failure is never cached)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(getattr(record, "task_run_name", "")).startswith("llm-"):
            return True
        text = record.getMessage()
        return not (text.startswith("Task run failed with")   # the traceback
                    or (text.startswith("Failed to write result") and "LLMError" in text))  # it is not cached


if not any(isinstance(f, _OneLineFailures) for f in logging.getLogger("prefect.task_runs").filters):
    logging.getLogger("prefect.task_runs").addFilter(_OneLineFailures())


def cache_key(key: str) -> str:
    return f"nasflow-llm-{key}"


@task(persist_result=True, result_serializer=SERIALIZER, retries=0, task_run_name="llm-{role}",
      cache_key_fn=lambda _ctx, params: cache_key(params["key"]))
def llm_call(role: str, key: str, fetch: Callable[[], Fetched]) -> list[Any]:
    """Failures raise (the client already retried): a failed state is never cached, and its log
    is one line (`_OneLineFailures`)."""
    install_log_scrubbing()  # wherever the task runs: a reply or an error may quote a key
    result, retries, source = fetch()
    return [result, retries, source]



def call_shape(data: Any) -> str | None:
    """The problem of a cached `llm_call` result, or None for [result, retries, source]."""
    if not isinstance(data, list) or len(data) != 3:
        return "expected [result, retries, source]"
    result, retries, source = data
    if not is_count(retries) or source not in ("live", "cache"):
        return "bad retries or source"
    return check_fields(result, REPLY_FIELDS, exact=False)


def call_options(cached: bool, rejected: bool) -> dict[str, bool]:
    """How a call's task reads Prefect's store: as it is (a hit is a cached reply); a refused record
    asked again (`refresh_cache`); uncached, still a task run in the UI, but its reply neither read
    from nor kept in the store, so a later cached search cannot find it."""
    if not cached:
        return {"refresh_cache": True, "persist_result": False}
    return {"refresh_cache": True} if rejected else {}


def prefect_calls(role: str, key: str, fetch: Callable[[], Fetched], cached: bool) -> Fetched:
    """`LLMClient(calls=...)`: one task run per call; a Prefect cache hit is a cached reply.
    The call's record is checked first (tasks/records.py): a refused one is asked again.
    Uncached (`llm.cache=false`), every call reaches `fetch`."""
    rejected = cached and read_record(cache_key(key), call_shape, f"the {role} call {key}",
                                      "asking the model again")[1]
    options = call_options(cached, rejected)
    call = llm_call.with_options(**options) if options else llm_call
    state = call(role, key, fetch, return_state=True)
    if not state.is_completed():
        err = state.result(raise_on_failure=False)
        raise err if isinstance(err, LLMError) else LLMError(f"{role} call failed in its task: {err}")
    result, retries, source = state.result()
    return result, (0 if state.name == "Cached" else retries), ("cache" if state.name == "Cached" else source)

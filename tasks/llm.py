"""Agent LLM calls as Prefect tasks, cached by the call's key (model, messages,
parameters, prompt template version, attempt): under `runner=prefect` every
Proposer/Modifier/Mutator/... call is a task run in the UI, and a repeated
search answers from Prefect's result store without calling the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefect import task

from nas.llm.client import Fetched, LLMError


@task(persist_result=True, retries=0, task_run_name="llm-{role}",
      cache_key_fn=lambda _ctx, params: f"nasflow-llm-{params['key']}")
def llm_call(role: str, key: str, fetch: Callable[[], Fetched]) -> list[Any]:
    """Failures raise (the client already retried): a failed state is never cached."""
    result, retries, source = fetch()
    return [result, retries, source]


def prefect_calls(role: str, key: str, fetch: Callable[[], Fetched]) -> Fetched:
    """`LLMClient(calls=...)`: one task run per call; a Prefect cache hit is a cached reply."""
    state = llm_call(role, key, fetch, return_state=True)
    if not state.is_completed():
        err = state.result(raise_on_failure=False)
        raise err if isinstance(err, LLMError) else LLMError(f"{role} call failed in its task: {err}")
    result, retries, source = state.result()
    return result, (0 if state.name == "Cached" else retries), ("cache" if state.name == "Cached" else source)

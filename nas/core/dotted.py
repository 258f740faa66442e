"""Nested settings as flat dotted keys ('evaluator.data.root'), the names in which a run dir's
refusal (`nas.search.rundir`) and `nas compare` say where two configs differ, and which of
them change no result."""

from __future__ import annotations

from typing import Any


def flatten(node: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """'prefix.key.subkey' → value for each leaf (a value that is not a dict; an empty dict has none)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        out.update(flatten(value, name) if isinstance(value, dict) else {name: value})
    return out


# Settings that change no result: where things live, how long to wait, how often to retry, a sleep.
# Runs differing only in them share an axis in `nas compare`, and a search resumes across a change
# of them (a moved dataset, a raised sandbox limit, a slower LLM endpoint). Names as `flatten` gives
# them with a component's 'params.' level dropped ('evaluator.sandbox', not 'evaluator.params.sandbox').
RESULT_NEUTRAL = (
    "evaluator.simulated_cost_seconds", "evaluator.sandbox", "evaluator.data.root", "evaluator.device",
    "evaluator.data.cache_gb", "evaluator.data.workers",
    "strategy.sandbox",
    "strategy.llm.api_key_env", "strategy.llm.timeout_s", "strategy.llm.max_retries", "strategy.llm.backoff_s",
    "strategy.llm.backoff_max_s", "strategy.llm.cache_dir", "strategy.llm.local.n_threads",
    "strategy.llm.local.prompt_cache_mb", "strategy.llm.local.startup_timeout_s",
)


def result_neutral(name: str) -> bool:
    """Whether the dotted setting `name` (or the group holding it) is one of RESULT_NEUTRAL."""
    name = name.replace(".params.", ".")
    return any(name == n or name.startswith(n + ".") for n in RESULT_NEUTRAL)

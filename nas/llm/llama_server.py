"""`python -m nas.llm.llama_server ARGS...`: llama-cpp-python's OpenAI-compatible server, with
its prompt cache (`--cache`) sized by what the cache really holds.

The cache keeps the model state after each reply and restores the one that shares the longest
prefix with a new prompt, so a role whose long system prompt comes back after another role's
call evaluates only its new tokens. llama-cpp-python counts only the KV state against
`--cache_size`, but each entry also holds a copy of the logits (up to n_batch x vocab floats,
~100 MB for SmolLM2): counted as shipped, the 2 GiB default could hold tens of GB."""

from __future__ import annotations

import runpy

from llama_cpp.llama_cache import LlamaRAMCache


def _held_bytes(cache: LlamaRAMCache) -> int:
    return sum(state.llama_state_size + state.scores.nbytes + state.input_ids.nbytes
               for state in cache.cache_state.values())


if __name__ == "__main__":
    LlamaRAMCache.cache_size = property(_held_bytes)  # type: ignore[method-assign,assignment]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)

"""Prompt size in tokens, estimated from characters. Deterministic and
endpoint-free on purpose: a cached or replayed run must rebuild the very
prompts (and so cache keys) the live run sent, with no server to ask."""

from __future__ import annotations

import math

PER_MESSAGE = 6   # chat-template tokens around each message (ChatML: "<|im_start|>role\n" ... "<|im_end|>\n")


def estimate_tokens(messages: list[dict[str, str]], chars_per_token: float) -> int:
    """An upper estimate of the tokens `messages` take once templated (a low `chars_per_token` is the margin)."""
    return sum(math.ceil(len(str(m.get("content") or "")) / chars_per_token) + PER_MESSAGE for m in messages)

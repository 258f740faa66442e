"""How long an LLM call may take, from the speed the endpoint was measured at rather than a fixed
limit: a local llama.cpp server on two busy cores generates several times slower than on idle ones,
and a fixed 120 s then cancelled replies that were streaming along, only to ask again from scratch.

A call's limit is the time its tokens should take at the measured speed, times MARGIN:
  before the first token   prompt tokens / prompt speed (measured on earlier calls) x MARGIN,
                           or, until a call has been measured, `llm.timeout_s`, doubled on each
                           retry (a machine slower than that assumed still gets its answer);
  once tokens stream in    the time to the first token + max_tokens / generation speed x MARGIN,
                           the speed measured on this very reply (after MIN_TOKENS tokens), so a
                           reply keeps going while it comes at the pace the machine gives it now.
Only a stalled call (nothing, or far slower than measured) is cancelled; none is cut for being
slow on a slow machine. Every limit is at least FLOOR_S (or `llm.timeout_s` when that is less)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

MARGIN = 3.0
FLOOR_S = 30.0
MIN_TOKENS = 4
SMOOTHING = 0.5  # weight of the newest measurement (the load on a shared machine changes)


@dataclass
class Speed:
    """Measured tokens per second of one endpoint: prompt processing and generation."""

    prompt_tps: float | None = None
    generate_tps: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def observe(self, prompt_tokens: int, first_token_s: float, completion_tokens: int, generate_s: float) -> None:
        """One finished reply: `first_token_s` from the request to its first token, `generate_s`
        from there to its last."""
        with self._lock:
            if prompt_tokens > 0 and first_token_s > 0:  # the slowest seen: llama.cpp's prompt cache makes a
                # prompt that shares a prefix with the last one look fast; one that does not is not
                tps = prompt_tokens / first_token_s
                self.prompt_tps = tps if self.prompt_tps is None else min(self.prompt_tps, tps)
            if completion_tokens >= MIN_TOKENS and generate_s > 0:
                self.generate_tps = _blend(self.generate_tps, completion_tokens / generate_s)

    def first_token_limit(self, prompt_tokens: int, unmeasured_s: float) -> float:
        """Seconds a call may wait for its first token."""
        if self.prompt_tps is None:
            return unmeasured_s
        return max(min(FLOOR_S, unmeasured_s), MARGIN * prompt_tokens / self.prompt_tps)

    def reply_limit(self, first_token_s: float, max_tokens: int, tokens: int, streaming_s: float,
                    unmeasured_s: float) -> float:
        """Seconds from the request that a reply streaming in may take in all: `tokens` came in
        `streaming_s` since its first."""
        floor = min(FLOOR_S, unmeasured_s)
        if tokens >= MIN_TOKENS and streaming_s > 0:
            tps = (tokens - 1) / streaming_s  # `streaming_s` runs from the first token
        elif self.generate_tps is not None:
            tps = self.generate_tps
        else:
            return first_token_s + unmeasured_s
        return first_token_s + max(floor, MARGIN * max_tokens / tps)

    def describe(self) -> str:
        parts = [f"{name} {tps:.1f} tokens/s" for name, tps in (("prompt", self.prompt_tps),
                                                                  ("generation", self.generate_tps)) if tps]
        return ", ".join(parts) or "not measured yet"


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


def retry_params(params: dict, retry: int, attempt: int = 0) -> dict:
    """What try `retry` (0, 1, ...) of an agent's `attempt` (0, 1, ...: asked again after a reply
    that did not parse) asks with: never the request that just failed again. The temperature goes
    up a step per try and attempt (a reply that was garbage or ran on is drawn anew, not repeated)
    and the sampler's seed changes; the first try of the first attempt asks as configured."""
    step = retry + attempt
    if step <= 0:
        return params
    temperature = float(params.get("temperature") or 0.0)
    return {**params, "temperature": round(min(1.5, temperature + 0.15 * step), 3), "seed": 1000 * attempt + retry}

"""Calls and tokens per role, for `summary.json`: what a search cost, and how
much of it the cache or a replay saved."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class RoleUsage:
    calls: int = 0              # answered calls (live + cached + replayed)
    live: int = 0               # calls that reached the endpoint and succeeded
    cached: int = 0
    replayed: int = 0
    failures: int = 0           # calls that failed after all retries
    retries: int = 0            # extra HTTP attempts (timeouts, 429, 5xx, garbage)
    truncated: int = 0          # replies cut at max_tokens
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0      # endpoint time of live calls

    def add(self, other: RoleUsage) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)


class Usage:
    """Thread-safe counters; tokens of cached and replayed calls count too (they are
    what the run consumed), `live` says how many were paid for now."""

    def __init__(self) -> None:
        self.roles: dict[str, RoleUsage] = {}
        self._lock = threading.Lock()

    def record(self, role: str, *, source: str | None, prompt_tokens: int = 0, completion_tokens: int = 0,
               retries: int = 0, truncated: bool = False, latency_s: float = 0.0) -> None:
        with self._lock:
            u = self.roles.setdefault(role, RoleUsage())
            u.retries += retries
            if source is None:
                u.failures += 1
                return
            u.calls += 1
            u.live += source == "live"
            u.cached += source == "cache"
            u.replayed += source == "replay"
            u.truncated += bool(truncated)
            u.prompt_tokens += prompt_tokens
            u.completion_tokens += completion_tokens
            u.latency_s += latency_s if source == "live" else 0.0

    def total(self) -> RoleUsage:
        out = RoleUsage()
        with self._lock:
            for u in self.roles.values():
                out.add(u)
        return out

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            roles = {name: asdict(u) for name, u in sorted(self.roles.items())}
        total = asdict(self.total())
        total["tokens"] = total["prompt_tokens"] + total["completion_tokens"]
        total["cache_hit_rate"] = (total["cached"] + total["replayed"]) / total["calls"] if total["calls"] else 0.0
        return {"roles": roles, "total": total}

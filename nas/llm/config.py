"""LLM settings (`conf/llm/*.yaml`): one endpoint, per-role sampling settings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from nas.core.registry import check_keys
from nas.errors import ConfigError
from nas.home import home
from nas.llm.local import PROMPT_CACHE_MB

BACKENDS = ("local", "openai", "replay")
STRUCTURED = ("auto", "grammar", "json_schema", "none")
ROLES = ("reader", "tagger", "analyst", "proposer", "modifier", "reflector", "navigator", "generator",
         "mutator", "debugger")
LOCAL_KEYS = ("n_ctx", "n_threads", "n_threads_decode", "startup_timeout_s", "prompt_cache_mb")


@dataclass
class RoleSettings:
    model: str | None = None     # None: the endpoint's default model
    temperature: float = 0.0
    max_tokens: int = 512


@dataclass
class LLMConfig:
    backend: str = "local"
    base_url: str | None = None            # openai backend: any OpenAI-compatible endpoint
    model: str = "smollm2-135m-instruct"
    api_key_env: str = "OPENAI_API_KEY"    # the key is read from this variable, never from config files
    timeout_s: float = 120.0
    max_retries: int = 4
    backoff_s: float = 0.5
    backoff_max_s: float = 20.0
    structured: str = "auto"               # grammar (llama.cpp), json_schema (OpenAI), none (tolerant parsing)
    cache: bool = True
    cache_dir: str | None = None           # default: $NASFLOW_HOME/llm/cache
    replay_from: str | None = None         # replay: a run dir (or its transcripts.jsonl)
    model_path: str | None = None          # local: any GGUF file; None: the embedded SmolLM2-135M
    context: int | None = None             # context window in tokens; None: local.n_ctx (local), unbounded
    chars_per_token: float = 2.0           # for fitting prompts into `context`; SmolLM2 on CoLLM's prompts: >= 2.2
    context_margin: int = 64               # tokens kept free besides prompt + max_tokens (chat template)
    local: dict[str, Any] = field(default_factory=lambda: {"n_ctx": 4096, "n_threads": None, "n_threads_decode": 1,
                                                           "startup_timeout_s": 120.0,
                                                           "prompt_cache_mb": PROMPT_CACHE_MB})
    roles: dict[str, RoleSettings] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> LLMConfig:
        data = dict(data or {})
        data.pop("name", None)
        valid = [f.name for f in fields(cls)]
        check_keys("llm", data, valid)
        roles_in = data.pop("roles", None) or {}
        cfg = cls(**data)
        for role, settings in dict(roles_in).items():
            if role not in ROLES:
                raise ConfigError(f"llm.roles: unknown role '{role}' (valid: {', '.join(ROLES)})")
            settings = dict(settings or {})
            check_keys(f"llm.roles.{role}", settings, [f.name for f in fields(RoleSettings)])
            cfg.roles[role] = RoleSettings(**settings)
        cfg.check()
        return cfg

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"llm.backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.structured not in STRUCTURED:
            raise ConfigError(f"llm.structured must be one of {', '.join(STRUCTURED)}, got {self.structured!r}")
        if self.backend == "replay" and not self.replay_from:
            raise ConfigError("llm=replay needs llm.replay_from=RUN_DIR (a run whose llm/transcripts.jsonl to replay)")
        if self.base_url is not None and not re.fullmatch(r"https?://[^\s/]+\S*", str(self.base_url)):
            raise ConfigError(f"llm.base_url must be an http:// or https:// URL, got {self.base_url!r}")
        if self.timeout_s <= 0 or self.max_retries < 0 or self.backoff_s < 0:
            raise ConfigError("llm.timeout_s must be > 0 and llm.max_retries, llm.backoff_s >= 0")
        check_keys("llm.local", self.local, list(LOCAL_KEYS))
        for name in ("n_threads", "n_threads_decode"):
            threads = self.local.get(name)
            if threads is not None and (type(threads) is not int or threads < 1):
                raise ConfigError(f"llm.local.{name} must be an integer >= 1 (or null), got {threads!r}")
        cache_mb = self.local.get("prompt_cache_mb", 0)
        if type(cache_mb) is not int or cache_mb < 0:
            raise ConfigError(f"llm.local.prompt_cache_mb must be an integer >= 0 (MB; 0: off), got {cache_mb!r}")
        if self.context is not None and int(self.context) <= 0:
            raise ConfigError(f"llm.context must be > 0 tokens (or null), got {self.context}")
        if float(self.chars_per_token) <= 0 or int(self.context_margin) < 0:
            raise ConfigError("llm.chars_per_token must be > 0 and llm.context_margin >= 0")
        if self.model_path is not None and self.backend == "local":
            check_gguf(self.model_path)
        for role, rs in self.roles.items():
            if not 0.0 <= float(rs.temperature) <= 2.0:
                raise ConfigError(f"llm.roles.{role}.temperature must be in [0, 2], got {rs.temperature}")
            if int(rs.max_tokens) <= 0:
                raise ConfigError(f"llm.roles.{role}.max_tokens must be > 0, got {rs.max_tokens}")

    def role(self, name: str) -> RoleSettings:
        if name not in ROLES:
            raise ConfigError(f"unknown LLM role '{name}' (valid: {', '.join(ROLES)})")
        rs = self.roles.get(name, RoleSettings())
        return RoleSettings(model=rs.model or self.model, temperature=float(rs.temperature),
                            max_tokens=int(rs.max_tokens))

    def context_window(self) -> int | None:
        """Tokens a request may use in all (prompt + reply); None where unknown."""
        if self.context is not None:
            return int(self.context)
        if self.backend == "openai":
            return None
        return int(self.local.get("n_ctx") or 0) or None

    def model_id(self, model: str) -> str:
        """What cache keys name: the model, and for a chosen GGUF file its name and size (the alias
        alone would let two files share replies)."""
        if self.model_path is None or self.backend != "local":
            return model
        path = Path(self.model_path).expanduser()
        return f"{model}@{path.name}:{path.stat().st_size}"

    def structured_mode(self) -> str:
        """What the endpoint is asked for: llama.cpp takes GBNF grammars, OpenAI JSON schemas."""
        if self.structured != "auto":
            return self.structured
        return "grammar" if self.backend == "local" else "json_schema"

    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser().resolve() if self.cache_dir else home() / "llm" / "cache"


GGUF_MAGIC = b"GGUF"


def check_gguf(path: str) -> None:
    """A one-line error unless `path` is a readable GGUF file (its first four bytes)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"llm.model_path: {file} does not exist or is not a file (give a .gguf model file)")
    try:
        with file.open("rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise ConfigError(f"llm.model_path: cannot read {file}: {err.strerror or err}") from None
    if magic != GGUF_MAGIC:
        raise ConfigError(f"llm.model_path: {file} is not a GGUF file (starts with {magic!r}, "
                          f"expected {GGUF_MAGIC!r})")

"""One client for every agent: the `openai` SDK against an OpenAI-compatible
endpoint (OpenAI, vLLM, Ollama, llama.cpp, or the embedded SmolLM2 server),
with retries, constrained decoding, a reply cache, transcripts, replay and
per-role accounting. Replies are streamed, so a call given up at its timeout
closes the connection and the server stops generating it. Failures come back as `LLMError`/`ParseError`, never as
crashes, so a bad reply costs one candidate, not a search."""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar

from nas.errors import ConfigError, NasError
from nas.llm.accounting import Usage
from nas.llm.cache import ReplayBook, ReplyCache, Transcript, call_key
from nas.llm.config import LLMConfig
from nas.llm.local import shared_server
from nas.llm.parse import ParseError
from nas.llm.prompts import Prompt
from nas.llm.speed import MIN_TOKENS, Speed, retry_params
from nas.llm.tokens import PER_MESSAGE, estimate_tokens
from nas.secrets import register, scrub, scrub_data
from nas.terminal import printable

log = logging.getLogger("nas.llm")
progress_log = logging.getLogger("nas.progress")  # one line per live call in a search's search.log
T = TypeVar("T")
Fetched = tuple[dict[str, Any], int, str]          # (result, retries, source)
Calls = Callable[[str, str, Callable[[], Fetched], bool], Fetched]   # (role, key, fetch, cached)


class LLMError(NasError):
    """A call failed after its retries (endpoint down, 4xx, repeated garbage) or has no recorded reply."""


@dataclass
class Reply:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    source: str        # live | cache | replay
    key: str
    role: str
    attempt: int

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class Answer(Generic[T]):
    """A parsed reply, or why none of the attempts gave one."""

    value: T | None = None
    replies: list[Reply] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.value is not None


class _Garbage(Exception):
    """The endpoint answered 200 with something that is not a chat completion."""


class _Abandoned(Exception):
    """The call ran past its limit (`nas.llm.speed`): no first token, or a stalled stream."""

    def __init__(self, limit_s: float, tokens: int) -> None:
        super().__init__(f"{limit_s:.0f} s")
        self.limit_s, self.tokens = limit_s, tokens


class LLMClient:
    def __init__(self, config: LLMConfig | dict[str, Any] | None = None, run_dir: Path | None = None, *,
                 sleep: Callable[[float], None] = time.sleep, calls: Calls | None = None) -> None:
        """`calls(role, key, fetch, cached)` runs each non-replayed call's `fetch()` (e.g. as a
        cached Prefect task, `tasks/llm.py`) and returns its (result, retries, source);
        `cached` is `llm.cache`, so that with it off no store answers the call either."""
        self.config = config if isinstance(config, LLMConfig) else LLMConfig.from_dict(config)
        register(os.environ.get(self.config.api_key_env))  # never written, whatever writes it
        self.calls = calls
        self.usage = Usage()
        self.transcript = Transcript(run_dir) if run_dir is not None else None
        self._seq = 0
        if self.transcript is not None:  # a resumed run: its accounting covers the calls before the restart
            for record in self.transcript.previous:
                self._account(record)
            self._seq = len(self.transcript.previous)
            self.transcript.previous = []
        self.cache = ReplyCache(self.config.cache_path()) if self.config.cache else None
        self.book = ReplayBook(str(self.config.replay_from)) if self.config.backend == "replay" else None
        self._sleep = sleep
        self.speed = Speed()     # the endpoint's measured tokens/s: each call's time limit follows it
        self._sdk: Any = None
        self._key = ""
        self._base_url = ""      # the local server's, for its tokenizer
        self._lock = threading.Lock()
        # Where a live call's progress goes ("navigator call 3, 12 s, 140 tokens"): e.g. the search's bar.
        self.on_status: Callable[[str], None] | None = None

    # -- public -------------------------------------------------------------------------------------------

    def complete(self, role: str, messages: list[dict[str, str]] | str, *, template: str = "",
                 grammar: str | None = None, schema: dict[str, Any] | None = None, attempt: int = 0,
                 temperature: float | None = None, max_tokens: int | None = None) -> Reply:
        """One chat completion. Raises LLMError when no reply can be had."""
        chat: list[dict[str, str]] = scrub_data(  # a prompt built from a verdict or an error never sends a key on
            [{"role": "user", "content": messages}] if isinstance(messages, str) else messages)
        settings = self.config.role(role)
        model = str(settings.model)  # role() fills in the endpoint's model
        model_id = self.config.model_id(model)
        if self.book is not None and role in self.book.settings:
            # Replay asks with the recorded settings, whatever the replaying config says.
            recorded = self.book.settings[role]
            model, model_id = recorded["model"], recorded["model_id"]
            temperature = recorded["temperature"] if temperature is None else temperature
            max_tokens = recorded["max_tokens"] if max_tokens is None else max_tokens
        # The key follows what constrains the reply: the grammar or schema and the mode that sends it
        # (a grammar sent to llama.cpp and the same grammar left out are different calls).
        mode = self.config.structured_mode()
        if self.book is not None and role in self.book.settings:
            mode = self.book.settings[role]["structured_mode"]
        structured = mode if self._structured(grammar, schema, mode) else "none"
        params = {"temperature": settings.temperature if temperature is None else float(temperature),
                  "max_tokens": settings.max_tokens if max_tokens is None else int(max_tokens),
                  "grammar": grammar, "schema": schema, "structured": structured}
        key = call_key(str(model_id), chat, params, template, attempt)
        context = self.book.settings[role].get("context") if self.book is not None and role in self.book.settings \
            else self.config.context_window()
        base = {"key": key, "role": role, "model": model, "model_id": model_id, "template": template,
                "attempt": attempt, "messages": chat, "params": params, "context": context,
                "structured_mode": mode}
        if self.book is not None:
            hit = self.book.get(key)
            if hit is None:
                self._finish(base, None, retries=0, error="no recorded reply")
                raise LLMError(f"replay: no recorded {role} call with key {key} (template {template or '-'}, "
                               f"attempt {attempt}) in {self.book.path}; the prompts or settings differ")
            if hit.get("error"):
                self._finish(base, None, retries=0, error=hit["error"])
                raise LLMError(hit["error"])
            return self._finish(base, hit, retries=0, source="replay")
        def fetch() -> Fetched:
            if self.cache is not None and (hit := self.cache.get(key)) is not None:
                return hit, 0, "cache"
            result, retries = self._live(role, model, chat, params, attempt)
            if self.cache is not None:
                self.cache.put({**base, **result})
            return result, retries, "live"

        try:
            result, retries, source = self.calls(role, key, fetch, self.config.cache) if self.calls is not None else fetch()
        except LLMError as err:
            self._finish(base, None, retries=getattr(err, "retries", 0), error=str(err))
            raise
        return self._finish(base, result, retries=retries, source=source)

    def attempt(self, answer: Answer[T], role: str, messages: list[dict[str, str]], parse: Callable[[Reply], T], *,
                template: str, grammar: str | None = None, schema: dict[str, Any] | None = None,
                attempt: int = 0, max_tokens: int | None = None) -> bool:
        """One call and parse into `answer` (reply, value or the error); True when it parsed."""
        try:
            reply = self.complete(role, messages, template=template, grammar=grammar, schema=schema,
                                  attempt=attempt, max_tokens=max_tokens)
        except LLMError as err:
            answer.errors.append(f"attempt {attempt}: {err}")
            return False
        answer.replies.append(reply)
        try:
            if reply.truncated:
                raise ParseError(f"reply cut at max_tokens ({reply.completion_tokens} tokens); "
                                 f"raise llm.roles.{role}.max_tokens")
            answer.value = parse(reply)
            return True
        except (ParseError, ValueError) as err:
            answer.errors.append(f"attempt {attempt}: {err}")
            return False

    def ask(self, role: str, prompt: Prompt, values: dict[str, Any], parse: Callable[[Reply], T], *,
            grammar: str | None = None, schema: dict[str, Any] | None = None, tries: int = 1,
            first_attempt: int = 0) -> Answer[T]:
        """Render, call and parse; a failed parse asks again (next attempt = new cache key)."""
        answer: Answer[T] = Answer()
        messages = prompt.render(**values)
        for attempt in range(first_attempt, first_attempt + max(1, tries)):
            if self.attempt(answer, role, messages, parse, template=prompt.template_id, grammar=grammar,
                            schema=schema, attempt=attempt):
                return answer
        return answer

    def prompt_budget(self, role: str, max_tokens: int | None = None) -> int | None:
        """Tokens a prompt may take so that it and the role's reply fit the context; None: no known limit."""
        recorded = self.book.settings.get(role, {}) if self.book is not None else None
        # A replay fits prompts to the recorded run's context, so that it rebuilds the same prompts.
        window = self.config.context_window() if recorded is None else recorded.get("context")
        if window is None:
            return None
        if max_tokens is None:
            max_tokens = (recorded or {}).get("max_tokens") or self.config.role(role).max_tokens
        return int(window) - int(max_tokens) - self.config.context_margin

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return estimate_tokens(messages, self.config.chars_per_token)

    # -- internals ----------------------------------------------------------------------------------------

    def _finish(self, base: dict[str, Any], result: dict[str, Any] | None, *, retries: int,
                source: str | None = None, error: str | None = None) -> Reply:
        with self._lock:
            self._seq += 1
            seq = self._seq
        res = result or {}
        text = None if res.get("reply") is None else reply_text(str(res["reply"]))  # a cache or transcript of before
        record = {**base, "seq": seq, "source": source, "retries": retries, "error": error,
                  "reply": text, "finish_reason": res.get("finish_reason"),
                  "prompt_tokens": int(res.get("prompt_tokens") or 0),
                  "completion_tokens": int(res.get("completion_tokens") or 0),
                  "latency_s": float(res.get("latency_s") or 0.0)}
        if self.transcript is not None:
            self.transcript.append(record)
        self._account(record)
        return Reply(text=text or "", finish_reason=str(record["finish_reason"] or ""),
                     prompt_tokens=record["prompt_tokens"], completion_tokens=record["completion_tokens"],
                     source=str(source), key=base["key"], role=base["role"], attempt=base["attempt"])

    def _account(self, record: dict[str, Any]) -> None:
        self.usage.record(str(record.get("role")), source=record.get("source"),
                          prompt_tokens=int(record.get("prompt_tokens") or 0),
                          completion_tokens=int(record.get("completion_tokens") or 0),
                          retries=int(record.get("retries") or 0),
                          truncated=record.get("finish_reason") == "length",
                          latency_s=float(record.get("latency_s") or 0.0))

    def _endpoint(self) -> Any:
        with self._lock:
            if self._sdk is not None:
                return self._sdk
            from openai import OpenAI  # lazy: loads openai (start-up time)

            cfg = self.config
            base_url: str | None
            if cfg.backend == "local":
                base_url = shared_server(alias=cfg.model, model=cfg.model_path, **cfg.local).start()
                self._key = "local"
                self._base_url = base_url
            else:
                base_url = cfg.base_url
                self._key = os.environ.get(cfg.api_key_env, "")
                register(self._key)
                if not self._key:
                    if base_url is None:
                        raise ConfigError(f"llm=openai: set the API key in ${cfg.api_key_env} "
                                          "(or llm.base_url for a server without keys)")
                    self._key = "not-needed"
            # Our own retry loop below (it knows about garbage replies and counts retries).
            self._sdk = OpenAI(base_url=base_url, api_key=self._key, timeout=cfg.timeout_s, max_retries=0)
            return self._sdk

    def _structured(self, grammar: str | None, schema: dict[str, Any] | None, mode: str) -> dict[str, Any]:
        """What is sent to constrain the reply in `mode` (llm.structured, resolved): {} for nothing."""
        if mode == "grammar" and grammar:
            return {"extra_body": {"grammar": grammar}}
        if mode == "grammar" and schema:
            return {"response_format": {"type": "json_object", "schema": schema}}
        if mode == "json_schema" and schema:
            return {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "reply", "schema": schema}}}
        return {}

    def _live(self, role: str, model: str, messages: list[dict[str, str]], params: dict[str, Any],
              attempt: int = 0) -> tuple[dict[str, Any], int]:
        import httpx  # lazy: loads httpx (start-up time)
        import openai  # lazy: loads openai (start-up time)

        sdk = self._endpoint()
        cfg = self.config
        extra = self._structured(params["grammar"], params["schema"], cfg.structured_mode())
        retries = 0
        u = self.usage.roles.get(role)
        label = f"{role} call {1 + (u.calls + u.failures if u else 0)}"
        while True:
            start = time.perf_counter()
            wait = None
            try:
                result = self._stream(sdk, model, messages, retry_params(params, retries, attempt), extra, start,
                                      f"{label}, try {retries + 1}" if retries else label, retries)
                progress_log.info("llm: %s: %.1f s, %d+%d tokens", label, result["latency_s"],
                                  result["prompt_tokens"], result["completion_tokens"])
                return result, retries
            except openai.RateLimitError as err:
                problem, wait = "rate limited (429)", _retry_after(err)
                wait = None if wait is None else min(wait, cfg.backoff_max_s)
            except openai.APIStatusError as err:
                if err.status_code < 500 and err.status_code not in (408, 409):
                    raise self._error(f"endpoint refused the request (HTTP {err.status_code}): {err.message}",
                                      retries) from None
                problem = f"server error (HTTP {err.status_code})"
            except _Abandoned as err:
                problem = (f"no reply within {err.limit_s:.0f} s ({err.tokens} tokens; limit from the measured "
                           f"speed: {self.speed.describe()}; generation cancelled)")
            except (openai.APITimeoutError, httpx.TimeoutException):
                problem = f"timed out after {cfg.timeout_s:g} s (generation cancelled)"
            except (openai.APIConnectionError, httpx.TransportError) as err:
                problem = f"connection failed ({getattr(err, '__cause__', None) or err})"
            except (_Garbage, openai.APIResponseValidationError, ValueError) as err:
                problem = f"garbage reply: {err}"
            except openai.APIError as err:  # an error event inside the stream
                problem = f"stream error: {err.message}"
            if retries >= cfg.max_retries:
                raise self._error(f"{problem}; gave up after {retries + 1} tries", retries)
            delay = wait if wait is not None else min(cfg.backoff_max_s, cfg.backoff_s * 2 ** retries)
            delay *= 1.0 + 0.1 * random.random() if wait is None else 1.0
            varied = retry_params(params, retries + 1, attempt)
            log.warning("llm: %s; retry %d/%d in %.1f s, with temperature %g and seed %d (not the same request)",
                        scrub(problem), retries + 1, cfg.max_retries, delay, varied["temperature"], varied["seed"])
            self._sleep(delay)
            retries += 1

    def _stream(self, sdk: Any, model: str, messages: list[dict[str, str]], params: dict[str, Any],
                extra: dict[str, Any], start: float, label: str, retries: int = 0) -> dict[str, Any]:
        """One streamed completion. Streamed so that giving up closes the connection: llama.cpp's
        server stops generating for a client that left (a non-streamed request it would finish,
        and the retry would queue behind it). The limit follows the endpoint's measured speed
        (`nas.llm.speed`): a reply streaming in at the machine's pace is never cut."""
        prompt_estimate = self.prompt_tokens(messages)
        # unmeasured, each retry waits twice as long: a machine slower than llm.timeout_s assumed still answers
        unmeasured = self.config.timeout_s * 2 ** min(retries, 4)
        limit = self.speed.first_token_limit(prompt_estimate, unmeasured)
        first: float | None = None
        parts: list[str] = []
        finish, usage, chunks, seen = None, None, 0, False
        shown = start
        self._status(f"{label}...")
        try:
            stream = sdk.chat.completions.create(model=model, messages=messages,
                                                 temperature=params["temperature"],
                                                 max_tokens=params["max_tokens"], stream=True,
                                                 stream_options={"include_usage": True},
                                                 # the wait for bytes: the first token may take as long
                                                 # as the measured prompt speed says, not llm.timeout_s
                                                 timeout=max(self.config.timeout_s, limit),
                                                 **({"seed": params["seed"]} if "seed" in params else {}), **extra)
            try:
                for chunk in stream:
                    now = time.perf_counter()
                    if first is not None:
                        limit = self.speed.reply_limit(first - start, params["max_tokens"], chunks, now - first,
                                                       unmeasured)
                    if now - shown >= 1.0:
                        shown = now
                        self._status(f"{label}, {now - start:.0f} s, {chunks} tokens")
                    usage = getattr(chunk, "usage", None) or usage
                    for choice in getattr(chunk, "choices", None) or []:
                        seen = True
                        text = getattr(choice.delta, "content", None) if choice.delta is not None else None
                        if text:
                            parts.append(text)
                            chunks += 1
                            first = now if first is None else first
                        finish = choice.finish_reason or finish
                    if now - start > limit and finish is None:
                        if chunks < MIN_TOKENS:  # nothing worth keeping: asked again (a varied request)
                            raise _Abandoned(limit, chunks)
                        # what was generated is kept, as a reply cut at max_tokens is: the caller's parser
                        # decides, and an agent asks again (attempt + 1) only if it cannot use it
                        log.warning("llm: %s: cut at its %.0f s limit after %d tokens (%s); the reply so far is "
                                    "kept as a truncated one", label, limit, chunks, self.speed.describe())
                        finish = "length"
                        break
            finally:
                stream.close()
        finally:
            self._status("")
        if not seen:
            raise _Garbage("no chat completion chunk in the stream")
        # Servers that send no usage chunk (llama.cpp): one chunk per token, the prompt estimated.
        prompt = getattr(usage, "prompt_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
        end = time.perf_counter()
        if first is not None:
            self.speed.observe(prompt if prompt is not None else prompt_estimate, first - start,
                               completion if completion is not None else chunks, end - first)
        return {"reply": reply_text("".join(parts)),  # made safe before it is cached, recorded or quoted again
                "finish_reason": finish or "stop",
                "prompt_tokens": prompt if prompt is not None else self._counted(model, messages),
                "completion_tokens": completion if completion is not None else chunks,
                "latency_s": time.perf_counter() - start}

    def _counted(self, model: str, messages: list[dict[str, str]]) -> int:
        """Prompt tokens for accounting where the stream had no usage: llama.cpp's tokenizer
        (its /extras/tokenize/count, plus the template's tokens per message), else the estimate."""
        if self.config.backend == "local" and self._base_url:

            text = "".join(str(m.get("content") or "") for m in messages)
            req = urllib.request.Request(self._base_url.removesuffix("/v1") + "/extras/tokenize/count",
                                         data=json.dumps({"input": text, "model": model}).encode(),
                                         headers={"content-type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return int(json.loads(resp.read())["count"]) + PER_MESSAGE * len(messages)
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return self.prompt_tokens(messages)

    def _status(self, text: str) -> None:
        if self.on_status is not None:
            self.on_status(text)

    def _error(self, message: str, retries: int) -> LLMError:
        err = LLMError(printable(f"llm: {scrub(message)}".splitlines()[0]))  # the endpoint's words, one line
        err.retries = retries  # type: ignore[attr-defined]
        return err


def reply_text(text: str) -> str:
    """A reply as it is kept, quoted in prompts and shown: secrets masked and control characters
    escaped (`nas.terminal`), its lines kept. CRLF becomes a newline and a tab spaces to the
    next multiple of 8 (Python's tab stops), so that code in a reply survives the escaping;
    a control character inside a string literal keeps its value as the escape."""
    return printable(scrub(text).replace("\r\n", "\n").expandtabs(8), lines=True)


def _retry_after(err: Exception) -> float | None:
    headers = getattr(getattr(err, "response", None), "headers", None) or {}
    value = headers.get("retry-after")
    try:
        return None if value is None else max(0.0, float(value))
    except (TypeError, ValueError):
        return None

"""The LLM layer's own logic case by case (issue 52, the library mutation run): speed limits and
retry parameters, accounting, token estimates, GBNF literals, tolerant parsing, prompt files,
settings checks, the reply cache and replay book, and the client's request shaping, backoff,
speed measurement and transcripts against the scripted loopback server (tests/support/scripted.py).
Each boundary at and either side, each check both ways, messages matched whole."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import signal
import sys
import types

import pytest

from nas.errors import ConfigError, NasError
from nas.llm import accounting, guard, local, speed
from nas.llm.accounting import RoleUsage, Usage
from nas.llm.cache import ReplayBook, ReplyCache, Transcript, _reply_problem, call_key
from nas.llm.client import Answer, LLMClient, LLMError, Reply, _retry_after, reply_text
from nas.llm.config import LLMConfig, RoleSettings, check_gguf
from nas.llm.gbnf import gbnf_choice, gbnf_literal
from nas.llm.parse import (
    ParseError,
    extract_code,
    extract_json,
    extract_list,
    extract_tagged,
    fences,
    find_tagged,
    snippet,
)
from nas.llm.prompts import Prompt, load_prompt, packaged_prompts, parse_prompt
from nas.llm.speed import FLOOR_S, MARGIN, MIN_TOKENS, Speed, retry_params
from nas.llm.tokens import PER_MESSAGE, estimate_tokens
from support.scripted import ScriptedServer, Step

KEY = "NASFLOW_TEST_KEY"


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY, "sk-test-cases")


def client_for(server, tmp_path, run_dir=None, **overrides):
    cfg = {"backend": "openai", "base_url": server.base_url if server else "http://127.0.0.1:9/v1", "model": "m",
           "api_key_env": KEY, "timeout_s": 5, "max_retries": 3, "backoff_s": 0.01, "cache": False,
           "cache_dir": str(tmp_path / "cache"), "structured": "none", **overrides}
    sleeps: list[float] = []
    return LLMClient(cfg, run_dir=run_dir, sleep=sleeps.append), sleeps


# -- speed ---------------------------------------------------------------------------------------------

def test_speed_constants_are_as_documented():
    assert (MARGIN, FLOOR_S, MIN_TOKENS, speed.SMOOTHING) == (3.0, 30.0, 4, 0.5)


@pytest.mark.parametrize("prompt, first_s, expected", [
    (0, 1.0, None), (1, 0.0, None), (-1, 1.0, None), (1, -1.0, None), (1, 0.5, 2.0), (10, 4.0, 2.5)])
def test_a_prompt_speed_needs_tokens_and_time(prompt, first_s, expected):
    s = Speed()
    s.observe(prompt, first_s, 0, 0.0)
    assert s.prompt_tps == expected and s.generate_tps is None


@pytest.mark.parametrize("tokens, generate_s, expected", [
    (3, 1.0, None), (4, 1.0, 4.0), (5, 2.0, 2.5), (4, 0.0, None), (4, -1.0, None)])
def test_a_generation_speed_needs_min_tokens_and_time(tokens, generate_s, expected):
    s = Speed()
    s.observe(0, 0.0, tokens, generate_s)
    assert s.generate_tps == expected and s.prompt_tps is None


def test_the_prompt_speed_kept_is_the_slowest_and_generation_blends_half_and_half():
    s = Speed()
    s.observe(100, 1.0, 8, 2.0)          # 100 tokens/s, 4 tokens/s
    s.observe(100, 4.0, 8, 1.0)          # 25 tokens/s (slower: kept), 8 tokens/s (blended)
    assert (s.prompt_tps, s.generate_tps) == (25.0, 6.0)
    s.observe(100, 0.5, 8, 0.5)          # 200 tokens/s (faster: not kept), 16 tokens/s
    assert (s.prompt_tps, s.generate_tps) == (25.0, 11.0)
    assert speed._blend(None, 7.0) == 7.0 and speed._blend(2.0, 6.0) == 4.0


@pytest.mark.parametrize("prompt, unmeasured, expected", [
    (10, 120.0, 30.0),      # the floor: FLOOR_S
    (10, 12.0, 12.0),       # the floor: llm.timeout_s when that is less
    (1000, 12.0, 30.0),     # MARGIN * 1000 / 100
    (2000, 120.0, 60.0),
])
def test_first_token_limit_is_the_measured_time_times_margin_above_a_floor(prompt, unmeasured, expected):
    s = Speed(prompt_tps=100.0)
    assert s.first_token_limit(prompt, unmeasured) == expected
    assert Speed().first_token_limit(prompt, unmeasured) == unmeasured  # nothing measured


@pytest.mark.parametrize("tokens, streaming_s, generate_tps, unmeasured, expected", [
    (4, 1.5, None, 120.0, 2.0 + 3.0 * 20 / 2.0),    # this reply's own speed: 3 tokens after the first in 1.5 s
    (5, 2.0, 1.0, 120.0, 2.0 + 3.0 * 20 / 2.0),     # its own, not the measured one
    (3, 1.5, 10.0, 120.0, 2.0 + 30.0),              # too few of its own: the measured speed, above the floor
    (4, 0.0, 10.0, 120.0, 2.0 + 30.0),              # no time yet: the measured speed
    (3, 1.5, None, 120.0, 2.0 + 120.0),             # nothing measured: the unmeasured limit
    (3, 1.5, 10.0, 5.0, 2.0 + 6.0),                 # MARGIN * 20 / 10 = 6 s above a 5 s floor
    (3, 1.5, 100.0, 5.0, 2.0 + 5.0),                # 0.6 s: the floor
])
def test_reply_limit_follows_the_replys_own_speed_then_the_measured_one(tokens, streaming_s, generate_tps,
                                                                        unmeasured, expected):
    s = Speed(generate_tps=generate_tps)
    assert s.reply_limit(2.0, 20, tokens, streaming_s, unmeasured) == pytest.approx(expected, abs=1e-12)


def test_speed_describes_what_was_measured():
    assert Speed().describe() == "not measured yet"
    assert Speed(prompt_tps=12.34).describe() == "prompt 12.3 tokens/s"
    assert Speed(generate_tps=5.0).describe() == "generation 5.0 tokens/s"
    assert Speed(prompt_tps=500.0, generate_tps=10.0).describe() == "prompt 500.0 tokens/s, generation 10.0 tokens/s"
    assert Speed(prompt_tps=0.0, generate_tps=0.0).describe() == "not measured yet"


@pytest.mark.parametrize("temperature, retry, attempt, out", [
    (0.1234, 1, 0, 0.273),  # rounded to three places
    (0.0, 2, 1, 0.45), (None, 1, 0, 0.15), (1.4, 1, 0, 1.5), (1.5, 3, 3, 1.5),  # at most 1.5
])
def test_a_retry_s_temperature_steps_up_rounded_to_three_places_and_capped(temperature, retry, attempt, out):
    assert retry_params({"temperature": temperature}, retry, attempt)["temperature"] == out


def test_retry_params_vary_every_retry_and_attempt_but_not_the_first():
    params = {"temperature": 0.2, "max_tokens": 9}
    assert retry_params(params, 0) is params and retry_params(params, 0, 0) is params
    assert retry_params(params, 1) == {"temperature": 0.35, "max_tokens": 9, "seed": 1}
    assert retry_params(params, 3, 2) == {"temperature": 0.95, "max_tokens": 9, "seed": 2003}
    assert retry_params({"temperature": 1.4}, 1) == {"temperature": 1.5, "seed": 1}     # capped at 1.5
    assert retry_params({"temperature": 1.3}, 1) == {"temperature": 1.45, "seed": 1}
    assert retry_params({"temperature": None}, 2) == {"temperature": 0.3, "seed": 2}
    assert retry_params({}, 0, 1) == {"temperature": 0.15, "seed": 1000}
    assert params == {"temperature": 0.2, "max_tokens": 9}  # never changed in place


# -- accounting ----------------------------------------------------------------------------------------

def test_usage_counts_each_source_and_failures_apart():
    u = Usage()
    u.record("reader", source="live", prompt_tokens=3, completion_tokens=2, retries=1, truncated=True, latency_s=0.5)
    u.record("reader", source="cache", prompt_tokens=4, completion_tokens=1, latency_s=9.0)
    u.record("reader", source="replay", prompt_tokens=5, completion_tokens=5, latency_s=9.0)
    u.record("reader", source=None, prompt_tokens=100, completion_tokens=100, retries=2, truncated=True,
             latency_s=9.0)
    assert u.roles["reader"] == RoleUsage(calls=3, live=1, cached=1, replayed=1, failures=1, retries=3, truncated=1,
                                          prompt_tokens=12, completion_tokens=8, latency_s=0.5)
    u.record("analyst", source="live", prompt_tokens=1, completion_tokens=1, truncated=False, latency_s=0.25)
    d = u.to_dict()
    assert list(d["roles"]) == ["analyst", "reader"]
    assert d["total"] == {"calls": 4, "live": 2, "cached": 1, "replayed": 1, "failures": 1, "retries": 3,
                          "truncated": 1, "prompt_tokens": 13, "completion_tokens": 9, "latency_s": 0.75,
                          "tokens": 22, "cache_hit_rate": 0.5}
    assert u.total() == RoleUsage(calls=4, live=2, cached=1, replayed=1, failures=1, retries=3, truncated=1,
                                  prompt_tokens=13, completion_tokens=9, latency_s=0.75)


def test_usage_of_nothing_or_only_failures_has_no_hit_rate():
    assert Usage().to_dict() == {"roles": {}, "total": {**dataclasses.asdict(RoleUsage()), "tokens": 0,
                                                        "cache_hit_rate": 0.0}}
    u = Usage()
    u.record("debugger", source=None)
    assert u.to_dict()["total"]["cache_hit_rate"] == 0.0 and u.roles["debugger"].failures == 1
    a = RoleUsage(calls=1, latency_s=0.5)
    a.add(RoleUsage(calls=2, retries=4, latency_s=0.25))
    assert a == RoleUsage(calls=3, retries=4, latency_s=0.75)
    assert accounting.Usage is Usage


# -- tokens and grammar --------------------------------------------------------------------------------

@pytest.mark.parametrize("contents, per_token, expected", [
    ([""], 2.0, PER_MESSAGE), ([None], 2.0, PER_MESSAGE), (["abcd"], 2.0, 2 + 6), (["abcde"], 2.0, 3 + 6),
    (["abc", "x" * 10], 2.5, 2 + 6 + 4 + 6), ([], 2.0, 0)])
def test_token_estimate_rounds_each_message_up_and_adds_its_template(contents, per_token, expected):
    assert PER_MESSAGE == 6
    assert estimate_tokens([{"role": "user", "content": c} for c in contents], per_token) == expected


def test_gbnf_literals_escape_backslashes_and_quotes_and_choices_keep_their_order():
    assert gbnf_literal('a"b\\c') == '"a\\"b\\\\c"' and gbnf_literal("") == '""'
    assert gbnf_choice(["z", "a b"]) == '"z" | "a b"' and gbnf_choice([]) == ""


# -- parsing -------------------------------------------------------------------------------------------

def test_snippet_flattens_and_cuts_at_n():
    assert snippet("a\n  b\tc") == "'a b c'"
    assert snippet("x" * 60) == repr("x" * 60) and snippet("x" * 61) == repr("x" * 60 + "...")
    assert snippet("abcd", 3) == "'abc...'" and snippet("abc", 3) == "'abc'"


def test_tags_are_found_last_first_case_blind_and_unclosed_to_the_end():
    assert find_tagged("<a>1</a> <A>2</A>", "a") == "2"
    assert find_tagged("x <a> open", "a") == " open" and find_tagged("none", "a") is None
    assert find_tagged("<a.b>1</a.b> <aXb>2</aXb>", "a.b") == "1"
    assert extract_tagged("<ans> 42 </ans>", "ans") == "42"
    assert extract_tagged("one ##ans## 1 ##ans##  2 \n", "ans") == "2"
    with pytest.raises(ParseError) as err:
        extract_tagged("no answer here", "ans")
    assert str(err.value) == "no '##ans##' or <ans> in reply 'no answer here'"


def test_code_is_the_longest_fence_in_the_language_else_bare_python():
    text = "```Python\nshort\n```\n```py\nlonger one\n```\n```\nunlabelled, longest\n```\n```js\nx" + "y" * 40 + "\n```"
    assert fences("```Python x\nbody\n```") == [("python", "body\n")]
    assert extract_code(text) == "unlabelled, longest\n"
    assert extract_code("```py\nlonger one\n```\n```c\n" + "c" * 30 + "\n```") == "longer one\n"
    assert extract_code(text, "js") == "x" + "y" * 40 + "\n"
    assert extract_code("```py\nonly py\n```\n```\n\n\nno\n\n```", "c") == "no\n"
    assert extract_code("  import os\nx = 1  ") == "import os\nx = 1\n"
    assert extract_code("# a comment") == "# a comment\n" and extract_code("def f(): pass") == "def f(): pass\n"
    assert extract_code("```python\nopen to the end") == "open to the end\n"
    for text, lang in (("import os", "c"), ("x = 1", "python"), ("```py\nnot c\n```", "c")):
        with pytest.raises(ParseError) as err:
            extract_code(text, lang)
        assert str(err.value) == f"no ```{lang} code block in reply {snippet(text)}"


def test_json_is_the_whole_reply_a_fence_or_the_first_balanced_value():
    assert extract_json(' {"a": 1} ') == {"a": 1}
    assert extract_json('see\n```json\n[1, 2]\n```') == [1, 2]
    assert extract_json('see\n```\n{"b": 2}\n```') == {"b": 2}
    assert extract_json('```json\nnot json\n```\n```\n{"c": 3}\n```') == {"c": 3}
    assert extract_json('```python\n{"py": 1}\n``` and {"d": 4} later') == {"py": 1}  # the python fence is prose
    assert extract_json('x [1] then {"e": 5}') == [1] and extract_json('x {"e": 5} then [1]') == {"e": 5}
    assert extract_json('{"f": 6} trailing') == {"f": 6} and extract_json("[2] {") == [2]
    with pytest.raises(ParseError) as err:
        extract_json("no braces")
    assert str(err.value) == "no JSON object in reply 'no braces'"
    with pytest.raises(ParseError) as err:
        extract_json('ab {"a": }')
    assert str(err.value) == "invalid JSON at char 9: Expecting value in reply 'ab {\"a\": }'"


def test_lists_take_marked_items_else_plain_lines():
    assert extract_list("intro\n- a \n* b\n• c\n1. d\n(2) e\n3) f\nIdea 4: g\nidea5 - h\n") == \
        ["a", "b", "c", "d", "e", "f", "g", "h"]
    assert extract_list("  one \n\n two\n") == ["one", "two"]
    for text in ("", " \n\t\n"):
        with pytest.raises(ParseError) as err:
            extract_list(text)
        assert str(err.value) == f"no list items in reply {snippet(text)}"


# -- prompts -------------------------------------------------------------------------------------------

PROMPT = "---\nname: t\nversion: 3\nrole: reader\n---\n[system]\nBe {{ tone }}.\n[user]\nSay {{what}} {json}\n"


def test_a_prompt_file_parses_renders_and_is_immutable():
    p = parse_prompt(PROMPT, "t.md")
    assert p == Prompt("t", 3, "reader", "Be {{ tone }}.", "Say {{what}} {json}",
                       hashlib.sha256(PROMPT.encode()).hexdigest()[:8])
    assert p.template_id == f"t@3:{p.digest}" and p.fields() == {"tone", "what"}
    assert p.render(tone="brief", what=1) == [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Say 1 {json}"}]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.version = 4  # type: ignore[misc]
    assert hash(p) == hash(parse_prompt(PROMPT, "elsewhere.md"))  # frozen: hashable, the same by value
    with pytest.raises(ConfigError) as err:
        p.render(tone="x")
    assert str(err.value) == "prompt t: no value for field 'what'"
    with pytest.raises(ConfigError, match="prompt t: unknown field 'extra'"):
        p.render(tone="x", what="y", extra=1)
    bare = parse_prompt("---\nname: u\nversion: 1\nrole: reader\n---\n[user]\nhi\n", "u.md")
    assert bare.system == "" and bare.render() == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("text, message", [
    ("name: t\n---\n", "w.md: a prompt file starts with a '---' header"),
    ("---\nname: t\nversion: 1\nrole: r\n[user]\nx\n", "w.md: the '---' header is not closed"),
    ("---\nname: t\nversion 1\nrole: r\n---\n[user]\nx\n", "w.md:3: header line needs 'key: value'"),
    ("---\nversion 1\n---\n[user]\nx\n", "w.md:2: header line needs 'key: value'"),
    ("---\nname: t\nrole: r\n---\n[user]\nx\n", "w.md: header has no 'version'"),
    ("---\nversion: 1\nrole: r\n---\n[user]\nx\n", "w.md: header has no 'name'"),
    ("---\nname: t\nversion: 1\n---\n[user]\nx\n", "w.md: header has no 'role'"),
    ("---\nname: t\nversion: 1\nrole: r\n---\n[system]\nx\n", "w.md: no [user] section"),
    ("---\nname: t\nversion: one\nrole: r\n---\n[user]\nx\n", "w.md: version must be an integer, got 'one'"),
])
def test_malformed_prompt_files_are_one_line_errors(text, message):
    with pytest.raises(ConfigError) as err:
        parse_prompt(text, "w.md")
    assert str(err.value) == message


def test_prompts_load_by_name_or_by_path(tmp_path):
    names = packaged_prompts()
    assert names and all(where.endswith(f"/{name}.md") for name, (where, _) in names.items())
    name = sorted(names)[0]
    assert load_prompt(name).name and load_prompt(name) is load_prompt(name)
    path = tmp_path / "mine.md"
    path.write_text(PROMPT, encoding="utf-8")
    assert load_prompt(str(path)).name == "t"
    with pytest.raises(ConfigError) as err:
        load_prompt("no_such_prompt")
    assert str(err.value) == f"unknown prompt 'no_such_prompt' (valid: {', '.join(sorted(names))})"
    with pytest.raises(ConfigError, match="unknown prompt"):
        load_prompt(str(tmp_path / "missing.md"))


# -- settings ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"backend": "vllm"}, "llm.backend must be one of local, openai, replay, got 'vllm'"),
    ({"structured": "xml"}, "llm.structured must be one of auto, grammar, json_schema, none, got 'xml'"),
    ({"backend": "replay"}, "llm=replay needs llm.replay_from=RUN_DIR (a run whose llm/transcripts.jsonl to replay)"),
    ({"base_url": "ftp://x"}, "llm.base_url must be an http:// or https:// URL, got 'ftp://x'"),
    ({"base_url": "http://"}, "llm.base_url must be an http:// or https:// URL, got 'http://'"),
    ({"timeout_s": 0}, "llm.timeout_s must be > 0 and llm.max_retries, llm.backoff_s >= 0"),
    ({"max_retries": -1}, "llm.timeout_s must be > 0 and llm.max_retries, llm.backoff_s >= 0"),
    ({"backoff_s": -0.1}, "llm.timeout_s must be > 0 and llm.max_retries, llm.backoff_s >= 0"),
    ({"local": {"n_threads": 0}}, "llm.local.n_threads must be an integer >= 1 (or null), got 0"),
    ({"local": {"n_threads_decode": 1.5}}, "llm.local.n_threads_decode must be an integer >= 1 (or null), got 1.5"),
    ({"local": {"n_threads": True}}, "llm.local.n_threads must be an integer >= 1 (or null), got True"),
    ({"local": {"prompt_cache_mb": -1}}, "llm.local.prompt_cache_mb must be an integer >= 0 (MB; 0: off), got -1"),
    ({"local": {"prompt_cache_mb": 1.0}}, "llm.local.prompt_cache_mb must be an integer >= 0 (MB; 0: off), got 1.0"),
    ({"local": {"n_cpus": 1}}, "llm.local: unknown key 'n_cpus' (valid: n_ctx, n_threads, n_threads_decode, "
                               "startup_timeout_s, prompt_cache_mb)"),
    ({"context": 0}, "llm.context must be > 0 tokens (or null), got 0"),
    ({"chars_per_token": 0}, "llm.chars_per_token must be > 0 and llm.context_margin >= 0"),
    ({"context_margin": -1}, "llm.chars_per_token must be > 0 and llm.context_margin >= 0"),
    ({"roles": {"writer": {}}}, "llm.roles: unknown role 'writer' (valid: reader, tagger, analyst, proposer, "
                                "modifier, reflector, navigator, generator, mutator, debugger)"),
    ({"roles": {"reader": {"top_p": 1}}}, "llm.roles.reader: unknown key 'top_p' (valid: model, temperature, "
                                          "max_tokens)"),
    ({"roles": {"reader": {"temperature": -0.01}}}, "llm.roles.reader.temperature must be in [0, 2], got -0.01"),
    ({"roles": {"reader": {"temperature": 2.01}}}, "llm.roles.reader.temperature must be in [0, 2], got 2.01"),
    ({"roles": {"reader": {"max_tokens": 0}}}, "llm.roles.reader.max_tokens must be > 0, got 0"),
    ({"colour": 1}, "llm: unknown key 'colour'"),
])
def test_bad_llm_settings_are_one_line_errors(change, message):
    with pytest.raises(ConfigError) as err:
        LLMConfig.from_dict(change)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


@pytest.mark.parametrize("change", [
    {"name": "openai", "backend": "openai"}, {"backend": "replay", "replay_from": "run"},
    {"base_url": "https://h:1/v1"}, {"timeout_s": 0.01, "max_retries": 0, "backoff_s": 0},
    {"local": {"n_threads": 1, "n_threads_decode": None, "prompt_cache_mb": 0}},
    {"context": 1, "context_margin": 0, "chars_per_token": 0.1},
    {"roles": {"reader": {"temperature": 0.0, "max_tokens": 1}, "tagger": {"temperature": 2.0}, "analyst": None}},
])
def test_llm_settings_at_their_limits_are_accepted(change):
    LLMConfig.from_dict(change)


def test_role_settings_context_model_id_and_structured_mode(tmp_path, monkeypatch):
    cfg = LLMConfig.from_dict({"model": "base", "roles": {"reader": {"model": "r", "temperature": 1, "max_tokens": 7}}})
    assert cfg.role("reader") == RoleSettings("r", 1.0, 7) and cfg.role("tagger") == RoleSettings("base", 0.0, 512)
    with pytest.raises(ConfigError) as err:
        cfg.role("writer")
    assert str(err.value).startswith("unknown LLM role 'writer' (valid: reader, tagger, ")
    assert [LLMConfig.from_dict(d).context_window() for d in (
        {}, {"context": 100}, {"backend": "openai"}, {"backend": "openai", "context": 50},
        {"local": {"n_ctx": 0}}, {"local": {"n_ctx": 128}})] == [4096, 100, None, 50, None, 128]
    assert [LLMConfig.from_dict(d).structured_mode() for d in (
        {}, {"backend": "openai"}, {"backend": "openai", "structured": "grammar"},
        {"structured": "none"})] == ["grammar", "json_schema", "grammar", "none"]
    assert LLMConfig.from_dict({"cache_dir": str(tmp_path / "a" / ".." / "c")}).cache_path() == tmp_path / "c"
    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    assert LLMConfig().cache_path() == tmp_path / "home" / "llm" / "cache"


def test_only_a_gguf_file_is_a_model(tmp_path):
    with pytest.raises(ConfigError) as err:
        check_gguf(str(tmp_path))
    assert str(err.value) == f"llm.model_path: {tmp_path} does not exist or is not a file (give a .gguf model file)"
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"GGU")
    with pytest.raises(ConfigError) as err:
        check_gguf(str(bad))
    assert str(err.value) == f"llm.model_path: {bad} is not a GGUF file (starts with b'GGU', expected b'GGUF')"
    bad.write_bytes(b"GGUFrest")
    check_gguf(str(bad))
    LLMConfig.from_dict({"backend": "openai", "model_path": str(tmp_path / "none.gguf")})  # only local reads it


# -- cache, transcript, replay -------------------------------------------------------------------------

def test_call_keys_follow_every_part_of_the_call():
    base = ("m", [{"role": "user", "content": "x"}], {"temperature": 0.0}, "t@1:ab", 0)
    key = call_key(*base)
    assert len(key) == 32 and key == call_key(*base)
    others = [("n", *base[1:]), (base[0], [{"role": "user", "content": "y"}], *base[2:]),
              (*base[:2], {"temperature": 0.1}, *base[3:]), (*base[:3], "t@2:ab", 0), (*base[:4], 1)]
    assert len({key, *(call_key(*o) for o in others)}) == 6


GOOD = {"reply": "r", "finish_reason": "stop", "prompt_tokens": 0, "completion_tokens": 3, "latency_s": 0}


@pytest.mark.parametrize("change, problem", [
    ({}, None), ({"latency_s": 0.5}, None),
    ({"reply": None}, "no reply text"), ({"finish_reason": 1}, "no reply text"),
    ({"prompt_tokens": -1}, "bad token counts"), ({"completion_tokens": True}, "bad token counts"),
    ({"completion_tokens": 1.0}, "bad token counts"), ({"prompt_tokens": None}, "bad token counts"),
    ({"latency_s": "1"}, "bad latency"), ({"latency_s": False}, "bad latency"), ({"latency_s": None}, "bad latency"),
])
def test_a_cached_reply_is_used_only_whole(change, problem):
    assert _reply_problem({**GOOD, **change}) == problem


def test_the_reply_cache_returns_only_its_own_well_formed_records(tmp_path, caplog):
    cache = ReplyCache(tmp_path)
    assert cache.get("k1") is None
    cache.put({"key": "k1", **GOOD})
    assert cache.get("k1") == {"key": "k1", **GOOD}
    cache.write("k2", {"key": "other", **GOOD})
    cache.write("k3", ["k3"])
    cache.write("k4", {"key": "k4", **GOOD, "reply": None})
    cache.path("k5").parent.mkdir()
    cache.path("k5").write_text("{", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="nas.llm"):
        assert [cache.get(k) for k in ("k2", "k3", "k4", "k5")] == [None] * 4
    assert [r.getMessage() for r in caplog.records] == [
        f"corrupt LLM cache file {cache.path('k4')} (no reply text); asking the model again",
        f"corrupt LLM cache file {cache.path('k5')} (Expecting property name enclosed in double quotes: "
        "line 1 column 2 (char 1)); asking the model again"]


def test_the_replay_book_keeps_a_success_over_a_failure_and_each_roles_first_settings(tmp_path):
    records = [
        {"key": "a", "role": "reader", "model": "m1", "params": {"temperature": 0.1, "max_tokens": 5},
         "context": 99, "error": "boom"},
        {"key": 7, "role": "tagger", "model": "skipped"},
        {"key": "a", "role": "reader", "model": "m2", "model_id": "m2@f", "reply": "ok", "error": None,
         "structured_mode": "grammar"},
        {"key": "a", "role": "reader", "reply": "later", "error": None},
        {"key": "b", "role": "tagger", "model": "t", "error": "x"},
        {"key": "b", "role": "tagger", "model": "t", "error": "y"},
    ]
    run = tmp_path / "run"
    (run / "llm").mkdir(parents=True)
    (run / "llm" / "transcripts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    book = ReplayBook(run)
    assert book.path == run / "llm" / "transcripts.jsonl" and set(book.records) == {"a", "b"}
    assert book.get("a")["reply"] == "ok" and book.get("b")["error"] == "x" and book.get("c") is None
    assert book.settings == {
        "reader": {"model": "m1", "model_id": "m1", "temperature": 0.1, "max_tokens": 5, "context": 99,
                   "structured_mode": "none"},
        "tagger": {"model": "t", "model_id": "t", "temperature": None, "max_tokens": None, "context": None,
                   "structured_mode": "none"}}
    assert ReplayBook(run / "llm" / "transcripts.jsonl").records.keys() == book.records.keys()
    with pytest.raises(ConfigError) as err:
        ReplayBook(tmp_path / "nothing")
    assert str(err.value) == (f"llm.replay_from: {tmp_path / 'nothing'} does not exist "
                              "(give a run dir with llm/transcripts.jsonl)")


def test_a_transcript_cuts_a_torn_last_line_and_appends_after_it(tmp_path):
    path = tmp_path / "llm" / "transcripts.jsonl"
    path.parent.mkdir()
    path.write_text('{"seq": 1}\n{"seq": 2', encoding="utf-8")
    t = Transcript(tmp_path)
    assert t.previous == [{"seq": 1}]
    t.append({"seq": 3})
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"seq": 1}, {"seq": 3}]


# -- the client ----------------------------------------------------------------------------------------

def test_replies_and_answers_say_what_they_hold():
    reply = Reply("t", "length", 1, 2, "live", "k", "reader", 0)
    assert reply.truncated and not dataclasses.replace(reply, finish_reason="stop").truncated
    assert not Answer().ok and Answer(value=0).ok and Answer(value="").ok


def test_retry_after_is_a_non_negative_number_or_none():
    def err(headers):
        return types.SimpleNamespace(response=types.SimpleNamespace(headers=headers))
    assert [_retry_after(err(h)) for h in ({"retry-after": "2.5"}, {"retry-after": "-3"}, {"retry-after": "soon"},
                                            {}, None)] == [2.5, 0.0, None, None, None]
    assert _retry_after(ValueError("no response")) is None


def test_reply_text_masks_escapes_and_keeps_lines_and_tab_stops():
    assert reply_text("a\r\nb\tc\x1b[31m") == "a\nb       c\\x1b[31m"
    assert reply_text("12345678\tx") == "12345678        x"


@pytest.mark.parametrize("mode, grammar, schema, expected", [
    ("grammar", "root ::= x", {"type": "object"}, {"extra_body": {"grammar": "root ::= x"}}),
    ("grammar", None, {"type": "object"}, {"response_format": {"type": "json_object", "schema": {"type": "object"}}}),
    ("grammar", "", None, {}),
    ("json_schema", "root ::= x", {"type": "object"},
     {"response_format": {"type": "json_schema", "json_schema": {"name": "reply", "schema": {"type": "object"}}}}),
    ("json_schema", "root ::= x", None, {}),
    ("none", "root ::= x", {"type": "object"}, {}),
])
def test_what_constrains_a_reply_follows_the_mode(tmp_path, mode, grammar, schema, expected):
    client, _ = client_for(None, tmp_path)
    assert client._structured(grammar, schema, mode) == expected


def test_a_constrained_call_sends_its_grammar_and_keys_on_it(tmp_path):
    with ScriptedServer(["a", "b", "c"]) as srv:
        client, _ = client_for(srv, tmp_path, structured="grammar")
        one = client.complete("reader", "q", grammar="root ::= x")
        two = client.complete("reader", "q")
        three = client.complete("reader", "q", schema={"type": "object"})
    assert srv.requests[0]["grammar"] == "root ::= x" and "grammar" not in srv.requests[1]
    assert srv.requests[2]["response_format"] == {"type": "json_object", "schema": {"type": "object"}}
    assert len({one.key, two.key, three.key}) == 3


def test_no_key_and_no_base_url_is_a_config_error_and_a_keyless_server_gets_a_placeholder(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY)
    client = LLMClient({"backend": "openai", "api_key_env": KEY, "cache": False})
    with pytest.raises(ConfigError) as err:
        client.complete("reader", "x")
    assert str(err.value) == f"llm=openai: set the API key in ${KEY} (or llm.base_url for a server without keys)"
    with ScriptedServer(["fine"]) as srv:
        client, _ = client_for(srv, tmp_path)
        assert client.complete("reader", "x").text == "fine"
    assert srv.auth_headers == ["Bearer not-needed"]


def test_backoff_doubles_up_to_its_cap_with_at_most_a_tenth_of_jitter(tmp_path):
    with ScriptedServer([Step(fault="500")] * 4 + ["ok"]) as srv:
        client, sleeps = client_for(srv, tmp_path, max_retries=4, backoff_s=1.0, backoff_max_s=3.0)
        reply = client.complete("reader", "x")
    assert reply.text == "ok" and len(sleeps) == 4
    for slept, base in zip(sleeps, (1.0, 2.0, 3.0, 3.0)):
        assert base <= slept <= base * 1.1


def test_a_rate_limit_waits_as_told_capped_without_jitter_and_a_client_error_is_final(tmp_path):
    with ScriptedServer([Step(fault="429"), "ok", Step(fault="404"), Step(fault="408"), "again"]) as srv:
        client, sleeps = client_for(srv, tmp_path, backoff_s=5.0, backoff_max_s=20.0)
        assert client.complete("reader", "x").text == "ok"
        with pytest.raises(LLMError) as err:
            client.complete("reader", "y")
        assert client.complete("reader", "z").text == "again"   # 408 is retried
    assert sleeps[0] == 0.0 and 5.0 <= sleeps[1] <= 5.5 and len(sleeps) == 2
    assert str(err.value) == "llm: endpoint refused the request (HTTP 404): Error code: 404 - scripted fault: HTTP 404"
    assert client.usage.roles["reader"] == RoleUsage(calls=2, live=2, failures=1, retries=2,
                                                     prompt_tokens=2, completion_tokens=2,
                                                     latency_s=client.usage.roles["reader"].latency_s)


def test_giving_up_counts_every_try_in_one_line(tmp_path):
    with ScriptedServer([], default=None) as srv:
        client, sleeps = client_for(srv, tmp_path, max_retries=1)
        with pytest.raises(LLMError) as err:
            client.complete("reader", "x")
    assert str(err.value) == "llm: server error (HTTP 500); gave up after 2 tries" and len(sleeps) == 1
    assert err.value.retries == 1 and client.usage.roles["reader"].retries == 1
    with ScriptedServer([], default=None) as srv:
        client, sleeps = client_for(srv, tmp_path, max_retries=0)
        with pytest.raises(LLMError, match=r"^llm: server error \(HTTP 500\); gave up after 1 tries$"):
            client.complete("reader", "x")
    assert sleeps == []


def test_a_live_call_measures_the_endpoints_speed_and_labels_its_calls(tmp_path):
    """Prompt speed over the time to the first token, generation over the rest: a loopback answer's
    first token comes within seconds of the request, so its prompt speed is far above 6 tokens per 30 s."""
    words = " ".join(f"w{i}" for i in range(8))
    with ScriptedServer([words, Step(fault="500"), "b"]) as srv:
        client, _ = client_for(srv, tmp_path)
        statuses: list[str] = []
        client.on_status = statuses.append
        client.complete("reader", "a b c d e f")
        assert client.speed.prompt_tps is not None and client.speed.prompt_tps > 6 / 30
        assert client.speed.generate_tps is not None and client.speed.generate_tps > 8 / 30
        client.complete("reader", "a")
    assert [s for s in statuses if s] == ["reader call 1...", "reader call 2...", "reader call 2, try 2..."]


def test_a_resumed_transcript_carries_its_accounting_and_numbering(tmp_path):
    run = tmp_path / "run"
    with ScriptedServer(["one", "two"]) as srv:
        first, _ = client_for(srv, tmp_path, run_dir=run)
        first.complete("reader", "q1")
        second, _ = client_for(srv, tmp_path, run_dir=run)
        assert second.usage.roles["reader"].calls == 1 and second.transcript.previous == []
        second.complete("reader", "q2")
    records = [json.loads(line) for line in (run / "llm" / "transcripts.jsonl").read_text().splitlines()]
    assert [r["seq"] for r in records] == [1, 2] and [r["reply"] for r in records] == ["one", "two"]
    assert second.usage.roles["reader"].calls == 2 and second.usage.roles["reader"].live == 2


def test_a_replay_asks_with_the_recorded_settings_and_fits_prompts_to_the_recorded_context(tmp_path):
    run = tmp_path / "run"
    with ScriptedServer(["one"]) as srv:
        live, _ = client_for(srv, tmp_path, run_dir=run, context=500,
                             roles={"reader": {"temperature": 0.3, "max_tokens": 64}})
        assert live.prompt_budget("reader") == 500 - 64 - 64
        live.complete("reader", "q1")
    replay = LLMClient({"backend": "replay", "replay_from": str(run), "api_key_env": KEY, "cache": False,
                        "roles": {"reader": {"temperature": 0.9, "max_tokens": 8}}})
    assert replay.prompt_budget("reader") == 500 - 64 - 64 and replay.prompt_budget("reader", 10) == 500 - 10 - 64
    assert replay.prompt_budget("tagger") is None  # a role the run never asked: no recorded context
    again = replay.complete("reader", "q1")
    assert again.text == "one" and again.source == "replay"
    with pytest.raises(LLMError, match=r"^replay: no recorded reader call with key \w+ \(template -, attempt 0\)"):
        replay.complete("reader", "q1", temperature=0.9)


def test_a_replayed_call_has_no_retries_and_a_recorded_failure_fails_again(tmp_path):
    run = tmp_path / "run"
    with ScriptedServer(["one", Step(fault="500")]) as srv:
        live, _ = client_for(srv, tmp_path, run_dir=run, max_retries=0)
        live.complete("reader", "q1")
        with pytest.raises(LLMError):
            live.complete("reader", "q2")
    replay = LLMClient({"backend": "replay", "replay_from": str(run), "api_key_env": KEY, "cache": False})
    assert replay.complete("reader", "q1").text == "one"
    with pytest.raises(LLMError) as err:
        replay.complete("reader", "q2")
    assert str(err.value) == "llm: server error (HTTP 500); gave up after 1 tries"
    assert replay.usage.roles["reader"] == RoleUsage(calls=1, replayed=1, failures=1, prompt_tokens=1,
                                                     completion_tokens=1)


def test_the_cache_answers_a_repeat_and_a_calls_hook_runs_each_fetch(tmp_path):
    seen = []

    def calls(role, key, fetch, cached):
        seen.append((role, len(key), cached))
        return fetch()

    with ScriptedServer(["one"]) as srv:
        client, _ = client_for(srv, tmp_path, cache=True)
        client.calls = calls
        first, again = client.complete("reader", "q"), client.complete("reader", "q")
    assert (first.source, again.source, again.text, len(srv.requests)) == ("live", "cache", "one", 1)
    assert seen == [("reader", 32, True), ("reader", 32, True)]
    record = ReplyCache(tmp_path / "cache").get(first.key)
    assert record is not None and record["reply"] == "one" and record["role"] == "reader"


def test_ask_tries_at_least_once_from_its_first_attempt_and_a_cut_reply_names_its_setting(tmp_path):
    prompt = parse_prompt("---\nname: t\nversion: 1\nrole: proposer\n---\n[user]\ngo\n", "t.md")
    with ScriptedServer([Step("a b c d", fault="truncated"), "no", "yes"]) as srv:
        client, _ = client_for(srv, tmp_path)
        cut = client.ask("proposer", prompt, {}, lambda r: r.text, tries=0, first_attempt=2)
        answer = client.ask("proposer", prompt, {}, lambda r: int(r.text == "yes") or int("x"), tries=2)
    assert not cut.ok and [r.attempt for r in cut.replies] == [2]
    assert cut.errors == ["attempt 2: reply cut at max_tokens (2 tokens); raise llm.roles.proposer.max_tokens"]
    assert answer.value == 1 and answer.errors == ["attempt 0: invalid literal for int() with base 10: 'x'"]
    assert [r.attempt for r in answer.replies] == [0, 1]


def test_each_transient_fault_is_said_as_what_it_was(tmp_path):
    cases = [("garbage", "garbage reply: "), ("disconnect", "connection failed ("), ("badjson", "garbage reply: ")]
    for fault, start in cases:
        with ScriptedServer([Step(fault=fault)]) as srv:
            client, _ = client_for(srv, tmp_path, max_retries=0)
            with pytest.raises(LLMError) as err:
                client.complete("reader", "x")
        message = str(err.value)
        assert message.startswith(f"llm: {start}") and message.endswith("; gave up after 1 tries"), message
        assert "\n" not in message


def test_a_call_that_never_starts_streaming_is_abandoned_at_its_limit(tmp_path):
    with ScriptedServer([Step("late words here", fault="slow", delay_s=3.0)]) as srv:
        client, _ = client_for(srv, tmp_path, max_retries=0, timeout_s=0.3)
        with pytest.raises(LLMError) as err:
            client.complete("reader", "x")
    assert str(err.value) in ("llm: timed out after 0.3 s (generation cancelled); gave up after 1 tries",
                              "llm: no reply within 0 s (0 tokens; limit from the measured speed: not measured "
                              "yet; generation cancelled); gave up after 1 tries")


def test_local_accounting_asks_the_local_tokenizer_only_for_the_local_backend(tmp_path):
    client, _ = client_for(None, tmp_path)
    messages = [{"role": "user", "content": "x" * 9}]
    assert client._counted("m", messages) == 5 + 6
    client._base_url = "http://127.0.0.1:9/v1"      # openai backend: never asked
    assert client._counted("m", messages) == 11
    local = LLMClient({"backend": "local", "cache": False})
    assert local._counted("m", messages) == 11      # no server started: the estimate
    local._base_url = "http://127.0.0.1:9/v1"       # nothing listening: the estimate
    assert local._counted("m", messages) == 11


def test_an_error_is_one_masked_line(tmp_path):
    client, _ = client_for(None, tmp_path)
    err = client._error("first line sk-test-cases\nsecond", 2)
    assert str(err) == "llm: first line ***" and err.retries == 2


# -- the local server's lifecycle, with a stand-in child ----------------------------------------------

READY = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if self.path == "/v1/models" else 404
        self.send_response(code); self.send_header("content-length", "0"); self.end_headers()
    def log_message(self, *a): pass
print("listening", flush=True)
http.server.HTTPServer(("127.0.0.1", PORT), H).serve_forever()
"""


class Stand(local.LocalServer):
    """LocalServer whose child is `script` (PORT filled in) instead of llama.cpp's server."""

    def __init__(self, script: str, **kwargs) -> None:
        super().__init__("unused.gguf", alias="stand", **kwargs)
        self.script = script

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-c", self.script.replace("PORT", str(port))]


def test_a_local_server_starts_once_answers_and_stops(tmp_path):
    srv = Stand(READY, log_path=tmp_path / "new" / "dir" / "s.log", startup_timeout_s=20)
    assert (srv.running, srv.pid, srv.base_url) == (False, None, None)
    try:
        url = srv.start()
        assert url == f"http://127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}/v1" and url == srv.base_url
        pid = srv.pid
        assert srv.running and pid is not None and srv.start() == url and srv.pid == pid   # started once
        assert repr(srv) == f"LocalServer(alias='stand', base_url='{url}', running=True)"
    finally:
        srv.stop()
    assert (srv.running, srv.pid, srv.base_url, srv._log_fh) == (False, None, None, None)
    assert "listening" in (tmp_path / "new" / "dir" / "s.log").read_text()
    srv.stop()  # stopping twice is nothing


def test_a_local_server_that_dies_or_hangs_is_one_line_naming_its_log(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("from an earlier run\n")
    dies = Stand("import sys; print('loading'); print('  bad magic  '); print(); sys.exit(3)", log_path=log)
    with pytest.raises(NasError) as err:
        dies.start()
    assert str(err.value) == f"local LLM server (stand) exited with status 3 before it was ready: bad magic (log: {log})"
    assert not dies.running and dies.base_url is None
    hangs = Stand("import time; time.sleep(60)", log_path=tmp_path / "h.log", startup_timeout_s=0.3)
    with pytest.raises(NasError) as err:
        hangs.start()
    assert str(err.value) == (f"local LLM server (stand) was not ready after 0.3 s: (log is empty) "
                              f"(log: {tmp_path / 'h.log'})")
    assert not hangs.running and hangs._proc is None


def test_the_last_log_line_is_clipped_and_read_from_the_offset(tmp_path):
    log = tmp_path / "l.log"
    log.write_bytes(b"old line\nnew \xff\n" + b"x" * 301 + b"\n\n")
    assert local.log_since(log, 9) == "new \ufffd\n" + "x" * 301 + "\n\n"
    assert local._last_line(log, 0) == "x" * 297 + "..."
    log.write_text("a\n" + "y" * 300 + "\n")
    assert local._last_line(log, 0) == "y" * 300 and local._last_line(log, 1000) == ""
    assert local.log_since(tmp_path / "none", 0) == "" and local._last_line(tmp_path / "none", 0) == ""


def test_shared_servers_are_one_per_settings_and_all_stop(tmp_path, monkeypatch):
    made = []

    class Recorded(Stand):
        def __init__(self, **settings):
            super().__init__(READY, log_path=tmp_path / f"{len(made)}.log", startup_timeout_s=20)
            made.append(settings)

    monkeypatch.setattr(local, "LocalServer", Recorded)
    monkeypatch.setattr(local, "_shared", {})
    try:
        a = local.shared_server(model=tmp_path / "m.gguf", n_ctx=1)
        b = local.shared_server(n_ctx=1, model=str(tmp_path / "m.gguf"))
        c = local.shared_server(n_ctx=2)
        assert a is b and a is not c and a.running and c.running and len(made) == 2
        assert local._settings_key({"b": 1, "a": tmp_path}) == (("a", str(tmp_path)), ("b", 1))
    finally:
        local.stop_shared()
    assert not a.running and not c.running and local._shared == {}


def test_the_guard_runs_its_command_and_says_how_to_call_it(capsys):
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert guard.main([]) == 2
        assert capsys.readouterr().err == "usage: python -m nas.llm.guard COMMAND [ARGS...]\n"
        assert guard.main([sys.executable, "-c", "raise SystemExit(3)"]) == 3
        assert guard.main([sys.executable, "-c", "pass"]) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_idle_cores_leave_at_least_one_and_an_unreadable_machine_looks_idle(tmp_path, monkeypatch):
    assert local.idle_cores(4, lambda: 10) == 1 and local.idle_cores(4, lambda: 1) == 4
    assert local.idle_cores(4, iter([9, 1, 3, 2, 9]).__next__) == 2   # the median look: 3 running, 2 others
    monkeypatch.setattr(local.os, "cpu_count", lambda: None)
    assert local.idle_cores(None, lambda: 1) == 1
    assert local._running_processes(tmp_path / "none") == 1
    (tmp_path / "loadavg").write_text("0.5 0.4 0.3 7/300 12\n")
    assert local._running_processes(tmp_path / "loadavg") == 7


def test_the_prompt_cache_counts_the_logits_and_tokens_it_keeps():
    from nas.llm.llama_server import _held_bytes

    def state(size, scores, ids):
        return types.SimpleNamespace(llama_state_size=size, scores=types.SimpleNamespace(nbytes=scores),
                                     input_ids=types.SimpleNamespace(nbytes=ids))

    cache = types.SimpleNamespace(cache_state={"a": state(100, 20, 3), "b": state(1000, 200, 30)})
    assert _held_bytes(cache) == 1353 and _held_bytes(types.SimpleNamespace(cache_state={})) == 0


def test_a_retry_is_logged_with_its_number_and_what_it_asks_with(tmp_path, caplog):
    with ScriptedServer([Step(fault="500"), "ok"]) as srv:
        client, _ = client_for(srv, tmp_path, backoff_s=0.001)
        with caplog.at_level(logging.WARNING, logger="nas.llm"):
            client.complete("reader", "x")
    assert [r.getMessage() for r in caplog.records] == [
        "llm: server error (HTTP 500); retry 1/3 in 0.0 s, with temperature 0.15 and seed 1 (not the same request)"]


def test_an_attempt_says_false_when_it_failed_and_true_when_it_parsed(tmp_path):
    with ScriptedServer(["not a number", "7"]) as srv:
        client, _ = client_for(srv, tmp_path)
        answer: Answer[int] = Answer()
        failed = client.attempt(answer, "reader", [{"role": "user", "content": "x"}], lambda r: int(r.text),
                                template="t")
        parsed = client.attempt(answer, "reader", [{"role": "user", "content": "x"}], lambda r: int(r.text),
                                template="t", attempt=1)
    assert failed is False and parsed is True and answer.value == 7


def test_the_guard_as_a_module_runs_its_arguments_as_the_command():
    import os
    import subprocess
    from pathlib import Path

    tree = str(Path(__file__).resolve().parents[1])   # this tree's nas, whatever PYTHONPATH says
    done = subprocess.run([sys.executable, "-m", "nas.llm.guard", sys.executable, "-c", "raise SystemExit(3)"],
                          capture_output=True, timeout=60, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
    assert done.returncode == 3 and done.stderr == b""

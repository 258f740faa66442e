"""The LLM client against a real loopback chat-completions server with scripted
replies and faults: retries, timeouts, garbage, cache, transcripts, replay,
accounting, constrained decoding requests, and no API key in any file."""

from __future__ import annotations

import json
import logging
import time

import pytest

from nas.errors import ConfigError
from nas.llm import LLMClient, LLMConfig, LLMError, ParseError
from nas.llm.parse import extract_code, extract_json, extract_list, extract_tagged
from nas.llm.prompts import load_prompt, packaged_prompts, parse_prompt
from support.scripted import ScriptedServer, Step

SECRET = "sk-test-SECRETSECRET123456"


def make_client(server, tmp_path, run_dir=None, **overrides):
    cfg = {"backend": "openai", "base_url": server.base_url if server else None, "model": "m",
           "api_key_env": "NASFLOW_TEST_KEY", "timeout_s": 5, "max_retries": 3, "backoff_s": 0.01,
           "cache_dir": str(tmp_path / "cache"), "structured": "none", **overrides}
    sleeps: list[float] = []
    client = LLMClient(cfg, run_dir=run_dir, sleep=sleeps.append)
    return client, sleeps


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", SECRET)


def test_reply_usage_and_transcript(tmp_path):
    with ScriptedServer(["two words"]) as srv:
        client, _ = make_client(srv, tmp_path, run_dir=tmp_path / "run")
        reply = client.complete("proposer", "hello there model")
    assert reply.text == "two words" and reply.source == "live" and not reply.truncated
    assert (reply.prompt_tokens, reply.completion_tokens) == (3, 2)
    usage = client.usage.to_dict()
    assert usage["roles"]["proposer"]["live"] == 1 and usage["total"]["tokens"] == 5
    lines = (tmp_path / "run/llm/transcripts.jsonl").read_text().splitlines()
    record = json.loads(lines[0])
    assert record["reply"] == "two words" and record["role"] == "proposer" and record["source"] == "live"
    assert srv.auth_headers == [f"Bearer {SECRET}"]


@pytest.mark.parametrize("fault", ["500", "429", "garbage", "disconnect"])
def test_transient_faults_are_retried(tmp_path, fault):
    with ScriptedServer([Step(fault=fault), Step(fault=fault), "fine"]) as srv:
        client, sleeps = make_client(srv, tmp_path)
        reply = client.complete("modifier", "x")
    assert reply.text == "fine"
    assert len(srv.requests) == 3 and len(sleeps) == 2
    assert client.usage.to_dict()["roles"]["modifier"]["retries"] == 2


def test_backoff_grows_and_429_honours_retry_after(tmp_path):
    with ScriptedServer([Step(fault="500"), Step(fault="500"), Step(fault="429"), "ok"]) as srv:
        client, sleeps = make_client(srv, tmp_path, backoff_s=1.0)
        client.complete("reader", "x")
    assert 1.0 <= sleeps[0] < sleeps[1] and sleeps[2] == 0.0  # retry-after: 0


def test_timeout_then_success(tmp_path):
    with ScriptedServer([Step(reply="late", fault="slow", delay_s=3.0), "on time"]) as srv:
        client, sleeps = make_client(srv, tmp_path, timeout_s=0.5)
        assert client.complete("reader", "x").text == "on time"
    assert len(sleeps) == 1


def test_timeout_closes_the_stream_so_the_server_stops_generating(tmp_path, monkeypatch):
    """The call is streamed: giving up at its limit closes the connection mid-reply (llama.cpp's server
    then stops generating), so nothing queues behind an abandoned generation. The limit follows the
    reply's own speed (nas/llm/speed.py): 60 tokens at 10 tokens/s with a margin of 0.5 may take 3 s,
    so the 6 s reply is cut about halfway, and what came is kept as a truncated reply (nothing
    computed is thrown away; the caller's parser decides)."""
    from nas.llm import speed

    monkeypatch.setattr(speed, "MARGIN", 0.5)
    words = " ".join(f"w{i}" for i in range(60))
    with ScriptedServer([Step(words, fault="slow", delay_s=6.0)]) as srv:
        client, sleeps = make_client(srv, tmp_path, timeout_s=0.6, run_dir=tmp_path / "run")
        statuses: list[str] = []
        client.on_status = statuses.append                                  # e.g. the search's progress bar
        reply = client.complete("reader", "x y", max_tokens=60)
        deadline = time.monotonic() + 5
        while not srv.abandoned and time.monotonic() < deadline:
            time.sleep(0.05)
    assert reply.truncated and reply.finish_reason == "length" and sleeps == [] and len(srv.requests) == 1
    assert 10 < len(reply.text.split()) < 60 and words.startswith(reply.text)
    assert reply.completion_tokens == len(reply.text.split())
    assert len(srv.abandoned) == 1 and srv.abandoned[0]["request"] == 0 and srv.abandoned[0]["sent"] < 60
    assert all(r["stream"] for r in srv.requests)
    record = json.loads((tmp_path / "run/llm/transcripts.jsonl").read_text().splitlines()[0])
    assert record["retries"] == 0 and record["latency_s"] > 0 and record["reply"] == reply.text
    assert [s for s in statuses if " tokens" not in s] == ["reader call 1...", ""]
    assert "reader call 1, 2 s, " in " | ".join(statuses)                # a live count while it streamed


def test_model_path_must_be_a_gguf_and_names_the_cache_key(tmp_path):
    with pytest.raises(ConfigError, match=r"llm.model_path: .*nope.gguf does not exist"):
        LLMConfig.from_dict({"model_path": str(tmp_path / "nope.gguf")})
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ConfigError, match=r"is not a GGUF file \(starts with b'PK\\x03\\x04'"):
        LLMConfig.from_dict({"model_path": str(fake)})
    fake.write_bytes(b"GGUF" + bytes(60))
    cfg = LLMConfig.from_dict({"model_path": str(fake)})
    assert cfg.model_id("m") == "m@model.gguf:64" and LLMConfig().model_id("m") == "m"
    assert LLMConfig.from_dict({"backend": "openai", "model_path": str(fake)}).model_id("m") == "m"


def test_prompt_budget_leaves_room_for_the_reply(tmp_path):
    client, _ = make_client(None, tmp_path, base_url="http://127.0.0.1:9/v1", context=1000, context_margin=50,
                            chars_per_token=2.0, roles={"navigator": {"max_tokens": 300}})
    assert client.prompt_budget("navigator") == 650 and client.prompt_budget("navigator", 100) == 850
    assert client.prompt_tokens([{"role": "user", "content": "x" * 101}]) == 51 + 6
    assert make_client(None, tmp_path, base_url="http://127.0.0.1:9/v1")[0].prompt_budget("reader") is None
    assert LLMConfig().context_window() == 4096
    with pytest.raises(ConfigError, match="llm.context must be > 0"):
        LLMConfig.from_dict({"context": 0})


def test_gives_up_with_one_line_and_records_failure(tmp_path, caplog):
    with ScriptedServer([], default=None) as srv:  # every call: 500 "script exhausted"
        client, sleeps = make_client(srv, tmp_path, max_retries=2, run_dir=tmp_path / "run")
        with caplog.at_level(logging.WARNING, logger="nas.llm"):
            with pytest.raises(LLMError) as err:
                client.complete("debugger", "x")
    msg = str(err.value)
    assert "\n" not in msg and "HTTP 500" in msg and "3 tries" in msg
    assert len(sleeps) == 2 and len(caplog.records) == 2
    assert client.usage.to_dict()["roles"]["debugger"]["failures"] == 1
    record = json.loads((tmp_path / "run/llm/transcripts.jsonl").read_text())
    assert record["error"] == msg and record["source"] is None


def test_connection_refused_is_an_llm_error(tmp_path):
    srv = ScriptedServer(["x"]).start()
    url = srv.base_url
    srv.stop()
    client = LLMClient({"backend": "openai", "base_url": url, "api_key_env": "NASFLOW_TEST_KEY",
                        "max_retries": 1, "cache": False}, sleep=lambda s: None)
    with pytest.raises(LLMError, match="connection failed"):
        client.complete("reader", "x")


def test_truncated_reply_is_a_parse_failure_not_a_crash(tmp_path):
    prompt = parse_prompt("---\nname: t\nversion: 1\nrole: proposer\n---\n[user]\nsay {{what}}\n", "t.md")
    with ScriptedServer([Step(reply="one two three four", fault="truncated"), "<answer>42</answer>"]) as srv:
        client, _ = make_client(srv, tmp_path)
        answer = client.ask("proposer", prompt, {"what": "it"}, lambda r: extract_tagged(r.text, "answer"), tries=2)
    assert answer.ok and answer.value == "42"
    assert "max_tokens" in answer.errors[0]
    assert [r.attempt for r in answer.replies] == [0, 1]
    assert client.usage.to_dict()["roles"]["proposer"]["truncated"] == 1


def test_garbage_content_never_raises_from_ask(tmp_path):
    prompt = parse_prompt("---\nname: t\nversion: 1\nrole: generator\n---\n[user]\ngo\n", "t.md")
    with ScriptedServer(["%%% nothing useful %%%", Step(fault="500")], default=None) as srv:
        client, _ = make_client(srv, tmp_path, max_retries=0)
        answer = client.ask("generator", prompt, {}, lambda r: extract_json(r.text), tries=2)
    assert not answer.ok and len(answer.errors) == 2
    assert "no JSON object" in answer.errors[0] and "HTTP 500" in answer.errors[1]


def test_cache_serves_a_rerun_without_calls(tmp_path):
    with ScriptedServer(["a", "b", "c"]) as srv:
        first, _ = make_client(srv, tmp_path)
        replies = [first.complete("proposer", "p1").text, first.complete("proposer", "p2").text]
        second, _ = make_client(srv, tmp_path)
        again = [second.complete("proposer", "p1"), second.complete("proposer", "p2")]
        assert len(srv.requests) == 2
        third = second.complete("proposer", "p1", attempt=1)  # another attempt is another call
    assert [r.text for r in again] == replies and {r.source for r in again} == {"cache"}
    assert third.source == "live" and len(srv.requests) == 3
    assert second.usage.to_dict()["total"]["cache_hit_rate"] == pytest.approx(2 / 3)


def test_prompt_edit_changes_the_key(tmp_path):
    a = parse_prompt("---\nname: t\nversion: 1\nrole: reader\n---\n[user]\nA {{x}}\n", "a.md")
    b = parse_prompt("---\nname: t\nversion: 1\nrole: reader\n---\n[user]\nA  {{x}}\n", "b.md")
    assert a.template_id != b.template_id
    with ScriptedServer(["r1", "r2"]) as srv:
        client, _ = make_client(srv, tmp_path)
        client.ask("reader", a, {"x": 1}, lambda r: r.text)
        client.ask("reader", b, {"x": 1}, lambda r: r.text)
    assert len(srv.requests) == 2


def test_replay_is_identical_and_offline(tmp_path):
    run = tmp_path / "run"
    with ScriptedServer(["one", Step(fault="500"), "two"]) as srv:
        live, _ = make_client(srv, tmp_path, run_dir=run, cache=False, max_retries=0,
                              roles={"reader": {"temperature": 0.3, "max_tokens": 64}})
        history = [live.complete("reader", "q1").text]
        with pytest.raises(LLMError) as failed:
            live.complete("reader", "q2")
        history.append(live.complete("reader", "q2", attempt=1).text)
    # The server is gone; the replaying config even differs in role settings.
    replay = LLMClient({"backend": "replay", "replay_from": str(run), "cache": False},
                       run_dir=tmp_path / "run2")
    assert replay.complete("reader", "q1").text == history[0]
    with pytest.raises(LLMError) as again:
        replay.complete("reader", "q2")
    assert str(again.value) == str(failed.value)
    assert replay.complete("reader", "q2", attempt=1).text == history[1]
    with pytest.raises(LLMError, match="no recorded reader call"):
        replay.complete("reader", "never asked")
    usage = replay.usage.to_dict()["total"]
    assert usage["replayed"] == 2 and usage["live"] == 0


def test_replay_takes_the_recorded_structured_mode(tmp_path):
    """A run recorded with grammars sent replays under a config whose own mode would send none."""
    run = tmp_path / "run"
    with ScriptedServer(["free", "grammared"]) as srv:
        live, _ = make_client(srv, tmp_path, run_dir=run, cache=False, structured="grammar")
        live.complete("reader", "q")                                    # the role's first call sends nothing
        live.complete("reader", "q", grammar='root ::= "a"')
    replay = LLMClient({"backend": "replay", "replay_from": str(run), "cache": False, "structured": "none"},
                       run_dir=tmp_path / "run2")
    assert replay.complete("reader", "q").text == "free"
    assert replay.complete("reader", "q", grammar='root ::= "a"').text == "grammared"


def test_structured_requests_follow_the_mode(tmp_path):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    with ScriptedServer(['{"a": "x"}'] * 3) as srv:
        gram, _ = make_client(srv, tmp_path, structured="grammar", cache=False)
        gram.complete("reader", "x", grammar='root ::= "a"')
        js, _ = make_client(srv, tmp_path, structured="json_schema", cache=False)
        js.complete("reader", "x", schema=schema)
        none, _ = make_client(srv, tmp_path, structured="none", cache=False)
        none.complete("reader", "x", grammar='root ::= "a"', schema=schema)
    assert srv.requests[0]["grammar"] == 'root ::= "a"'
    assert srv.requests[1]["response_format"]["json_schema"]["schema"] == schema
    assert "grammar" not in srv.requests[2] and "response_format" not in srv.requests[2]


def test_api_key_never_written(tmp_path, caplog):
    run = tmp_path / "run"
    with ScriptedServer([Step(fault="500"), "ok"]) as srv:
        client, _ = make_client(srv, tmp_path, run_dir=run)
        with caplog.at_level(logging.DEBUG):
            client.complete("reader", "x")
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and not any(SECRET in p.read_text(errors="replace") for p in files)
    assert SECRET not in caplog.text


def test_config_errors_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="llm: unknown key 'modle'"):
        LLMConfig.from_dict({"modle": "x"})
    with pytest.raises(ConfigError, match="llm.backend must be one of"):
        LLMConfig.from_dict({"backend": "gpt"})
    with pytest.raises(ConfigError, match="replay_from"):
        LLMConfig.from_dict({"backend": "replay"})
    with pytest.raises(ConfigError, match="unknown role 'poet'"):
        LLMConfig.from_dict({"roles": {"poet": {}}})
    with pytest.raises(ConfigError, match="temperature"):
        LLMConfig.from_dict({"roles": {"reader": {"temperature": 5}}})
    for url in ("notaurl", "127.0.0.1:8000/v1", "ftp://host/v1", "http:// spaced"):
        with pytest.raises(ConfigError, match=r"llm.base_url must be an http:// or https:// URL, got "):
            LLMConfig.from_dict({"backend": "openai", "base_url": url})
    assert LLMConfig.from_dict({"backend": "openai", "base_url": "http://127.0.0.1:8000/v1"}).base_url
    for bad in (-1, 1.5, "big", True):
        with pytest.raises(ConfigError, match=r"llm.local.prompt_cache_mb must be an integer >= 0 .*got " + repr(bad)):
            LLMConfig.from_dict({"local": {"prompt_cache_mb": bad}})
    for name in ("n_threads", "n_threads_decode"):
        for bad in (0, -1, 1.5, "2", True):
            with pytest.raises(ConfigError, match=rf"llm.local.{name} must be an integer >= 1 .*got " + repr(bad)):
                LLMConfig.from_dict({"local": {name: bad}})
        for good in (None, 1, 2):
            assert LLMConfig.from_dict({"local": {name: good}}).local[name] == good
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    client = LLMClient({"backend": "openai", "cache": False})
    with pytest.raises(ConfigError, match=r"\$OPENAI_API_KEY"):
        client.complete("reader", "x")


def test_shipped_llm_configs_load():
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    for name in ("local", "openai", "replay"):
        with initialize_config_module("conf", version_base="1.3"):
            cfg = compose("config", overrides=[f"llm={name}", "llm.replay_from=/tmp/x"])
        data = OmegaConf.to_container(cfg.llm, resolve=True)
        config = LLMConfig.from_dict(data)
        assert config.backend == name and config.role("modifier").max_tokens > 0


# -- prompts and tolerant parsing -------------------------------------------------------------------------

def test_packaged_prompts_render():
    for name in ("reader_filter", "reader_extract", "tagger", "tree_analyst"):
        prompt = load_prompt(name)
        values = {f: "x" for f in prompt.fields()}
        messages = prompt.render(**values)
        assert messages[-1]["role"] == "user" and "{{" not in messages[-1]["content"]
    with pytest.raises(ConfigError, match="no value for field 'idea'"):
        load_prompt("tagger").render(candidates="")
    with pytest.raises(ConfigError, match="unknown field 'ideas'"):
        load_prompt("tagger").render(candidates="", idea="", ideas="")
    with pytest.raises(ConfigError, match="unknown prompt 'nope'"):
        load_prompt("nope")


def test_prompts_sit_beside_the_code_that_sends_them():
    """The knowledge agents' prompts in nas/knowledge/prompts/, each LLM method's in its folder."""
    where = {name: path for name, (path, _) in packaged_prompts().items()}
    knowledge = ("reader_filter", "reader_extract", "tagger", "tree_analyst")
    assert {n: where[n] for n in knowledge} == {n: f"nas/knowledge/prompts/{n}.md" for n in knowledge}
    methods = {n: p for n, p in where.items() if n not in knowledge}
    assert methods and all(p == f"nas/agents/{n.split('_')[0]}/prompts/{n}.md" for n, p in methods.items()), methods


@pytest.mark.parametrize("text,bad", [
    ("name: x\n", "starts with a '---' header"),
    ("---\nname: x\nversion: 1\nrole: r\n", "not closed"),
    ("---\nname: x\nversion: one\nrole: r\n---\n[user]\nhi\n", "version must be an integer"),
    ("---\nname: x\nversion: 1\nrole: r\n---\n[system]\nhi\n", "no [user] section"),
])
def test_bad_prompt_files(text, bad):
    with pytest.raises(ConfigError, match=bad.replace("[", r"\[").replace("]", r"\]")):
        parse_prompt(text, "p.md")


def test_tolerant_parsers():
    assert extract_tagged("blah ##response##performance*op", "response") == "performance*op"
    assert extract_tagged("x <block>##a##\n1:Conv</block> y", "block") == "##a##\n1:Conv"
    code = extract_code("Here:\n```python\nimport torch\nclass Net: pass\n```\nthanks")
    assert code.startswith("import torch") and "thanks" not in code
    assert extract_code("import torch\nx = 1") == "import torch\nx = 1\n"
    assert extract_json('Sure! {"a": [1, 2]} hope it helps') == {"a": [1, 2]}
    assert extract_json('```json\n{"b": 1}\n```') == {"b": 1}
    assert extract_list("Ideas:\n1. use SE\n2) add skip\n- widen") == ["use SE", "add skip", "widen"]
    with pytest.raises(ParseError, match="no '##response##'"):
        extract_tagged("nothing here", "response")
    with pytest.raises(ParseError, match="no ```python code block"):
        extract_code("I cannot do that")
    with pytest.raises(ParseError, match="invalid JSON at char"):
        extract_json('{"a": 1,,}')


@pytest.mark.slow
def test_local_backend_runs_the_embedded_model(tmp_path, monkeypatch):
    """llm=local end to end: the client starts SmolLM2's server itself, asks with a grammar, stops it at exit."""
    from nas.llm.local import stop_shared

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    client = LLMClient({"backend": "local", "cache_dir": str(tmp_path / "cache"),
                        "local": {"n_ctx": 2048, "n_threads": 2, "startup_timeout_s": 120}}, run_dir=tmp_path / "run")
    prompt = parse_prompt("---\nname: t\nversion: 1\nrole: reader\n---\n[user]\n"
                          "Is a depthwise convolution mainly about {{q}}? Answer performance or efficiency.\n", "t.md")
    try:
        answer = client.ask("reader", prompt, {"q": "cost"}, lambda r: r.text.strip(),
                            grammar='root ::= "performance" | "efficiency"')
        free = client.complete("proposer", "Name one building block of a CNN.", max_tokens=24)
    finally:
        stop_shared()
    assert answer.ok and answer.value in ("performance", "efficiency")
    assert free.text.strip() and free.completion_tokens > 0 and free.source == "live"
    usage = client.usage.to_dict()
    assert usage["total"]["live"] == 2 and usage["total"]["prompt_tokens"] > 10
    assert (tmp_path / "home/llm/local-server.log").exists()


def test_a_reply_streaming_at_the_machines_pace_is_not_cut(tmp_path):
    """A slow machine generates slowly: a reply that keeps streaming runs past llm.timeout_s (the limit
    before anything is measured) because its limit follows the speed measured on it."""
    words = " ".join(f"w{i}" for i in range(30))
    with ScriptedServer([Step(words, fault="slow", delay_s=3.0)]) as srv:
        client, sleeps = make_client(srv, tmp_path, timeout_s=1.0)
        start = time.perf_counter()
        reply = client.complete("reader", "x y", max_tokens=30)
        wall = time.perf_counter() - start
    assert reply.text == words and sleeps == [] and len(srv.requests) == 1
    assert client.speed.generate_tps is not None and 5 < client.speed.generate_tps < 20
    # the prompt was read before its first token came, within the call: at least its tokens per wall second
    prompt_tokens = client.usage.to_dict()["total"]["prompt_tokens"]
    assert prompt_tokens > 0 and client.speed.prompt_tps is not None and client.speed.prompt_tps >= prompt_tokens / wall


def test_a_retry_is_never_the_same_request(tmp_path, caplog):
    with ScriptedServer([Step(fault="garbage"), Step(fault="500"), "fine"]) as srv:
        client, _ = make_client(srv, tmp_path)
        with caplog.at_level(logging.WARNING, logger="nas.llm"):
            assert client.complete("modifier", "x").text == "fine"
    sent = [(r.get("temperature"), r.get("seed")) for r in srv.requests]
    assert len(set(sent)) == 3 and sent[0][1] is None and [s for _, s in sent[1:]] == [1, 2]
    assert sent[0][0] < sent[1][0] < sent[2][0]
    assert "with temperature" in caplog.text and "(not the same request)" in caplog.text


def test_speed_limits():
    from nas.llm.speed import FLOOR_S, MARGIN, Speed, retry_params

    speed = Speed()
    assert speed.first_token_limit(1000, 120.0) == 120.0  # nothing measured: llm.timeout_s
    speed.observe(prompt_tokens=1000, first_token_s=2.0, completion_tokens=100, generate_s=10.0)
    assert (speed.prompt_tps, speed.generate_tps) == (500.0, 10.0)
    assert speed.first_token_limit(6000, 120.0) == MARGIN * 12.0 and speed.first_token_limit(10, 120.0) == FLOOR_S
    assert speed.reply_limit(2.0, 200, 0, 0.0, 120.0) == 2.0 + MARGIN * 20.0  # the measured speed
    assert speed.reply_limit(2.0, 200, 11, 5.0, 120.0) == 2.0 + MARGIN * 100.0  # this reply's own: 2 tokens/s
    speed.observe(prompt_tokens=1000, first_token_s=1.0, completion_tokens=100, generate_s=5.0)
    assert speed.generate_tps == 15.0  # the newest counts half: the load changes
    assert speed.prompt_tps == 500.0  # the slowest prompt speed: a cached prefix makes one look fast
    assert retry_params({"temperature": 0.7, "max_tokens": 5}, 0) == {"temperature": 0.7, "max_tokens": 5}
    assert retry_params({"temperature": 0.7, "max_tokens": 5}, 2) == {"temperature": 1.0, "max_tokens": 5, "seed": 2}
    assert retry_params({"temperature": 0.7}, 0, 1) == {"temperature": 0.85, "seed": 1000}  # an agent's next attempt
    assert retry_params({"temperature": 0.7}, 1, 1) == {"temperature": 1.0, "seed": 1001}


def test_an_agents_next_attempt_is_not_the_same_request(tmp_path):
    with ScriptedServer(["one", "two"]) as srv:
        client, _ = make_client(srv, tmp_path)
        client.complete("modifier", "same prompt", attempt=0)
        client.complete("modifier", "same prompt", attempt=1)
    assert [(r.get("temperature"), r.get("seed")) for r in srv.requests] == [(0.0, None), (0.15, 1000)]

"""The scripted OpenAI-compatible server: scripts, faults and usage, checked
over raw HTTP (urllib) and through the openai SDK."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest
from openai import OpenAI

from support.scripted import ScriptedServer, Step

MESSAGES = [{"role": "system", "content": "you are terse"},
            {"role": "user", "content": "pick a cell please"}]  # 3 + 4 = 7 words


def post(srv: ScriptedServer, body: dict | bytes, *, timeout: float = 5.0,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{srv.base_url}/chat/completions", data=data, method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def chat(srv: ScriptedServer, **extra) -> tuple[int, dict]:
    status, _, raw = post(srv, {"model": "m", "messages": MESSAGES, **extra})
    return status, json.loads(raw)


def client(srv: ScriptedServer, **kwargs) -> OpenAI:
    return OpenAI(base_url=srv.base_url, api_key="sk-test-key", max_retries=0, **kwargs)


def create(c: OpenAI, **extra):
    return c.chat.completions.create(model="m", messages=MESSAGES, **extra)


# -- raw HTTP --------------------------------------------------------------------

def test_list_script_in_order_then_exhausted():
    with ScriptedServer(["first", Step("second"), "third"]) as srv:
        assert srv.remaining == 3
        replies = [chat(srv)[1]["choices"][0]["message"]["content"] for _ in range(3)]
        assert replies == ["first", "second", "third"]
        assert srv.remaining == 0
        status, body = chat(srv)
        assert status == 500
        assert "script exhausted" in body["error"]["message"]


def test_default_after_script():
    with ScriptedServer(["only"], default="fallback") as srv:
        assert [chat(srv)[1]["choices"][0]["message"]["content"] for _ in range(3)] == \
            ["only", "fallback", "fallback"]


def test_push_appends_steps():
    with ScriptedServer() as srv:
        assert srv.remaining == 0
        srv.push("a", Step("b"))
        assert srv.remaining == 2
        assert chat(srv)[1]["choices"][0]["message"]["content"] == "a"
        assert chat(srv)[1]["choices"][0]["message"]["content"] == "b"


def test_completion_shape_and_usage():
    with ScriptedServer(["one two three"]) as srv:
        status, body = chat(srv)
    assert status == 200
    assert body["object"] == "chat.completion"
    assert body["id"] and isinstance(body["created"], int)
    assert body["model"] == "m"  # echoes the request's model
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "one two three"}
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}


def test_max_tokens_cuts_reply_to_words():
    with ScriptedServer(["a b c d e", "a b"]) as srv:
        _, body = chat(srv, max_tokens=3)
        assert body["choices"][0]["message"]["content"] == "a b c"
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 3
        _, body = chat(srv, max_tokens=3)
        assert body["choices"][0]["finish_reason"] == "stop"


def test_callable_script_sees_request_body():
    seen = []

    def script(body: dict) -> Step | str:
        seen.append(body)
        return f"echo {body['messages'][-1]['content']}"

    with ScriptedServer(script) as srv:
        _, body = chat(srv, temperature=0.5)
    assert body["choices"][0]["message"]["content"] == "echo pick a cell please"
    assert seen[0]["temperature"] == 0.5 and seen[0]["messages"] == MESSAGES


def test_requests_and_auth_recorded():
    with ScriptedServer(["x", "y"]) as srv:
        post(srv, {"model": "m", "messages": MESSAGES, "n": 1},
             headers={"Authorization": "Bearer secret"})
        post(srv, {"model": "m2", "messages": []})
        assert [r["model"] for r in srv.requests] == ["m", "m2"]
        assert srv.requests[0]["messages"] == MESSAGES
        assert srv.auth_headers == ["Bearer secret"]


def test_models_endpoint():
    with ScriptedServer(model="tiny") as srv:
        with urllib.request.urlopen(f"{srv.base_url}/models", timeout=5) as resp:
            assert resp.status == 200
            body = json.loads(resp.read())
    assert body["object"] == "list"
    assert body["data"][0]["id"] == "tiny" and body["data"][0]["object"] == "model"


def test_malformed_is_400_and_consumes_no_step():
    with ScriptedServer(["kept"]) as srv:
        status, _, raw = post(srv, b"{not json")
        assert status == 400 and "error" in json.loads(raw)
        assert srv.remaining == 1


def test_stream_sends_one_word_per_chunk_and_usage_when_asked():
    with ScriptedServer(["  two words \n", "one two three"]) as srv:
        status, headers, raw = post(srv, {"model": "m", "messages": MESSAGES, "stream": True,
                                          "stream_options": {"include_usage": True}})
        events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
        assert status == 200 and headers["content-type"] == "text/event-stream"
        assert raw.decode().rstrip().endswith("data: [DONE]")
        deltas = [c["choices"][0]["delta"].get("content") for c in events if c["choices"]]
        assert "".join(d for d in deltas if d) == "  two words \n" and len([d for d in deltas if d]) == 2
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 2
        _, _, raw = post(srv, {"model": "m", "messages": MESSAGES, "stream": True, "max_tokens": 2})
        events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "length"         # no usage chunk unasked
        assert srv.abandoned == []


def test_raw_faults():
    script = [Step(fault="500"), Step(fault="429"), Step("abcdefgh", fault="truncated"),
              Step(fault="garbage"), Step(fault="badjson")]
    with ScriptedServer(script) as srv:
        status, _, raw = post(srv, {"model": "m", "messages": MESSAGES})
        assert status == 500 and json.loads(raw)["error"]["type"] == "server_error"
        status, headers, raw = post(srv, {"model": "m", "messages": MESSAGES})
        assert status == 429 and json.loads(raw)["error"]["message"]
        assert {k.lower(): v for k, v in headers.items()}["retry-after"] == "0"
        status, body = chat(srv)
        assert status == 200
        assert body["choices"][0]["message"]["content"] == "abcd"
        assert body["choices"][0]["finish_reason"] == "length"
        status, headers, raw = post(srv, {"model": "m", "messages": MESSAGES})
        assert status == 200 and raw == b"<html>not json"
        assert {k.lower(): v for k, v in headers.items()}["content-type"] == "text/html"
        status, _, raw = post(srv, {"model": "m", "messages": MESSAGES})
        assert status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(raw)


def test_raw_disconnect_and_slow():
    with ScriptedServer([Step(fault="disconnect"), Step("late", fault="slow", delay_s=1.0),
                         "after"]) as srv:
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            post(srv, {"model": "m", "messages": MESSAGES})
        with pytest.raises((TimeoutError, urllib.error.URLError)):
            post(srv, {"model": "m", "messages": MESSAGES}, timeout=0.2)
        assert chat(srv)[1]["choices"][0]["message"]["content"] == "after"


def test_unknown_fault_rejected():
    with pytest.raises(ValueError, match="unknown fault"):
        Step(fault="teapot")


def test_concurrent_requests_each_get_one_step():
    n = 20
    with ScriptedServer([str(i) for i in range(n)]) as srv:
        got: list[str] = []
        lock = threading.Lock()

        def one() -> None:
            content = chat(srv)[1]["choices"][0]["message"]["content"]
            with lock:
                got.append(content)

        threads = [threading.Thread(target=one) for _ in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(got, key=int) == [str(i) for i in range(n)]
        assert len(srv.requests) == n


def test_stop_is_idempotent_and_restartable():
    srv = ScriptedServer(["x"]).start()
    assert srv.start() is srv
    srv.stop()
    srv.stop()
    with pytest.raises(RuntimeError):
        srv.base_url
    srv.start()
    try:
        assert chat(srv)[1]["choices"][0]["message"]["content"] == "x"
    finally:
        srv.stop()


# -- the openai SDK --------------------------------------------------------------

def test_sdk_plain_completion_and_key_sent():
    with ScriptedServer(["hello there"], model="scripted") as srv:
        c = client(srv)
        resp = create(c)
        assert resp.choices[0].message.content == "hello there"
        assert resp.choices[0].finish_reason == "stop"
        assert resp.usage.prompt_tokens == 7 and resp.usage.completion_tokens == 2
        assert [m.id for m in c.models.list()] == ["scripted"]
        assert srv.auth_headers == ["Bearer sk-test-key"] * 2


def test_sdk_faults_surface_as_openai_errors():
    script = [Step(fault="500"), Step(fault="429"), Step("late", fault="slow", delay_s=1.0),
              Step(fault="disconnect"), Step("abcdefgh", fault="truncated")]
    with ScriptedServer(script) as srv:
        c = client(srv, timeout=0.3)
        with pytest.raises(openai.InternalServerError) as err:
            create(c)
        assert err.value.status_code == 500
        with pytest.raises(openai.RateLimitError) as err:
            create(c)
        assert err.value.status_code == 429
        with pytest.raises(openai.APITimeoutError):
            create(c)
        with pytest.raises(openai.APIConnectionError) as err:
            create(c)
        assert not isinstance(err.value, openai.APITimeoutError)
        resp = create(c)
        assert resp.choices[0].message.content == "abcd"
        assert resp.choices[0].finish_reason == "length"


def test_sdk_garbage_and_badjson():
    with ScriptedServer([Step(fault="garbage")] * 2 + [Step(fault="badjson")]) as srv:
        # A text/html 200 is handed back as the raw text by the lenient SDK...
        assert create(client(srv)) == "<html>not json"
        # ...and rejected when strict response validation is on.
        with pytest.raises(openai.APIResponseValidationError):
            create(client(srv, _strict_response_validation=True))
        # An application/json 200 that does not parse raises json's own error.
        with pytest.raises(json.JSONDecodeError):
            create(client(srv))


def test_sdk_retries_429():
    # The SDK ignores `retry-after: 0` (it honours only 0 < s <= 60) and backs
    # off its own 0.5 s x 2**n (less up to 25 % jitter) instead.
    with ScriptedServer([Step(fault="429"), "ok"]) as srv:
        c = OpenAI(base_url=srv.base_url, api_key="k", max_retries=1)
        assert create(c).choices[0].message.content == "ok"
        assert len(srv.requests) == 2


def test_sdk_stream_and_a_stream_closed_early_is_abandoned():
    words = " ".join(f"w{i}" for i in range(40))
    with ScriptedServer(["a b c", Step(words, fault="slow", delay_s=4.0)]) as srv:
        parts = [c.choices[0].delta.content for c in create(client(srv), stream=True) if c.choices]
        assert "".join(p for p in parts if p) == "a b c"
        stream = create(client(srv), stream=True)
        next(iter(stream)), next(iter(stream))
        stream.close()
        deadline = time.monotonic() + 5
        while not srv.abandoned and time.monotonic() < deadline:
            time.sleep(0.05)
    assert len(srv.abandoned) == 1 and srv.abandoned[0]["request"] == 1
    assert srv.abandoned[0]["sent"] < 40 and srv.abandoned[0]["words"] == 40

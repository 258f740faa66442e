"""No secret in anything nasflow writes or sends on: the scrubber itself, the
nas.io writers, LLM replies and errors through the real scripted
OpenAI-compatible server (transcripts, reply cache, the next prompt), a whole
LLM search's run files, a verdict that carries the key into history.jsonl, and
log lines (records passed through the scrubbing filter, file handlers too)."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import NAS, ROOT
from nas.agents.collm.agents import values_text
from nas.core.trial import EvalResult
from nas.errors import EvaluationError
from nas.evaluators import EVALUATORS, Evaluator
from nas.io import append_jsonl, atomic_write_json, atomic_write_text, read_jsonl, rewrite_jsonl
from nas.llm import LLMClient, LLMError
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import Component, SearchSpec
from nas.secrets import MASK, Scrubber, install_log_scrubbing, register, scrub
from nas.spaces.nb201.arch import OPS, NB201Cell
from nas.spaces.nb201.space import NB201Space
from support.scripted import ScriptedServer

KEYLIKE = "sk-proj-AbCdEf0123456789"  # the shape of an OpenAI key, never registered


@pytest.fixture
def secret(monkeypatch) -> str:
    """A key no earlier test registered, not sk- shaped: only its registration can mask it."""
    value = f"nasflow-{uuid.uuid4().hex}"
    monkeypatch.setenv("NASFLOW_TEST_KEY", value)
    return value


def leaks(root: Path, *values: str) -> list[str]:
    """Files under `root` that contain any of `values`."""
    return [str(p) for p in root.rglob("*") if p.is_file()
            and any(v.encode() in p.read_bytes() for v in values)]


def client_for(srv: ScriptedServer, tmp_path: Path, base_url: str | None = None, **extra) -> LLMClient:
    return LLMClient({"backend": "openai", "base_url": base_url or srv.base_url, "model": "m",
                      "api_key_env": "NASFLOW_TEST_KEY", "max_retries": 0, "structured": "none",
                      "cache_dir": str(tmp_path / "cache"), **extra}, run_dir=tmp_path / "run")


# -- the scrubber --------------------------------------------------------------------------------------------

def test_scrubber_masks_registered_env_and_keylike_values():
    s = Scrubber()
    s.register_env({"OPENAI_API_KEY": "abcd1234XYZ", "HF_TOKEN": "short", "PATH": "/usr/local/bin:/usr/bin",
                    "MY_SERVICE_TOKEN": "tok-99887766"})
    s.register("abcd1234")  # a prefix of a registered key: the longer one is masked whole
    text = f"a=abcd1234XYZ b=short c=/usr/bin d=tok-99887766 e={KEYLIKE} f=abcd1234 risk-averse task-force"
    assert s.scrub(text) == "a=*** b=short c=/usr/bin d=*** e=*** f=*** risk-averse task-force"
    s.register("abc")  # too short to be a key: masking it would mask words
    assert s.scrub("abc") == "abc"


def test_scrub_data_keeps_json_valid_for_secrets_json_would_escape():
    s = Scrubber()
    odd = 'pa"ss\\wörd-1234'
    s.register(odd)
    data = {"k": [odd, (f"x{odd}y", Path(f"/tmp/{odd}"))], odd: {"n": 1.5, "none": None}}
    text = json.dumps(s.scrub_data(data))
    assert json.loads(text) == {"k": ["***", ["x***y", "/tmp/***"]], "***": {"n": 1.5, "none": None}}
    assert odd not in json.loads(text) and json.dumps(odd)[1:-1] not in text


def test_io_writers_scrub(tmp_path, secret):
    register(secret)
    record = {"error": f"model printed {secret}", "note": KEYLIKE}
    atomic_write_json(tmp_path / "a.json", record)
    atomic_write_text(tmp_path / "b.md", f"# {secret}\n")
    append_jsonl(tmp_path / "c.jsonl", [record])
    rewrite_jsonl(tmp_path / "d.jsonl", [record, record])
    assert leaks(tmp_path, secret, KEYLIKE) == []
    assert read_jsonl(tmp_path / "d.jsonl") == [{"error": "model printed ***", "note": MASK}] * 2
    assert (tmp_path / "b.md").read_text() == "# ***\n"


# -- LLM replies and errors through the scripted server ------------------------------------------------------

def test_reply_that_echoes_the_key_is_stored_and_sent_on_scrubbed(tmp_path, secret):
    with ScriptedServer([f"your key is {secret}, also {KEYLIKE}."], default="fine") as srv:
        client = client_for(srv, tmp_path)  # registers $NASFLOW_TEST_KEY
        reply = client.complete("proposer", "design a block")
        assert reply.text == "your key is ***, also ***."
        # The next prompt is built from the reply (and here from the key itself, as a verdict could be).
        client.complete("modifier", [{"role": "user", "content": f"{reply.text} and {secret}"}])
        sent = json.dumps(srv.requests[-1]["messages"])
        assert secret not in sent and "and ***" in sent
        assert srv.auth_headers[0] == f"Bearer {secret}"  # the key itself still authenticates
        again = client_for(srv, tmp_path).complete("proposer", "design a block")
        assert (again.source, again.text) == ("cache", reply.text) and len(srv.requests) == 2
    transcript = read_jsonl(tmp_path / "run" / "llm" / "transcripts.jsonl")
    assert [r["reply"] for r in transcript][0] == "your key is ***, also ***."
    assert list((tmp_path / "cache").rglob("*.json")), "the reply cache was written"
    assert leaks(tmp_path, secret, KEYLIKE) == []


def test_llm_error_message_with_the_key_is_scrubbed(tmp_path, secret):
    with ScriptedServer(["never"]) as srv:
        # A wrong route: the endpoint's 404 message quotes the path, which holds the key.
        client = client_for(srv, tmp_path, base_url=f"{srv.base_url}/{secret}/{KEYLIKE}")
        with pytest.raises(LLMError) as err:
            client.complete("debugger", "x")
    assert "HTTP 404" in str(err.value) and "/***/***/chat" in str(err.value)
    assert secret not in str(err.value) and KEYLIKE not in str(err.value)
    record = read_jsonl(tmp_path / "run" / "llm" / "transcripts.jsonl")[0]
    assert record["error"] == str(err.value)
    assert leaks(tmp_path, secret, KEYLIKE) == []


# -- whole searches ------------------------------------------------------------------------------------------

SPACE = NB201Space()
CELLS = [NB201Cell(ops) for ops in itertools.product(OPS, repeat=6)]


def test_llm_search_run_files_and_prompts_never_hold_the_key(tmp_path, secret):
    """CoLLM-NAS on the table: the Navigator's strategy echoes the key; it is kept in
    state.json and summary.json and quoted in every Generator prompt."""
    strategy = (f"# SUMMARY\nConvolutions help (key {secret}, {KEYLIKE}).\n# DIRECTIONS\n"
                + "".join(f"{d.name}: prefer nor_conv_3x3\n" for d in SPACE.decisions()))
    served = itertools.count()

    def script(body: dict) -> str:
        if "You are the Navigator" in body["messages"][0]["content"]:
            return strategy
        return "[\n" + ",\n".join(values_text(SPACE, CELLS[(next(served) * 977) % len(CELLS)])
                                  for _ in range(2)) + "\n]"

    with ScriptedServer(script) as srv:
        llm = {"backend": "openai", "base_url": srv.base_url, "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
               "max_retries": 0, "cache_dir": str(tmp_path / "cache"), "structured": "none"}
        spec = SearchSpec(space=Component("nb201"), evaluator=Component("table"), seed=0, trials=6,
                          strategy=Component("collm", {"llm": llm, "candidates_per_iteration": 2}), batch_size=2)
        summary = SearchLoop(spec, tmp_path / "run", LocalExecutor(spec.build_evaluator(spec.build_space()), None),
                             progress=False).run_search()
    assert summary["trials"] == 6 and summary["llm"]["roles"]["navigator"]["live"] >= 1
    generator_prompts = [json.dumps(r["messages"]) for r in srv.requests
                         if "You are the Navigator" not in r["messages"][0]["content"]]
    assert len(generator_prompts) >= 2 and "Convolutions help (key ***, ***)" in generator_prompts[-1]
    assert not any(secret in json.dumps(r) for r in srv.requests)
    assert "(key ***, ***)" in (tmp_path / "run" / "state.json").read_text()
    assert leaks(tmp_path, secret, KEYLIKE) == []


class EnvPrintingEvaluator(Evaluator):
    """A candidate whose run printed the parent's environment: the key is in its verdict."""

    @classmethod
    def accepts(cls, space) -> bool:
        return space is NB201Space

    def fingerprint(self) -> str:
        return "env-printing"

    def evaluate(self, arch, seed=None) -> EvalResult:
        if arch.ops[0] == "none":
            raise EvaluationError(f"model crashed; env: NASFLOW_TEST_KEY={os.environ['NASFLOW_TEST_KEY']}")
        return EvalResult(accuracy=float(len(arch.key())), metrics={"note": 1.0})


@pytest.fixture
def env_printing():
    EVALUATORS.register("env_printing_test")(EnvPrintingEvaluator)
    yield
    EVALUATORS._entries.pop("env_printing_test")


def test_verdict_with_the_key_never_reaches_history(tmp_path, secret, env_printing):
    register(secret)  # what building the LLM client does with llm.api_key_env
    spec = SearchSpec(space=Component("nb201"), strategy=Component("random"), seed=1, trials=30,
                      evaluator=Component("env_printing_test"))
    SearchLoop(spec, tmp_path / "run", LocalExecutor(spec.build_evaluator(spec.build_space()), None),
               progress=False).run_search()
    errors = [r["error"] for r in read_jsonl(tmp_path / "run" / "history.jsonl") if r["error"]]
    assert errors and set(errors) == {"model crashed; env: NASFLOW_TEST_KEY=***"}
    assert leaks(tmp_path, secret) == []


# -- logs ----------------------------------------------------------------------------------------------------

def test_log_lines_and_tracebacks_are_scrubbed(tmp_path, secret, caplog):
    install_log_scrubbing()
    register(secret)
    log = logging.getLogger("nas.test_secrets")
    handler = logging.FileHandler(tmp_path / "search.log")  # like Hydra's, added after the install
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="nas.test_secrets"):
            log.warning("llm: endpoint said %s (%s)", secret, KEYLIKE)
            try:
                raise RuntimeError(f"key {secret}")
            except RuntimeError:
                log.exception("evaluation crashed")
    finally:
        log.removeHandler(handler)
        handler.close()
    written = (tmp_path / "search.log").read_text()
    for text in (caplog.text, written):
        assert secret not in text and KEYLIKE not in text
        assert "llm: endpoint said *** (***)" in text and "RuntimeError: key ***" in text
    assert caplog.records[0].getMessage() == "llm: endpoint said *** (***)"
    assert scrub(f"x {secret}") == "x ***"


def test_hydra_sweep_lines_show_their_tab_as_spaces(tmp_path):
    """Hydra logs each job of a sweep as `\\t#0 : overrides`; the escaping of log records (a control
    character from a model's text must not move the cursor) printed that tab as a literal `\\x09`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["NASFLOW_HOME"] = str(tmp_path / "home")
    out = subprocess.run([*NAS, "search", "-m", "space=nb201", "strategy=random", "seed=0,1", "budget.trials=1",
                          "runner=local", "progress=false", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = out.stdout + out.stderr
    jobs = re.findall(r"\[HYDRA\] +#(\d) : space=nb201 strategy=random seed=(\d) ", printed)
    assert jobs == [("0", "0"), ("1", "1")] and "\\x09" not in printed
    install_log_scrubbing()
    record = logging.getLogger("nas.test_secrets").makeRecord("nas.test_secrets", logging.INFO, __file__, 1,
                                                               "\t#%d : %s\x1b[2J", (0, "a=1"), None)
    assert record.getMessage() == "    #0 : a=1\\x1b[2J"  # the tab as spaces, other controls escaped still

"""Fault tolerance, with counts: kill -9 and SIGTERM of a running LLM search
(nothing finished is redone, no LLM call is repeated, nothing is left
running), LLM endpoint faults mid-search (retries counted, garbage becomes
counted rejections), and damaged run files (repaired, or one line that says
what to do). CoLLM-NAS on the NB201 table against the scripted
OpenAI-compatible server: the fastest LLM search end to end."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import NAS, ROOT, run_nas
from nas.agents.collm.agents import values_text
from nas.spaces.nb201.arch import OPS, NB201Cell
from nas.spaces.nb201.space import NB201Space
from support.scripted import ScriptedServer, Step

SPACE = NB201Space()
CELLS = [NB201Cell(ops) for ops in itertools.product(OPS, repeat=6)]
STRATEGY = "# SUMMARY\nConvolutions help.\n# DIRECTIONS\n" + "".join(
    f"{d.name}: prefer nor_conv_3x3\n" for d in SPACE.decisions())


def is_navigator(body: dict) -> bool:
    return "You are the Navigator" in body["messages"][0]["content"]


def script(body: dict) -> str:
    """A pure function of the request: the same request always gets the same reply."""
    if is_navigator(body):
        return STRATEGY
    k = int(re.findall(r"(\d+)\s+(?:new\s+)?candidates", body["messages"][-1]["content"])[-1])
    digest = int(hashlib.sha256(json.dumps(body["messages"]).encode()).hexdigest(), 16)
    return "[\n" + ",\n".join(values_text(SPACE, CELLS[(digest + 977 * i) % len(CELLS)]) for i in range(k)) + "\n]"


def search_args(srv: ScriptedServer, run_dir: Path, *extra: str) -> list[str]:
    return ["space=nb201", "strategy=collm", "evaluator=table", "llm=openai", f"llm.base_url={srv.base_url}",
            "llm.api_key_env=NASFLOW_NO_KEY", "llm.structured=none", "progress=false",
            "strategy.candidates_per_iteration=2", "budget.batch_size=2", "budget.trials=8",
            f"hydra.run.dir={run_dir}", *extra]


@pytest.fixture
def env(nas_env):
    return {**nas_env, "NASFLOW_NO_KEY": ""}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def survivors(home: str) -> list[int]:
    """Processes started for this test's NASFLOW_HOME (nas, the Prefect server, guards)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"NASFLOW_HOME={home}\0".encode() in (proc / "environ").read_bytes() \
                    and (proc / "stat").read_text().split(")")[-1].split()[0] != "Z":
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def assert_nothing_left(home: str) -> None:
    deadline = time.time() + 15
    while (left := survivors(home)) and time.time() < deadline:
        time.sleep(0.1)
    for pid in left:  # do not leak them into other tests, then fail
        os.kill(pid, signal.SIGKILL)
    assert not left, f"orphaned processes after the kill: {left}"


def reference_requests(srv: ScriptedServer, tmp_path: Path, args: list[str]) -> tuple[int, list[str]]:
    """An uninterrupted run of the same search, in process: its LLM requests and trial keys."""
    from nas.config import compose_config
    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.spec import SearchSpec

    before = len(srv.requests)
    keep = [a for a in args if not a.startswith(("hydra.", "evaluator.simulated_cost_seconds"))]
    cfg = compose_config([*keep, f"llm.cache_dir={tmp_path / 'ref'}"])
    spec = SearchSpec.from_config(cfg)
    loop = SearchLoop(spec, tmp_path / "ref-run", LocalExecutor(spec.build_evaluator(spec.build_space()), None),
                      progress=False)
    loop.run_search()
    return len(srv.requests) - before, [r["key"] for r in lines(tmp_path / "ref-run" / "history.jsonl")]


def evaluation_records(cache: Path) -> dict[str, dict]:
    """Prefect's persisted evaluation results (its LLM-call results are lists)."""
    out = {}
    for path in cache.iterdir() if cache.exists() else []:
        try:
            value = json.loads(json.loads(path.read_text())["result"])  # plain JSON (tasks/records.py)
        except (ValueError, KeyError, TypeError):
            continue  # being written
        if isinstance(value, dict) and "accuracy" in value:
            out[path.name] = value
    return out


# -- 1. kill -9 and SIGTERM --------------------------------------------------------------------------------

@pytest.mark.slow
def test_kill_9_mid_batch_then_restart_redoes_nothing_finished(tmp_path, env):
    """CoLLM, 2 candidates per iteration = per batch, evaluated one after the other (workers=1).
    The search is killed (SIGKILL to the `nas` process alone, like the OOM killer) when the
    current batch has one evaluation finished and persisted but not yet in history.jsonl,
    so the batch in flight is asked again on restart. "0 redone" means: (1) every
    evaluation that finished is never run again: the restarted batch's finished one is
    served from Prefect's cache (cached=true), the rest of the run evaluates only new
    architectures; (2) every LLM request that was answered is never sent again: the
    restarted iteration's Navigator and Generator calls come from the cache, so the
    server answers exactly as many requests as for an uninterrupted run; (3) nothing that
    `nas` started outlives it."""
    run_dir, home = tmp_path / "run", env["NASFLOW_HOME"]
    cache = Path(home) / "cache"
    with ScriptedServer(script) as srv:
        args = search_args(srv, run_dir, "runner=prefect", "runner.workers=1",
                           "evaluator.simulated_cost_seconds=0.6")
        needed, ref_keys = reference_requests(srv, tmp_path, args)
        assert needed == 8 and len(ref_keys) == 8  # 4 iterations: a Navigator and a Generator call each

        proc = subprocess.Popen([*NAS, "search", *args], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline, history = time.time() + 300, run_dir / "history.jsonl"
        while True:
            done = history.read_text().count("\n") if history.exists() else 0
            if done >= 2 and len(evaluation_records(cache)) == done + 1:
                break  # one evaluation of the batch in flight finished, the other is running
            assert proc.poll() is None and time.time() < deadline, "the search ended before the kill"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert_nothing_left(home)
        before = lines(history)
        finished = len(evaluation_records(cache))
        served_before = len(srv.requests) - needed

        out = run_nas(["search", *args], env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert_nothing_left(home)
        served = len(srv.requests) - needed

    after = lines(history)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [r["key"] for r in after] == ref_keys  # the interrupted search ends where an uninterrupted one does
    assert after[:len(before)] == before and summary["resumed_trials"] == len(before)
    redone = after[len(before):len(before) + 2]
    # (1) The batch in flight: its finished evaluation came from the cache, its killed one ran again;
    # every later trial is a new architecture evaluated once.
    assert [r["cached"] for r in redone] == [True, False]
    assert not any(r["cached"] for r in after[len(before) + 2:])
    assert len(evaluation_records(cache)) == len({r["key"] for r in after}) == 8
    assert finished == len(before) + 1
    # (2) Answered LLM requests: as many as the uninterrupted run, each request body once.
    assert served == needed, f"{served - needed} LLM requests repeated ({served_before} before the kill)"
    bodies = [json.dumps(b, sort_keys=True) for b in srv.requests[needed:]]
    assert len(set(bodies)) == len(bodies)
    usage = summary["llm"]["total"]  # accounting over both processes, from the run's transcript
    assert usage["live"] == needed and usage["cached"] == 2 and usage["failures"] == 0


@pytest.mark.slow
def test_sigterm_during_an_llm_call_stops_promptly_with_state_saved(tmp_path, env):
    """SIGTERM while `nas` waits on the LLM: under Prefect the process ends at once (exit 143,
    one line saying how to resume), but its ephemeral API server used to live on holding
    stdout/stderr, so a caller waiting for the output (a shell pipe, subprocess.run) hung as
    if SIGTERM were ignored."""
    run_dir, home = tmp_path / "run", env["NASFLOW_HOME"]
    generator, held = [], []

    def holding(body: dict) -> Step | str:
        generator.extend([] if is_navigator(body) else [body])
        if len(generator) == 2 and not held:
            held.append(body)  # the second iteration's Generator call: held until the server stops
            return Step(reply=script(body), fault="slow", delay_s=300)
        return script(body)

    with ScriptedServer(holding) as srv:
        proc = subprocess.Popen([*NAS, "search", *search_args(srv, run_dir, "runner=prefect")], env=env,
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        deadline = time.time() + 300
        while not held:
            assert proc.poll() is None and time.time() < deadline, "the search ended before the held call"
            time.sleep(0.05)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=30)  # EOF on both pipes: nothing else holds them
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail("nas search did not stop within 30 s of SIGTERM")
        stopped = time.time() - start
    assert proc.returncode == 143 and stopped < 30
    assert_nothing_left(home)
    state = json.loads((run_dir / "state.json").read_text())
    assert state["history_lines"] == 2 == len(lines(run_dir / "history.jsonl"))  # the first batch is kept
    # As after Ctrl-C: one line with what was saved and what to do, not Prefect's crash report
    assert err.strip().splitlines()[-1] == \
        f"nas: terminated after 2 trials; run the same command to resume (run dir: {run_dir})"
    assert "Crash detected" not in err and "Traceback" not in err


# -- 2. LLM endpoint faults ----------------------------------------------------------------------------------

def test_llm_faults_mid_search_are_retried_counted_and_survived(tmp_path, caplog):
    """Per role, the endpoint's answers in order (then normal ones): HTTP 500 once, a
    Navigator call that fails all 3 tries, a timeout, a non-JSON body, and a 200 reply
    that is no list of candidates."""
    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.spec import Component, SearchSpec

    faults = {"navigator": ["500", None, "500", "500", "500"],
              "generator": ["slow", None, "garbage", None, "prose"]}
    served = {"navigator": 0, "generator": 0}

    def faulty(body: dict) -> Step | str:
        role = "navigator" if is_navigator(body) else "generator"
        served[role] += 1
        plan = faults[role]
        fault = plan[served[role] - 1] if served[role] <= len(plan) else None
        if fault == "prose":
            return "I would rather not write candidates today."
        # "slow" sleeps well past the limit: once a call is measured, the first token may take 3x the prompt
        # time that speed predicts (nas.llm.speed), which on a loaded machine can exceed timeout_s's 0.5 s
        return Step(reply=script(body), fault=fault, delay_s=8.0 if fault == "slow" else 0.0)

    with ScriptedServer(faulty) as srv:
        llm = {"backend": "openai", "base_url": srv.base_url, "model": "m", "api_key_env": "NASFLOW_NO_KEY",
               "timeout_s": 0.5, "max_retries": 2, "backoff_s": 0.0, "cache_dir": str(tmp_path / "cache"),
               "structured": "none"}
        spec = SearchSpec(space=Component("nb201"), evaluator=Component("table"), seed=0, trials=8,
                          strategy=Component("collm", {"llm": llm, "candidates_per_iteration": 2}), batch_size=2)
        with caplog.at_level(logging.WARNING, logger="nas.llm"):
            summary = SearchLoop(spec, tmp_path / "run", LocalExecutor(spec.build_evaluator(spec.build_space()),
                                                                      None), progress=False).run_search()
    assert summary["trials"] == 8 and summary["failed"] == 0
    roles = summary["llm"]["roles"]
    # Retries: navigator 1 (500) + 2 (the call that gave up); generator 1 (timeout) + 1 (non-JSON body).
    assert (roles["navigator"]["retries"], roles["generator"]["retries"]) == (3, 2)
    assert (roles["navigator"]["failures"], roles["generator"]["failures"]) == (1, 0)
    assert len([r for r in caplog.records if "retry" in r.getMessage()]) == 5
    collm = summary["collm"]
    # The failed Navigator call: the iteration goes on with the last strategy; the prose reply:
    # one counted Generator failure, asked again (attempt 1), never a crash.
    assert collm["navigator_failures"] == 1 and collm["generator_failures"] == 1
    assert collm["iterations"] == 4 and collm["random_fill"] == 0
    assert {e["role"] for e in collm["errors"]} == {"navigator", "generator"}
    assert served == {"navigator": 7, "generator": 7} and len(srv.requests) == 14


# -- 3. damaged files ----------------------------------------------------------------------------------------

def finished_run(tmp_path: Path, trials: int = 6) -> tuple[Path, list[str]]:
    """A finished `random` search on the table, made in process with the CLI's config."""
    from nas.config import compose_config
    from nas.search.loop import LocalExecutor, SearchLoop
    from nas.search.spec import SearchSpec

    args = ["space=nb201", "strategy=random", "evaluator=table", "runner=local", "progress=false"]
    spec = SearchSpec.from_config(compose_config([*args, f"budget.trials={trials}"]))
    run_dir = tmp_path / "run"
    SearchLoop(spec, run_dir, LocalExecutor(spec.build_evaluator(spec.build_space()), None),
               progress=False).run_search()
    return run_dir, [*args, f"hydra.run.dir={run_dir}"]


def one_line_error(out: subprocess.CompletedProcess) -> str:
    errors = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and len(errors) == 1 and errors[0].startswith("nas: error: "), out.stderr
    return errors[0]


@pytest.mark.slow
def test_torn_last_history_line_is_repaired_on_resume(tmp_path, env):
    run_dir, args = finished_run(tmp_path)
    history = run_dir / "history.jsonl"
    whole = history.read_bytes()
    with open(history, "ab") as fh:
        fh.write(b'{"trial": 6, "key": "torn mid-wr')  # a crash mid-append of the next batch
    out = run_nas(["search", *args, "budget.trials=9"], env)
    assert out.returncode == 0, out.stderr[-2000:]
    after = lines(history)
    assert history.read_bytes().startswith(whole) and [r["trial"] for r in after] == list(range(9))
    assert json.loads((run_dir / "summary.json").read_text())["resumed_trials"] == 6


@pytest.mark.slow
def test_corrupt_history_line_and_state_are_one_line_errors(tmp_path, env):
    run_dir, args = finished_run(tmp_path)
    history, state = run_dir / "history.jsonl", run_dir / "state.json"
    good = history.read_text().splitlines(keepends=True)
    history.write_text("".join([*good[:2], '{"trial": 2, "key"\n', *good[3:]]))
    error = one_line_error(run_nas(["search", *args, "budget.trials=9"], env))
    assert f"{history}:3: corrupt JSON line" in error and "use a new hydra.run.dir" in error

    history.write_text("".join(good))
    state.write_text(state.read_text()[:40])
    error = one_line_error(run_nas(["search", *args, "budget.trials=9"], env))
    assert f"{state}: corrupt JSON" in error and "delete it and history.jsonl to restart this search" in error
    state.unlink()  # the recovery the message names: the search starts again from scratch
    history.unlink()
    out = run_nas(["search", *args, "budget.trials=3"], env)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_trials"] == 0 and len(lines(history)) == 3


def test_corrupt_llm_cache_file_is_a_miss_with_a_warning(tmp_path, caplog):
    """The reply cache is derived data: a damaged file costs one call again, and is rewritten."""
    from nas.llm import LLMClient

    with ScriptedServer(default="hello") as srv:
        cfg = {"backend": "openai", "base_url": srv.base_url, "api_key_env": "NASFLOW_NO_KEY",
               "cache_dir": str(tmp_path / "cache")}
        first = LLMClient(cfg).complete("reader", "hi")
        path = next((tmp_path / "cache").rglob(f"{first.key}.json"))
        path.write_bytes(b'{"key": "\xff')
        with caplog.at_level(logging.WARNING, logger="nas.llm"):
            again = LLMClient(cfg).complete("reader", "hi")
            third = LLMClient(cfg).complete("reader", "hi")
    assert (first.source, again.source, third.source) == ("live", "live", "cache") and len(srv.requests) == 2
    # warnings only: an earlier in-process `nas search` in this worker may have left nas.progress at INFO
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0] and "asking the model again" in warnings[0]


def test_torn_transcript_is_repaired_and_accounting_survives_a_restart(tmp_path):
    """A kill mid-append tears the transcript's last line; the restarted client cuts it (else
    the next record glues onto it and replay fails) and counts the calls made before."""
    from nas.llm import LLMClient
    from nas.llm.cache import ReplayBook

    run = tmp_path / "run"
    with ScriptedServer(default="hello") as srv:
        cfg = {"backend": "openai", "base_url": srv.base_url, "api_key_env": "NASFLOW_NO_KEY",
               "cache_dir": str(tmp_path / "cache")}
        LLMClient(cfg, run_dir=run).complete("reader", "one")
        transcript = run / "llm" / "transcripts.jsonl"
        with open(transcript, "a") as fh:
            fh.write('{"key": "torn')
        client = LLMClient(cfg, run_dir=run)
        client.complete("reader", "two")
        client.complete("reader", "one")
    total = client.usage.to_dict()["total"]
    assert (total["calls"], total["live"], total["cached"]) == (3, 2, 1)
    records = lines(transcript)
    assert [r["seq"] for r in records] == [1, 2, 3]
    assert len(ReplayBook(run).records) == 2

"""Cache records that cannot run code: Prefect's result records for evaluations,
LLM calls and supernet training are plain JSON, and a record rewritten by anyone
who can write to `$NASFLOW_HOME/cache` (a pickle that runs code when loaded, a
serializer with an importable decoder, a payload of the wrong shape) is refused
before Prefect reads it: one warning line, the work done again, no code run."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import numpy as np
import pytest
from prefect.results import ResultRecord, ResultRecordMetadata
from prefect.serializers import PickleSerializer, Serializer
from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

from conftest import run_nas
from nas.core.trial import EvalResult
from support.supernet_training import fake_supernet_training
from tasks.evaluate import RESULT_FIELDS  # (imports Prefect's task engine, which configures logging)
from tasks.records import SERIALIZER, PlainJSONSerializer, check_fields, read_record, record_path

KEYLIKE = "sk-proj-AbCdEf0123456789"


class Poison:
    """Unpickling it creates `marker`: any code could run there instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def pickle_record(path: Path, marker: Path) -> bytes:
    """A genuine Prefect record (metadata: pickle) whose payload creates `marker` when read."""
    return ResultRecord(metadata=ResultRecordMetadata(serializer=PickleSerializer(), storage_key=str(path)),
                        result=Poison(marker)).serialize()


def json_record(payload, serializer: dict | None = None) -> bytes:
    return json.dumps({"metadata": {"storage_key": "k", "expiration": None, "prefect_version": "3.8.8",
                                    "serializer": serializer or {"type": "nasflow-json"}, "storage_block_id": None},
                       "result": json.dumps(payload)}).encode()


def test_the_poison_runs_when_prefect_reads_it(tmp_path):
    """The attack is real: Prefect itself executes such a record's payload."""
    marker = tmp_path / "pwned"
    ResultRecord.deserialize(pickle_record(tmp_path / "r", marker))
    assert marker.exists()


def test_serializer_round_trip_is_plain_json_and_scrubbed(monkeypatch):
    from nas.secrets import register

    register("nasflow-serializer-secret")
    blob = SERIALIZER.dumps({"error": "printed nasflow-serializer-secret", "curve": (1.0, 2.5)})
    assert json.loads(blob) == SERIALIZER.loads(blob) == {"error": "printed ***", "curve": [1.0, 2.5]}
    # A record naming our serializer is read back with it (and it can name nothing else).
    assert isinstance(Serializer(type="nasflow-json"), PlainJSONSerializer)
    with pytest.raises(ValueError):
        Serializer(type="nasflow-json", object_decoder="os.system")
    # A class-tagged object stays a dict: no import, no instance (Prefect's JSON decoder would build it).
    assert SERIALIZER.loads(b'{"__class__": "pathlib.Path", "data": "/"}') == {"__class__": "pathlib.Path",
                                                                               "data": "/"}


EVAL = EvalResult(accuracy=91.5, metrics={"m": 91.5}, params=10, flops=20).to_dict()


def eval_shape(data) -> str | None:
    return check_fields(data, RESULT_FIELDS, exact=True)


@pytest.mark.parametrize("content, why", [
    (b"{not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # nested past the recursion limit
    (json_record(EVAL, {"type": "pickle", "picklelib": "cloudpickle"}), "serializer 'pickle' is not nasflow-json"),
    (json_record(EVAL, {"type": "json", "jsonlib": "json", "object_decoder": "os.system"}), "serializer 'json'"),
    (json_record(EVAL, {"type": "nasflow-json", "jsonlib": "os"}), "serializer options jsonlib are not ours"),
    (json.dumps({"metadata": {}, "result": json.dumps(EVAL)}).encode(), "no serializer named"),  # Prefect: pickle
    (json.dumps({"metadata": {"serializer": {"type": "nasflow-json"}}, "result": json.dumps(EVAL),
                 "serializer": {"type": "pickle"}}).encode(), "not a result record"),  # moved into metadata
    (json_record({**EVAL, "accuracy": "high"}), "unexpected payload: bad accuracy"),
    (json_record({k: v for k, v in EVAL.items() if k != "curve"}), "unexpected payload: missing curve"),
    (json_record({**EVAL, "extra": 1}), "unexpected payload: unknown field 'extra'"),
    (json_record([EVAL]), "unexpected payload: expected an object, got list"),
    (json.dumps({"metadata": {"serializer": {"type": "nasflow-json"}}, "result": "{"}).encode(),
     "payload is not JSON"),
])
def test_refused_records_are_reported_in_one_line_and_removed(tmp_path, caplog, content, why):
    (tmp_path / "k1").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="tasks.records"), \
            temporary_settings(updates={PREFECT_RESULTS_LOCAL_STORAGE_PATH: tmp_path}):
        assert record_path("k1") == tmp_path / "k1"
        assert read_record("k1", eval_shape, "candidate c1", "re-evaluating it") == (None, True)
    [message] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert message.startswith(f"corrupt cache entry {tmp_path / 'k1'} for candidate c1 (")
    assert why in message and message.endswith("; re-evaluating it") and "\n" not in message
    assert not (tmp_path / "k1").exists()


def test_safe_record_is_read_and_kept(tmp_path, caplog):
    (tmp_path / "k1").write_bytes(json_record(EVAL))
    with caplog.at_level(logging.WARNING), temporary_settings(updates={PREFECT_RESULTS_LOCAL_STORAGE_PATH: tmp_path}):
        assert read_record("k1", eval_shape, "candidate c1", "re-evaluating it") == (EVAL, False)
        assert read_record("absent", eval_shape, "candidate c2", "re-evaluating it") == (None, False)
    assert (tmp_path / "k1").exists() and not caplog.records


def test_result_fields_match_eval_result():
    from dataclasses import fields

    assert set(RESULT_FIELDS) == {f.name for f in fields(EvalResult)}


# -- whole searches ------------------------------------------------------------------------------------------

def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def history(run_dir: Path) -> list[tuple]:
    return [(r["key"], r["accuracy"]) for r in map(json.loads, (run_dir / "history.jsonl").read_text().splitlines())]


@pytest.mark.slow
def test_poisoned_evaluation_records_are_refused_by_the_search(tmp_path, nas_env):
    """`nas search` twice on one cache; between the runs three of the five records are
    replaced: a pickle that would create a file, a JSON record of the wrong shape, and
    one naming a key-like serializer (its warning is scrubbed in search.log too)."""
    args = ["search", "space=nb201", "evaluator=table", "strategy=random", "budget.trials=5", "seed=4",
            "progress=false"]
    out = run_nas([*args, f"hydra.run.dir={tmp_path / 'a'}"], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    cache = Path(nas_env["NASFLOW_HOME"]) / "cache"
    records = sorted(cache.iterdir())
    assert len(records) == 5 and all(json.loads(p.read_bytes())["metadata"]["serializer"] == {"type": "nasflow-json"}
                                     for p in records)
    marker = tmp_path / "pwned"
    poisoned, wrong_shape, keylike = records[:3]
    poisoned.write_bytes(pickle_record(poisoned, marker))
    wrong_shape.write_bytes(json_record({"accuracy": "99.9"}))
    keylike.write_bytes(json_record(EVAL, {"type": KEYLIKE}))

    out = run_nas([*args, f"hydra.run.dir={tmp_path / 'b'}"], nas_env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not marker.exists(), "a cache record was unpickled"
    warnings = [line for line in out.stderr.splitlines() if "corrupt cache entry" in line]
    assert len(warnings) == 3 and "Traceback" not in out.stderr
    for path, why in ((poisoned, "serializer 'pickle'"), (wrong_shape, "unexpected payload"),
                      (keylike, "serializer '***'")):
        assert sum(str(path) in w and why in w and w.endswith("re-evaluating it") for w in warnings) == 1, why
    assert KEYLIKE not in out.stderr and KEYLIKE not in (tmp_path / "b" / "search.log").read_text()
    assert (tmp_path / "b" / "search.log").read_text().count("corrupt cache entry") == 3
    assert summary(tmp_path / "b")["cache_hits"] == 2
    assert history(tmp_path / "a") == history(tmp_path / "b")
    # Re-evaluated and re-cached as plain JSON records like the two that were read back above.
    assert sorted(cache.iterdir()) == records and not marker.exists()
    with temporary_settings(updates={PREFECT_RESULTS_LOCAL_STORAGE_PATH: cache}):
        for path in records:
            payload, rejected = read_record(path.name, eval_shape, "candidate", "re-evaluating it")
            assert not rejected and payload == json.loads(json.loads(path.read_bytes())["result"])


@pytest.mark.slow
def test_poisoned_llm_call_record_is_refused_and_the_call_made_again(prefect_home, caplog):
    from prefect import flow

    from nas.llm import LLMClient
    from support.scripted import ScriptedServer
    from tasks.llm import prefect_calls

    @flow(persist_result=False)
    def ask(base_url: str, text: str) -> tuple[str, str]:
        reply_cache = prefect_home / uuid.uuid4().hex   # empty each time: only Prefect's store can answer
        client = LLMClient({"backend": "openai", "base_url": base_url, "model": "scripted",
                            "cache_dir": str(reply_cache), "api_key_env": "NASFLOW_NO_KEY", "max_retries": 0},
                           prefect_home / "run", calls=prefect_calls)
        reply = client.complete("mutator", text)
        return reply.text, reply.source

    marker = prefect_home / "pwned"
    text = f"design a block {uuid.uuid4().hex}"  # a call no other test made
    cache = record_path("x").parent
    before = set(cache.iterdir())
    with ScriptedServer(["first", "second", "third"]) as srv:
        assert ask(srv.base_url, text) == ("first", "live")
        [record] = set(cache.iterdir()) - before
        assert record.name.startswith("nasflow-llm-")
        assert ask(srv.base_url, text) == ("first", "cache")  # the record is read as it is

        record.write_bytes(pickle_record(record, marker))
        with caplog.at_level(logging.WARNING, logger="tasks.records"):
            assert ask(srv.base_url, text) == ("second", "live")
        assert not marker.exists(), "an LLM call record was unpickled"
        [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert f"corrupt cache entry {record} for the mutator call" in warning and "serializer 'pickle'" in warning
        assert warning.endswith("asking the model again")

        caplog.clear()
        record.write_bytes(json_record([{"reply": 42}, 0, "live"]))
        with caplog.at_level(logging.WARNING, logger="tasks.records"):
            assert ask(srv.base_url, text) == ("third", "live")
        [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert "unexpected payload: missing completion_tokens" in warning
        assert ask(srv.base_url, text) == ("third", "cache")
        assert len(srv.requests) == 3


@pytest.mark.slow
def test_poisoned_supernet_record_is_refused_and_the_supernet_trained_again(prefect_home, monkeypatch, caplog):
    from flows.supernet import train_supernet_flow

    trained = fake_supernet_training(monkeypatch)
    overrides = ["space=nb201", "data=digits", "supernet.epochs=1", f"out={prefect_home / 'sn'}"]
    cache = record_path("x").parent
    before = set(cache.iterdir())
    assert not train_supernet_flow(overrides)["cached"]
    assert train_supernet_flow(overrides)["cached"]
    [record] = set(cache.iterdir()) - before
    marker = prefect_home / "pwned"
    record.write_bytes(pickle_record(record, marker))
    with caplog.at_level(logging.WARNING, logger="tasks.records"):
        assert not train_supernet_flow(overrides)["cached"]
    assert not marker.exists() and trained == [1, 1]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"corrupt cache entry {record} for supernet nb201" in warning and warning.endswith("training again")
    assert train_supernet_flow(overrides)["cached"]


@pytest.mark.parametrize("damage", ["shape", "deep"])
def test_llm_reply_cache_file_of_the_wrong_shape_is_a_miss(tmp_path, caplog, damage):
    """The reply cache is JSON only, and a file in it is used only with a reply's shape."""
    from nas.llm import LLMClient
    from support.scripted import ScriptedServer

    with ScriptedServer(["first", "second"]) as srv:
        cfg = {"backend": "openai", "base_url": srv.base_url, "api_key_env": "NASFLOW_NO_KEY",
               "cache_dir": str(tmp_path / "cache"), "max_retries": 0}
        first = LLMClient(cfg).complete("reader", "hi")
        path = next((tmp_path / "cache").rglob(f"{first.key}.json"))
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, "prompt_tokens": "many"}) if damage == "shape"
                        else "[" * 100_000 + "]" * 100_000)
        with caplog.at_level(logging.WARNING, logger="nas.llm"):
            again = LLMClient(cfg).complete("reader", "hi")
    assert (first.text, again.text, again.source) == ("first", "second", "live")
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"corrupt LLM cache file {path} (" in warning and "\n" not in warning
    assert ("bad token counts" if damage == "shape" else "recursion") in warning


@pytest.mark.parametrize("uses_seed", [True, False])
def test_the_evaluation_cache_key_holds_the_seed_when_results_depend_on_it(uses_seed):
    """Two searches that differ only in seed must not replay each other's trained results
    from Prefect's cache; an evaluator whose results ignore the seed shares them."""
    from nas.core.trial import Candidate
    from nas.search.spec import Component, SearchSpec, build_evaluator
    from nas.spaces import SPACES
    from tasks.evaluate import PrefectExecutor, cache_key

    space = SPACES.create("nb201", {})
    evaluator = build_evaluator(Component("table", {}), space)
    evaluator.uses_seed = uses_seed
    candidate = Candidate(space.sample(np.random.default_rng(0)))
    keys = [cache_key(PrefectExecutor(SearchSpec(Component("nb201", {}), Component("random", {}),
                                                 Component("table", {}), seed=seed), evaluator, 0).inputs(candidate))
            for seed in (0, 1, 1)]
    assert keys[1] == keys[2]
    assert (keys[0] != keys[1]) is uses_seed


def test_an_evaluations_cache_entry_may_be_read_when_absent_or_safe_not_when_refused(tmp_path, caplog):
    from tasks.evaluate import cache_key, check_cache_entry

    inputs = {"key": "c1", "arch": "a", "space": {}, "evaluator": {}, "seed": 0}
    with temporary_settings(updates={PREFECT_RESULTS_LOCAL_STORAGE_PATH: tmp_path}):
        path = record_path(cache_key(inputs))
        assert check_cache_entry(inputs) is True  # no record: Prefect evaluates (nothing to refuse)
        path.write_bytes(json_record(EVAL))
        assert check_cache_entry(inputs) is True and path.exists()  # a safe record: read as it is
        path.write_bytes(json_record({**EVAL, "accuracy": "high"}))
        with caplog.at_level(logging.WARNING, logger="tasks.records"):
            assert check_cache_entry(inputs) is False  # refused: reported, removed, evaluated again
        assert not path.exists() and "for candidate c1 (" in caplog.text

"""The sandbox's protocol (`nas.sandbox.protocol`), field by field: every field of every message a
sandbox child or the trusted worker sends, at each of its bounds, just past them, of a wrong type,
null, missing, and with a key besides, each row sent as a line through the channel's parser. The
bounds are written out here, apart from the schema, so that a bound moved by one, a field made
nullable, an unknown key taken, a type widened (a bool as an integer, a string as a number) each
fail a row. Then the rules across fields, strict JSON, exit statuses in words, and the routes issue
49 found (tracebacks instead of one line), each through the real reader (`verify._take`,
`conclude`) to its one line. All in-process."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nas.sandbox.limits import Limits
from nas.sandbox.protocol import (
    CHECK_WORKER,
    CHILD,
    CHILD_VERDICT,
    EPOCH,
    MAX_LINE,
    TRAINED,
    TRAINING_WORKER,
    WORKER_VERDICT,
    Channel,
    ProtocolError,
    decode,
    exit_words,
)
from nas.sandbox.verify import ChildRun, Verdict, _collect, _take, conclude, exit_status
from nas.train.progress import EpochProgress
from nas.train.result import TrainResult

ROOT = Path(__file__).resolve().parents[1]
REFUSED = object()  # a row's expectation: ProtocolError
SAME = object()  # accepted as sent
MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
STAGE_NAMES = ["syntax", "import", "instantiate", "forward", "output_shape", "backward", "export", "measure",
               "structure", "graph", "train", "done", "limits", "policy", "crash"]

VERDICT = {"ok": True, "stage": "done", "error": None, "traceback": None, "params": 1, "flops": 2,
           "output_shape": [2, 10], "changed": None, "changed_layers": None, "layers": 1, "self_reported": False,
           "export_error": None, "wall_s": 0.5, "graph": None}
MEASURED = {**VERDICT, "graph": "0" * 64}  # the trusted worker's ok verdict: counted and hashed
POLICY = {"error": "policy: writing outside the sandbox directory is not allowed", "traceback": None}
TRAINED_OK = {"valid_accuracy": 90.0, "test_accuracy": 89.5, "loss_curve": [1.0, 0.5], "epochs": 2,
              "terminated": None, "wall_seconds": 1.0, "device_seconds": 1.0, "params": 10, "flops": 20,
              "device": "cpu", "world_size": 1, "cuda_graphs": "off", "compile_seconds": 0.0, "eval_seconds": 0.0}
STOPPED = {**TRAINED_OK, "terminated": "loss not improving", "valid_accuracy": None, "test_accuracy": None}
PROGRESS = {"label": "model.py", "epoch": 1, "epochs": 2, "loss": 0.5, "elapsed": 1.0, "terminated": None}
WORK = {"work": 10, "images": 100, "epochs": 2}


# --- the rows: (id, channel, message, path to the field, expected) -----------------

def ints(lo: int, hi: int, null: bool) -> list[tuple[str, Any, Any]]:
    return [("lo", lo, SAME), ("hi", hi, SAME), ("below", lo - 1, REFUSED), ("above", hi + 1, REFUSED),
            ("float", lo + 0.5, REFUSED), ("bool", True, REFUSED), ("string", str(lo), REFUSED),
            ("list", [lo], REFUSED), ("null", None, SAME if null else REFUSED)]


def nums(lo: float, hi: float, null: bool = False, nonfinite: bool = False) -> list[tuple[str, Any, Any]]:
    rows = [("lo", lo, float(lo)), ("hi", hi, float(hi)), ("an integer", int(lo) + 1, float(int(lo) + 1)),
            ("bool", True, REFUSED), ("string", "1", REFUSED), ("null", None, SAME if null else REFUSED),
            ("NaN", math.nan, math.nan if nonfinite else REFUSED),
            ("Infinity", math.inf, math.inf if nonfinite else REFUSED),
            ("an integer past every float", 10**400, REFUSED)]
    if lo > -1e300:
        rows.append(("below", lo - 1e-6, REFUSED))
    if hi < 1e300:
        rows += [("above", hi + 1e-6 * max(1, hi), REFUSED), ("integer above", int(hi) + 1, REFUSED)]
    return rows


def flags(null: bool) -> list[tuple[str, Any, Any]]:
    return [("true", True, SAME), ("false", False, SAME), ("1", 1, REFUSED), ("string", "true", REFUSED),
            ("null", None, SAME if null else REFUSED)]


def texts(most: int, breaks: str, null: bool, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """`breaks`: refuse, escape or keep a line break; the bound holds for the text as escaped."""
    fill = prefix + "x" * (most - len(prefix))
    newline = {"refuse": REFUSED, "escape": prefix + "a\\x0ab", "keep": prefix + "a\nb"}[breaks]
    return [("at most", fill, SAME), ("one over", fill + "x", REFUSED),
            ("escaped to its most", fill[:-6] + "\u202e", fill[:-6] + "\\u202e"),
            ("escaped one over", fill[:-5] + "\u202e", REFUSED),
            ("newline", prefix + "a\nb", newline),
            ("carriage return", prefix + "a\rb", REFUSED if breaks == "refuse" else prefix + "a\\x0db"),
            ("surrogate, bidi, zero-width", prefix + "a\ud800\u2066\u200b", prefix + "a\\ud800\\u2066\\u200b"),
            ("number", 1, REFUSED), ("list", [prefix], REFUSED), ("null", None, SAME if null else REFUSED)]


def seqs(most: int, good: Any, null: bool) -> list[tuple[str, Any, Any]]:
    return [("at most", [good] * most, SAME), ("one over", [good] * (most + 1), REFUSED), ("empty", [], SAME),
            ("not a list", good, REFUSED), ("null", None, SAME if null else REFUSED)]


# record -> (channel, base message, where its fields are in it, field -> its cases)
FIELDS: dict[str, tuple[Channel, dict, tuple[str, ...], dict[str, list]]] = {
    "verdict": (CHILD, {"verdict": VERDICT}, ("verdict",), {
        "ok": [("bool", 1, REFUSED), ("null", None, REFUSED), ("string", "true", REFUSED)],
        "stage": [("unknown", "hacked", REFUSED), ("startup", "startup", REFUSED), ("Done", "Done", REFUSED),
                  ("number", 11, REFUSED), ("null", None, REFUSED)],
        "error": texts(1000, "refuse", True), "traceback": texts(8000, "keep", True),
        "params": ints(0, 2**53, True), "flops": ints(0, 2**53, True),
        "output_shape": [*seqs(8, 1, True), ("dimension at most", [2, 2**31], SAME),
                         ("dimension one over", [2, 2**31 + 1], REFUSED), ("negative", [2, -1], REFUSED),
                         ("a float", [2, 10.0], REFUSED), ("a bool", [True], REFUSED)],
        "changed": flags(True), "changed_layers": ints(0, 2**20, True), "layers": ints(0, 2**20, True),
        "self_reported": flags(False), "export_error": texts(1000, "refuse", True), "wall_s": nums(0, 1e7),
        "graph": [("hex", "0" * 64, SAME), ("hex letters", "0123456789abcdef" * 4, SAME), ("null", None, SAME),
                  ("short", "0" * 63, REFUSED), ("long", "0" * 65, REFUSED), ("upper case", "A" * 64, REFUSED),
                  ("not hex", "g" * 64, REFUSED), ("newline", "0" * 63 + "\n", REFUSED), ("number", 0, REFUSED)]}),
    "policy": (CHILD, {"policy": POLICY}, ("policy",), {
        "error": [*texts(1000, "refuse", False, prefix="policy: "), ("no prefix", "denied", REFUSED)],
        "traceback": texts(8000, "keep", True)}),
    "trained": (CHILD, {"trained": TRAINED_OK}, ("trained",), {
        "valid_accuracy": [r if r[0] != "null" else ("null", None, REFUSED) for r in nums(0, 100, True)],
        "test_accuracy": [r if r[0] != "null" else ("null", None, REFUSED) for r in nums(0, 100, True)],
        "loss_curve": [*seqs(65536, 0.5, False), ("NaN", [math.nan], [math.nan]), ("Infinity", [math.inf], [math.inf]),
                       ("a string", ["0.5"], REFUSED), ("a bool", [True], REFUSED), ("huge", [1.7e308], SAME)],
        "epochs": ints(0, 65536, False), "terminated": [("null", None, SAME), ("number", 1, REFUSED)],
        "wall_seconds": nums(0, 1e7), "device_seconds": nums(0, 1e7), "params": ints(0, 2**53, False),
        "flops": ints(0, 2**53, False), "device": texts(32, "escape", False), "world_size": ints(1, 1024, False),
        "cuda_graphs": texts(300, "escape", False), "compile_seconds": nums(0, 1e7), "eval_seconds": nums(0, 1e7)}),
    "trained (terminated)": (CHILD, {"trained": STOPPED}, ("trained",), {
        "terminated": texts(500, "escape", False)}),  # a terminated training measured no accuracy
    "stage": (CHILD, {"stage": "forward"}, (), {
        "stage": [*((name, name, SAME) for name in STAGE_NAMES), ("startup", "startup", REFUSED),
                  ("unknown", "hacked", REFUSED), ("number", 3, REFUSED), ("null", None, REFUSED)]}),
    "ready": (CHECK_WORKER, {"ready": 1}, (), {"ready": ints(0, MEMORY, False)}),
    "work (check)": (CHECK_WORKER, {"work": 1}, (), {"work": ints(0, 2**63 - 1, False)}),
    "work (training)": (TRAINING_WORKER, WORK, (), {k: ints(0, 2**63 - 1, False) for k in WORK}),
    "limit": (TRAINING_WORKER, {"limit": "memory"}, (), {
        "limit": [("memory", "memory", SAME), ("gpu", "gpu", SAME), ("disk", "disk", REFUSED), ("empty", "", REFUSED),
                  ("list", ["gpu"], REFUSED), ("null", None, REFUSED)]}),
    "epoch": (TRAINING_WORKER, {"epoch": PROGRESS}, ("epoch",), {
        "label": texts(1000, "escape", False), "epoch": ints(0, 65536, False), "epochs": ints(0, 65536, False),
        "loss": [("NaN", math.nan, math.nan), ("Infinity", math.inf, math.inf), ("-Infinity", -math.inf, -math.inf),
                 ("most", 1.7e308, SAME), ("least", -1.7e308, SAME), ("an integer", 3, 3.0), ("bool", True, REFUSED),
                 ("string", "0.5", REFUSED), ("null", None, REFUSED), ("an integer past every float", 10**400, REFUSED)],
        "elapsed": nums(0, 1e7), "terminated": texts(1000, "escape", True)}),
    "proxies": (TRAINING_WORKER, {"proxies": {"synflow": 1.5}}, (), {
        "proxies": [("64 names", {f"p{i}": 1.0 for i in range(64)}, SAME),
                    ("65 names", {f"p{i}": 1.0 for i in range(65)}, REFUSED),
                    ("a name of 64", {"n" * 64: 1.0}, SAME), ("a name of 65", {"n" * 65: 1.0}, REFUSED),
                    ("an integer score", {"snip": 3}, {"snip": 3.0}), ("NaN", {"snip": math.nan}, REFUSED),
                    ("Infinity", {"snip": math.inf}, REFUSED), ("a bool", {"snip": True}, REFUSED),
                    ("a string", {"snip": "1"}, REFUSED), ("a list", [1.0], REFUSED), ("null", None, REFUSED),
                    ("an integer past every float", {"snip": 10**400}, REFUSED)]}),
    **{kind: (TRAINING_WORKER, {kind: "RuntimeError: x"}, (), {kind: texts(1000, "escape", False)})
       for kind in ("no_proxies", "error", "failed")},
    "verdict (worker)": (CHECK_WORKER, {"verdict": MEASURED}, ("verdict",), {
        "params": ints(0, 2**53, True)[:-1], "graph": [("hex", "f" * 64, SAME), ("short", "f" * 63, REFUSED)]}),
    "trained (worker)": (TRAINING_WORKER, {"trained": [TRAINED_OK]}, (), {
        "trained": [*seqs(16, TRAINED_OK, False)[:-1], ("a malformed report", [{**TRAINED_OK, "epochs": -1}], REFUSED),
                    ("null", None, REFUSED)]}),
}


def _set(message: dict, path: tuple[str, ...], key: str, value: Any) -> dict:
    message = json.loads(json.dumps(message))
    inner = message
    for step in path:
        inner = inner[step]
    inner[key] = value
    return message


def _get(message: dict, path: tuple[str, ...], key: str) -> Any:
    for step in path:
        message = message[step]
    return message[key]


ROWS = [(f"{record}.{key} {case}", channel, _set(base, path, key, value), path, key, value, expected)
        for record, (channel, base, path, fields) in FIELDS.items() for key, cases in fields.items()
        for case, value, expected in cases]


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, and of the same types (an integer is not a float)."""
    return json.dumps(a) == json.dumps(b) and type(a) is type(b) and (
        not isinstance(a, list) or all(_same(x, y) for x, y in zip(a, b)))


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_each_field_of_each_message_at_its_bounds(row) -> None:
    name, channel, message, path, key, value, expected = row
    line = json.dumps(message).encode()
    if expected is REFUSED:
        with pytest.raises(ProtocolError) as refused:
            channel.parse(line)
        assert "\n" not in str(refused.value) and str(refused.value), name
        return
    kind, checked = channel.parse(line)
    assert _same(_get(checked, path, key), value if expected is SAME else expected), name
    assert _same(channel.read(checked)[1], checked)  # checked again: the same


@pytest.mark.parametrize("record", list(FIELDS))
def test_every_field_is_required_and_no_key_besides_is_taken(record: str) -> None:
    channel, base, path, _ = FIELDS[record]
    assert channel.parse(json.dumps(base).encode())[0] == (path or tuple(base))[0]
    inner = _get({"_": base}, ("_", *path[:-1]), path[-1]) if path else base
    for key in inner:
        missing = json.loads(json.dumps(base))
        target = _get({"_": missing}, ("_", *path[:-1]), path[-1]) if path else missing
        del target[key]
        with pytest.raises(ProtocolError, match="has the wrong fields|has the keys"):
            channel.parse(json.dumps(missing).encode())
    extra = _set(base, path[:-1], path[-1], {**inner, "extra": 1}) if path else {**base, "extra": 1}
    with pytest.raises(ProtocolError, match="has the wrong fields|has the keys"):
        channel.parse(json.dumps(extra).encode())


def test_each_channel_takes_its_own_messages_only() -> None:
    """A worker's message on the child's pipe, a training's on a check's, a result beside another key."""
    for channel, line in [(CHILD, {"ready": 1}), (CHILD, {"work": 1}), (CHECK_WORKER, {"stage": "done"}),
                          (CHECK_WORKER, {"epoch": PROGRESS}), (CHECK_WORKER, {"trained": [TRAINED_OK]}),
                          (CHECK_WORKER, {"error": "x"}), (CHECK_WORKER, {"failed": "x"}),
                          (CHECK_WORKER, {"proxies": {"snip": 1.0}}), (CHECK_WORKER, WORK),
                          (TRAINING_WORKER, {"work": 1}), (CHILD, {"verdict": VERDICT, "stage": "done"}),
                          (TRAINING_WORKER, {"verdict": MEASURED, "trained": []}), (CHILD, {}), (CHILD, [VERDICT])]:
        with pytest.raises(ProtocolError):
            channel.parse(json.dumps(line).encode())
    assert TRAINING_WORKER.parse(json.dumps({"trained": [TRAINED_OK]}).encode())[0] == "trained"


def test_the_schema_names_every_field_of_the_types_built_from_it() -> None:
    """A field added to a verdict, a training report or an epoch's progress must be declared too."""
    for record, cls in ((CHILD_VERDICT, Verdict), (WORKER_VERDICT, Verdict), (TRAINED, TrainResult),
                        (EPOCH, EpochProgress)):
        assert list(record.fields) == [f.name for f in dataclasses.fields(cls)], record.name


# --- rules across fields ---------------------------------------------------------------

RULES = [  # (channel, verdict, accepted)
    (CHILD, {**VERDICT, "stage": "forward"}, False),  # ok before done
    (CHILD, {**VERDICT, "ok": False, "error": "x"}, False),  # failed at done
    (CHILD, {**VERDICT, "ok": False, "stage": "forward"}, False),  # failed without a word
    (CHILD, {**VERDICT, "ok": False, "stage": "forward", "error": ""}, False),
    (CHILD, {**VERDICT, "ok": False, "stage": "forward", "error": "forward: x"}, True),
    *((CHILD, {**VERDICT, "self_reported": True, key: None}, False) for key in ("params", "flops", "output_shape",
                                                                                 "layers")),
    (CHILD, {**VERDICT, "self_reported": True}, True),
    (CHILD, {**VERDICT, "params": None, "flops": None, "layers": None}, True),  # exported: measured here
    (CHILD, {**VERDICT, "ok": False, "stage": "forward", "error": "x", "self_reported": True, "params": None}, True),
    *((CHECK_WORKER, {**MEASURED, key: None}, False) for key in ("params", "flops", "output_shape", "layers",
                                                                  "graph")),
    (CHECK_WORKER, {**MEASURED, "self_reported": True}, False),
    (CHECK_WORKER, MEASURED, True),
    (CHECK_WORKER, {**VERDICT, "ok": False, "stage": "graph", "error": "graph: x", "params": None}, True),
]


@pytest.mark.parametrize("channel, verdict, accepted", RULES)
def test_a_verdict_is_ok_only_when_done_and_counted(channel: Channel, verdict: dict, accepted: bool) -> None:
    line = json.dumps({"verdict": verdict}).encode()
    if accepted:
        assert channel.parse(line)[1]["verdict"]["ok"] == verdict["ok"]
    else:
        with pytest.raises(ProtocolError, match="disagree|without its"):
            channel.parse(line)


def test_a_training_report_has_accuracies_exactly_when_it_was_not_terminated() -> None:
    assert TRAINED.check(STOPPED)["terminated"] == "loss not improving"
    for report in ({**STOPPED, "valid_accuracy": 50.0}, {**TRAINED_OK, "test_accuracy": None}):
        with pytest.raises(ProtocolError, match=r"field\(s\) valid_accuracy, test_accuracy malformed"):
            TRAINED.check(report)
    with pytest.raises(ValueError, match=r"field\(s\) loss_curve, epochs malformed"):
        TrainResult.from_untrusted(TRAINED.check(TRAINED_OK), max_epochs=1)
    assert math.isnan(TrainResult.from_untrusted(TRAINED.check({**TRAINED_OK, "loss_curve": [math.inf]}), 2)
                      .loss_curve[0])


# --- strict JSON ---------------------------------------------------------------------

@pytest.mark.parametrize("line, value", [
    (b"9223372036854775807", 2**63 - 1), (b"-9223372036854775808", -(2**63)), (b"1e308", 1e308), (b"1e-400", 0.0),
    (b'{"a": 1, "b": [1, 2]}', {"a": 1, "b": [1, 2]}), (b'"\\ud800"', "\ud800"),
    (b"[" + b" " * (MAX_LINE - 2) + b"]", []),
])
def test_json_within_bounds_is_read(line: bytes, value: Any) -> None:
    assert decode(line) == value


@pytest.mark.parametrize("line", [
    b"9223372036854775808", b"-9223372036854775809", b"1" * 21, b"1" * 5000, b"1e400", b"-1e400", b"1" * 400 + b".0",
    b'{"a": 1, "a": 2}', b"\xff", b'"\xed\xa0\x80"', '{"a": 1}'.encode("utf-16"), b"", b"{", b'{"a": 1}\n{"a": 1}',
    b"[" * 100_000 + b"]" * 100_000, b"[" + b" " * (MAX_LINE - 1) + b"]",
], ids=["2**63", "-2**63-1", "21 digits", "5000 digits", "1e400", "-1e400", "400-digit float", "key twice", "0xff",
        "surrogate bytes", "utf-16", "empty", "cut", "two", "deep", "one byte over"])
def test_json_past_its_bounds_is_one_line(line: bytes) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode(line)
    assert "\n" not in str(refused.value)


def test_nan_and_infinity_reach_only_the_fields_that_take_them() -> None:
    assert math.isnan(TRAINING_WORKER.parse(b'{"epoch": ' + json.dumps(PROGRESS).replace("0.5", "NaN").encode()
                                            + b"}")[1]["epoch"]["loss"])
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        with pytest.raises(ProtocolError, match="wall_s"):
            CHILD.parse(json.dumps({"verdict": VERDICT}).encode().replace(b"0.5", literal))


# --- exit statuses ---------------------------------------------------------------------

@pytest.mark.parametrize("returncode, words", [
    (None, "ended without an exit status"), (0, "exited with status 0"), (1, "exited with status 1"),
    (255, "exited with status 255"), (-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (-34, "killed by SIGRTMIN"),
    (-40, "killed by signal 40"), (-64, "killed by SIGRTMAX"), (-65, "exited with status -65"),
    (-72, "exited with status -72"), (-(2**70), f"exited with status {-(2**70)}"), (2**70, f"exited with status {2**70}"),
])
def test_every_exit_status_has_words(returncode: int | None, words: str) -> None:
    assert exit_words(returncode) == words


@pytest.mark.parametrize("isolated, returncode, status", [
    (True, 137, -9), (True, 129, -1), (True, 192, -64), (True, 168, -40), (True, 193, 193), (True, 200, 200),
    (True, 128, 128), (True, 0, 0), (True, -9, -9), (True, None, None), (False, 137, 137), (False, -9, -9),
])
def test_bwrap_statuses_become_signals_only_when_they_name_one(isolated: bool, returncode: int | None,
                                                                status: int | None) -> None:
    """bwrap exits 128+N when its child died of signal N: a child's own status past 128 that names
    no signal (200: 72) stays a status, never a signal number that is none."""
    assert exit_status(SimpleNamespace(returncode=returncode), SimpleNamespace(isolated=isolated)) == status


# --- the routes issue 49 found, in-process ---------------------------------------------------

def _concluded(*lines: bytes, returncode: int | None = 0) -> Verdict:
    run = ChildRun(returncode=returncode)
    for line in lines:
        _take(run, line)
    return conclude(run, Limits())


@pytest.mark.parametrize("line", [
    json.dumps({"verdict": {**VERDICT, "ok": False, "stage": "forward", "error": "x", "wall_s": 10**400}}).encode(),
    json.dumps({"verdict": VERDICT}).encode().replace(b'"params": 1', b'"params": 1e400'),
    json.dumps({"verdict": VERDICT}).encode().replace(b'"params": 1', b'"params": 1e400, "params": 1'),
    json.dumps({"verdict": {**VERDICT, "self_reported": True, "params": None, "flops": None}}).encode(),
    json.dumps({"verdict": {**VERDICT, "params": 2**64}}).encode(),
], ids=["int past float", "1e400", "key twice", "ok without counts", "past int64"])
def test_a_forged_verdict_is_one_malformed_report_line(line: bytes) -> None:
    verdict = _concluded(json.dumps({"stage": "done"}).encode(), line)
    assert (verdict.ok, verdict.stage) == (False, "crash")
    assert verdict.error.startswith("crash: malformed report from the sandbox during done: ") and "\n" not in verdict.error


@pytest.mark.parametrize("returncode, words", [(-72, "exited with status -72"), (-40, "killed by signal 40"),
                                               (200, "exited with status 200"), (None, "ended without an exit status")])
def test_an_exit_without_a_verdict_is_one_line_whatever_its_status(returncode: int | None, words: str) -> None:
    verdict = _concluded(json.dumps({"stage": "import"}).encode(), returncode=returncode)
    assert verdict.error == f"crash: sandbox {words} during import without a verdict"


def test_surrogates_and_bidi_in_a_childs_words_arrive_escaped_and_printable_anywhere() -> None:
    error = "forward: RuntimeError: boom \udfff\ud800 \u202e)sPOLF 1( ledom dilav\u2069\u200b"  # lone: low, high
    verdict = _concluded(json.dumps({"verdict": {**VERDICT, "ok": False, "stage": "forward", "error": error,
                                                 "traceback": f"File x\n{error}"}}).encode())
    assert verdict.error == "forward: RuntimeError: boom \\udfff\\ud800 \\u202e)sPOLF 1( ledom dilav\\u2069\\u200b"
    assert verdict.traceback == f"File x\n{verdict.error}"
    for text in (verdict.error, verdict.traceback):
        text.encode("ascii")  # every escape is ASCII: no terminal encoding refuses it
    worker = CHECK_WORKER.parse(json.dumps({"verdict": {**VERDICT, "ok": False, "stage": "graph",
                                                        "error": "graph: argument \ud800\u202e not allowed"}}).encode())
    assert worker[1]["verdict"]["error"] == "graph: argument \\ud800\\u202e not allowed"


def test_a_message_said_more_often_than_a_child_says_it_is_malformed() -> None:
    policy = json.dumps({"policy": POLICY}).encode()
    verdict = json.dumps({"verdict": VERDICT}).encode()
    for lines in ([verdict, verdict], [policy, policy], *([json.dumps({"trained": TRAINED_OK}).encode()] * 17,)):
        run = ChildRun()
        for line in lines:
            _take(run, line)
        assert run.malformed and run.problem.endswith("message once too often")
    assert _concluded(policy).stage == "policy"


# --- what the child sends stays within the bounds it is read by -------------------------------

def test_a_verdict_made_with_long_text_passes_its_own_check() -> None:
    """A model's words of any length (a 10,000-character class name in an error, a source line of a
    megabyte in a traceback) are cut where a verdict is made, so an honest child's verdict is never
    a malformed report; a traceback keeps its end, which says what failed."""
    verdict = Verdict(ok=False, stage="forward", error="forward: " + "\u202e" * 5000,
                      traceback="Traceback\n" + "x" * 20000 + "\nValueError: the end", export_error="y" * 2000)
    assert len(verdict.error) == len(verdict.export_error) == 1000 and verdict.traceback.endswith("ValueError: the end")
    assert len(verdict.traceback) == 8000
    assert Verdict.from_child(verdict.to_dict()) == verdict


def test_a_policy_report_of_long_text_is_cut_to_the_bounds_it_is_read_by() -> None:
    """`Reporter.deny` (the child's side of a policy report), run in a process of its own (it leaves
    with `os._exit`): its line is one the protocol takes, however long the model made it."""
    code = ("from nas.sandbox.worker import Reporter\n"
            "Reporter(1).deny('policy: writing ' + '\\u202e' * 3000 + ' is not allowed', 'tb\\n' * 5000)\n")
    sent = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    kind, msg = CHILD.parse(sent.stdout.rstrip(b"\n"))
    assert kind == "policy" and msg["policy"]["error"].startswith("policy: writing \\u202e")
    assert len(msg["policy"]["error"]) == 1000 and msg["policy"]["traceback"].endswith("tb\ntb\n")


@pytest.mark.parametrize("sent, stage, malformed", [(b'{"stage": "done"}\n', "done", False),
                                                    (b'{"stage": "done"}', "startup", True),
                                                    (b'{"stage": "done"}\n{"sta', "done", True)])
def test_a_last_line_cut_short_is_malformed(sent: bytes, stage: str, malformed: bool) -> None:
    """`_collect` on a real process's report pipe: a line without its newline was cut short."""
    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", f"import os; os.write({write}, {sent!r})"], pass_fds=(write,),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(write)
    try:
        run = _collect(proc, read, None, time.monotonic() + 60)
    finally:
        os.close(read)
        proc.wait()
    assert run.stage == stage and run.malformed == malformed
    assert run.problem == ("a last line without its newline" if malformed else None)

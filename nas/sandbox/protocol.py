"""What a sandbox child or the trusted worker may say to this process: every message, one strict schema.

A sandbox child runs a model's code and the trusted worker runs a child's graph, so either may write
anything on its pipe. Each line it sends is read here and only here (`Channel.parse`): strict JSON
first (`decode`: UTF-8, at most `MAX_LINE` bytes, no integer past int64, no number past the float
range, NaN and Infinity only where a field takes them, no key twice), then exactly one of the
channel's messages (`Record`: its keys, no more, no fewer), every field checked against its declared
type and finite range (`Int`, `Num`, `Flag`, `Text`, `Seq`, `Names`, a nested `Record`), then the
record's rules across fields. Text comes back escaped for the terminal (`nas.terminal.printable`)
and bounded as escaped, so a checked value passes its check again unchanged. Any failure is one
`ProtocolError` line, which the reader turns into its malformed-message refusal: never a KeyError,
TypeError, UnicodeError or OverflowError in this process. When a message may come (first, once, at
most N times) is the reader's part (`verify._take`, `trusted.TrustedWorker._talk`).

Each of the channels' messages and their fields, with their bounds, is declared below.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from nas.terminal import printable

MAX_LINE = 1 << 20  # bytes of one message
STAGES = ("syntax", "import", "instantiate", "forward", "output_shape", "backward", "export", "measure",
          "structure", "graph", "train", "done", "limits", "policy", "crash")
MAX_SEEDS = 16  # training reports of one training
# Bounds on the numbers, past any real model's or run's: a count beyond them is forged.
MAX_COUNT = 1 << 53  # params, FLOPs: exact as a JSON float too
MAX_DIM = 1 << 31  # an output dimension
MAX_NODES = 1 << 20  # layers, changed layers
MAX_WALL_S = 1e7  # seconds: 115 days
MAX_EPOCHS = 1 << 16
MAX_WORK = (1 << 63) - 1  # the worker's counts of work, images, epochs
MAX_MEMORY = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # bytes: the worker's resident memory
MAX_FLOAT = sys.float_info.max  # a loss or a proxy score: any finite float
MAX_ERROR = 1000  # characters of a one-line message, as escaped
MAX_TRACEBACK = 8000
MAX_PROXIES = 64  # proxy scores in one message, each named in at most MAX_NAME characters
MAX_NAME = 64
LIMITS = ("memory", "gpu")  # the caps the trusted worker names when one refused an allocation
SIGNALS = frozenset(signal.valid_signals())  # the numbers a process can die of
_INT_DIGITS = 20  # the longest int64 literal, with its sign


class ProtocolError(ValueError):
    """One line saying what of a message was malformed (escaped: it may quote the message)."""


# --- strict JSON ---------------------------------------------------------------------

class _NonFinite(str):
    """A JSON NaN, Infinity or -Infinity as read: only a `Num` that takes non-finite values takes it."""


def _int(text: str) -> int:
    if len(text) > _INT_DIGITS or not -(1 << 63) <= (value := int(text)) < 1 << 63:
        raise ProtocolError(f"an integer of {len(text):,} characters, past int64")
    return value


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError(f"a number past the float range ({printable(text[:20])})")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise ProtocolError("a key twice in one object")
    return value


def decode(line: bytes) -> Any:
    """One message's JSON, strictly (see the module's docstring); raises ProtocolError."""
    if len(line) > MAX_LINE:
        raise ProtocolError(f"a line of {len(line):,} bytes, over {MAX_LINE:,}")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ProtocolError(f"not UTF-8 (at byte {err.start})") from None
    try:
        return json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_NonFinite,
                          object_pairs_hook=_object)
    except ProtocolError:
        raise
    except json.JSONDecodeError as err:
        raise ProtocolError(f"not JSON ({err.msg} at character {err.pos})") from None
    except RecursionError:
        raise ProtocolError("not JSON (nested too deep)") from None


# --- field types -----------------------------------------------------------------------

class _Bad(Exception):
    """A field's value is not of its type or range (the record names the field)."""


@dataclass(frozen=True)
class Int:
    """An integer (a bool is not one) from `lo` to `hi`; None too with `null`."""

    lo: int
    hi: int
    null: bool = False

    def check(self, value: Any) -> int | None:
        if value is None and self.null:
            return None
        if type(value) is not int or not self.lo <= value <= self.hi:
            raise _Bad
        return value


@dataclass(frozen=True)
class Num:
    """A number (an integer too, not a bool) from `lo` to `hi`, as a float; NaN and the infinities
    too with `nonfinite` (a diverged training's loss); None too with `null`."""

    lo: float
    hi: float
    null: bool = False
    nonfinite: bool = False

    def check(self, value: Any) -> float | None:
        if value is None and self.null:
            return None
        if type(value) is _NonFinite and self.nonfinite:
            return float(value)
        if type(value) not in (int, float):
            raise _Bad
        if isinstance(value, float) and not math.isfinite(value):
            if self.nonfinite:
                return value
            raise _Bad
        if not self.lo <= value <= self.hi:  # exact for any integer: no float conversion before the bound
            raise _Bad
        return float(value)


@dataclass(frozen=True)
class Flag:
    """true or false; None too with `null`."""

    null: bool = False

    def check(self, value: Any) -> bool | None:
        if value is None and self.null:
            return None
        if type(value) is not bool:
            raise _Bad
        return value


Breaks = Literal["refuse", "escape", "keep"]


@dataclass(frozen=True)
class Text:
    """A string of at most `most` characters as escaped (`printable`). `breaks`: a line break in
    a one-line field is refused (it would print as a forged line of its own), escaped, or kept (a
    traceback's lines). `choices`: one of these; `pattern`: matching it whole; `prefix`:
    starting so. None too with `null`."""

    most: int
    breaks: Breaks = "refuse"
    null: bool = False
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    prefix: str = ""

    def check(self, value: Any) -> str | None:
        if value is None and self.null:
            return None
        if (type(value) is not str or len(value) > self.most or (self.choices and value not in self.choices)
                or (self.pattern is not None and re.fullmatch(self.pattern, value) is None)
                or not value.startswith(self.prefix)
                or (self.breaks == "refuse" and ("\n" in value or "\r" in value))):
            raise _Bad
        shown = printable(value, lines=self.breaks == "keep")
        if len(shown) > self.most:
            raise _Bad
        return shown


@dataclass(frozen=True)
class Seq:
    """A list of at most `most` items, each an `item`; None too with `null`."""

    item: Spec
    most: int
    null: bool = False

    def check(self, value: Any) -> list[Any] | None:
        if value is None and self.null:
            return None
        if type(value) is not list or len(value) > self.most:
            raise _Bad
        return [_inner(self.item, v) for v in value]


@dataclass(frozen=True)
class Names:
    """An object of at most `most` names (each at most `MAX_NAME` characters, none escaped: the
    reader compares them with names of its own) to a `value` each."""

    value: Spec
    most: int

    def check(self, value: Any) -> dict[str, Any]:
        if type(value) is not dict or len(value) > self.most or any(len(k) > MAX_NAME for k in value):
            raise _Bad
        return {k: _inner(self.value, v) for k, v in value.items()}


@dataclass(frozen=True)
class Rule:
    """What must hold across a record's checked fields; `says` completes "<record> ..." when it does not."""

    says: str
    holds: Callable[[Mapping[str, Any]], bool]


@dataclass(frozen=True)
class Record:
    """A JSON object of exactly `fields` (none missing, none unknown), each checked, then its `rules`.
    `name` is the record's in a refusal, and a message's kind (`Channel`)."""

    name: str
    fields: Mapping[str, Spec]
    rules: tuple[Rule, ...] = field(default=())

    def check(self, value: Any) -> dict[str, Any]:
        """The checked (and escaped) copy of `value`; raises ProtocolError in one line."""
        if type(value) is not dict or value.keys() != self.fields.keys():
            raise ProtocolError(f"{self.name} has the wrong fields")
        out: dict[str, Any] = {}
        bad: list[str] = []
        for key, spec in self.fields.items():
            try:
                out[key] = spec.check(value[key])
            except _Bad:
                bad.append(key)
            except ProtocolError as err:  # a record in a message: its own words
                raise ProtocolError(f"{self.name}: {err}") from None
        if bad:
            raise ProtocolError(f"{self.name} field(s) {', '.join(bad)} malformed")
        for rule in self.rules:
            if not rule.holds(out):
                raise ProtocolError(f"{self.name} {rule.says}")
        return out


Spec = Int | Num | Flag | Text | Seq | Names | Record


def _inner(spec: Spec, value: Any) -> Any:
    """An item of a list or an object: a record in it that is malformed makes the field malformed."""
    try:
        return spec.check(value)
    except ProtocolError:
        raise _Bad from None


@dataclass(frozen=True)
class Channel:
    """What one sender may send: one of `messages`, told apart by their keys."""

    name: str
    messages: tuple[Record, ...]

    def parse(self, line: bytes) -> tuple[str, dict[str, Any]]:
        """(the message's kind, its checked fields) of one line; raises ProtocolError in one line."""
        return self.read(decode(line))

    def read(self, data: Any) -> tuple[str, dict[str, Any]]:
        """As `parse`, of a message decoded already."""
        if type(data) is not dict:
            raise ProtocolError(f"a {self.name} message is a JSON object, not {type(data).__name__}")
        for record in self.messages:
            if data.keys() == record.fields.keys():
                return record.name, record.check(data)
        keys = printable(", ".join(sorted(data))[:80])
        raise ProtocolError(f"no {self.name} message has the keys [{keys}]")


# --- the messages ------------------------------------------------------------------------

_COUNTS = ("params", "flops", "output_shape", "layers")
_AGREE = Rule("has ok, stage and error that disagree (ok only at stage done, a failure says why)",
              lambda v: v["ok"] == (v["stage"] == "done") and (v["ok"] or bool(v["error"])))
_VERDICT_FIELDS: dict[str, Spec] = {
    "ok": Flag(), "stage": Text(16, choices=STAGES), "error": Text(MAX_ERROR, null=True),
    "traceback": Text(MAX_TRACEBACK, "keep", null=True), "params": Int(0, MAX_COUNT, null=True),
    "flops": Int(0, MAX_COUNT, null=True), "output_shape": Seq(Int(0, MAX_DIM), 8, null=True),
    "changed": Flag(null=True), "changed_layers": Int(0, MAX_NODES, null=True),
    "layers": Int(0, MAX_NODES, null=True), "self_reported": Flag(), "export_error": Text(MAX_ERROR, null=True),
    "wall_s": Num(0, MAX_WALL_S), "graph": Text(64, pattern="[0-9a-f]{64}", null=True)}
# A sandbox child's verdict (`nas.sandbox.verify.Verdict`); kept verdicts are read so too. An ok one
# it measured itself (self-reported: the model could not be exported) has every count.
CHILD_VERDICT = Record("report", _VERDICT_FIELDS, (_AGREE, Rule(
    "says ok and self-reported without its params, FLOPs, output shape and layers",
    lambda v: not (v["ok"] and v["self_reported"]) or all(v[k] is not None for k in _COUNTS))))
# The trusted worker's: an ok one measured the exported graph here, every count and its hash.
WORKER_VERDICT = Record("verdict", _VERDICT_FIELDS, (_AGREE, Rule(
    "says ok without its params, FLOPs, output shape, layers and graph hash, or self-reported",
    lambda v: not v["ok"] or (not v["self_reported"] and all(v[k] is not None for k in (*_COUNTS, "graph"))))))
# A child's report of a forbidden action (`nas.sandbox.limits.install_policy`).
POLICY = Record("policy report", {"error": Text(MAX_ERROR, prefix="policy: "),
                                  "traceback": Text(MAX_TRACEBACK, "keep", null=True)})
_SECONDS = Num(0, MAX_WALL_S)
_PERCENT = Num(0, 100, null=True)
# One seed's training (`nas.train.result.TrainResult`): accuracies measured when it finished, None
# (not 0) when it was terminated.
TRAINED = Record("training report", {
    "valid_accuracy": _PERCENT, "test_accuracy": _PERCENT,
    "loss_curve": Seq(Num(-MAX_FLOAT, MAX_FLOAT, nonfinite=True), MAX_EPOCHS), "epochs": Int(0, MAX_EPOCHS),
    "terminated": Text(500, "escape", null=True), "wall_seconds": _SECONDS, "device_seconds": _SECONDS,
    "params": Int(0, MAX_COUNT), "flops": Int(0, MAX_COUNT), "device": Text(32, "escape"),
    "world_size": Int(1, 1024), "cuda_graphs": Text(300, "escape"), "compile_seconds": _SECONDS,
    "eval_seconds": _SECONDS}, (Rule(
        "field(s) valid_accuracy, test_accuracy malformed",
        lambda v: all((v[k] is None) == (v["terminated"] is not None) for k in ("valid_accuracy", "test_accuracy"))),))
# One epoch's progress of a training in the worker (`nas.train.progress.EpochProgress`).
EPOCH = Record("epoch progress", {
    "label": Text(MAX_ERROR, "escape"), "epoch": Int(0, MAX_EPOCHS), "epochs": Int(0, MAX_EPOCHS),
    "loss": Num(-MAX_FLOAT, MAX_FLOAT, nonfinite=True), "elapsed": _SECONDS,
    "terminated": Text(MAX_ERROR, "escape", null=True)})

# The sandbox child's report pipe (`nas.sandbox.worker.Reporter`): the stage it enters, a policy
# report, a training report per seed, its verdict.
CHILD = Channel("sandbox report", (
    Record("stage", {"stage": Text(16, choices=STAGES)}), Record("verdict", {"verdict": CHILD_VERDICT}),
    Record("policy", {"policy": POLICY}), Record("trained", {"trained": TRAINED})))
# The trusted worker's stdout (`nas.sandbox.trusted_worker`): its resident memory once imported, the
# work it counted (a training's images and epochs too), a cap that refused an allocation; a
# training's epochs and proxy scores (or why there are none); then its result, the last message.
_READY = Record("ready", {"ready": Int(0, MAX_MEMORY)})
_LIMIT = Record("limit", {"limit": Text(8, choices=LIMITS)})
_WORKER_VERDICT = Record("verdict", {"verdict": WORKER_VERDICT})
CHECK_WORKER = Channel("check worker", (_READY, Record("work", {"work": Int(0, MAX_WORK)}), _LIMIT,
                                        _WORKER_VERDICT))
TRAINING_WORKER = Channel("training worker", (
    _READY, Record("work", {"work": Int(0, MAX_WORK), "images": Int(0, MAX_WORK), "epochs": Int(0, MAX_WORK)}),
    _LIMIT, Record("epoch", {"epoch": EPOCH}),
    Record("proxies", {"proxies": Names(Num(-MAX_FLOAT, MAX_FLOAT), MAX_PROXIES)}),
    Record("no_proxies", {"no_proxies": Text(MAX_ERROR, "escape")}), _WORKER_VERDICT,
    Record("error", {"error": Text(MAX_ERROR, "escape")}), Record("failed", {"failed": Text(MAX_ERROR, "escape")}),
    Record("trained", {"trained": Seq(TRAINED, MAX_SEEDS)})))


def exit_words(returncode: int | None) -> str:
    """How a process ended, for any return code: a signal's by name (Popen's negative codes),
    any other integer as its status, negative or huge alike."""
    if returncode is None:
        return "ended without an exit status"
    if returncode < 0 and -returncode in SIGNALS:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:  # a real-time signal: a number, no name
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"

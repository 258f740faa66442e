"""Lines a sandbox child or the trusted worker could send, as hypothesis strategies, for the protocol's
fuzz target (`support.fuzz.TARGETS["protocol"]`: tests/test_fuzz_boundary.py, benchmarks/fuzz.py).

Each example is one line for one channel (`nas.sandbox.protocol.CHILD`, `CHECK_WORKER`,
`TRAINING_WORKER`): a message of the channel built field by field from its declared types, values
drawn at and around their bounds and from hostile text (bidi overrides, zero-width and tag characters,
lone surrogates, private use, line breaks, escapes); then perhaps one field spoiled (a value past its
bound or of another type, NaN, a number past the float range, a key dropped or added, a message of
another channel), and perhaps the line's bytes (a key twice, a huge literal, bytes not UTF-8, cut
short, padded past `MAX_LINE`). The property (`run_line`): `Channel.parse` returns the message's
kind and fields, each within its declared type and bounds, its text terminal-safe and encodable,
checked again unchanged; or raises `ProtocolError` in one line (`support.fuzz.outcome` says so).
"""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from nas.sandbox.protocol import (
    CHECK_WORKER,
    CHILD,
    MAX_LINE,
    MAX_NAME,
    TRAINING_WORKER,
    Channel,
    Flag,
    Int,
    Names,
    Num,
    Record,
    Seq,
    Spec,
    Text,
)
from nas.terminal import UNSAFE, printable

CHANNELS = {channel.name: channel for channel in (CHILD, CHECK_WORKER, TRAINING_WORKER)}
HOSTILE = ["\u202e", "\u2066", "\u2069", "\u200b", "\u200d", "\ufeff", "\U000e0041", "\ud800", "\udfff", "\ue000",
           "\U0010fffd", "\u2028", "\u2029", "\n", "\r", "\x1b[2J", "\x85", "\x00", "\t", "é", "漢", "😀"]
_SEQ_MOST = 40  # longest list drawn (a list at its bound of 65,536 items is the table test's)


@dataclass(frozen=True)
class Line:
    """One example: the channel it is sent on, its bytes, and how it was made (its repr)."""

    channel: str
    data: bytes
    made: str

    def __repr__(self) -> str:
        text = repr(self.data[:200]) + ("..." if len(self.data) > 200 else "")
        return f"Line({self.channel!r}, {self.made}, {len(self.data):,} bytes: {text})"


def _texts(spec: Text) -> st.SearchStrategy[str]:
    if spec.choices:
        return st.sampled_from(spec.choices)
    if spec.pattern is not None:
        return st.sampled_from(["0" * 64, "f" * 64, "0123456789abcdef" * 4])
    room = max(0, spec.most - len(spec.prefix))
    body = st.one_of(st.text(max_size=min(room, 30)), st.just("x" * room),
                     st.lists(st.sampled_from(HOSTILE) | st.text(max_size=3), max_size=8).map("".join))
    return body.map(lambda b: (spec.prefix + b)[:spec.most])


_STRATEGIES: dict[int, st.SearchStrategy[Any]] = {}  # by the spec's id: a record's fields (a dict) hash no value


def values(spec: Spec) -> st.SearchStrategy[Any]:
    """Values of `spec`'s type, most often within its bounds, at them now and then (one strategy per spec:
    hypothesis validates each strategy object once)."""
    if id(spec) in _STRATEGIES:
        return _STRATEGIES[id(spec)]
    drawn: st.SearchStrategy[Any]
    if isinstance(spec, Int):
        drawn = st.sampled_from([spec.lo, spec.hi, spec.lo + 1, spec.hi - 1]) | st.integers(spec.lo, spec.hi)
    elif isinstance(spec, Num):
        edges = [spec.lo, spec.hi, 0.0 if spec.lo <= 0 <= spec.hi else spec.lo]
        edges += [math.nan, math.inf, -math.inf] if spec.nonfinite else []
        drawn = st.sampled_from(edges) | st.floats(spec.lo, spec.hi) | st.integers(0, 3)
    elif isinstance(spec, Flag):
        drawn = st.booleans()
    elif isinstance(spec, Text):
        drawn = _texts(spec)
    elif isinstance(spec, Seq):
        drawn = st.lists(values(spec.item), max_size=min(spec.most, _SEQ_MOST))
    elif isinstance(spec, Names):
        drawn = st.dictionaries(st.text(min_size=1, max_size=MAX_NAME), values(spec.value), max_size=4)
    else:
        drawn = st.fixed_dictionaries({k: values(inner) for k, inner in spec.fields.items()})
    if getattr(spec, "null", False):
        drawn = st.one_of(drawn, drawn, drawn, drawn, st.none())
    _STRATEGIES[id(spec)] = drawn
    return drawn


_SPOILED = st.sampled_from([None, True, False, -1, 0, 1 << 63, -(1 << 63) - 1, 10**30, 2**53 + 1, 1e300, -1e-9,
                            math.nan, math.inf, -math.inf, 0.5, "", "1", "x" * 9000, [], [1] * 9, {}, {"a": 1},
                            "done", "policy: x\nmodel.py: valid model", "\ud800", "\u202e"])


@st.composite
def spoiled(draw: Any, message: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """`message` with one of its values (perhaps a nested record's) set to another, a key gone or a key more."""
    target, path = message, []
    while isinstance(target, dict) and target and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(target)))
        if not isinstance(target[key], dict):
            break
        path.append(key)
        target = target[key]
    if not isinstance(target, dict) or not target:
        return message, "as is"
    key = draw(st.sampled_from(sorted(target)))
    how = draw(st.sampled_from(["value", "value", "value", "drop", "add", "list item"]))
    where = ".".join([*path, key])
    if how == "drop":
        del target[key]
    elif how == "add":
        target[draw(st.sampled_from(["extra", key.upper(), "ok", "ready", "verdict"]))] = draw(_SPOILED)
    elif how == "list item" and isinstance(target[key], list) and target[key]:
        target[key][draw(st.integers(0, len(target[key]) - 1))] = draw(_SPOILED)
    else:
        target[key] = draw(_SPOILED)
    return message, f"{how} {where}"


@st.composite
def lines(draw: Any) -> Line:
    channel = draw(st.sampled_from(sorted(CHANNELS)))
    sender = CHANNELS[channel] if draw(st.integers(0, 7)) else CHANNELS[draw(st.sampled_from(sorted(CHANNELS)))]
    record = draw(st.sampled_from(sender.messages))
    message = draw(values(record))
    for verdict in (message.get("verdict"),):  # most often a verdict its rules take: the accepting paths too
        if isinstance(verdict, dict) and draw(st.integers(0, 3)):
            verdict["ok"] = verdict["stage"] == "done"
            verdict["error"] = None if verdict["ok"] else verdict["error"] or "x"
            verdict["self_reported"] = verdict["self_reported"] and not verdict["ok"]
            verdict["graph"] = verdict["graph"] or ("0" * 64 if verdict["ok"] else None)
            for key, filled in (("params", 1), ("flops", 1), ("output_shape", [2, 10]), ("layers", 1)):
                verdict[key] = filled if verdict[key] is None else verdict[key]
    made = [f"{record.name} of {sender.name}"]
    if draw(st.integers(0, 2)):
        message, how = draw(spoiled(message))
        made.append(how)
    text = json.dumps(message, ensure_ascii=draw(st.integers(0, 3)) > 0)
    how = draw(st.sampled_from(["as is"] * 6 + ["key twice", "huge int", "past floats", "not utf-8", "cut", "pad",
                                                "surrogate bytes", "two", "deep"]))
    if how == "key twice" and text.startswith('{"'):
        text = text.replace("{", '{"' + text[2:].split('"', 1)[0] + '": 1, ', 1)
    elif how == "huge int":
        text = text.replace("1", "1" + "0" * draw(st.sampled_from([19, 20, 400, 5000])), 1)
    elif how == "past floats":
        text = text.replace("0.5", "1e400", 1).replace(": 1,", ": -1e999,", 1)
    elif how == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif how == "deep":
        n = draw(st.integers(1, 50_000))
        text = text.replace(":", ": " + "[" * n + "]" * n + ", \"d\":", 1)
    data = text.encode("utf-8", "surrogatepass")  # ensure_ascii=False keeps lone surrogates: not UTF-8 on the wire
    if how == "not utf-8":
        data = data.replace(b'"', b'"\xff', 1)
    elif how == "surrogate bytes":
        data = data.replace(b'"', b'"\xed\xa0\x80', 1)
    elif how == "pad":
        data = data[:-1] + b" " * (MAX_LINE - len(data) + draw(st.integers(0, 1))) + data[-1:]
    elif how == "two":
        data += b"\n" + data
    if how != "as is":
        made.append(how)
    return Line(channel, data, ", ".join(made))


# --- the property --------------------------------------------------------------------

def _holds(spec: Spec, checked: Any, where: str) -> None:
    """`checked` is of `spec`'s type and within its bounds, its text terminal-safe (AssertionError if not)."""
    def fail(why: str) -> None:
        raise AssertionError(f"{where}: {why}: {checked!r}"[:300])

    if checked is None:
        if not getattr(spec, "null", False):
            fail("None in a field that takes no null")
        return
    if isinstance(spec, Int):
        if type(checked) is not int or not spec.lo <= checked <= spec.hi:
            fail(f"not an integer in [{spec.lo}, {spec.hi}]")
    elif isinstance(spec, Num):
        if type(checked) is not float or (math.isfinite(checked) and not spec.lo <= checked <= spec.hi) or (
                not math.isfinite(checked) and not spec.nonfinite):
            fail(f"not a float in [{spec.lo}, {spec.hi}]{' or non-finite' if spec.nonfinite else ''}")
    elif isinstance(spec, Flag):
        if type(checked) is not bool:
            fail("not a bool")
    elif isinstance(spec, Text):
        if type(checked) is not str or len(checked) > spec.most:
            fail(f"not a string of at most {spec.most}")
        if printable(checked, lines=spec.breaks == "keep") != checked:
            fail("text not escaped")
        unsafe = [c for c in checked if c != "\n" and unicodedata.category(c) in UNSAFE]
        if unsafe or (spec.breaks != "keep" and "\n" in checked):
            fail(f"an unsafe character {unsafe[:1]!r} or a line break")
        checked.encode("utf-8")  # a lone surrogate would raise here, as it would on any terminal
    elif isinstance(spec, Seq):
        if type(checked) is not list or len(checked) > spec.most:
            fail(f"not a list of at most {spec.most}")
        for i, item in enumerate(checked):
            _holds(spec.item, item, f"{where}[{i}]")
    elif isinstance(spec, Names):
        if type(checked) is not dict or len(checked) > spec.most:
            fail("not an object of names")
        for name, item in checked.items():
            _holds(spec.value, item, f"{where}.{name[:20]}")
    else:
        if type(checked) is not dict or checked.keys() != spec.fields.keys():
            fail("not the record's keys")
        for key, inner in spec.fields.items():
            _holds(inner, checked[key], f"{where}.{key}")
        if not all(rule.holds(checked) for rule in spec.rules):
            fail("a rule does not hold")


def run_line(line: Line) -> tuple[str, dict[str, Any]]:
    """Parse `line` on its channel: the kind and checked fields, which must hold the schema's promises."""
    channel: Channel = CHANNELS[line.channel]
    kind, checked = channel.parse(line.data)
    record: Record = next(r for r in channel.messages if r.name == kind and r.fields.keys() == checked.keys())
    _holds(record, checked, kind)
    _, again = channel.read(checked)
    if json.dumps(again) != json.dumps(checked):  # NaN as text: equal when both are NaN
        raise AssertionError(f"{kind}: checking the checked message again changed it")
    return kind, checked

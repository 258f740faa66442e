"""Fuzzing the trusted side's boundary: every byte a sandbox child sends back (the artifact ZIP,
its graph JSON and safetensors headers, the report pipe's lines and JSON) and every line of the trusted
worker's (`nas.sandbox.protocol`'s channels, field by field) ends, whatever it holds, in a value or
exactly one refusal (`GraphError`; `ValueError` for a report, `ProtocolError` for a line) whose message is one line, within
a bounded time (hypothesis's `deadline`, and an alarm) and a bounded growth of peak resident memory
(`support.fuzz.check`). The generators (`support.fuzz`) mutate a few small honest artifacts
field by field. The long run is `benchmarks/fuzz.py`.

Profiles (`NASFLOW_FUZZ=<name>`): `ci`, the default, derandomized (the same examples every run,
~40 s on 2 cores); `dev`, the same size, random (`pytest --hypothesis-seed=N` replays a run);
`long`, 20 times the examples."""

from __future__ import annotations

import dataclasses
import io
import os
import struct
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings

from nas.sandbox import graph as graph_module
from nas.sandbox import protocol, verify
from nas.sandbox.graph import GRAPH_FILE, GraphError, unpack
from support import fuzz

_COMMON = dict(deadline=fuzz.SECONDS * 1000, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=1, derandomize=True, database=None, **_COMMON)
settings.register_profile("dev", max_examples=1, **_COMMON)
settings.register_profile("long", max_examples=20, **_COMMON)
PROFILE = settings.get_profile(os.environ.get("NASFLOW_FUZZ", "ci"))
ALL = ("init", "const", "seed0")  # the weight sets the honest artifacts hold
SCALE = PROFILE.max_examples  # examples per test below: a multiple of each test's own count


def fuzzed(examples: int) -> settings:
    return settings(PROFILE, max_examples=examples * SCALE)


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    fuzz.warm()


def _holds(target: str, example, known: bool = True) -> None:
    """The property; `known`: a break already reported (`fuzz.KNOWN`, each with an xfail test below) passes."""
    problem = fuzz.check(target, example)
    ok = problem is None or (known and fuzz.known(target, example, problem))
    assert ok, f"{fuzz.summary(target, example)}\n-> {problem}"


def test_the_honest_artifacts_pass_every_check() -> None:
    """The generators start from artifacts the trusted side accepts: a refusal found is the mutation's."""
    for base in fuzz.bases():
        assert fuzz.check("unpack", fuzz.ZipCase(base.name, base.data(), ALL, 1 << 30)) is None
        assert fuzz.check("graphnet", fuzz.GraphCase(base.name, [], base.artifact())) is None
    for report in fuzz.VALID_REPORTS:
        assert fuzz.check("verdict", report) is None
        line = fuzz.protocol_fuzz.Line("sandbox report", fuzz.json.dumps({"verdict": report}).encode(), "honest")
        assert fuzz.check("protocol", line) is None


@fuzzed(3000)
@given(fuzz.zip_cases())
def test_unpack_ends_in_an_artifact_or_one_line(case: fuzz.ZipCase) -> None:
    _holds("unpack", case)


@fuzzed(2000)
@given(fuzz.graph_cases())
def test_graphnet_and_its_dry_run_end_in_a_value_or_one_line(case: fuzz.GraphCase) -> None:
    _holds("graphnet", case)


@fuzzed(2000)
@given(fuzz.reports())
def test_a_childs_report_ends_in_a_verdict_or_one_line(report) -> None:
    _holds("verdict", report)


@fuzzed(500)
@given(fuzz.report_lines())
def test_a_report_line_ends_in_a_verdict_a_mark_or_one_line(line: bytes) -> None:
    _holds("report_line", line)


@fuzzed(1000)
@given(fuzz.protocol_fuzz.lines())
def test_a_line_of_any_channel_ends_in_fields_within_their_bounds_or_one_line(line) -> None:
    _holds("protocol", line)


# --- what the fuzzers found (one case each, kept as a test) -------------------------

def _graph_in(encoding: str, depth: int, base: fuzz.Base | None = None) -> bytes:
    base = base or fuzz.bases()[0]
    graph = base.graph_dict()
    graph["train"]["nodes"][0]["args"].append(['"', "DEEP", '"'])
    text = fuzz.json.dumps(graph).replace('"DEEP"', "[" * depth + "]" * depth)
    return fuzz.build([fuzz.Entry(GRAPH_FILE.encode(), text.encode(encoding)),
                       *(fuzz.Entry(n.encode(), b) for n, b in base.bodies)])


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-32"])
def test_nesting_is_bounded_in_every_encoding_json_accepts(encoding: str) -> None:
    with pytest.raises(GraphError, match="is not (UTF-8 )?JSON"):  # read as UTF-8: no nesting hides behind NULs
        unpack(_graph_in(encoding, 40), 1 << 30, ALL)
    _holds("unpack", fuzz.ZipCase(f"list 500 deep in {encoding}", _graph_in(encoding, 500), ALL, 1 << 30), False)


def test_a_reference_of_any_value_is_refused_in_one_line() -> None:
    base = fuzz.bases()[0]
    graph = base.graph_dict()
    graph["train"]["nodes"][0]["args"][0] = {"ref": "x\nmodel.py: valid model"}
    _holds("graphnet", fuzz.GraphCase(base.name, ["ref with a newline"], fuzz.Artifact(graph, base.artifact().weights)),
           False)


def test_an_unknown_tag_is_refused_in_one_line() -> None:
    base = fuzz.bases()[0]
    graph = base.graph_dict()
    graph["train"]["nodes"][0]["args"][0] = {"x\nmodel.py: valid model": 1}
    _holds("graphnet", fuzz.GraphCase(base.name, ["tag with a newline"], fuzz.Artifact(graph, base.artifact().weights)),
           False)


def test_a_graph_with_a_long_integer_is_a_graph_error() -> None:
    base = fuzz.bases()[0]
    text = base.graph.replace('"format": 1', '"format": 1, "n": ' + "9" * 5000)
    data = fuzz.build([fuzz.Entry(GRAPH_FILE.encode(), text.encode()),
                       *(fuzz.Entry(n.encode(), b) for n, b in base.bodies)])
    _holds("unpack", fuzz.ZipCase("5,000-digit int", data, ALL, 1 << 30), False)


def test_a_safetensors_error_is_one_line() -> None:
    base = fuzz.bases()[0]
    bodies = dict(base.bodies)
    size = int.from_bytes(bodies["init.safetensors"][:8], "little")
    header = fuzz.json.loads(bodies["init.safetensors"][8:8 + size])
    next(v for k, v in header.items() if k != "__metadata__")["dtype"] = "X\nmodel.py: valid model"
    text = fuzz.json.dumps(header).encode()
    bodies["init.safetensors"] = struct.pack("<Q", len(text)) + text + bodies["init.safetensors"][8 + size:]
    data = fuzz.build([fuzz.Entry(GRAPH_FILE.encode(), base.graph.encode()),
                       *(fuzz.Entry(n.encode(), b) for n, b in bodies.items())])
    _holds("unpack", fuzz.ZipCase("dtype with a newline", data, ALL, 1 << 30), False)


@pytest.mark.parametrize("line", [b'{"verdict": ' + b"9" * 5000 + b"}", b"[" * 100_000 + b"]" * 100_000],
                         ids=["long int", "deep"])
def test_a_report_line_of_any_json_is_taken_or_marked_malformed(line: bytes) -> None:
    _holds("report_line", line, False)


# --- the fuzzer notices a broken gate ---------------------------------------------

def test_the_fuzzer_finds_a_directory_check_taken_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `_entries`'s bounds gone (it returns the names `zipfile` lists), the generated ZIPs
    reach `zipfile` and `safetensors` unchecked and some example breaks the property."""
    def unchecked(data: bytes, expected: set[str], max_bytes: int) -> list[str]:
        return [n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if n in expected]

    monkeypatch.setattr(graph_module, "_entries", unchecked)
    found = []

    @settings(PROFILE, max_examples=300, deadline=None)
    @given(fuzz.zip_cases())
    def probe(case: fuzz.ZipCase) -> None:
        if (problem := fuzz.check("unpack", case)) is not None and not fuzz.known("unpack", case, problem):
            found.append(problem)

    probe()
    assert found, "no example broke the property with the directory checks gone"
    print(f"{len(found)} of 300 examples broke it, e.g. {sorted(set(found))[:3]}")


def _mutant_without_rule(monkeypatch: pytest.MonkeyPatch, says: str) -> None:
    """`Verdict.from_child`'s schema with its rule saying `says` taken away (a hand-made mutant of the gate)."""
    rules = tuple(r for r in protocol.CHILD_VERDICT.rules if says not in r.says)
    assert len(rules) == len(protocol.CHILD_VERDICT.rules) - 1
    monkeypatch.setattr(verify, "CHILD_VERDICT", dataclasses.replace(protocol.CHILD_VERDICT, rules=rules))


def _finds(target: str, examples: int = 300) -> list[str]:
    found = []

    @settings(PROFILE, max_examples=examples, deadline=None)
    @given(fuzz.TARGETS[target][0]())
    def probe(example) -> None:
        if (problem := fuzz.check(target, example)) is not None and not fuzz.known(target, example, problem):
            found.append(problem)

    probe()
    return found


def test_the_fuzzer_finds_a_report_gate_that_lets_ok_pass_at_any_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    _mutant_without_rule(monkeypatch, "ok, stage and error")
    assert any("says ok=True at stage" in p for p in _finds("verdict", 1000))


def test_the_fuzzer_finds_text_let_through_unescaped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol, "printable", lambda text, lines=False: text)
    assert any("text not escaped" in p or "unsafe character" in p for p in _finds("protocol"))


def test_the_fuzzer_finds_an_integer_bound_taken_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protocol.Int, "check", lambda self, value: value)
    assert any("not an integer in" in p or "None in a field" in p for p in _finds("protocol"))


def test_the_fuzzer_finds_the_json_nesting_bound_taken_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_module, "MAX_JSON_DEPTH", 10**6)
    assert any("nested" in p or "RecursionError" in p for p in _finds("unpack"))


def test_a_directory_listing_one_entry_65535_times_is_refused_quickly() -> None:
    """The structured builder reaches the flood the issue names: one entry's record repeated."""
    base = fuzz.bases()[0]
    one = fuzz.build([fuzz.Entry(GRAPH_FILE.encode(), base.graph.encode())])
    size, start = struct.unpack_from("<LL", one, len(one) - 10)
    flood = one[:start] + one[start:start + size] * 0xFFFF + struct.pack(
        "<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, size * 0xFFFF, start, 0)
    _holds("unpack", fuzz.ZipCase("flood", flood, ALL, 1 << 30), False)

"""The trusted side takes nothing on faith: the bytes a sandbox child sends back (the artifact's
ZIP, its JSON and safetensors headers) are parsed only within bounds, its strings are escaped
before anyone reads them, and the gates that decide (`allowed`, `Verdict.from_child`) are
checked case by case, so a weakened gate fails here. All in-process: no sandbox child."""

from __future__ import annotations

import copy
import io
import json
import pickle
import struct
import time
import zipfile
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from torch import nn

from nas.sandbox.aten_ops import ALLOWED, allowed
from nas.sandbox.graph import _DEVICE, GRAPH_FILE, GraphError, GraphNet, export_graph, pack, unpack
from nas.sandbox.limits import MB
from nas.sandbox.protocol import TRAINING_WORKER, ProtocolError
from nas.sandbox.trusted import exceeded, proxy_scores
from nas.sandbox.trusted_worker import gpu_fraction, limit_hit
from nas.sandbox.verify import STAGES, Verdict
from nas.terminal import printable

FAKE = "model.py: valid model (1 params, 1 FLOPs)"
ZIP_END = struct.Struct("<4s4H2LH")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def artifact(net: nn.Module | None = None, **extra: dict[str, torch.Tensor]) -> bytes:
    net = net or Small()
    graph = export_graph(net, torch.randn(2, 3, 8, 8))
    return pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants"), **extra})


def entries(data: bytes) -> list[tuple[str, bytes]]:
    zf = zipfile.ZipFile(io.BytesIO(data))
    return [(name, zf.read(name)) for name in zf.namelist()]


def zip_of(items: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, body in items:
            zf.writestr(name, body)
    return buf.getvalue()


def replaced(data: bytes, name: str, body: bytes, new_name: str | None = None) -> bytes:
    """`data` with entry `name` holding `body` (and named `new_name`): as many entries as asked for."""
    return zip_of([(new_name or n, body) if n == name else (n, b) for n, b in entries(data)])


def directory_flood(data: bytes, count: int, times: int = 1_000_000) -> bytes:
    """The graph entry's directory record `times` over (a few MB, stored), the end record saying `count`."""
    one = zip_of([e for e in entries(data) if e[0] == GRAPH_FILE])
    size, start = struct.unpack_from("<LL", one, len(one) - 10)
    return one[:start] + one[start:start + size] * times + ZIP_END.pack(
        b"PK\x05\x06", 0, 0, count, count, size * times, start, 0)


def safetensors_of(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header


def tensor_flood(count: int) -> bytes:
    return safetensors_of(b"{" + b",".join(b'"t%d":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}' % i
                                           for i in range(count)) + b"}")


def deep_graph(data: bytes, depth: int) -> bytes:
    graph = json.loads(dict(entries(data))[GRAPH_FILE])
    graph["train"]["nodes"][0]["args"][-1] = "DEEP"
    return replaced(data, GRAPH_FILE, json.dumps(graph).replace('"DEEP"', "[" * depth + "]" * depth).encode())


FORGERIES = {  # name -> (forge the honest artifact, the refusal)
    "directory lists one entry a million times": (lambda d: directory_flood(d, 0xFFFF), "lists 65,535 entries"),
    "end record undercounts the directory": (lambda d: directory_flood(d, 1), "more than its 1 entries"),
    "one entry more than asked for": (lambda d: zip_of([*entries(d), ("seed7.safetensors", b"")]),
                                      "lists 4 entries, over the 3 expected"),
    "graph.json twice": (lambda d: replaced(d, "const.safetensors", dict(entries(d))[GRAPH_FILE], GRAPH_FILE),
                         "lists 'graph.json' twice"),
    "a weight set not asked for": (lambda d: replaced(d, "const.safetensors", b"", "seed7.safetensors"),
                                   "unexpected files \\('seed7.safetensors'"),
    "a pickle": (lambda d: replaced(d, "const.safetensors", b"\x80\x04K\x01.", "weights.pkl"), "unexpected files"),
    "a second archive appended": (lambda d: d + d, "does not end at its end record"),
    "a comment after the end record": (lambda d: d[:-2] + b"\x04\x00PK!!", "no ZIP end record at its end"),
    "a million zero-size tensors": (lambda d: replaced(d, "init.safetensors", tensor_flood(1_000_000)),
                                    "init.safetensors header claims [0-9,]+ bytes, over the"),
    "a header length past the file": (lambda d: replaced(d, "init.safetensors", struct.pack("<Q", 1 << 62) + b"{}"),
                                      "over its file's size"),
    "more tensors than the graph has inputs": (lambda d: replaced(d, "init.safetensors", tensor_flood(40)),
                                               "holds 40 tensors, more than its graph's"),
    "a header nested deep": (lambda d: replaced(d, "init.safetensors", safetensors_of(b'{"a":' * 40 + b"1" + b"}" * 40)),
                             "header nests deeper than 32"),
    "a graph argument nested 100,000 deep": (lambda d: deep_graph(d, 100_000), "graph nests deeper than 32"),
    "a graph argument nested 40 deep": (lambda d: deep_graph(d, 40), "graph nests deeper than 32"),
}


@pytest.mark.parametrize("forge, error", FORGERIES.values(), ids=FORGERIES)
def test_forged_artifacts_are_refused_in_one_line_before_they_are_parsed(forge, error: str) -> None:
    """Each forgery ends in one `GraphError` line naming what is wrong and where, in a bounded time
    (`zipfile` alone took minutes and gigabytes over a directory of a million entries)."""
    data = forge(artifact())
    began = time.monotonic()
    with pytest.raises(GraphError, match=error) as refused:
        unpack(data, 1 << 30)
    assert time.monotonic() - began < 5 and "\n" not in str(refused.value)


def test_only_the_weight_sets_asked_for_are_read() -> None:
    """A set the request named is read, one it did not is refused, not loaded (a check trains no seed)."""
    net = Small()
    data = artifact(net, seed7=dict(net.state_dict()))
    with pytest.raises(GraphError, match="lists 4 entries, over the 3 expected"):
        unpack(data, 1 << 30)
    art = unpack(data, 1 << 30, ("init", "const", "seed7"))
    assert set(art.weights) == {"init", "const", "seed7"}
    assert set(unpack(artifact(net), 1 << 30, ("init", "const", "seed7")).weights) == {"init", "const"}


def test_graph_nesting_within_the_bound_is_parsed() -> None:
    """The nesting bound is a bound, not a ban: an honest graph and 30 levels pass `unpack`."""
    assert unpack(artifact(), 1 << 30).graph["format"] == 1
    assert unpack(deep_graph(artifact(), 30 - 8), 1 << 30).graph["train"]["nodes"]


class WithDevice(Small):
    """Names the input's device, as honest models do (`arange(..., device=x.device)`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + torch.arange(10, device=x.device)


def test_the_device_placeholder_survives_deepcopy_and_pickle() -> None:
    """The zero-cost proxies score a deep copy of the network: with a copied placeholder, a graph
    naming a device failed there (and lost its scores)."""
    assert copy.deepcopy(_DEVICE) is _DEVICE and copy.copy(_DEVICE) is _DEVICE
    assert pickle.loads(pickle.dumps(_DEVICE)) is _DEVICE
    net = GraphNet(unpack(artifact(WithDevice()), 1 << 30)).eval()
    x = torch.randn(3, 3, 8, 8)
    assert torch.equal(copy.deepcopy(net)(x), net(x))


def _written(op: str, overload: str) -> list[str]:
    """The arguments `aten.<op>.<overload>`'s schema marks as written (a mutable alias)."""
    schema = getattr(getattr(torch.ops.aten, op), overload)._schema
    return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _overloads() -> list[tuple[str, str]]:
    """Every overload of every listed operator and of its in-place form."""
    found = []
    for op in sorted(ALLOWED | {f"{op}_" for op in ALLOWED}):
        packet = getattr(torch.ops.aten, op, None)
        found += [(op, overload) for overload in (packet.overloads() if packet is not None else [])]
    return found


def test_operators_that_write_into_their_arguments_are_refused_by_schema() -> None:
    """Over every overload of the allowed operators: allowed exactly when its schema writes into
    no argument but an in-place form's `self`; whatever the name, every overload with a
    written argument such as `out`, `values`, `max` is refused (names like `dim_max`,
    `values_stable` and `OutTensor` slipped past a check on names)."""
    overloads = _overloads()
    wrong = [f"aten.{op}.{o}" for op, o in overloads
             if allowed(op, o) != (_written(op, o) in ([], ["self"] if op.endswith("_") else []))]
    assert not wrong, f"allowed() disagrees with the schema on {wrong}"
    writing = [(op, o) for op, o in overloads if not op.endswith("_") and _written(op, o)]
    assert len(writing) > 100 and not any(allowed(op, o) for op, o in writing)
    for name in ("max.dim_max", "min.dim_min", "sort.values", "sort.values_stable", "topk.values",
                 "xlogy.OutTensor", "xlogy.OutScalar_Self", "xlogy.OutScalar_Other", "add.out", "add_.Tensor"):
        op, overload = name.split(".")
        assert allowed(op, overload) == (name == "add_.Tensor"), name
    assert allowed("add", "Tensor") and allowed("sort", "default") and not allowed("as_strided", "default")
    assert not allowed("add", "no_such_overload") and not allowed("add", "__call__")


GOOD = Verdict(ok=True, stage="done", params=1, flops=2, output_shape=[2, 10]).to_dict()


@pytest.mark.parametrize("stage", [s for s in STAGES if s != "done"])
def test_a_child_verdict_is_ok_only_when_done(stage: str) -> None:
    """ok=True at any other stage (a check cut short) is a malformed report, however complete it looks."""
    with pytest.raises(ValueError, match="disagree"):
        Verdict.from_child({**GOOD, "stage": stage})
    with pytest.raises(ValueError, match="disagree"):
        Verdict.from_child({**GOOD, "ok": False, "stage": stage, "error": None})
    assert not Verdict.from_child({**GOOD, "ok": False, "stage": stage, "error": f"{stage}: x"}).ok


@pytest.mark.parametrize("field", ["error", "export_error"])
def test_a_child_verdict_with_a_line_break_in_a_single_line_field_is_refused(field: str) -> None:
    for text in (f"forward: boom\n{FAKE}", f"forward: boom\r{FAKE}"):
        with pytest.raises(ValueError, match=f"field\\(s\\) {field} malformed"):
            Verdict.from_child({**GOOD, "ok": False, "stage": "forward", "error": "forward: x", field: text})


BEYOND = {  # field -> values no honest child reports: non-finite or negative seconds, unbounded counts
    "wall_s": [float("nan"), float("inf"), -float("inf"), -0.5, 1e300],
    "params": [2**53 + 1, 2**63, 10**40, -1], "flops": [2**64, 10**300, -1],
    "layers": [2**31], "changed_layers": [2**31], "output_shape": [[2, 2**40], [1] * 9],
    "graph": ["0" * 63, "Z" * 64, "0" * 64 + "\n"],
}


@pytest.mark.parametrize("field, value", [(f, v) for f, vs in BEYOND.items() for v in vs],
                         ids=[f"{f}={v!r}"[:40] for f, vs in BEYOND.items() for v in vs])
def test_a_child_verdict_with_a_number_out_of_bounds_is_refused_in_one_line(field: str, value: object) -> None:
    """A gate that took any number would keep NaN seconds (every comparison false) or a count past
    2**53 (not exact as a float, past int64 in a store): each is one line naming the field."""
    with pytest.raises(ValueError, match=f"^report field\\(s\\) {field} malformed$"):
        Verdict.from_child({**GOOD, field: value})
    assert Verdict.from_child({**GOOD, "wall_s": 0, "params": 2**53, "graph": "0" * 64}).params == 2**53


NAMES = ("synflow", "snip")
SCORES = {"synflow": 57.6, "snip": -1e30}
FORGED_SCORES = {  # what the training worker could send for the proxies NAMES: none of it is kept
    "a name not asked for": {"proxies": {**SCORES, "naswot": 1.0}},
    "a name missing": {"proxies": {"synflow": 57.6}},
    "NaN": {"proxies": {**SCORES, "snip": float("nan")}},
    "infinity": {"proxies": {**SCORES, "snip": float("inf")}},
    "an integer past any float": {"proxies": {**SCORES, "snip": 10**400}},
    "a bool": {"proxies": {**SCORES, "snip": True}},
    "a string": {"proxies": {**SCORES, "snip": "1.0"}},
    "a list of scores": {"proxies": [57.6, 1.0]},
    "scores and a reason": {"proxies": SCORES, "no_proxies": "RuntimeError: x"},
    "a reason that is not a string": {"no_proxies": ["RuntimeError: x"]},
    "a reason of a megabyte": {"no_proxies": "x" * (1 << 20)},
}


@pytest.mark.parametrize("msg", list(FORGED_SCORES.values()), ids=list(FORGED_SCORES))
def test_proxy_scores_are_the_names_asked_for_as_finite_floats_or_nothing(msg: dict) -> None:
    """The worker's proxy message reaches a trial's metrics: only exactly the proxies asked for, each
    a finite float, or one bounded line saying why there are none; anything else refuses the worker
    (`proxy_scores` None: a malformed message), as does any proxy message when none was asked for."""
    def heard(message: dict, names: tuple[str, ...]) -> object:
        """The scores `_talk` passes on: the protocol's reading of the message, then `proxy_scores`."""
        try:
            return proxy_scores(TRAINING_WORKER.read(message)[1], names)
        except ProtocolError:
            return None

    assert heard(json.loads(json.dumps(msg)), NAMES) is None
    assert heard({"proxies": SCORES}, NAMES) == SCORES
    assert heard({"proxies": SCORES}, ()) is None and heard({"no_proxies": "x"}, ()) is None


def test_why_a_graph_has_no_proxy_scores_is_one_escaped_line() -> None:
    why = proxy_scores(TRAINING_WORKER.read({"no_proxies": f"RuntimeError: boom\x1b[2K\r\n{FAKE}"})[1], NAMES)
    assert why == f"RuntimeError: boom\\x1b[2K\\x0d\\x0a{FAKE}"


def test_the_gpu_memory_budget_and_the_line_an_out_of_memory_gives() -> None:
    """A training on a GPU may hold `memory_mb` of the device (the CUDA caching allocator's share),
    all of it at most; torch's OutOfMemoryError there, a MemoryError or torch's RuntimeError from
    the host's cap each name their limit in the refusal; any other error is not a limit."""
    assert gpu_fraction(1024, 140 * 1024 * MB) == 1 / 140
    assert gpu_fraction(8192, 8192 * MB) == gpu_fraction(1 << 20, 8192 * MB) == 1.0
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity "
                                 "of 139.80 GiB of which 130.12 GiB is free.")
    assert limit_hit(oom) == "gpu"
    assert limit_hit(MemoryError()) == limit_hit(RuntimeError(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes.")) == "memory"
    assert limit_hit(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x8 and 16x10)")) is None
    assert exceeded("gpu", 1024) == "exceeded its GPU memory limit (1024 MB)"
    assert exceeded("memory", 256) == "exceeded its memory limit (256 MB)"
    for other in ("disk", ["gpu"]):  # any other kind: the protocol's refusal, before any words
        with pytest.raises(ProtocolError, match="^limit field\\(s\\) limit malformed$"):
            TRAINING_WORKER.read({"limit": other})


def test_a_childs_graph_hash_is_never_kept() -> None:
    """Only the trusted side hashes a graph: a hash in a child's verdict is dropped (it could name
    the checked graph while the child trains another)."""
    from nas.sandbox.limits import Limits
    from nas.sandbox.verify import ChildRun, conclude

    said = conclude(ChildRun(verdict={**GOOD, "graph": "a" * 64}), Limits())
    assert said.ok and said.graph is None


def test_text_from_a_child_is_escaped_before_anyone_reads_it() -> None:
    """Escapes (CSI, OSC 52 clipboard writes, C1 CSI) and line separators in a child's strings
    arrive as `\\xNN` text; a traceback keeps its lines."""
    error = f"forward: \x1b]52;c;b3duZWQ=\x07\x1b[2K\x1b[1G{FAKE}\x9b2J\x7f\u2028"
    verdict = Verdict.from_child({**GOOD, "ok": False, "stage": "forward", "error": error,
                                  "traceback": "File x\n\x1b[31mValueError\x1b[0m"})
    assert verdict.error == (f"forward: \\x1b]52;c;b3duZWQ=\\x07\\x1b[2K\\x1b[1G{FAKE}\\x9b2J\\x7f\\u2028")
    assert verdict.traceback == "File x\n\\x1b[31mValueError\\x1b[0m"
    assert printable("tab\there\nnext") == "tab\\x09here\\x0anext"
    assert printable("a\tb\nc", lines=True) == "a\\x09b\nc" and printable("plain: ü ∑ 漢") == "plain: ü ∑ 漢"


def test_a_policy_report_or_a_crash_carries_no_second_line_or_escape() -> None:
    """A forged policy report with a line break is malformed (a crash), and a crashed child's
    output tail, shown as its traceback, arrives escaped."""
    from nas.sandbox.limits import Limits
    from nas.sandbox.verify import ChildRun, conclude

    forged = conclude(ChildRun(policy={"error": f"policy: denied\n{FAKE}", "traceback": None}), Limits())
    assert (forged.stage, forged.error) == ("crash", "crash: malformed policy report from the sandbox")
    crashed = conclude(ChildRun(returncode=1, output=b"Fatal\n\x1b]0;title\x07\x1b[2J"), Limits())
    assert crashed.stage == "crash" and crashed.traceback == "Fatal\n\\x1b]0;title\\x07\\x1b[2J"


def test_validate_prints_one_plain_line_whatever_the_verdict_holds(monkeypatch, capsys, tmp_path: Path) -> None:
    """The CLI's line is escaped as a whole: a verdict's text set after it was made (as a training
    run sets `export_error`) cannot print a second line or an escape."""
    from nas.cli import arch

    verdict = Verdict(ok=False, stage="forward", error="forward: x")
    verdict.error = f"forward: boom\x1b[2K\r\n{FAKE}"
    monkeypatch.setattr(arch, "_verify", lambda *args: verdict)
    assert arch._validate_one(tmp_path / "m.py", "", None, Namespace()) == 1
    out = capsys.readouterr().out
    assert out == f"{tmp_path / 'm.py'}: forward: boom\\x1b[2K\\x0d\\x0a{FAKE}\n"


def test_log_lines_are_escaped_for_every_handler(caplog) -> None:
    """A model's or an LLM's text in a log record (console, search.log, Prefect) keeps its lines
    but not its escapes: the record factory `nas` installs escapes the message and traceback."""
    import logging

    from nas.secrets import install_log_scrubbing

    install_log_scrubbing()
    log = logging.getLogger("nas.test_trusted_side")
    with caplog.at_level(logging.INFO, logger=log.name):
        log.warning("collm: generator failed: %s", f"boom\x1b[2K\r{FAKE}\nsecond line")
        try:
            raise ValueError("\x1b]0;title\x07")
        except ValueError:
            log.exception("crashed")
    assert caplog.records[0].getMessage() == f"collm: generator failed: boom\\x1b[2K\\x0d{FAKE}\nsecond line"
    assert "ValueError: \\x1b]0;title\\x07" in caplog.records[1].exc_text and "\x1b" not in caplog.text

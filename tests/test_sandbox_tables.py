"""Case tables of the trusted side's arithmetic, called in this process: the work each aten operator
counts (nas/sandbox/aten_ops.py), the operators a graph may call, the tensors a split returns, the
messages and bit counts of the graph loader (nas/sandbox/graph.py) and the disk a child's work folder
holds (nas/sandbox/verify.py). Each number is exact, so a slip in a formula's constant, comparison
or operator changes one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from nas.sandbox import trusted
from nas.sandbox.aten_ops import MAX_PIECES, WorkCounter, allowed, pieces, zero_filled
from nas.sandbox.limits import MB
from nas.sandbox.verify import seed_labels

aten = torch.ops.aten


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


# name -> (input shapes, the call on those meta tensors, (macs, traffic, other, slow, fvcore_bound))
COSTS = {
    # products: macs by torch's formula, halved; traffic the larger of the elements read and written
    "conv2d": ([(1, 3, 8, 8), (4, 3, 3, 3), (4,)], lambda x, w, b: F.conv2d(x, w, b, padding=1),
               (256 * 27, 192 + 108 + 4, 0, 0, 256 * 27)),
    # a transposed convolution: its 162 output elements' traffic 32 times (31 of them slow)
    "conv_transpose2d": ([(1, 4, 4, 4), (4, 2, 3, 3)], lambda x, w: F.conv_transpose2d(x, w, stride=2),
                         (64 * 2 * 9, 162, 0, 31 * 162, 64 * 2 * 9)),
    # F.bilinear as aten._trilinear: x1 (2, 3), x2 (2, 4), weight (5, 3, 4) broadcast to one 2 x 5 x 3 x 4
    # product; traffic the 6 + 8 + 60 elements read; other its views and sum
    "bilinear product": ([(2, 3), (2, 4), (5, 3, 4)], F.bilinear, (2 * 5 * 3 * 4, 6 + 8 + 60, 24, 0, 120)),
    "mm": ([(4, 8), (8, 5)], lambda a, b: a @ b, (4 * 8 * 5, 32 + 40, 0, 0, 160)),
    "dot": ([(8,), (8,)], torch.dot, (8, 16, 0, 0, 8)),
    "addbmm": ([(3, 5), (2, 3, 4), (2, 4, 5)], torch.addbmm, (2 * 3 * 4 * 5, 15 + 24 + 40, 0, 0, 120)),
    # attention as its math kernel's two batched products, q k^T (8 x 8 x 6 x 16) and w v (8 x 8 x 6 x 32),
    # plus the scaling, softmax and views between them
    "scaled_dot_product_attention": ([(2, 4, 8, 16), (2, 4, 6, 16), (2, 4, 6, 32)], F.scaled_dot_product_attention,
                                     (64 * 6 * (16 + 32), 1792 + 2048, 12800, 0, 64 * 6 * 48)),
    # a pool: kernel area x output (7 x 7 x 9), slow as its weight says (4 with indices, 2 average)
    "max_pool2d": ([(1, 1, 9, 9)], lambda x: F.max_pool2d(x, 3, stride=1), (0, 0, 441, 3 * 441, 0)),
    "avg_pool2d": ([(1, 1, 9, 9)], lambda x: F.avg_pool2d(x, 3, stride=1), (0, 0, 441, 441, 0)),
    # in one dimension: a 1 x 3 kernel in two (and the views there and back, 9 + 7)
    "avg_pool1d": ([(1, 1, 9)], lambda x: F.avg_pool1d(x, 3, stride=1), (0, 0, 7 * 3 + 9 + 7, 7 * 3, 0)),
    # adaptive 10 -> 3: windows of ceil(10 / 3) = 4, one more as they overlap: 5 x 5 x 9 outputs
    "adaptive_avg_pool2d": ([(1, 1, 10, 10)], lambda x: F.adaptive_avg_pool2d(x, 3), (0, 0, 225, 225, 4 * 100)),
    "adaptive_max_pool2d": ([(1, 1, 10, 10)], lambda x: F.adaptive_max_pool2d(x, 3), (0, 0, 225, 7 * 225, 0)),
    # 10x10 -> 1x3: windows of 10 rows (one output) by 5 columns
    "adaptive_avg_pool2d to 1 x 3": ([(1, 1, 10, 10)], lambda x: F.adaptive_avg_pool2d(x, (1, 3)),
                                     (0, 0, 10 * 5 * 3, 10 * 5 * 3, 4 * 100)),
    # 9x9 -> 1x3: windows of 9 rows (one output, no overlap) by 3 columns, as many as its elements
    "adaptive_avg_pool2d 9 to 1 x 3": ([(1, 1, 9, 9)], lambda x: F.adaptive_avg_pool2d(x, (1, 3)), (0, 0, 81, 81, 4 * 81)),
    "adaptive_avg_pool2d exact": ([(1, 1, 9, 9)], lambda x: F.adaptive_avg_pool2d(x, 3), (0, 0, 81, 81, 4 * 81)),
    # an interpolation: its 64 outputs x its mode's taps (bilinear 4, not linear's 2; bicubic 16; nearest 1)
    "bicubic": ([(1, 1, 4, 4)], lambda x: F.interpolate(x, size=(8, 8), mode="bicubic"), (0, 0, 1024, 1024, 0)),
    "nearest": ([(1, 1, 4, 4)], lambda x: F.interpolate(x, size=(8, 8), mode="nearest"), (0, 0, 64, 3 * 64, 4 * 64)),
    "linear": ([(1, 1, 4)], lambda x: F.interpolate(x, size=8, mode="linear"), (0, 0, 16, 0, 0)),
    # antialiased 16x16 -> 4x4: 4 taps x the downscaling of 256 to 16 inputs an output
    "bilinear antialiased": ([(1, 1, 16, 16)],
                             lambda x: F.interpolate(x, size=(4, 4), mode="bilinear", antialias=True),
                             (0, 0, 16 * 4 * 16, 0, 0)),
    # upscaled antialiased: the mode's taps (no factor under 1); to one output: all 256 inputs' factor
    "bilinear antialiased up": ([(1, 1, 4, 4)], lambda x: F.interpolate(x, size=(8, 8), mode="bilinear", antialias=True),
                                (0, 0, 64 * 4, 0, 0)),
    "bilinear antialiased to 1 x 1": ([(1, 1, 16, 16)],
                                      lambda x: F.interpolate(x, size=(1, 1), mode="bilinear", antialias=True),
                                      (0, 0, 1 * 4 * 256, 0, 0)),
    # a sort: n log2 n along its dimension for each of the 32 values, 16 times slow
    "sort": ([(2, 16)], torch.sort, (0, 0, 32 * 4, 15 * 128, 0)),
    "sort along dim 0": ([(2, 16)], lambda x: torch.sort(x, dim=0), (0, 0, 64, 15 * 64, 0)),
    "topk": ([(2, 16)], lambda x: torch.topk(x, 3), (0, 0, 128, 15 * 128, 0)),
    "topk of 2": ([(8, 2)], lambda x: torch.topk(x, 1), (0, 0, 16, 15 * 16, 0)),  # log2 2 = 1, not under it
    "sort of nothing": ([(0, 16)], torch.sort, (0, 0, 4, 15 * 4, 0)),  # at least one slice's n log2 n
    "argsort of 1": ([(1,)], torch.argsort, (0, 0, 2, 15 * 2, 0)),  # a sort: n log2 n of at least 1
    # elementwise: the larger of the elements read (40) and written (32), weighted
    "add": ([(4, 8), (8,)], torch.add, (0, 0, 40, 0, 0)),
    "tanh": ([(4, 8)], torch.tanh, (0, 0, 32, 3 * 32, 0)),
    "asinh": ([(4, 8)], torch.asinh, (0, 0, 32, 63 * 32, 0)),
    "bernoulli_ (in place)": ([(4, 8)], lambda x: x.bernoulli_(0.5), (0, 0, 32, 31 * 32, 0)),
    # normalisations: fvcore counts 5 per element read or written (x, statistics and their outputs)
    "batch_norm": ([(2, 3, 4, 4), (3,), (3,)], lambda x, m, v: F.batch_norm(x, m, v, training=True),
                   (0, 0, 102, 3 * 102, 5 * 102)),
    "layer_norm": ([(2, 3, 4, 4)], lambda x: F.layer_norm(x, [4]), (0, 0, 144, 0, 5 * 144)),
    "expand": ([(1, 8)], lambda x: x.expand(1000, 8), (0, 0, 8000, 0, 0)),
}


@pytest.mark.parametrize("name", COSTS)
def test_each_operator_counts_its_exact_work(name: str) -> None:
    """What `WorkCounter` counts for one call on meta tensors, in each of its five totals: products'
    multiply-accumulates and traffic, other work by its formula (pools, interpolations, sorts), the
    slow operators' extra and fvcore's bound."""
    shapes, call, expected = COSTS[name]
    inputs = [_meta(*shape) for shape in shapes]
    with WorkCounter() as work:
        call(*inputs)
    assert (work.macs, work.traffic, work.other, work.slow, work.fvcore_bound) == expected
    assert work.total == sum(expected[:4])


@pytest.mark.parametrize("name", ["bicubic", "linear", "scaled_dot_product_attention"])
def test_the_count_is_the_same_under_the_python_dispatcher(name: str) -> None:
    """A process that traced a graph may be left under the Python dispatcher, where interpolations
    run their Python decompositions: the counter leaves it for its own run, and enters it again after."""
    from torch._dispatch.python import enable_python_dispatcher

    shapes, call, expected = COSTS[name]
    inputs = [_meta(*shape) for shape in shapes]
    with enable_python_dispatcher():
        with WorkCounter() as work:
            call(*inputs)
        assert "PythonDispatcher" in str(torch._C._dispatch_tls_local_include_set())
    assert (work.macs, work.traffic, work.other, work.slow, work.fvcore_bound) == expected


def test_a_factory_without_a_device_runs_on_meta_and_one_naming_another_device_is_refused() -> None:
    """A factory the graph calls without a device makes a meta tensor (counted by its elements); one
    naming the CPU, or an operator given a CPU tensor, is refused before it runs."""
    cpu, a, b = torch.zeros(3), _meta(3), _meta(3)
    with WorkCounter() as work:
        assert aten.zeros.default([5, 7]).device.type == "meta"
        assert work.other == 35
        with pytest.raises(ValueError, match=r"^aten\.zeros\.default names a device other than its input's \(cpu\)$"):
            aten.zeros.default([5, 7], device="cpu")
        with pytest.raises(ValueError, match=r"^aten\.add\.Tensor names a device other than its input's \(None\)$"):
            aten.add.Tensor(cpu, a)
        assert aten.add.Tensor(a, b).device.type == "meta"
    assert work.other == 35 + 6  # the add reads 3 + 3 elements


@pytest.mark.parametrize("op, overload, expected", [
    ("add", "Tensor", True), ("add_", "Tensor", True), ("relu_", "default", True), ("max", "dim", True),
    ("add", "out", False), ("max", "dim_max", False), ("sort", "values", False),  # write into an argument
    ("sort", "int", False), ("mul_", "t", False),  # into `self` without the in-place name, into another one with it
    ("as_strided", "default", False), ("_reshape_alias", "default", False),  # not listed
    ("as_strided_", "default", False), ("cauchy_", "default", False),  # in place, but of an operator not listed
    ("add", "no_such_overload", False), ("mul__", "Tensor", False), ("relux", "default", False),
])
def test_an_operator_is_allowed_by_its_name_and_its_schema(op: str, overload: str, expected: bool) -> None:
    """Listed operators, and the in-place form `op_` of one, are allowed in any overload that writes into
    no argument but an in-place form's `self`; an overload that does not exist, or a name not listed, is not."""
    assert allowed(op, overload) is expected


def test_only_the_empty_family_runs_zero_filled() -> None:
    """`empty` returns zeros, named as the operator it wraps; any other operator is itself."""
    empty = zero_filled(aten.empty.memory_format)
    assert empty.__name__ == "empty.memory_format (zero-filled)"
    assert torch.equal(empty([2, 3]), torch.zeros(2, 3))
    assert zero_filled(aten.add.Tensor) is aten.add.Tensor
    assert zero_filled(aten.zeros.default) is aten.zeros.default


X = torch.zeros(5, 4)


@pytest.mark.parametrize("func, args, kwargs, expected", [
    (aten.chunk.default, (X, 3), {}, 3), (aten.chunk.default, (X, 0), {}, 1),
    (aten.split.Tensor, (X, 2), {}, 3), (aten.split.Tensor, (X, 5), {}, 1), (aten.split.Tensor, (X, 1, 1), {}, 4),
    (aten.split.Tensor, (X, 0), {}, 1), (aten.split.Tensor, (X, -2), {}, 1),
    (aten.split_with_sizes.default, (X, [2, 3]), {}, 2),
    (aten.tensor_split.indices, (X, [1, 3]), {}, 3), (aten.tensor_split.sections, (X, 4), {}, 4),
    (aten.tensor_split.sections, (X, 0), {}, 1),
    (aten.tensor_split.tensor_indices_or_sections, (X, torch.tensor([1, 2])), {}, 3),
    (aten.tensor_split.tensor_indices_or_sections, (X, torch.tensor(3)), {}, MAX_PIECES + 1),
    (aten.unbind.int, (X,), {"dim": 1}, 4), (aten.add.Tensor, (X, X), {}, 1), (aten.unbind.int, (3,), {}, 1),
], ids=lambda v: getattr(v, "__name__", None) if callable(v) else None)
def test_a_split_returns_at_most_the_pieces_its_arguments_say(func, args, kwargs, expected) -> None:
    """`pieces` counts a split's outputs before it runs: `chunk`'s chunks, a `split_size`'s
    ceiling of the length over it, a list's entries (indices: one more), a tensor of indices one
    more than its entries and a scalar tensor's unknown sections more than MAX_PIECES; any other
    operator, or a split of no tensor, one."""
    assert pieces(func, args, kwargs) == expected


def test_a_processs_resident_memory_is_read_in_bytes_and_none_once_it_is_gone() -> None:
    """What the trusted worker's memory limit is held to (`_rss`, VmRSS of /proc/<pid>/status)."""
    held = bytearray(64 << 20)  # touched: resident
    rss = trusted._rss(os.getpid())
    with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as fh:
        resident = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert rss is not None and len(held) < rss and abs(rss - resident) < 16 << 20
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert trusted._rss(gone.pid) is None


class _Usage:
    ru_utime, ru_stime = 1.25, 0.5


@pytest.mark.parametrize("seconds, threads, expected", [(2.0, 3, 8), (2.0, 1, 4), (0.25, 4, 3), (0.0, 2, 2)])
def test_the_worker_s_cpu_limit_is_what_it_used_plus_its_seconds_on_every_thread_rounded_up(
        monkeypatch, seconds, threads, expected) -> None:
    """`_cpu_limit`: RLIMIT_CPU soft at ceil(user + system + seconds x threads), hard one more."""
    from nas.sandbox import trusted_worker as w

    limits: list[tuple[int, tuple[int, int]]] = []
    monkeypatch.setattr(w.resource, "getrusage", lambda who: _Usage())
    monkeypatch.setattr(w.resource, "setrlimit", lambda which, pair: limits.append((which, pair)))
    w._cpu_limit(seconds, threads)
    assert limits == [(w.resource.RLIMIT_CPU, (expected, expected + 1))]


@pytest.mark.parametrize("hard, soft", [(-1, 8), (100, 8), (8, 8), (7, 7)])
def test_a_worker_phase_s_clock_is_an_alarm_and_a_cpu_soft_limit_under_the_hard_one(monkeypatch, hard, soft) -> None:
    """`_phase`: a named phase sets its clock (the alarm at `seconds`, RLIMIT_CPU's soft limit at
    ceil(used + seconds x threads), no higher than a finite hard limit) and both signals end it;
    None stops the clock: no alarm, the soft limit back at the hard one, the signals at their default."""
    import signal as sig

    from nas.sandbox import trusted_worker as w

    hard = w.resource.RLIM_INFINITY if hard == -1 else hard
    calls: list[tuple[str, object, object]] = []
    monkeypatch.setattr(w.resource, "getrusage", lambda who: _Usage())
    monkeypatch.setattr(w.resource, "getrlimit", lambda which: (0, hard))
    monkeypatch.setattr(w.resource, "setrlimit", lambda which, pair: calls.append(("rlimit", which, pair)))
    monkeypatch.setattr(w.signal, "setitimer", lambda which, s: calls.append(("timer", which, s)))
    monkeypatch.setattr(w.signal, "signal", lambda s, handler: calls.append(("signal", s, handler)))
    monkeypatch.setattr(w, "_CLOCK", {"what": None, "seconds": 0.0})
    w._phase("its dry run", 2.0, 3)
    assert calls == [("signal", sig.SIGALRM, w._out_of_time), ("signal", sig.SIGXCPU, w._out_of_time),
                     ("rlimit", w.resource.RLIMIT_CPU, (soft, hard)), ("timer", sig.ITIMER_REAL, 2.0)]
    assert w._CLOCK == {"what": "its dry run", "seconds": 2.0}
    calls.clear()
    w._phase(None, 0.0, 3)
    assert calls == [("signal", sig.SIGALRM, sig.SIG_IGN), ("signal", sig.SIGXCPU, sig.SIG_IGN),
                     ("timer", sig.ITIMER_REAL, 0), ("rlimit", w.resource.RLIMIT_CPU, (hard, hard)),
                     ("signal", sig.SIGALRM, sig.SIG_DFL), ("signal", sig.SIGXCPU, sig.SIG_DFL)]
    with pytest.raises(w._OutOfTime):
        w._out_of_time(sig.SIGALRM, None)
    assert not issubclass(w._OutOfTime, Exception)


def test_the_worker_caps_its_data_segment_above_what_it_holds_and_reports_its_resident_memory(monkeypatch) -> None:
    """`_limit`: RLIMIT_DATA at VmData plus the budget (0 where unread), no core files, then "ready"
    with VmRSS (0 where unread)."""
    from nas.sandbox import trusted_worker as w

    limits: list[tuple[int, tuple[int, int]]] = []
    sent: list[dict] = []
    monkeypatch.setattr(w.resource, "setrlimit", lambda which, pair: limits.append((which, pair)))
    monkeypatch.setattr(w, "_send", sent.append)
    monkeypatch.setattr(w, "_status", lambda pid, key: {"VmData": 3000, "VmRSS": 2000}[key])
    w._limit(2)
    assert limits == [(w.resource.RLIMIT_DATA, (3000 + 2 * w.MB,) * 2), (w.resource.RLIMIT_CORE, (0, 0))]
    assert sent == [{"ready": 2000}]
    limits.clear()
    sent.clear()
    monkeypatch.setattr(w, "_status", lambda pid, key: None)
    w._limit(1)
    assert limits == [(w.resource.RLIMIT_DATA, (w.MB, w.MB)), (w.resource.RLIMIT_CORE, (0, 0))]
    assert sent == [{"ready": 0}]


@pytest.mark.parametrize("memory_mb, device_mb, expected", [(1, 4, 0.25), (4, 4, 1.0), (8, 4, 1.0), (3, 4, 0.75)])
def test_a_training_s_gpu_share_is_its_budget_over_the_device_s_memory_at_most_all(memory_mb, device_mb, expected) -> None:
    from nas.sandbox import trusted_worker as w

    assert w.gpu_fraction(memory_mb, device_mb * w.MB) == expected


def test_a_worker_phase_past_its_clock_is_a_limits_failure_naming_the_phase_and_its_seconds(monkeypatch) -> None:
    from nas.sandbox import trusted_worker as w

    monkeypatch.setattr(w, "_CLOCK", {"what": "its dry run (12 nodes)", "seconds": 30.4})
    late = w._late("check")
    assert (late["ok"], late["stage"]) == (False, "limits")
    assert late["error"] == ("limits: refused: the parent's check of the graph exceeded its clock for "
                             "its dry run (12 nodes) (30 s)")


@pytest.mark.parametrize("past, timed_out", [(-0.5, False), (0.0, True), (0.5, True)])
def test_collect_stops_waiting_for_the_child_s_exit_at_its_deadline(monkeypatch, past, timed_out) -> None:
    """`_collect`, its pipes closed and the child not yet exited: at or past the deadline the run is
    timed out; before it, it waits (sleeping) until the child has exited."""
    import types

    from nas.sandbox import verify

    deadline, exits = 1000.0, []

    def exited(pid: int) -> bool:
        exits.append(pid)
        return len(exits) > 1

    clock = types.SimpleNamespace(monotonic=lambda: deadline + past if exits else deadline - 1, sleep=lambda s: None)
    monkeypatch.setattr(verify, "time", clock)
    monkeypatch.setattr(verify, "_exited", exited)
    report, report_w = os.pipe()
    out, out_w = os.pipe()
    os.close(report_w)
    os.close(out_w)
    with os.fdopen(out, "rb") as stdout:
        run = verify._collect(types.SimpleNamespace(pid=4321, stdout=stdout), report, None, deadline)
    os.close(report)
    assert run.timed_out is timed_out and exits == ([4321] if timed_out else [4321, 4321])


def test_the_protocol_s_specs_are_immutable_so_no_reader_can_loosen_a_shared_one() -> None:
    """Every field type, rule, record and channel of `nas.sandbox.protocol` is a frozen dataclass:
    a spec shared by several messages (`_SECONDS`, `_VERDICT_FIELDS`' types) cannot be widened."""
    import dataclasses

    from nas.sandbox import protocol as p

    specs = [p.Int(0, 1), p.Num(0, 1), p.Flag(), p.Text(1), p.Seq(p.Flag(), 1), p.Names(p.Flag(), 1),
             p.Rule("holds", bool), p.Record("r", {}), p.Channel("c", ())]
    for spec in specs:
        name = dataclasses.fields(spec)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(spec, name, None)
    assert len({p.Int(0, 1), p.Int(0, 1), p.Num(0, 1), p.Flag(), p.Text(1), p.Seq(p.Flag(), 1)}) == 5


class _ScriptedWorker:
    """A trusted worker's process as `_talk` sees it: its stdout holds `lines` then ends; it exits with `rc`."""

    def __init__(self, lines: list[dict], rc: int) -> None:
        import io
        import json

        read, write = os.pipe()
        os.write(write, b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        os.close(write)
        self.stdout, self.stdin, self.pid, self.rc, self.killed = os.fdopen(read, "rb"), io.BytesIO(), 4321, rc, 0

    def kill(self) -> None:
        self.killed += 1

    def wait(self) -> int:
        return self.rc


_VERDICT = {"ok": False, "stage": "measure", "error": "measure: it failed", "traceback": None, "params": None,
            "flops": None, "output_shape": None, "changed": None, "changed_layers": None, "layers": None,
            "self_reported": False, "export_error": None, "wall_s": 1.0, "graph": None}
_MALFORMED = "the parent's check of the graph sent a malformed message "


@pytest.mark.parametrize("lines, rc, rss, expected", [
    ([], 0, 0, ("the parent's check of the graph ended without a verdict (exit status 0)", "crash")),
    ([], -15, 0, ("the parent's check of the graph ended without a verdict (exit status -15)", "crash")),
    ([], -24, 0, ("refused: the parent's check of the graph exceeded its CPU-time limit (the counted work's)", "limits")),
    ([], -9, 0, ("refused: the parent's check of the graph exceeded its CPU-time limit (the counted work's)", "limits")),
    ([{"work": 1}], 0, 0, (_MALFORMED + "(a first message other than its resident memory (work))", "crash")),
    ([{"ready": 5}, {"ready": 5}], 0, 0, (_MALFORMED + "(its resident memory a second time)", "crash")),
    ([{"ready": 5}, {"work": 1}, {"work": 1}], 0, 0, (_MALFORMED + "(a second set of work counts)", "crash")),
    ([{"ready": 5}, {"limit": "gpu"}], 0, 0, ("refused: the parent's check of the graph exceeded its GPU memory limit "
                                             "(2 MB)", "limits")),
    ([{"ready": 5}, {"limit": "memory"}], 0, 0, ("refused: the parent's check of the graph exceeded its memory limit "
                                                "(2 MB)", "limits")),
    ([{"ready": 5}, {"work": 1}, {"verdict": _VERDICT}], 0, 0, _VERDICT),
    ([{"ready": 5}], 0, 5 + 2 * MB, ("the parent's check of the graph ended without a verdict (exit status 0)", "crash")),
    ([{"ready": 5}], 0, 6 + 2 * MB, ("refused: the parent's check of the graph exceeded its memory limit (2 MB)",
                                     "limits")),
])
def test_the_parent_reads_a_check_worker_s_messages_in_their_turn_and_holds_it_to_its_limits(
        monkeypatch, lines, rc, rss, expected) -> None:
    """`TrustedWorker._talk` on a scripted worker: its resident memory first and once, its work once,
    a cap's refusal, its verdict; a memory over `memory_mb` above its base refused, at it not; an
    exit without a verdict a crash, or the CPU-time limit by SIGXCPU or SIGKILL."""
    worker = object.__new__(trusted.TrustedWorker)
    worker.memory_mb, worker.job, worker.proc = 2, "check", _ScriptedWorker(lines, rc)
    monkeypatch.setattr(trusted, "_rss", lambda pid: rss)
    got = worker.check(b"graph", {"input_shape": [2, 3, 8, 8]})
    assert got == (expected if isinstance(expected, dict) else trusted.Refusal(*expected))
    assert worker.proc.killed == (not isinstance(expected, dict))


@pytest.mark.parametrize("late, refused", [(0.0, True), (1.0, True), (-1.0, False)])
def test_the_parent_refuses_a_worker_at_its_start_up_clock_and_not_before(monkeypatch, late, refused) -> None:
    calls: list[int] = []

    def clock() -> float:
        calls.append(1)
        return 0.0 if len(calls) == 1 else trusted.STARTUP_SECONDS + late

    worker = object.__new__(trusted.TrustedWorker)
    worker.memory_mb, worker.job, worker.proc = 2, "check", _ScriptedWorker([], 0)
    monkeypatch.setattr(trusted.time, "monotonic", clock)
    got = worker.check(b"graph", {"input_shape": [2, 3, 8, 8]})
    assert isinstance(got, trusted.Refusal)
    assert (got.line == "refused: the parent's check of the graph exceeded its wall clock (its start and dry run)"
            ) is refused


@pytest.mark.parametrize("msg, names, expected", [
    ({"proxies": {"a": 1.0, "b": 2.0}}, ("b", "a"), {"b": 2.0, "a": 1.0}),
    ({"proxies": {"a": 1.0}}, ("a", "b"), None),
    ({"proxies": {"a": 1.0, "b": 2.0}}, ("a",), None),
    ({"proxies": {"a": 1.0}}, (), None),
    ({"no_proxies": "it cannot run"}, ("a",), "it cannot run"),
    ({"no_proxies": "it cannot run"}, (), None),
])
def test_proxy_scores_are_exactly_the_names_asked_for_in_their_order(msg, names, expected) -> None:
    got = trusted.proxy_scores(msg, names)
    assert got == expected and (not isinstance(got, dict) or list(got) == list(names))


def test_the_worker_s_clocks_are_its_base_plus_its_counted_work_s_cost() -> None:
    assert trusted.check_seconds(0, 4) == trusted.BASE_SECONDS
    assert trusted.check_seconds(10 ** 8, 3) == pytest.approx(30.0 + 10 ** 8 * 10 * 2e-8)
    assert trusted.train_seconds(0, 0, 0) == trusted.BASE_SECONDS
    assert trusted.train_seconds(10 ** 6, 1000, 2) == pytest.approx(30.0 + 2 * 30.0 + 1000 * (1e-4 + 3 * 10 ** 6 * 2e-8))


def _run_bpf(program: bytes, arch: int, nr: int) -> int:
    """What a classic-BPF seccomp program returns for a system call `nr` of the ABI `arch`
    (the instructions `seccomp_filter` uses: load, jump if equal / at least, return)."""
    import struct

    data = {0: nr, 4: arch}
    code = [struct.unpack("HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x06:
            return k
        if op == 0x20:
            acc, pc = data[k], pc + 1
        else:
            pc += 1 + (jt if (acc == k if op == 0x15 else acc >= k) else jf)


def test_the_seccomp_filter_refuses_each_denied_call_allows_the_rest_and_kills_other_abis() -> None:
    from nas.sandbox import isolation as iso

    program = iso.seccomp_filter()
    if program is None:
        pytest.skip("seccomp filter is x86_64 only")
    allow, kill, eperm = 0x7FFF0000, 0x80000000, 0x00050000 | 1
    assert all(_run_bpf(program, 0xC000003E, nr) == eperm for nr in iso._DENIED_SYSCALLS)
    assert [_run_bpf(program, 0xC000003E, nr) for nr in (0, 1, 59, 102, 300, 451)] == [allow] * 6
    assert _run_bpf(program, 0xC000003E, 0x40000000) == eperm  # the x32 ABI's numbers, from its bit
    assert _run_bpf(program, 0xC000003E, 0x40000000 - 1) == allow
    assert _run_bpf(program, 0x40000003, 0) == kill  # i386


def test_the_isolated_command_sizes_tmp_sets_exactly_env_and_starts_in_the_writable_folder(monkeypatch) -> None:
    from nas.sandbox import isolation as iso

    monkeypatch.setattr(iso.glob, "glob", lambda pattern: [])
    args = iso.Isolation("bwrap").command(["python", "x"], {"A": "1"}, writable="/w", tmp_mb=3, seccomp=7)
    assert args[0] == "bwrap" and args[-3:] == ["--", "python", "x"]
    pairs = list(zip(args, args[1:]))
    assert ("--size", str(3 << 20)) in pairs and ("--uid", "65534") in pairs and ("--seccomp", "7") in pairs
    assert ("--chdir", "/w") in pairs and ("--bind", "/w") in pairs and ("--setenv", "A") in pairs
    assert "/sys" not in args
    bare = iso.Isolation("bwrap").command(["p"], {}, gpu=True)
    assert list(zip(bare, bare[1:])).count(("--chdir", "/tmp")) == 1 and "--seccomp" not in bare
    assert "--setenv" not in bare and ("--ro-bind-try", "/sys") in list(zip(bare, bare[1:]))
    assert iso.Isolation(None).command(["p"], {"A": "1"}) == ["p"] and not iso.Isolation(None).isolated


@pytest.mark.parametrize("num_classes, input_shape, refused", [
    (1, (2, 3), None), (10, (2, 3, 8, 8), None), (0, (2, 3), "num_classes"), (1, (1, 3), "input_shape"),
    (1, (2,), "input_shape"), (1, (3, 1), None),
])
def test_a_check_s_arguments_need_a_batch_of_two_and_a_class(num_classes, input_shape, refused) -> None:
    from nas.sandbox import verify

    if refused is None:
        verify._check_args("model.py", num_classes, input_shape)
    else:
        with pytest.raises(ValueError, match=f"^{refused}"):
            verify._check_args("model.py", num_classes, input_shape)


@pytest.mark.parametrize("graph, data, expected", [(3, 1, True), (3, 3, False), (1, 1, False), (1, 3, False)])
def test_only_a_colour_graph_takes_grey_data_as_colour(graph, data, expected) -> None:
    from nas.sandbox import verify

    assert verify._grey_as_rgb(graph, data) is expected


@pytest.mark.parametrize("extra, refused", [(0, False), (1, True)])
def test_a_source_up_to_one_mb_is_parsed_and_one_byte_more_refused(extra, refused) -> None:
    from nas.sandbox import verify

    verdict = verify.check_syntax("#" * ((1 << 20) + extra), "model.py")
    assert (verdict is not None) is refused
    if verdict is not None:
        assert (verdict.stage, verdict.error) == ("syntax", "syntax: source is over 1 MB")


def _collected(monkeypatch, report: bytes, artifact: bytes = b"", output: bytes = b""):
    """`_collect` on pipes holding what a child wrote, then closed; the child exited."""
    import types

    from nas.sandbox import verify

    monkeypatch.setattr(verify, "_exited", lambda pid: True)
    fds = []
    for data in (report, artifact, output):
        read, write = os.pipe()
        os.write(write, data)
        os.close(write)
        fds.append(read)
    with os.fdopen(fds[2], "rb") as stdout:
        run = verify._collect(types.SimpleNamespace(pid=4321, stdout=stdout), fds[0], fds[1],
                              verify.time.monotonic() + 60)
    os.close(fds[0])
    os.close(fds[1])
    return run


@pytest.mark.parametrize("line, malformed", [(b'{"stage":"import"}\n', False), (b'{"stage": "import"}\n', True)])
def test_collect_reads_a_report_up_to_its_cap_and_calls_one_byte_more_malformed(monkeypatch, line, malformed) -> None:
    from nas.sandbox import verify

    monkeypatch.setattr(verify, "_MAX_REPORT", 19)  # the first line's bytes
    run = _collected(monkeypatch, line)
    assert (run.malformed, run.stage) == (malformed, "startup" if malformed else "import")
    monkeypatch.setattr(verify, "_MAX_REPORT", 1 << 20)
    run = _collected(monkeypatch, b'{"stage": "forward"}\n{"stage": "export"}\n')
    assert (run.stage, run.malformed) == ("export", False)
    run = _collected(monkeypatch, b'{"stage": "forward"}')
    assert (run.stage, run.malformed, run.problem) == ("startup", True, "a last line without its newline")


@pytest.mark.parametrize("size, malformed", [(8, False), (9, True)])
def test_collect_keeps_an_artifact_up_to_its_cap_and_the_output_s_last_bytes(monkeypatch, size, malformed) -> None:
    from nas.sandbox import verify

    monkeypatch.setattr(verify, "_MAX_ARTIFACT", 8)
    monkeypatch.setattr(verify, "_OUTPUT_TAIL", 4)
    run = _collected(monkeypatch, b"", b"x" * size, b"abcdef")
    assert run.malformed is malformed and run.artifact == (b"" if malformed else b"x" * size)
    assert run.output == b"cdef" and not run.timed_out


def test_a_child_s_training_reports_are_taken_up_to_one_per_seed_it_may_have() -> None:
    import json

    from nas.sandbox import verify
    from nas.sandbox.protocol import MAX_SEEDS

    trained = {"valid_accuracy": 50.0, "test_accuracy": 40.0, "loss_curve": [1.0], "epochs": 1, "terminated": None,
               "wall_seconds": 1.0, "device_seconds": 1.0, "params": 10, "flops": 10, "device": "cpu",
               "world_size": 1, "cuda_graphs": "off", "compile_seconds": 0.0, "eval_seconds": 0.0}
    run = verify.ChildRun()
    for _ in range(MAX_SEEDS):
        verify._take(run, json.dumps({"trained": trained}).encode())
    assert len(run.trained) == MAX_SEEDS == 16 and not run.malformed
    verify._take(run, json.dumps({"trained": trained}).encode())
    assert len(run.trained) == 16 and run.malformed and run.problem == "a trained message once too often"


@pytest.mark.parametrize("rc, stage, says", [
    (-24, "limits", "limits: CPU time "), (-25, "limits", "limits: file size limit "),
    (-9, "limits", "limits: killed by SIGKILL during forward (CPU or memory)"), (-15, "crash", "crash: sandbox killed by SIGTERM"),
    (0, "crash", "crash: sandbox exited with status 0 during forward without a verdict"),
])
def test_a_child_s_exit_without_a_verdict_names_the_limit_its_signal_says(rc, stage, says) -> None:
    from nas.sandbox import verify

    verdict = verify.conclude(verify.ChildRun(returncode=rc, stage="forward"), verify.Limits())
    assert verdict.stage == stage and verdict.error.startswith(says)


def _worker_recorders(monkeypatch):
    from nas.sandbox import trusted_worker as w

    calls: list[tuple] = []
    monkeypatch.setattr(w, "_phase", lambda what, s, threads: calls.append(("phase", what, s, threads)))
    monkeypatch.setattr(w, "_cpu_limit", lambda s, threads: calls.append(("cpu", s, threads)))
    monkeypatch.setattr(w, "_send", lambda msg: calls.append(("send", msg)))
    monkeypatch.setattr(w, "_CLOCK", {"what": "its dry run", "seconds": 9.0})
    return w, calls


@pytest.mark.parametrize("raised", [None, MemoryError, "late"])
def test_the_worker_s_check_stops_each_phase_s_clock_sets_the_work_s_and_sends_one_verdict_or_limit(
        monkeypatch, raised) -> None:
    w, calls = _worker_recorders(monkeypatch)

    def measure(artifact, on_work, on_phase, **request):
        on_phase("its dry run", 9.0)
        on_work(100)
        if raised is not None:
            raise w._OutOfTime if raised == "late" else raised
        return {"ok": True, "request": request}

    monkeypatch.setattr(w, "measure", measure)
    w._check({"input_shape": [4, 3, 8, 8]}, b"graph", 2)
    start = [("phase", "its dry run", 9.0, 2), ("phase", None, 0.0, 2),
             ("cpu", trusted.check_seconds(100, 4), 2), ("send", {"work": 100}), ("phase", None, 0.0, 2)]
    last = {None: {"verdict": {"ok": True, "request": {"input_shape": [4, 3, 8, 8]}}},
            MemoryError: {"limit": "memory"}, "late": {"verdict": w._late("check")}}[raised]
    assert calls == [*start, ("send", last)]


@pytest.mark.parametrize("raised", [None, MemoryError, "late", ValueError])
def test_the_worker_s_training_relays_its_work_epochs_and_proxies_then_sends_its_result_or_limit(
        monkeypatch, raised) -> None:
    from nas.train.progress import EpochProgress

    w, calls = _worker_recorders(monkeypatch)
    progress = EpochProgress("m", 1, 2, 0.5, 3.0)

    def train_artifact(artifact, images, on_work, on_epoch, on_proxies, on_phase, **request):
        on_phase("its dry run", 9.0)
        on_work(10, 20, 3)
        on_proxies({"naswot": 1.5})
        on_proxies("it cannot run")
        on_epoch(progress)
        if raised is not None:
            raise w._OutOfTime if raised == "late" else raised("no")
        return {"trained": [images]}

    monkeypatch.setattr(w, "train_artifact", train_artifact)
    if raised is ValueError:
        with pytest.raises(ValueError, match="^no$"):
            w._train({}, b"graph", "images", 3)
        return
    w._train({}, b"graph", "images", 3)
    start = [("phase", "its dry run", 9.0, 3), ("phase", None, 0.0, 3), ("cpu", trusted.train_seconds(10, 20, 3), 3),
             ("send", {"work": 10, "images": 20, "epochs": 3}), ("send", {"proxies": {"naswot": 1.5}}),
             ("send", {"no_proxies": "it cannot run"}),
             ("send", {"epoch": {"label": "m", "epoch": 1, "epochs": 2, "loss": 0.5, "elapsed": 3.0, "terminated": None}})]
    end = {None: [("phase", None, 0.0, 3), ("send", {"trained": ["images"]})],
           MemoryError: [("send", {"limit": "memory"})],
           "late": [("phase", None, 0.0, 3), ("send", {"verdict": w._late("training")})]}[raised]
    assert calls == [*start, *end]


@pytest.mark.parametrize("label, seeds, labels", [
    ("net.py", [0], ["net.py"]), ("net.py", [7], ["net.py"]),
    ("net.py", [0, 1], ["net.py seed 0", "net.py seed 1"]), ("a", [3, 1, 2], ["a seed 3", "a seed 1", "a seed 2"]),
])
def test_each_seed_s_training_is_named_by_the_label_and_its_seed_only_when_there_are_several(label, seeds, labels):
    assert seed_labels(label, seeds) == labels

"""Checks of nas/sandbox that a mutation run (benchmarks/mutation.py, benchmarks/results/mutation_sandbox.json)
found untested: each fails on a realistic slip in the trusted side that the other sandbox tests let through."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import ROOT
from nas.sandbox.aten_ops import WorkCounter
from nas.sandbox.graph import MAX_WORK, GraphError, GraphNet, export_graph, pack, unpack
from nas.sandbox.limits import Limits, _user_tasks
from nas.sandbox.trusted import worker_env
from nas.sandbox.verify import measure
from test_sandbox_fast import in_forward


class Small(nn.Module):
    """A conv and a linear layer; `table` is a frozen buffer of `carried` values the model's code chose."""

    def __init__(self, width: int = 8, carried: int = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.fc = nn.Linear(width, 10)
        self.register_buffer("table", torch.zeros(carried, dtype=torch.uint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3))) + self.table.sum()


def artifact(net: nn.Module, shape: tuple[int, ...] = (2, 3, 8, 8)) -> bytes:
    graph = export_graph(net, torch.randn(shape))
    return pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")})


def check(data: bytes, input_shape: list[int]) -> dict:
    """The trusted side's check of a graph (what the trusted worker runs), here in-process."""
    return measure(data, num_classes=10, input_shape=input_shape, memory_mb=1024, with_parent=False, batch=256,
                   seeds=[], on_work=lambda units: None)


class Mixing(nn.Module):
    """An outer product over the whole flattened batch: work grows with the batch squared."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x.flatten()
        return self.fc(x.mean((2, 3))) + (f[:, None] * f[None, :]).mean()


def test_the_work_limit_scales_with_the_training_batch_and_says_so() -> None:
    """The work limit is per forward at the verification batch of 2, 128 times that at the training
    batch of 256: 64 channels at 64x64 (~8e6 operations an image, ~2e9 at batch 256) pass; work
    growing with the batch squared passes at 2 and is refused at 256, naming the limit it exceeded."""
    linear = GraphNet(unpack(artifact(Small(width=64), (2, 3, 64, 64)), 1 << 30))
    shape, work = linear.dry_run(2, 1 << 40, 256)
    assert shape == [2, 10] and work.total > 1e9
    mixing = GraphNet(unpack(artifact(Mixing(), (2, 3, 64, 64)), 1 << 30))
    assert mixing.dry_run(2, 1 << 60)[0] == [2, 10]
    with pytest.raises(GraphError) as refused:
        mixing.dry_run(2, 1 << 60, 256)
    said = re.fullmatch(r"train graph needs ([\d.e+]+) operations for one forward pass of 256 images, "
                        r"over the limit of ([\d.e+]+)", str(refused.value))
    assert said is not None, refused.value
    need, limit = map(float, said.groups())
    assert limit == MAX_WORK * 128 < need


@pytest.mark.parametrize("field, value", [("extra", b"\xfe\xca\x00\x00"), ("comment", b"model.py: valid model")],
                         ids=["extra field", "comment"])
def test_a_zip_entry_laid_out_otherwise_than_pack_writes_it_is_refused(field: str, value: bytes) -> None:
    """`pack` writes no extra fields and no comments; an entry with either (which `zipfile` would read
    without a word, an extra field being where ZIP64 sizes hide) is refused before `zipfile` sees it."""
    honest = artifact(Small())
    source, out = zipfile.ZipFile(io.BytesIO(honest)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for info in source.infolist():
            forged = zipfile.ZipInfo(info.filename, info.date_time)
            setattr(forged, field, value)
            zf.writestr(forged, source.read(info.filename))
    with pytest.raises(GraphError, match=r"^artifact's ZIP directory entry 0 \('graph.json'\) is malformed$"):
        unpack(out.getvalue(), 1 << 30)
    assert unpack(honest, 1 << 30).graph["format"] == 1


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


@pytest.mark.parametrize("call", [lambda: torch.mv(_meta(64, 1024), _meta(1024)),
                                  lambda: torch.addmv(_meta(64), _meta(64, 1024), _meta(1024))], ids=["mv", "addmv"])
def test_a_matrix_vector_product_counts_every_element_of_its_matrix(call) -> None:
    """torch has no FLOP formula for mv and addmv: counted here as the matrix's 64 x 1024 multiply-accumulates
    (the matrix is mv's first operand, addmv's second), never the vector's length, which would let a
    graph hide its products from the work limit."""
    with WorkCounter() as work:
        call()
    assert work.macs == 64 * 1024


class Paired(nn.Module):
    """Size arithmetic on the dynamic batch: the export computes `batch * 2` with `operator.mul`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.size(0)
        return self.fc(x.mean((2, 3)).repeat(2, 1).view(b * 2, 3).view(b, 6))


def test_size_arithmetic_within_int64_runs() -> None:
    """Python operators on sizes are bounded to int64 (`_bounded`), not refused: a graph that
    multiplies its batch runs here as it did in the model, at any batch."""
    net = Paired()
    graph = GraphNet(unpack(artifact(net), 1 << 30))
    assert "operator.mul" in [op for op, _ in graph.programs["train"].ops]
    assert graph.dry_run(2, 1 << 30, 256)[0] == [2, 10]
    x = torch.randn(5, 3, 8, 8)
    assert torch.allclose(graph(x), net(x))


class Scaled(nn.Module):
    """Multiplies its output by the integer literal `k`."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.fc = nn.Linear(3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean((2, 3))) * self.k


def test_an_integer_literal_counts_its_bits_not_one() -> None:
    """`mul(x, 2**41)` spells 40 bits more than `mul(x, 2)` (`int_bits`: 43 against 3), in the train
    and the eval graph: a count of one per literal would let an int64 word carry 8 bytes."""
    from nas.sandbox.graph import int_bits

    small, word = (GraphNet(unpack(artifact(Scaled(k)), 1 << 30)).carried() for k in (2, 1 << 41))
    assert int_bits(1 << 41) - int_bits(2) == 40
    for mode in ("train", "eval"):
        assert word[f"the {mode} graph"] - small[f"the {mode} graph"] == 40


def test_a_colour_model_is_checked_for_grey_data() -> None:
    """An RGB model on a grey dataset (digits, Fashion-MNIST) is trained on the images made RGB, so its
    graph's three input channels pass a check for one-channel data."""
    verdict = check(artifact(Small()), [2, 1, 8, 8])
    assert (verdict["ok"], verdict["stage"]) == (True, "done"), verdict["error"]


@pytest.mark.parametrize("channels", [2, 4])
def test_a_colour_model_is_refused_for_data_of_other_channels(channels: int) -> None:
    """Only grey data is made RGB for training (`ImageData.rgb`): a graph taking three channels is
    refused at the check for 2- or 4-channel data, in one line, not at its training."""
    verdict = check(artifact(Small()), [2, channels, 8, 8])
    assert (verdict["ok"], verdict["stage"]) == (False, "graph")
    assert verdict["error"] == f"graph: graph takes input [3, 8, 8], not [{channels}, 8, 8]"


def test_carried_bits_are_refused_only_past_the_bound() -> None:
    """A graph carrying MAX_BITS bits (here a uint8 buffer, 8 bits an element, beside what the
    graphs spell) passes; one byte more is refused in one line that says how many."""
    from nas.sandbox.graph import MAX_BITS

    def bits(n: int) -> int:
        return sum(GraphNet(unpack(artifact(Small(carried=n)), 1 << 30)).carried().values())

    base = bits(1) - 8
    n = (MAX_BITS - base) // 8
    while bits(n) > MAX_BITS:  # its shape's bits grow with n's
        n -= 1
    assert bits(n) <= MAX_BITS < bits(n + 1)
    at = check(artifact(Small(carried=n)), [2, 3, 8, 8])
    assert at["ok"], at["error"]
    over = check(artifact(Small(carried=n + 1)), [2, 3, 8, 8])
    assert (over["ok"], over["stage"]) == (False, "graph")
    assert f"carries {bits(n + 1):,} bits" in over["error"] and "\n" not in over["error"]


POLICY_PROBE = """
import os, sys
from nas.sandbox.limits import install_policy

class Denied(Exception):
    pass

def deny(error, traceback):
    raise Denied(error)

work = sys.argv[1]
install_policy(work, {}, deny)
%s
for call in calls:
    try:
        call()
        print("allowed")
    except Denied as err:
        print(err)
"""


def policy_probe(calls: str) -> str:
    """A child that installs the audit policy on the work folder (its argv[1]) and prints, for each
    call in the `calls` that `calls` (Python lines) defines, the policy's refusal or "allowed"."""
    return POLICY_PROBE % textwrap.dedent(calls)


POLICY = policy_probe("""
    outside = sys.argv[2]
    calls = (lambda: os.rename(outside, os.path.join(work, "taken")),
             lambda: os.rename(os.path.join(work, "mine"), outside + ".moved"),
             lambda: os.chmod(outside, 0o777), lambda: os.chown(outside, 0, 0))
""")


def test_the_policy_keeps_files_outside_the_work_folder_where_they_are(tmp_path: Path) -> None:
    """The audit policy refuses a rename from outside the work folder into it (taking a file), from
    it to outside (planting one), and a chmod or chown of a file outside, each in one line."""
    work, outside = tmp_path / "work", tmp_path / "outside.txt"
    work.mkdir()
    (work / "mine").write_text("x")
    outside.write_text("keep")
    out = subprocess.run([sys.executable, "-c", POLICY, str(work), str(outside)], capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()
    assert len(out) == 4 and all(line.startswith("policy: writing outside the sandbox directory is not allowed (os.")
                                 for line in out), out
    assert outside.read_text() == "keep" and sorted(p.name for p in work.iterdir()) == ["mine"]


RENAME_AT = policy_probe("""
    there = os.open(sys.argv[2], os.O_RDONLY | os.O_DIRECTORY)
    calls = (lambda: os.rename("mine", "planted", dst_dir_fd=there),
             lambda: os.rename("taken", "mine2", src_dir_fd=there))
""")


def test_the_policy_refuses_a_rename_relative_to_a_folder_outside_by_either_descriptor(tmp_path: Path) -> None:
    """A rename whose relative names hide where it goes (`os.rename(..., src_dir_fd=, dst_dir_fd=)`, the
    audit event's third and fourth arguments) is refused when either names a folder outside: the file
    in the work folder is not planted outside, nor one outside taken in."""
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "mine").write_text("x")
    (outside / "taken").write_text("keep")
    out = subprocess.run([sys.executable, "-c", RENAME_AT, str(work), str(outside)], capture_output=True,
                         text=True, timeout=120, check=True, cwd=work).stdout.splitlines()
    assert out == ["policy: writing outside the sandbox directory is not allowed (os.rename 'mine')",
                   "policy: writing outside the sandbox directory is not allowed (os.rename 'taken')"], out
    assert sorted(p.name for p in work.iterdir()) == ["mine"] and sorted(p.name for p in outside.iterdir()) == ["taken"]

NOBODY_ELSE = 54321  # a uid no other process on the machine runs as
THREADED = textwrap.dedent(f"""
    import os, threading, time
    os.setgid({NOBODY_ELSE})
    os.setuid({NOBODY_ELSE})
    for _ in range(3):
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
    print("ready", flush=True)
    time.sleep(120)
""")


@pytest.mark.skipif(os.getuid() != 0, reason="starts a process as another user")
def test_the_process_cap_counts_every_thread_of_the_user() -> None:
    """RLIMIT_NPROC counts a user's threads, so the child's headroom (`Limits.nprocs`) is added to
    their count, not to the processes': a process of a user with three threads besides its main one
    is four tasks, and none once it has exited."""
    with subprocess.Popen([sys.executable, "-c", THREADED], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
            assert _user_tasks(NOBODY_ELSE) == 4
        finally:
            proc.kill()
    assert _user_tasks(NOBODY_ELSE) == 0


def test_a_check_worker_sees_no_gpu_and_no_secret_of_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trusted worker that checks a graph starts in an environment of its own: no GPU unless
    asked for (a check runs on the CPU), no API key of this process, the torch threads asked for."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-reach-the-worker")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = worker_env(1)  # what TrustedWorker starts the check's worker with (read from /proc, a loaded
    # machine's worker could already have ended: an empty environ)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "1"
    assert "OPENAI_API_KEY" not in env
    assert "CUDA_VISIBLE_DEVICES" not in worker_env(1, training=True, gpu=True)


# --- found by the coverage-selected run of December (benchmarks/mutation.py --map) -----------------

def test_grid_sample_costs_the_taps_of_its_mode_sixteen_for_bicubic():
    from nas.sandbox.aten_ops import _grid_sample

    grid_sampler = torch.ops.aten.grid_sampler_2d.default
    inp, grid, out = torch.zeros(1, 1, 4, 4), torch.zeros(1, 4, 4, 2), torch.zeros(1, 1, 4, 4)
    # 16 output values x taps, at least reading the input (16) and the grid (32)
    assert [_grid_sample(grid_sampler, (inp, grid, mode, 0, False), {}, out) for mode in (0, 1, 2)] == [64, 48, 256]


def test_native_code_is_refused_but_a_dlopen_of_an_installed_library():
    from nas.sandbox.limits import _violation

    def outside(path):
        return False

    trusted = ("/trusted/site",)
    assert _violation("ctypes.dlopen", ("/trusted/site/lib.so",), outside, trusted) is None
    assert _violation("ctypes.dlopen", ("/tmp/evil.so",), outside, trusted) == "native code access"
    assert _violation("ctypes.dlopen", (None,), outside, trusted) == "native code access"
    assert _violation("ctypes.cdata", ("/trusted/site/lib.so",), outside, trusted) == "native code access"


def test_isolation_describes_itself_either_way():
    from nas.sandbox.isolation import ALLOW_ENV, Isolation

    assert Isolation(None).describe() == f"UNISOLATED ({ALLOW_ENV}=1): rlimits and an audit hook only"
    assert Isolation("/usr/bin/bwrap").describe() == "bubblewrap namespaces (/usr/bin/bwrap)"
    assert Isolation("/usr/bin/bwrap").isolated and not Isolation(None).isolated


def test_the_child_s_cpu_cap_kills_a_second_after_it_warns():
    code = """
import json, resource
from nas.sandbox.limits import Limits, apply_rlimits
apply_rlimits(Limits(), address_space=False)
print(json.dumps(resource.getrlimit(resource.RLIMIT_CPU)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          cwd=ROOT)
    soft, hard = json.loads(done.stdout.splitlines()[-1])
    assert hard == soft + 1 and soft >= Limits().cpu_s


def test_the_child_s_output_check_refuses_a_non_tensor_a_wrong_shape_and_nan():
    from nas.sandbox.worker import Stop, _check_output

    _check_output(torch.zeros(2, 10), [2, 10])
    for out, says in [("x", "Network returned str, expected a Tensor of shape [2, 10]"),
                      (torch.zeros(2, 9), "output shape [2, 9] != expected [2, 10]"),
                      (torch.full((2, 10), float("nan")), "output contains NaN or Inf values")]:
        with pytest.raises(Stop) as stop:
            _check_output(out, [2, 10])
        assert not stop.value.verdict.ok and stop.value.verdict.stage == "output_shape"
        assert says in stop.value.verdict.error


def test_the_child_exits_0_with_its_output_flushed():
    done = subprocess.run([sys.executable, "-c", "from nas.sandbox.worker import exit_now\nprint('said', end='')\n"
                                                 "exit_now()\nprint('never')"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert (done.returncode, done.stdout) == (0, "said")


def test_a_worker_line_over_the_limit_is_a_malformed_message_not_read_on():
    from nas.sandbox.protocol import MAX_LINE
    from nas.sandbox.trusted import Refusal, TrustedWorker

    worker = object.__new__(TrustedWorker)
    worker.memory_mb, worker.job = 1024, "check"
    worker.proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nsys.stdout.buffer.write(b'x' * (2 << 20))\n"
                                                          "sys.stdout.flush()\ntime.sleep(60)"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        got = worker.check(b"artifact", {"input_shape": [1, 3, 8, 8]})
    finally:
        worker.close()
    assert got == Refusal(f"the parent's check of the graph sent a malformed message (a line of over {MAX_LINE:,} "
                          "bytes)", "crash")


def test_an_unisolated_child_starts_in_its_writable_folder_else_at_the_root(tmp_path):
    from nas.sandbox.isolation import Isolation

    def cwd(**kwargs):
        proc = Isolation(None).popen([sys.executable, "-c", "import os; print(os.getcwd())"], dict(os.environ),
                                     stdout=subprocess.PIPE, text=True, **kwargs)
        out, _ = proc.communicate(timeout=60)
        return out.strip()

    assert cwd(writable=str(tmp_path)) == str(tmp_path)
    assert cwd() == "/"


def test_a_graph_s_inputs_count_only_programs_that_list_them():
    from nas.sandbox.graph import MAX_NODES, _inputs

    assert _inputs({"train": {"inputs": [1, 2]}, "eval": {"inputs": [3]}}) == 3
    assert _inputs({"train": None, "eval": {"inputs": [1, 2]}}) == 2
    assert _inputs({"train": {"inputs": "xy"}, "eval": 7}) == 0
    assert _inputs(["not", "a", "graph"]) == 0
    assert _inputs({"train": {"inputs": [0] * (MAX_NODES + 5)}}) == MAX_NODES


def test_a_graph_input_s_bits_are_its_tag_rank_and_sizes_and_with_values_its_bytes():
    from nas.sandbox.graph import TAG_BITS, int_bits, tensor_bits

    t = torch.zeros(3, 5, dtype=torch.int64)
    shape = TAG_BITS + int_bits(2) + int_bits(3) + int_bits(5)
    assert tensor_bits(t, False) == shape
    assert tensor_bits(t, True) == shape + 8 * 15 * 8


def test_the_child_s_default_caps_are_the_documented_ones():
    code = """
import json, resource
from nas.sandbox.limits import Limits, apply_rlimits
apply_rlimits(Limits(), address_space=False)
print(json.dumps([resource.getrlimit(resource.RLIMIT_FSIZE), resource.getrlimit(resource.RLIMIT_CORE)]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          cwd=ROOT)
    fsize, core = json.loads(done.stdout.splitlines()[-1])
    assert fsize == [16 << 20, 16 << 20] and core == [0, 0]  # Limits.file_mb: 16 MB written at most
    assert (Limits().wall_s, Limits().cpu_s, Limits().memory_mb, Limits().nprocs) == (60.0, 60, 4096, 8)


def test_the_worker_s_clocks_grow_by_each_epoch_image_and_batch_as_documented():
    from nas.sandbox.trusted import (
        BASE_SECONDS,
        EPOCH_SECONDS,
        IMAGE_SECONDS,
        SECONDS_PER_UNIT,
        check_seconds,
        train_seconds,
    )

    units, images = 10_000, 500
    per_image = IMAGE_SECONDS + 3 * units * SECONDS_PER_UNIT  # a forward and a backward (twice a forward)
    assert train_seconds(units, images, 0) == pytest.approx(BASE_SECONDS + images * per_image)
    assert train_seconds(units, images, 3) - train_seconds(units, images, 2) == pytest.approx(EPOCH_SECONDS)
    assert train_seconds(units, 2 * images, 1) - train_seconds(units, images, 1) == pytest.approx(images * per_image)
    # fvcore's trace at batch 1, then a forward and a backward at the batch
    assert check_seconds(units, 1) == pytest.approx(BASE_SECONDS + 4 * units * SECONDS_PER_UNIT)
    assert check_seconds(units, 8) - check_seconds(units, 7) == pytest.approx(3 * units * SECONDS_PER_UNIT)


def test_a_graph_tensor_path_may_be_32_parts_deep_and_no_deeper():
    from nas.sandbox.graph import GraphError, GraphNet

    net = GraphNet.__new__(GraphNet)
    nn.Module.__init__(net)
    owner, name = GraphNet._place(net, "PARAMETER", ".".join(f"m{i}" for i in range(32)), torch.ones(2))
    assert name == "m31" and torch.equal(owner.m31, torch.ones(2))
    with pytest.raises(GraphError, match="malformed"):
        GraphNet._place(net, "BUFFER", ".".join(f"n{i}" for i in range(33)), torch.ones(2))
    with pytest.raises(GraphError, match="malformed"):
        GraphNet._place(net, "BUFFER", "a.b-c", torch.ones(2))


def test_size_arithmetic_refuses_a_result_of_exactly_the_int64_limit():
    import operator

    from nas.sandbox.graph import _SIZE_LIMIT, GraphError, _bounded

    add = _bounded(operator.add)
    assert add(_SIZE_LIMIT - 2, 1) == _SIZE_LIMIT - 1
    with pytest.raises(GraphError, match="result outside int64 range"):
        add(_SIZE_LIMIT - 1, 1)


def test_trilinear_s_unsqueezed_dims_are_of_size_one():
    from nas.sandbox.aten_ops import _trilinear

    v = torch.zeros(3)
    assert _trilinear(None, (v, v, v, [0], [0], [0]), {}, None) == 3  # (1, 3) each: 3 products
    a, b = torch.zeros(2, 3), torch.zeros(2, 4)
    assert _trilinear(None, (a, b, torch.zeros(4), [2], [1], [0, 1]), {}, None) == 2 * 3 * 4


class Logged(nn.Module):
    """Small's layers, with a forward that logs (plain Python the compiler cannot trace, which a
    non-strict export runs as it is)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import logging

        logging.getLogger("nas.test.logged").debug("input %s", tuple(x.shape))
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def test_a_forward_that_logs_is_exported_and_checked_as_its_graph():
    """The child's export runs the model's Python as Python (non-strict): a forward that logs, which
    TorchDynamo's strict tracing refuses ('Unsupported'), is exported as its graph and passes the check,
    not left to a self-reported verdict."""
    net = Logged()
    graph = export_graph(net, torch.randn(2, 3, 8, 8))
    assert set(graph) >= {"train", "eval"} and graph["input_shape"] == [3, 8, 8]
    verdict = check(pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")}), [2, 3, 8, 8])
    assert (verdict["ok"], verdict["stage"], verdict["self_reported"]) == (True, "done", False), verdict["error"]


def test_the_dry_run_s_clock_counts_one_run_when_the_check_batch_is_the_training_batch():
    """The worker's clock for the dry run (`on_phase`) is its bookkeeping plus each run it makes, one
    graph at a batch: two at the verification batch of 2 and the training batch, one when the
    verification batch is the training batch (256)."""
    from nas.sandbox.graph import BOOKKEEPING_SECONDS, DRY_RUN_SECONDS_PER_UNIT

    data = artifact(Small())
    cost = GraphNet(unpack(data, 1 << 30)).cost
    for batch, runs in ((2, 2), (256, 1)):
        phases = []
        verdict = measure(data, num_classes=10, input_shape=[batch, 3, 8, 8], memory_mb=1024, with_parent=False,
                          batch=256, seeds=[], on_work=lambda units: None,
                          on_phase=lambda what, seconds, got=phases: got.append((what, seconds)))
        assert verdict["ok"], verdict["error"]
        dry = [seconds for what, seconds in phases if what.startswith("its dry run")]
        assert dry == [pytest.approx(BOOKKEEPING_SECONDS + runs * cost * DRY_RUN_SECONDS_PER_UNIT)], (batch, phases)


class Elementwise(nn.Module):
    """`k` element-wise operations on the input (work outside convolutions and matrix products), then a linear layer."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.fc = nn.Linear(3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.k):
            x = x.abs()
        return self.fc(x.mean((2, 3)))


def test_work_outside_the_counted_flops_of_exactly_the_slack_passes_and_one_operation_more_is_refused():
    """A graph's work per image outside convolutions and matrix products may be as much as
    UNCOUNTED_PER_INPUT per input element (its FLOPs count being smaller): exactly that passes, one
    element-wise operation more is refused as work hidden from the FLOPs count."""
    from nas.sandbox.verify import CHECK_BATCH, UNCOUNTED_PER_INPUT

    def hidden(k: int) -> int:  # as the check counts it: per image at the check batch
        net = GraphNet(unpack(artifact(Elementwise(k)), 1 << 30))
        return net.dry_run(2, 1 << 40, CHECK_BATCH)[1].other // CHECK_BATCH

    slack = UNCOUNTED_PER_INPUT * 3 * 8 * 8
    step = hidden(1) - hidden(0)
    k, rest = divmod(slack - hidden(0), step)
    assert rest == 0 and hidden(k) == slack < hidden(k + 1), (hidden(0), step)
    at = check(artifact(Elementwise(k)), [2, 3, 8, 8])
    assert (at["ok"], at["flops"] < slack) == (True, True), at["error"]
    over = check(artifact(Elementwise(k + 1)), [2, 3, 8, 8])
    assert (over["ok"], over["stage"]) == (False, "graph")
    assert over["error"].startswith(f"graph: {hidden(k + 1):,} operations per image (at batch {CHECK_BATCH}) outside")


def test_a_training_network_that_does_not_hash_as_the_checked_one_is_refused_before_it_trains():
    """`train_artifact` (in the training worker) trains only networks that hash as the graph checked:
    any other is a failed verdict of stage graph naming both hashes, before any data is touched."""
    from nas.sandbox.graph import graph_hash
    from nas.sandbox.verify import train_artifact

    net = Small()
    graph = export_graph(net, torch.randn(2, 3, 8, 8))
    weights = {"init": dict(net.state_dict()), "const": graph.pop("constants"), "seed0": dict(Small().state_dict())}
    data = pack(graph, weights)
    art = unpack(data, 1 << 30, ("init", "const", "seed0"))
    real = graph_hash(GraphNet(art, "seed0", like="init"), art.graph)
    checked = "0" * 64

    def never(*args):
        raise AssertionError("training started")

    result = train_artifact(data, None, graph=checked, seeds=[0], recipe={"epochs": 1, "batch_size": 64},
                            engine={"kind": "fast"}, labels=["model.py"], out=None, probe=None, proxies=None,
                            on_work=never, on_epoch=never, on_proxies=never)
    assert set(result) == {"verdict"}, result
    verdict = result["verdict"]
    assert (verdict["ok"], verdict["stage"]) == (False, "graph")
    assert f"(sha256 {real[:12]}) is not the one checked (sha256 {checked[:12]})" in verdict["error"]


def test_a_child_at_its_deadline_is_timed_out_and_not_read_on(monkeypatch):
    """`_collect` gives a child no read once its deadline has come: at exactly the deadline (no time
    left, none overdue) the run is timed out, though a report is waiting on its pipe."""
    from nas.sandbox import verify

    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", f"import os; os.write({write}, b'{{}}\\n')"], pass_fds=(write,),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    os.close(write)
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its pipes hold what it wrote
        now = 1000.0
        monkeypatch.setattr(verify.time, "monotonic", lambda: now)
        run = verify._collect(proc, read, None, deadline=now)
        assert run.timed_out and run.verdict is None and run.output == b"" and not run.malformed
    finally:
        monkeypatch.undo()
        os.close(read)
        proc.wait()
        proc.stdout.close()


def test_the_check_s_cpu_cap_is_the_clock_of_its_work_at_the_check_batch(monkeypatch):
    """The check worker caps its CPU time, once it hears the work per image, at `check_seconds` for
    the batch it runs the forward and backward at (the request's input batch), on every thread."""
    from nas.sandbox import trusted_worker
    from nas.sandbox.trusted import check_seconds

    data = artifact(Small())
    for batch in (2, 5):
        caps, sent = [], []
        monkeypatch.setattr(trusted_worker, "_cpu_limit",
                            lambda seconds, threads, got=caps: got.append((seconds, threads)))
        monkeypatch.setattr(trusted_worker, "_phase", lambda what, seconds, threads: None)
        monkeypatch.setattr(trusted_worker, "_send", sent.append)
        request = {"num_classes": 10, "input_shape": [batch, 3, 8, 8], "memory_mb": 1024, "with_parent": False,
                   "batch": 256, "seeds": []}
        trusted_worker._check(request, data, 3)
        work = [m["work"] for m in sent if "work" in m]
        assert len(work) == 1 and sent[-1]["verdict"]["ok"], sent
        assert caps == [(pytest.approx(check_seconds(work[0], batch)), 3)]


# TINY (an RGB model: its first convolution takes three channels) branching on its input's values
UNEXPORTABLE_RGB = in_forward("if x.mean() > 0:  # on the values: no graph can be exported\n    x = x * 2")


def test_a_colour_model_that_cannot_be_exported_is_measured_in_the_child_on_grey_data_made_rgb():
    """In the sandbox child (`worker._verify`): an RGB model (its first convolution takes three
    channels) checked for grey data runs on the grey channel three times; one whose forward branches on
    its values cannot be exported, so the child measures it itself (self-reported: params, FLOPs at
    batch 1 of three channels, layers) and, asked only to verify, trains nothing."""
    from nas.measure import count_flops, count_params
    from nas.sandbox.verify import verify_model_source

    verdict = verify_model_source(UNEXPORTABLE_RGB, input_shape=(2, 1, 8, 8),
                                  limits=Limits(wall_s=180, cpu_s=30, memory_mb=1024))
    assert (verdict.ok, verdict.stage, verdict.self_reported) == (True, "done", True), verdict.error
    assert verdict.export_error and verdict.output_shape == [2, 10] and verdict.layers == 2
    namespace: dict = {}
    exec(compile(UNEXPORTABLE_RGB, "model.py", "exec"), namespace)  # our own source: fine to run here
    net = namespace["Network"](num_classes=10)
    assert (verdict.params, verdict.flops) == (count_params(net), count_flops(net, (1, 3, 8, 8)))


def test_a_failed_verdict_is_never_handed_to_training(monkeypatch):
    """`train_model_source` trains only a verdict that passed and was measured here: a model whose
    forward raises in the sandbox child fails at stage forward, with nothing trained."""
    from nas.sandbox import verify

    def trained(*args, **kwargs):
        raise AssertionError("a failed verdict was handed to train_graphs")

    monkeypatch.setattr(verify, "train_graphs", trained)
    source = in_forward("raise RuntimeError('no forward')")
    verdict, runs = verify.train_model_source(
        source, data={"name": "digits"}, recipe={"epochs": 1, "batch_size": 64}, engine={"kind": "fast"},
        seeds=[0], num_classes=10, input_shape=(2, 1, 8, 8), limits=Limits(wall_s=180, cpu_s=30, memory_mb=1024))
    assert (verdict.ok, verdict.stage, runs) == (False, "forward", []), verdict.error
    assert "RuntimeError: no forward" in verdict.error


def test_a_model_file_without_network_names_only_its_own_module_classes(tmp_path):
    """A file that defines no `Network` fails at stage instantiate, naming the nn.Module classes it
    defines itself: not those it imports (nn.Linear), nor its other classes, functions or modules."""
    from nas.sandbox.worker import Stop, import_file, instantiate

    path = tmp_path / "model.py"
    path.write_text("import torch\nfrom torch import nn\nfrom torch.nn import Linear\n\n\n"
                    "def helper():\n    return 1\n\n\nclass Config:\n    pass\n\n\n"
                    "class Net(nn.Module):\n    pass\n\n\nclass Block(nn.Module):\n    pass\n")
    module = import_file(path, "nas_test_no_network")
    with pytest.raises(Stop) as stop:
        instantiate(module, "model.py", 10)
    assert (stop.value.verdict.ok, stop.value.verdict.stage) == (False, "instantiate")
    assert stop.value.verdict.error == ("instantiate: model.py defines no `Network` class "
                                        "(nn.Module classes found: Block, Net)")


def test_an_adaptive_pool_to_one_cell_costs_its_input_s_area():
    """An adaptive pool's window spans ceil(in / out) inputs, one more only where windows overlap: to 1x1
    it reads each input cell once per output (49 for 7x7, odd or even alike); 7 to 2 overlaps (5 a side)."""
    from nas.sandbox.aten_ops import _adaptive

    pool = torch.ops.aten._adaptive_avg_pool2d.default
    for size, out, area in ((7, 1, 49), (8, 1, 64), (7, 2, 25), (8, 2, 16)):
        x = torch.empty(1, 3, size, size, device="meta")
        assert _adaptive(pool, (x, [out, out]), {}, pool(x, [out, out])) == 3 * out * out * area, (size, out)


def test_a_verdict_may_say_no_layer_changed_and_an_output_dimension_up_to_two_to_the_31():
    """A child's verdict with changed_layers 0 (a candidate equal to its parent) is read, as is an output
    dimension of 2**31 (`MAX_DIM`, what an int32 index reaches); one more is a malformed field."""
    from nas.sandbox.protocol import CHILD_VERDICT, ProtocolError

    verdict = {"ok": True, "stage": "done", "error": None, "traceback": None, "params": 10, "flops": 10,
               "output_shape": [2, 10], "changed": False, "changed_layers": 0, "layers": 1, "self_reported": False,
               "export_error": None, "wall_s": 1.0, "graph": None}
    assert CHILD_VERDICT.check(verdict)["changed_layers"] == 0
    assert CHILD_VERDICT.check({**verdict, "output_shape": [2, 1 << 31]})["output_shape"] == [2, 1 << 31]
    with pytest.raises(ProtocolError, match="output_shape"):
        CHILD_VERDICT.check({**verdict, "output_shape": [2, (1 << 31) + 1]})


OPEN_INSIDE = policy_probe("""
    calls = (lambda: open("relative.txt", "w").write("x"),
             lambda: os.close(os.open(os.path.join(work, "absolute.txt"), os.O_WRONLY | os.O_CREAT)),
             lambda: os.close(os.open("relative_fd.txt", os.O_WRONLY | os.O_CREAT)))
""")


def test_the_policy_lets_open_write_a_relative_path_inside_but_not_os_open():
    """In the work folder, `open` may write a relative name (its audit event carries a mode) and
    `os.open` an absolute one inside; `os.open` of a relative name (mode None: it may be relative to a
    dir_fd the event does not show) is refused."""
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        out = subprocess.run([sys.executable, "-c", OPEN_INSIDE, work], capture_output=True, text=True,
                             timeout=120, check=True, cwd=work).stdout.splitlines()
        assert out[:2] == ["allowed", "allowed"], out
        assert out[2].startswith("policy: writing outside the sandbox directory is not allowed (open "), out
        assert sorted(os.listdir(work)) == ["absolute.txt", "relative.txt"]


def test_the_slow_operators_weights_are_the_op_costs_table_s_in_force(monkeypatch):
    """`aten_ops._WEIGHTS` is set from `benchmarks/op_costs.py`'s table, in steps of a power of two (2 to
    64: the slowdown per counted unit, brought within FACTOR of the median). The table's `within` holds
    only while the counter charges each weighted case what the table recorded: a weight changed without
    timing again (bernoulli's 32 made 33) leaves the table vouching for a count no longer in force. The
    table is not in a mutation run's copy (`results` folders are left out): there the steps alone."""
    from nas.sandbox.aten_ops import _WEIGHTS

    assert set(_WEIGHTS.values()) <= {2, 4, 8, 16, 32, 64}
    table_file = ROOT / "benchmarks" / "results" / "op_costs.json"
    if not table_file.is_file():
        return
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import op_costs

    table = json.loads(table_file.read_text())
    cases = op_costs.cases()
    weighted = [row for row in table["rows"] if row["operator"] in _WEIGHTS and row["case"] in cases]
    assert {"bernoulli", "sort", "tanh", "erf"} <= {row["operator"] for row in weighted}
    for row in weighted:
        fn, args, kwargs = cases[row["case"]]()
        assert op_costs.counted(fn, args, kwargs) == row["units"], row["case"]
        assert row["within"], row["case"]


def test_a_denied_action_s_traceback_keeps_its_lines_and_escapes_the_rest(monkeypatch):
    """A policy refusal raised in the model's code reaches the parent with its traceback line by
    line (the last line says what failed), its other control characters escaped as everywhere."""
    from nas.sandbox import worker

    def leave() -> None:
        raise SystemExit(0)

    monkeypatch.setattr(worker, "exit_now", leave)
    read, write = os.pipe()
    tb = 'Traceback (most recent call last):\n  File "model.py", line 3, in forward\nPermissionError: \x1b[2J\n'
    with pytest.raises(SystemExit):
        worker.Reporter(write).deny("policy: reading /etc/shadow is not allowed", tb)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        sent = json.loads(pipe.read())["policy"]
    assert sent["traceback"].splitlines() == ["Traceback (most recent call last):",
                                              '  File "model.py", line 3, in forward', "PermissionError: \\x1b[2J"]
    assert sent["error"] == "policy: reading /etc/shadow is not allowed"


def test_a_child_that_fills_its_work_folder_and_exits_between_two_looks_is_disk_full(monkeypatch, tmp_path):
    """The shared work folder is read every `_WATCH_EVERY_S`; a child that writes past `tmp_mb` there
    and closes its pipes before the next look is still caught: the folder is read once more after the
    pipes close, and the run is disk_full, not a clean exit."""
    from nas.sandbox import verify

    monkeypatch.setattr(verify, "_WATCH_EVERY_S", 3600.0)  # one look while the child runs: at its start
    report_r, report_w = os.pipe()
    code = f"import os; os.close({report_w}); open({str(tmp_path / 'big')!r}, 'wb').write(os.urandom(1 << 20))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            pass_fds=(report_w,))
    os.close(report_w)
    try:
        with os.fdopen(report_r, "rb", buffering=0) as report, proc.stdout:
            run = verify._collect(proc, report.fileno(), None, verify.time.monotonic() + 60,
                                  watch=str(tmp_path), watch_bytes=1 << 16)
    finally:
        proc.wait(timeout=60)
    assert (tmp_path / "big").stat().st_size == 1 << 20
    assert run.disk_full and not run.timed_out


def test_a_split_counts_the_length_of_its_dimension_and_one_piece_on_a_dimension_the_tensor_lacks():
    """`pieces` bounds a splitting call's outputs before it runs: an `unbind` along a dimension of the
    tensor (counted from either end) returns its length; along one the tensor lacks, or a `dim` that
    is no number, one (the operator itself then refuses it) rather than an error in the counter."""
    from nas.sandbox.aten_ops import pieces

    x = torch.zeros(2, 3)
    assert [pieces(torch.ops.aten.unbind.int, (x, dim), {}) for dim in (0, 1, -1, -2)] == [2, 3, 3, 2]
    assert [pieces(torch.ops.aten.unbind.int, (x, dim), {}) for dim in (2, -3, 5)] == [1, 1, 1]


def test_a_pool_s_one_number_kernel_is_that_size_in_each_of_its_dimensions():
    """A pool's kernel given as one number ([3]) reads a 3 x 3 (x 3) window, as aten pools it: counted
    the same as the kernel spelled out, in 1, 2 and 3 dimensions."""
    def work(pool, shape, kernel):
        with WorkCounter() as counter:
            pool(torch.zeros(shape, device="meta"), kernel)
        return counter.total

    aten = torch.ops.aten
    assert work(aten.max_pool2d_with_indices, (1, 1, 9, 9), [3]) == work(aten.max_pool2d_with_indices, (1, 1, 9, 9), [3, 3])
    assert work(aten.avg_pool3d, (1, 1, 9, 9, 9), [3]) == work(aten.avg_pool3d, (1, 1, 9, 9, 9), [3, 3, 3])


def test_an_artifact_whose_zip_end_record_has_a_comment_or_names_another_disk_is_refused():
    """An artifact's ZIP end record must be the plain one `pack` writes: one with a comment length,
    a disk number or a first-disk number, or a directory count differing from this disk's, is
    refused before `zipfile` reads anything, each on its own."""
    from nas.sandbox.graph import _END, _entries

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("graph.json", b"{}")
    data = buffer.getvalue()
    assert _entries(data, {"graph.json"}, 1 << 20) == ["graph.json"]
    fields = list(_END.unpack_from(data, len(data) - _END.size))
    for index, value in ((1, 1), (2, 1), (3, 0), (7, 1)):  # disk, first disk, entries here, comment
        changed = list(fields)
        changed[index] = value
        with pytest.raises(GraphError, match="a comment, or several disks"):
            _entries(data[:-_END.size] + _END.pack(*changed), {"graph.json"}, 1 << 20)



def test_every_protocol_spec_is_frozen():
    """The protocol's specs (`Int` ... `Channel`) are module constants every read of a child's or the
    trusted worker's line shares: none can be changed after it is made (a caller widening a bound, say
    a `Names` spec's `most`, would widen it for every later read)."""
    import dataclasses

    from nas.sandbox import protocol

    specs = [v for v in vars(protocol).values() if isinstance(v, type) and dataclasses.is_dataclass(v)
             and v.__module__ == protocol.__name__]
    assert {"Int", "Num", "Flag", "Text", "Seq", "Names", "Record", "Channel"} <= {s.__name__ for s in specs}
    assert all(s.__dataclass_params__.frozen for s in specs), [s.__name__ for s in specs]  # type: ignore[attr-defined]
    names = protocol.Names(protocol.Int(0, 1), 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        names.most = 10**6  # type: ignore[misc]


def test_the_parent_clocks_the_check_by_its_work_at_the_request_s_batch():
    """Once the check worker says its work per image, the parent's clock for the check is
    `check_seconds` of that work at the request's input batch (its first size, not its channels)."""
    from nas.sandbox.trusted import TrustedWorker, check_seconds

    worker = object.__new__(TrustedWorker)  # no process: `_talk` answers with the clock it was given
    worker._talk = lambda artifact, request, seconds_for: {"verdict": seconds_for({"work": 10**9})}
    for batch, channels in ((2, 3), (7, 1)):
        clock = worker.check(b"", {"input_shape": [batch, channels, 8, 8]})
        assert clock == check_seconds(10**9, batch) != check_seconds(10**9, channels)

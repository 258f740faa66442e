"""Checks of nas/sandbox that a mutation run (benchmarks/mutation.py, benchmarks/results/mutation_sandbox.json)
found untested: each fails on a realistic slip in the trusted side that the other sandbox tests let through."""

from __future__ import annotations

import io
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

from nas.sandbox.aten_ops import WorkCounter
from nas.sandbox.graph import MAX_WORK, GraphError, GraphNet, export_graph, pack, unpack
from nas.sandbox.limits import _user_tasks
from nas.sandbox.trusted import worker_env
from nas.sandbox.verify import measure


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


POLICY = textwrap.dedent("""
    import os, sys
    from nas.sandbox.limits import install_policy

    class Denied(Exception):
        pass

    def deny(error, traceback):
        raise Denied(error)

    work, outside = sys.argv[1], sys.argv[2]
    install_policy(work, {}, deny)
    for call in (lambda: os.rename(outside, os.path.join(work, "taken")),
                 lambda: os.rename(os.path.join(work, "mine"), outside + ".moved"),
                 lambda: os.chmod(outside, 0o777), lambda: os.chown(outside, 0, 0)):
        try:
            call()
            print("allowed")
        except Denied as err:
            print(err)
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

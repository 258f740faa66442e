"""The sandbox child's job (nas/sandbox/worker.py) called in this process, without a child: what
`answer` sets up before the untrusted work and sends after it, the stages `_verify` reports and
the verdict it builds, and how `_compare` and `_layers` tell a parent from a candidate. The caps
and the audit policy are replaced by recorders here (installing them would cap the test process);
the sandboxed runs of the same job are tests/test_sandbox_fast.py's. Last, the trusted worker's
command line, as its parent writes it and it reads it back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from nas.sandbox import worker
from nas.sandbox.graph import unpack
from nas.sandbox.limits import Limits
from nas.sandbox.verify import Verdict
from test_sandbox_fast import TINY, in_forward


@pytest.fixture(autouse=True)
def _torch_rng_kept():
    """`_verify` and `instantiate` seed torch as the child does: the tests after these draw as before."""
    state = torch.random.get_rng_state()
    yield
    torch.random.set_rng_state(state)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Answered:
    """`worker.answer` run here on `request` with `work`, its caps, policy, threads and exit
    recorded instead of applied: `threads`, `rlimits`, `policy` and the report lines sent."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: dict, work) -> None:
        self.threads: list[int] = []
        self.rlimits: list[tuple] = []
        self.policy: list[tuple] = []
        self.trainers: list[dict] = []
        self.jobs: list[worker.Job] = []
        report = tmp_path / "report"

        def leave() -> None:
            raise SystemExit(0)

        monkeypatch.setattr(worker, "exit_now", leave)
        monkeypatch.setattr(worker.torch, "set_num_threads", self.threads.append)
        monkeypatch.setattr(worker, "apply_rlimits", lambda limits, address_space: self.rlimits.append(
            (limits, address_space)))
        monkeypatch.setattr(worker, "install_policy", lambda *args: self.policy.append(args))
        monkeypatch.setattr(worker, "make_trainer", lambda training: self.trainers.append(training) or "trainer")
        monkeypatch.setattr(worker.sys, "dont_write_bytecode", False)

        def recorded(job: worker.Job) -> Verdict:
            self.jobs.append(job)
            return work(job)

        fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with warnings.catch_warnings(), pytest.raises(SystemExit):
                worker.answer({"result_fd": fd, **request}, tmp_path, "/policy/root", recorded)
        finally:
            os.close(fd)
        self.lines = _lines(report)


REQUEST = {"limits": {"memory_mb": 777, "cpu_s": 5}, "files": {"candidate": "model.py", "parent": "parent.py"}}


def test_answer_runs_the_work_on_one_thread_under_the_caps_and_the_policy_then_sends_its_verdict(
        monkeypatch, tmp_path):
    """A check (no `train`): torch on one thread, no trainer, the request's limits with an address-space
    cap, the policy on the root given over the untrusted files (their paths -> the names the user knows)
    and the hidden paths; the job sees the same; the last line sent is the work's verdict."""
    ran = Answered(monkeypatch, tmp_path, {**REQUEST, "hidden": ["/secret"]},
                   lambda job: Verdict(ok=True, stage="done", params=3))
    files = {str(tmp_path / "model.py"): "model.py", str(tmp_path / "parent.py"): "parent.py"}
    assert ran.threads == [1] and ran.trainers == []
    assert ran.rlimits == [(Limits(memory_mb=777, cpu_s=5), True)]
    (root, policy_files, deny, hidden), = ran.policy
    assert (root, policy_files, hidden) == ("/policy/root", files, ("/secret",))
    job, = ran.jobs
    assert deny == job.reporter.deny and job.files == files and job.trainer is None
    assert (job.limits, job.workdir) == (Limits(memory_mb=777, cpu_s=5), tmp_path)
    assert ran.lines == [{"verdict": Verdict(ok=True, stage="done", params=3).to_dict()}]


@pytest.mark.parametrize("gpu", [False, True])
def test_answer_trains_on_the_threads_asked_for_and_lifts_the_address_cap_only_for_a_gpu(monkeypatch, tmp_path, gpu):
    """A request that trains: torch on its `threads`, the trainer made before the caps and handed to
    the job; the address-space cap stays unless the training is on a GPU; no hidden paths: none."""
    training = {"threads": 3, "gpu": gpu}
    ran = Answered(monkeypatch, tmp_path, {**REQUEST, "train": training}, lambda job: Verdict(ok=True, stage="done"))
    assert ran.threads == [3] and ran.trainers == [training]
    assert ran.rlimits == [(Limits(memory_mb=777, cpu_s=5), not gpu)]
    assert ran.policy[0][3] == () and ran.jobs[0].trainer == "trainer"


def test_answer_sends_a_stop_s_verdict_and_names_the_stage_out_of_memory_stopped(monkeypatch, tmp_path):
    """A `Stop` from the work sends its verdict; a MemoryError (raised describing another failure)
    sends a limits verdict naming the memory cap and the stage the reporter was in."""
    stopped = Verdict(ok=False, stage="forward", error="forward: ValueError: no")

    def stop(job: worker.Job) -> Verdict:
        raise worker.Stop(stopped)

    def exhaust(job: worker.Job) -> Verdict:
        job.reporter.enter("backward")
        raise MemoryError

    assert Answered(monkeypatch, tmp_path, REQUEST, stop).lines == [{"verdict": stopped.to_dict()}]
    assert Answered(monkeypatch, tmp_path, REQUEST, exhaust).lines == [
        {"stage": "backward"},
        {"verdict": Verdict(ok=False, stage="limits",
                            error="limits: out of memory (memory_mb=777) during backward").to_dict()}]


GREY = TINY.replace("nn.Conv2d(3, 4", "nn.Conv2d(1, 4")
WIDER = TINY.replace("nn.Conv2d(3, 4", "nn.Conv2d(3, 6").replace("nn.Linear(4,", "nn.Linear(6,")


def _job(tmp_path: Path, request: dict, sources: dict[str, str]) -> tuple[worker.Job, Path, Path]:
    for name, source in sources.items():
        (tmp_path / name).write_text(source)
    report, artifact = tmp_path / "report", tmp_path / "artifact"
    files = {role: name for role, name in (("candidate", "model.py"), ("parent", "parent.py")) if name in sources}
    request = {"num_classes": 10, "input_shape": [2, 3, 8, 8], "files": files,
               "artifact_fd": os.open(artifact, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), **request}
    reporter = worker.Reporter(os.open(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    paths = {str(tmp_path / name): name for name in files.values()}
    return worker.Job(request, tmp_path, paths, Limits(), reporter, None), report, artifact


def _verify(tmp_path: Path, request: dict, sources: dict[str, str]) -> tuple[Verdict, list[str], Path]:
    job, report, artifact = _job(tmp_path, request, sources)
    try:
        verdict = worker._verify(job)
    except worker.Stop as stop:
        verdict = stop.verdict
    finally:
        os.close(job.reporter.fd)
        try:
            os.close(job.request["artifact_fd"])
        except OSError:  # `_send_artifact` closed it
            pass
    return verdict, [line["stage"] for line in _lines(report)], artifact


def test_verify_exports_a_model_that_passes_its_checks_and_measures_nothing_itself(tmp_path):
    """A model that passes import, forward, its output's shape [batch, classes] and backward is
    exported: the artifact (its graph taking the checked input) goes down its pipe, and the verdict
    says only the output's shape, nothing self-reported."""
    verdict, stages, artifact = _verify(tmp_path, {}, {"model.py": TINY})
    assert stages == ["import", "instantiate", "forward", "output_shape", "backward", "export", "done"]
    assert verdict == Verdict(ok=True, stage="done", output_shape=[2, 10], self_reported=False)
    graph = unpack(artifact.read_bytes(), 1 << 30).graph
    assert graph["input_shape"] == [3, 8, 8]


def test_verify_gives_a_colour_model_grey_input_three_times_and_a_grey_model_one_channel(tmp_path):
    """On one-channel data, a model whose first layer takes three channels is run (and exported) on
    three; one whose first layer takes one channel is run on one. Three-channel data never asks."""
    _, stages, artifact = _verify(tmp_path, {"input_shape": [2, 1, 8, 8]}, {"model.py": TINY})
    assert stages[:3] == ["import", "instantiate", "instantiate"]
    assert unpack(artifact.read_bytes(), 1 << 30).graph["input_shape"] == [3, 8, 8]
    _, stages, artifact = _verify(tmp_path, {"input_shape": [2, 1, 8, 8]}, {"model.py": GREY})
    assert unpack(artifact.read_bytes(), 1 << 30).graph["input_shape"] == [1, 8, 8]


def test_verify_refuses_an_output_of_the_wrong_number_of_classes_in_one_line(tmp_path):
    """The output must be [batch, num_classes]: a model built for 10 classes checked for 3 stops at
    output_shape, saying both shapes."""
    verdict, stages, _ = _verify(tmp_path, {"num_classes": 3}, {"model.py": TINY.replace(
        "nn.Linear(4, num_classes)", "nn.Linear(4, 10)")})
    assert stages[-1] == "output_shape"
    assert (verdict.stage, verdict.error) == (
        "output_shape", "output_shape: output shape [2, 10] != expected [2, 3] (batch, num_classes)")


def test_verify_measures_a_model_it_need_not_export_and_compares_it_with_its_parent(tmp_path):
    """With `export_error` set (the first child could not export it), the child measures the model
    itself (params, FLOPs per image, layers with parameters), marks it self-reported with that error,
    and compares it with its parent: two layers of six channels instead of four are two changed."""
    verdict, stages, artifact = _verify(tmp_path, {"export_error": "TypeError: no"},
                                        {"model.py": WIDER, "parent.py": TINY})
    assert stages == ["import", "instantiate", "forward", "output_shape", "backward", "measure", "structure", "done"]
    params = 6 * 3 * 9 + 6 + 6 * 10 + 10
    assert verdict == Verdict(ok=True, stage="done", params=params, flops=6 * 27 * 64 + 60, output_shape=[2, 10],
                              changed=True, changed_layers=2, layers=2, self_reported=True,
                              export_error="TypeError: no")
    assert artifact.read_bytes() == b""


def test_verify_keeps_the_candidate_s_numbers_when_its_parent_fails_to_build(tmp_path):
    """A parent without a `Network` stops the structure stage with the parent's error, prefixed, and
    the candidate's measured numbers and output shape kept."""
    verdict, _, _ = _verify(tmp_path, {"export_error": "TypeError: no"},
                            {"model.py": TINY, "parent.py": "X = 1\n"})
    assert (verdict.ok, verdict.stage) == (False, "structure")
    assert verdict.error == "structure: parent instantiate: parent.py defines no `Network` class (nn.Module classes " \
                            "found: none)"
    assert (verdict.params, verdict.layers, verdict.output_shape) == (4 * 27 + 4 + 40 + 10, 2, [2, 10])
    assert verdict.flops is not None and verdict.flops > 0


class Net(nn.Module):
    def __init__(self, skip: bool = False, width: int = 4) -> None:
        super().__init__()
        self.skip = skip
        self.body = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        if self.skip:
            y = y + x.mean(1, keepdim=True)
        return self.head(y.mean((2, 3)))


class Renamed(nn.Module):
    """`Net` with its attributes renamed and its forward spelled otherwise (`x.size(0)` read)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
        self.classifier = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.size(0) == x.shape[0]
        return self.classifier(self.trunk(x).mean((2, 3)))


def test_layers_are_the_leaves_and_the_modules_with_parameters_of_their_own():
    """A layer is a leaf module or one with parameters of its own (not its children's): the
    Sequential and the network holding it are no layers; the ReLU is one, without parameters."""
    assert worker._layers(Net()) == [
        ("Conv2d(3, 4, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1)) [[4, 3, 3, 3], [4]]", True),
        ("ReLU() []", False), ("Linear(in_features=4, out_features=10, bias=True) [[10, 4], [10]]", True)]


def test_a_new_skip_connection_is_a_change_without_changed_layers_and_renaming_is_none():
    """The same layers with another sequence of torch calls in forward (a skip connection) are a
    change of no layers; the same network is no change; wider layers are changes without any new call."""
    x = torch.randn(2, 3, 8, 8)
    assert worker._compare(Net(), Net(skip=True), x) == (True, 0)
    assert worker._compare(Net(), Net(), x) == (False, 0)
    assert worker._compare(Net(), Renamed(), x) == (False, 0)
    assert worker._compare(Net(), Net(width=6), x) == (True, 2)


@pytest.mark.parametrize("training", [False, True])
def test_the_trusted_worker_reads_back_the_command_line_its_parent_starts_it_with(monkeypatch, training):
    """`TrustedWorker` starts `python -m nas.sandbox.trusted_worker` with the memory, the threads, the job
    and its own pid; the worker's `arguments` read them back as `main` takes them."""
    from nas.sandbox import trusted
    from nas.sandbox.trusted_worker import arguments

    started: list[list[str]] = []

    class Recorded:
        def __init__(self, command: list[str], **kwargs) -> None:
            started.append(command)

    monkeypatch.setattr(trusted.subprocess, "Popen", Recorded)
    trusted.TrustedWorker(640, 3, training=training)
    command, = started
    argv = command[command.index("nas.sandbox.trusted_worker"):]  # what `-m` leaves in sys.argv, its path first
    assert arguments(argv) == (640, 3, "training" if training else "check", os.getpid())


DEEP = """def f(n):
    if n:
        return f(n - 1)
    raise ValueError("bad\\n  value\\n  third\\n  fourth")
"""


def _raised(tmp_path: Path, source: str, call: str) -> tuple[BaseException, dict[str, str]]:
    path = tmp_path / "model.py"
    path.write_text(source)
    namespace: dict = {}
    try:
        exec(compile(source + call, str(path), "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 - what the model raised, as `Job.stage` sees it
        return exc, {str(path): "model.py"}
    raise AssertionError("nothing raised")


def test_a_failure_is_one_line_at_the_model_s_last_frame_with_its_last_eight_frames_and_three_lines(tmp_path):
    """A model's exception: the stage, its type and message on one line, at the last frame in the
    untrusted file; the traceback keeps the last 8 of those frames (each its file's name, line and
    code) and the message's first three lines."""
    exc, files = _raised(tmp_path, DEEP, "f(9)\n")
    verdict = worker._failure("forward", exc, files, Limits())
    assert (verdict.ok, verdict.stage) == (False, "forward")
    assert verdict.error == "forward: ValueError: bad value third fourth at model.py:4"
    lines = verdict.traceback.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and len(lines) == 1 + 8 * 2 + 3
    assert lines[1:3] == ['  File "model.py", line 3, in f', "    return f(n - 1)"]
    assert lines[-5:] == ['  File "model.py", line 4, in f', '    raise ValueError("bad\\n  value\\n  third\\n  fourth")',
                          "ValueError: bad", "  value", "  third"]


def test_a_syntax_error_is_placed_at_its_line_and_an_error_outside_the_model_at_no_line(tmp_path):
    """A SyntaxError in the untrusted file names its line (it has no frame there); an exception
    without a frame in the untrusted file names none, and a message-less one its type alone."""
    exc, files = _raised(tmp_path, "x = 1\ny = (\n", "")
    verdict = worker._failure("import", exc, files, Limits())
    assert verdict.error.startswith("import: SyntaxError: ") and verdict.error.endswith(" at model.py:2")
    assert worker._failure("forward", KeyError(), files, Limits()).error == "forward: KeyError"
    assert worker._failure("forward", KeyError(), files, Limits()).traceback == \
        "Traceback (most recent call last):\nKeyError"


@pytest.mark.parametrize("exc, error", [
    (MemoryError(), "limits: out of memory (memory_mb=300) during forward"),
    (RuntimeError("std::bad_alloc"), "limits: out of memory (memory_mb=300) during forward"),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4096 bytes."),
     "limits: out of memory (memory_mb=300): tried to allocate 4096 bytes during forward"),
    (OSError(27, "File too large"), "limits: file size limit 7 MB exceeded"),
    (OSError(28, "No space left on device"), "forward: OSError: [Errno 28] No space left on device"),
], ids=["MemoryError", "torch allocator", "torch allocator with size", "file size", "other OSError"])
def test_a_cap_s_refusal_is_a_limits_failure_naming_the_cap(exc, error):
    """Out of memory (a MemoryError or the allocator's message, with the size it asked for when said) and
    a file over the size cap (EFBIG) are limits failures naming the cap; another OSError is the stage's."""
    verdict = worker._failure("forward", exc, {}, Limits(memory_mb=300, file_mb=7))
    assert verdict.error == error
    assert verdict.stage == ("forward" if error.startswith("forward") else "limits")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_an_exception_message_is_one_line_of_at_most_400_characters_or_says_it_is_unprintable():
    assert worker._message(ValueError("a\n b\t c")) == "a b c"
    assert worker._message(ValueError("a\n b"), one_line=False) == "a\n b"
    assert worker._message(ValueError("x" * 500)) == "x" * 400
    assert worker._message(Unprintable()) == "<unprintable Unprintable>"


@pytest.mark.parametrize("out, error", [
    ((1, 2), "output_shape: Network returned tuple, expected a Tensor of shape [2, 10]"),
    (torch.zeros(2, 9), "output_shape: output shape [2, 9] != expected [2, 10] (batch, num_classes)"),
    (torch.tensor([[float("nan")] * 10] * 2), "output_shape: output contains NaN or Inf values"),
    (torch.tensor([[float("inf")] * 10] * 2), "output_shape: output contains NaN or Inf values"),
])
def test_an_output_that_is_no_tensor_of_the_expected_shape_or_not_finite_stops_at_output_shape(out, error):
    with pytest.raises(worker.Stop) as stop:
        worker._check_output(out, [2, 10])
    assert (stop.value.verdict.stage, stop.value.verdict.error) == ("output_shape", error)
    worker._check_output(torch.zeros(2, 10), [2, 10])


def test_a_file_without_network_names_its_module_classes_and_a_network_that_is_no_module_says_what(tmp_path):
    """No `Network`: the nn.Module classes the file defines (not imported ones), sorted; a `Network`
    returning something else: its type."""
    path = tmp_path / "m.py"
    path.write_text("from torch import nn\nclass B(nn.Module): pass\nclass A(nn.Module): pass\nclass C: pass\n")
    module = worker.import_file(path, "nas_test_found")
    with pytest.raises(worker.Stop) as stop:
        worker.instantiate(module, "m.py", 10)
    assert stop.value.verdict.error == "instantiate: m.py defines no `Network` class (nn.Module classes found: A, B)"
    assert (stop.value.verdict.ok, stop.value.verdict.stage) == (False, "instantiate")
    path.write_text("x = 1\n")
    with pytest.raises(worker.Stop) as stop:
        worker.instantiate(worker.import_file(path, "nas_test_found"), "m.py", 10)
    assert stop.value.verdict.error == "instantiate: m.py defines no `Network` class (nn.Module classes found: none)"
    path.write_text("class Network:\n    def __init__(self, num_classes):\n        pass\n")
    with pytest.raises(worker.Stop) as stop:
        worker.instantiate(worker.import_file(path, "nas_test_found"), "m.py", 7)
    assert stop.value.verdict.error == "instantiate: Network(num_classes=7) returned Network, not an nn.Module"
    assert (stop.value.verdict.ok, stop.value.verdict.stage) == (False, "instantiate")


def test_the_first_in_channels_are_the_first_layer_s_that_has_them():
    assert worker.first_in_channels(Net()) == 3
    assert worker.first_in_channels(nn.Sequential(nn.ReLU(), nn.Conv2d(5, 2, 1), nn.Conv2d(2, 3, 1))) == 5
    assert worker.first_in_channels(nn.Linear(3, 4)) is None


def test_verify_runs_the_model_on_an_input_drawn_under_seed_0(tmp_path):
    """The check's input is the same every run (a verdict does not depend on the draw): torch's
    normal draw under seed 0, as a model that reports its first input value shows."""
    source = in_forward("raise RuntimeError(f'first {x.flatten()[0].item():.6f}')")
    verdict, _, _ = _verify(tmp_path, {}, {"model.py": source})
    torch.manual_seed(0)
    assert f"first {torch.randn(2, 3, 8, 8).flatten()[0].item():.6f}" in verdict.error


def test_the_child_leaves_with_status_0_whatever_the_model_left_running():
    """`exit_now` ends the child at once with status 0 (what the parent reads as a finished child),
    though a thread the model started would keep a normal exit waiting."""
    code = ("import threading, time\nfrom nas.sandbox.worker import exit_now\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\nexit_now()")
    done = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True)
    assert done.returncode == 0, done.stderr[-2000:]

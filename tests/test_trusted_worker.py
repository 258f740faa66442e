"""The parent's own compute on a child's graph runs in the trusted worker (`nas.sandbox.trusted`),
under a memory limit, a CPU-time limit and a wall clock from the counted work: a graph whose real
run, or its training, costs more than they allow is one refused trial, and this process goes on. The graph trained
is the graph checked (`graph_hash`): a second export of the same file that differs is refused.
The zero-cost proxies of a graph's fresh network are scored there too, as this process would.
Real worker processes, real graphs; no sandbox child (but in the tests marked so)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from nas.data.sources import load_data
from nas.errors import EvaluationError
from nas.proxies import PROXIES, score_network
from nas.proxies.batch import data_batch
from nas.sandbox import trusted, verify
from nas.sandbox.graph import GraphNet, export_graph, graph_hash, pack, unpack
from nas.sandbox.limits import Limits
from nas.sandbox.trusted import Refusal, TrustedWorker
from nas.sandbox.trusted_worker import limit_hit
from nas.sandbox.verify import ProxyRequest, Verdict, _graph_verdict, _seed_net, train_artifact, train_graphs
from nas.train.progress import EpochProgress

SHAPE = (2, 3, 16, 16)


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class Upsampled(Small):
    """~130 MB per activation at batch 2 (an upsample to 512x512 and a 64-channel conv there)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 64, 3, padding=1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.interpolate(x, size=(512, 512))
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


class Float32(Small):
    """Casts to float32 before its classifier: it trains, but synflow (in float64) cannot run it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)).float())


class Table(Small):
    """Carries a frozen buffer: the model's code chooses its values, so they are part of the network."""

    def __init__(self, value: float = 0.0) -> None:
        super().__init__()
        self.register_buffer("table", torch.full((10,), value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.table


def artifact(net: nn.Module, **extra: dict[str, torch.Tensor]) -> bytes:
    graph = export_graph(net, torch.randn(SHAPE))
    return pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants"), **extra})


def test_an_honest_graph_gets_the_same_verdict_as_measured_in_process() -> None:
    """The worker's verdict is what this process measures itself on the same graph (parameters,
    fvcore's FLOPs, layers), and names the graph's hash."""
    from nas.measure import count_flops, count_params

    net = Small()
    data = artifact(net)
    verdict = _graph_verdict(data, 10, SHAPE, Limits(), False)
    art = unpack(data, 1 << 30)
    here = GraphNet(art)
    assert verdict.ok and verdict.stage == "done", verdict.error
    assert (verdict.params, verdict.flops, verdict.layers) == (count_params(here), count_flops(here, (1, 3, 16, 16)), 2)
    assert verdict.graph == graph_hash(GraphNet(art), art.graph)


def test_a_graph_over_the_workers_memory_is_one_refusal_and_this_process_goes_on() -> None:
    """The dry run lets ~0.5 GB at batch 2 through (~100 GB for training); a worker limited to 256 MB
    is stopped by its limit (the data-segment cap or the resident-memory watch), one line naming
    it. The same limit lets a small graph through."""
    with TrustedWorker(memory_mb=256, threads=1) as worker:
        verdict = _graph_verdict(artifact(Upsampled()), 10, SHAPE, Limits(memory_mb=1 << 20), False, [0],
                                 worker=worker)
        assert worker.proc.poll() is not None  # killed, and reaped
    assert (verdict.ok, verdict.stage) == (False, "limits")
    assert verdict.error == "limits: refused: the parent's check of the graph exceeded its memory limit (256 MB)"
    with TrustedWorker(memory_mb=256, threads=1) as worker:
        assert _graph_verdict(artifact(Small()), 10, SHAPE, Limits(), False, worker=worker).ok


def test_the_wall_clock_comes_from_the_counted_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no seconds allowed per unit of counted work, the real run is out of time at once: one line."""
    assert trusted.check_seconds(10**9, 2) > trusted.check_seconds(10**6, 2) > trusted.BASE_SECONDS
    monkeypatch.setattr(trusted, "BASE_SECONDS", 0.0)
    monkeypatch.setattr(trusted, "SECONDS_PER_UNIT", 0.0)
    verdict = _graph_verdict(artifact(Upsampled()), 10, SHAPE, Limits(memory_mb=1 << 20), False)
    assert (verdict.ok, verdict.stage) == (False, "limits")
    assert verdict.error == ("limits: refused: the parent's check of the graph exceeded its wall clock "
                             "(0 s for its counted work)")


@pytest.mark.parametrize("sig, error", [
    (signal.SIGXCPU, "limits: refused: the parent's check of the graph exceeded its CPU-time limit (the counted work's)"),
    (signal.SIGTERM, "crash: the parent's check of the graph ended without a verdict (exit status -15)")],
    ids=["SIGXCPU", "SIGTERM"])
def test_a_worker_that_dies_is_one_line(sig: signal.Signals, error: str) -> None:
    """Killed by RLIMIT_CPU (SIGXCPU, or SIGKILL past the hard limit): the CPU-time limit; killed
    otherwise: a crash, not a limit."""
    with TrustedWorker(memory_mb=1024, threads=1) as worker:
        os.kill(worker.proc.pid, sig)
        verdict = _graph_verdict(artifact(Small()), 10, SHAPE, Limits(), False, worker=worker)
    assert verdict.error == error


FAKE_WORKER = """
import json, sys, time
for msg in json.loads(sys.argv[1]):
    print(json.dumps(msg), flush=True)
time.sleep(120)
"""


class FakeWorker(TrustedWorker):
    """A process that sends the parent `messages`, whatever it is asked: the parent's real pipes and checks."""

    def __init__(self, messages: list[dict]) -> None:
        self.memory_mb, self.job = 1024, "check"
        self.proc = subprocess.Popen([sys.executable, "-c", FAKE_WORKER, json.dumps(messages)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)


HONEST_RSS = 300 << 20
CHECKED = {"verdict": Verdict(ok=True, stage="done", params=1, flops=2, output_shape=[2, 10], layers=1,
                             graph="0" * 64).to_dict()}  # a measured verdict has its counts and hash
FORGED_READY = {  # what a worker could send instead of one `{"ready": its resident memory}` first
    "a negative size": [{"ready": -1}, {"work": 1}, CHECKED],
    "a bool": [{"ready": True}, {"work": 1}, CHECKED],
    "a float": [{"ready": float(HONEST_RSS)}, {"work": 1}, CHECKED],
    "a string": [{"ready": str(HONEST_RSS)}, {"work": 1}, CHECKED],
    "null": [{"ready": None}, {"work": 1}, CHECKED],
    "past the machine's memory": [{"ready": 1 << 62}, {"work": 1}, CHECKED],
    "another field besides": [{"ready": HONEST_RSS, "work": 1}, CHECKED],
    "not first": [{"work": 1}, {"ready": HONEST_RSS}, CHECKED],
    "a second one": [{"ready": HONEST_RSS}, {"work": 1}, {"ready": 1 << 40}, CHECKED],
}


@pytest.mark.parametrize("messages", list(FORGED_READY.values()), ids=list(FORGED_READY))
def test_the_workers_resident_memory_is_a_size_said_once_and_first(messages: list[dict]) -> None:
    """The worker's `ready` message sets the base of the parent's watch on its resident memory: a
    base that is not a size up to the machine's memory, or one said late or again (moving the
    limit), is a malformed message, one line; the honest order gets the verdict."""
    with FakeWorker(messages) as worker:
        refused = worker.check(b"", {"input_shape": list(SHAPE)})
    assert isinstance(refused, Refusal) and refused.stage == "crash"
    assert refused.line.startswith("the parent's check of the graph sent a malformed message (")
    with FakeWorker([{"ready": HONEST_RSS}, {"work": 1}, CHECKED]) as worker:
        assert worker.check(b"", {"input_shape": list(SHAPE)}) == CHECKED["verdict"]


READY = {"ready": HONEST_RSS}
FORGED_WORK_OR_RESULT = {  # a check's work counts and result in any other form than measure's
    "work as a string": [READY, {"work": "1"}, CHECKED],
    "work as a bool": [READY, {"work": True}, CHECKED],
    "negative work": [READY, {"work": -5}, CHECKED],
    "work past 2**63": [READY, {"work": 1 << 63}, CHECKED],
    "a training's counts in a check": [READY, {"work": 1, "images": 10, "epochs": 1}, CHECKED],
    "a second work message": [READY, {"work": 1}, {"work": 1 << 40}, CHECKED],
    "a result of unknown form": [READY, {"work": 1}, {"verdicts": {}}],
    "a training's result in a check": [READY, {"work": 1}, {"trained": []}],
    "a verdict that is not a mapping": [READY, {"work": 1}, {"verdict": "ok"}],
    "a verdict beside another key": [READY, {"work": 1}, {**CHECKED, "trained": []}],
}


@pytest.mark.parametrize("messages", list(FORGED_WORK_OR_RESULT.values()), ids=list(FORGED_WORK_OR_RESULT))
def test_work_counts_and_the_result_have_their_jobs_form(messages: list[dict]) -> None:
    """The work counts set the worker's clocks and the result is read by key: counts that are not
    the job's integers (or come twice), or a result not of the job's forms, are a malformed message
    in one line, never a TypeError or KeyError in this process, nor a wall clock moved out of reach."""
    with FakeWorker(messages) as worker:
        refused = worker.check(b"", {"input_shape": list(SHAPE)})
    assert isinstance(refused, Refusal) and refused.stage == "crash", refused
    assert refused.line.startswith("the parent's check of the graph sent a malformed message (")


def test_the_graph_trained_is_the_graph_checked() -> None:
    """A kept verdict's hash vouches for its graph only: a different graph, or the same graph whose
    training weights carry other values of a frozen buffer than the checked ones, is refused in one
    line; the same network (other drawn values, other seeds) passes."""
    honest = Table(0.0)
    data = artifact(honest, seed0=dict(Table(0.0).state_dict()), seed1=dict(Table(0.0).state_dict()))
    verdict = _graph_verdict(data, 10, SHAPE, Limits(), False, [0, 1])
    assert verdict.ok, verdict.error
    again = _graph_verdict(artifact(Table(0.0), seed0=dict(Table(0.0).state_dict())), 10, SHAPE, Limits(), False,
                              [0], checked=verdict.graph)
    assert again.ok and again.graph == verdict.graph
    other = _graph_verdict(artifact(Small(), seed0=dict(Small().state_dict())), 10, SHAPE, Limits(), False,
                           [0], checked=verdict.graph)
    assert (other.ok, other.stage) == (False, "graph")
    assert "is not the one checked" in other.error and "\n" not in other.error
    swapped = artifact(honest, seed0=dict(Table(5.0).state_dict()))  # checked with 0s, trained with 5s
    forged = _graph_verdict(swapped, 10, SHAPE, Limits(), False, [0])
    assert not forged.ok and "is not the one checked" in forged.error


TWO_FACED = '''
import sys

import torch
from torch import nn

_worker = sys.modules["__main__"]
_export, _fill = _worker._export, [0.0]


def _forged(module, candidate, workdir, request, *args):
    """A run that exports training seeds (the training run) builds another network than the check run."""
    _fill[0] = 3.0 if request.get("seeds") else 0.0
    return _export(module, candidate, workdir, request, *args)


_worker._export = _forged


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, num_classes)
        self.register_buffer("table", torch.full((num_classes,), _fill[0]))

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3))) + self.table
'''


def test_a_kept_verdict_vouches_for_no_other_graph() -> None:
    """The check and the training are two runs of one file: a file that exports another network
    when asked for training seeds passes the check, and its training run is refused in one line
    for the kept verdict's hash; without the forgery, the same two runs train."""
    from nas.sandbox.verify import train_model_source, verify_model_source

    train = {"data": {"name": "digits"}, "num_classes": 10, "input_shape": (2, 3, 8, 8),
             "recipe": {"epochs": 1, "batch_size": 64}, "engine": {"kind": "fast"}, "seeds": [0]}
    checked = verify_model_source(TWO_FACED, input_shape=(2, 3, 8, 8))
    assert checked.ok and checked.graph is not None, checked.error
    verdict, runs = train_model_source(TWO_FACED, checked=checked.graph, **train)  # type: ignore[arg-type]
    assert (verdict.ok, verdict.stage, runs) == (False, "graph", [])
    assert verdict.error.startswith("graph: the network sent for training (sha256 ") and "\n" not in verdict.error
    # the honest file's check would build the network the two-faced one's check built (the forgery
    # acts only on a run asked for training seeds): its kept hash is that one's, so it is reused
    honest = TWO_FACED.replace("_worker._export = _forged\n", "")
    verdict, runs = train_model_source(honest, checked=checked.graph, **train)  # type: ignore[arg-type]
    assert verdict.ok and len(runs) == 1, verdict.error


def _digits_graph(net: nn.Module) -> tuple[bytes, Verdict]:
    """`net` exported at the digits' size (3x8x8, grey data made RGB), with a training seed 0, and
    the verdict a check would keep for it (its hash; nothing run for real)."""
    graph = export_graph(net, torch.randn(2, 3, 8, 8))
    data = pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants"),
                        "seed0": dict(net.state_dict())})
    art = unpack(data, 1 << 30, ("init", "const", "seed0"))
    return data, Verdict(ok=True, stage="done", graph=graph_hash(GraphNet(art), art.graph))


_COMPILE = torch.compile


def _compiled_with(error: Exception):
    """torch.compile whose backend raises `error`, as a backend's allocation on a full device does."""
    def backend(graph, example_inputs):
        raise error

    return lambda model, **kw: _COMPILE(model, backend=backend, **kw)


@pytest.mark.parametrize("error, kind", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of "
                            "139.80 GiB of which 1.12 GiB is free."), "gpu"),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes."), "memory")],
    ids=["gpu", "memory"])
def test_an_out_of_memory_while_compiling_is_the_limit_not_a_compile_failure(
        monkeypatch: pytest.MonkeyPatch, error: Exception, kind: str) -> None:
    """With engine.compile, torch.compile's backend allocates too (inductor's autotuning on the
    device); the fast engine says a backend's error as `torch.compile failed: ...`. Where a cap
    refused that allocation, the training stops with that error and the worker tells the parent
    the cap (`limit_hit`: the limits line); any other compile failure stays the training's line."""
    data, checked = _digits_graph(Small())

    def train() -> dict:
        return train_artifact(data, load_data(name="digits"), graph=str(checked.graph), seeds=[0],
                              recipe={"epochs": 1, "batch_size": 64}, engine={"kind": "fast", "compile": True},
                              labels=["small.py"], out=None, probe=None, proxies=None,
                              on_work=lambda *counts: None, on_epoch=None, on_proxies=lambda scores: None)

    monkeypatch.setattr(torch, "compile", _compiled_with(error))
    with pytest.raises(EvaluationError, match="^torch.compile failed: ") as raised:
        train()
    assert limit_hit(raised.value) == kind
    monkeypatch.setattr(torch, "compile", _compiled_with(RuntimeError("no kernels today")))
    assert train() == {"error": "torch.compile failed: RuntimeError: no kernels today"}


def test_a_training_over_the_workers_memory_is_one_refusal_and_this_process_stays_small() -> None:
    """Training runs in a worker under the memory limit, never here: a graph whose training step
    needs gigabytes (64 channels at 512x512, batch 64) stops at the worker's 256 MB, in one line
    naming the limit, and this process's peak resident memory barely moves."""
    data, checked = _digits_graph(Upsampled())
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # resets this process's peak resident memory (VmHWM)
    base = trusted._status("self", "VmRSS")
    verdict, runs = train_graphs(checked, data, {"name": "digits"}, {"epochs": 1, "batch_size": 64},
                                 {"kind": "fast"}, [0], Limits(memory_mb=256))
    assert (verdict.ok, verdict.stage, runs) == (False, "limits", [])
    assert verdict.error == "limits: refused: the parent's training of the graph exceeded its memory limit (256 MB)"
    peak = trusted._status("self", "VmHWM")
    assert base is not None and peak is not None and peak - base < 64 << 20


def test_a_graph_trains_in_the_worker_and_reports_each_epoch(tmp_path: Path) -> None:
    """An honest graph trains in the worker under the same limit: each epoch's progress reaches
    `on_epoch` here, and its trained weights come back as safetensors with the graph's keys."""
    from safetensors.torch import load_file

    net = Small()
    data, checked = _digits_graph(net)
    heard: list[EpochProgress] = []
    verdict, runs = train_graphs(checked, data, {"name": "digits"}, {"epochs": 2, "batch_size": 64},
                                 {"kind": "fast"}, [0], Limits(memory_mb=256), on_epoch=heard.append,
                                 label="small.py", out=str(tmp_path), probe=0)
    assert verdict.ok and len(runs) == 1 and runs[0].epochs == 2, verdict.error
    assert [(p.label, p.epoch, p.epochs) for p in heard] == [("small.py", 1, 2), ("small.py", 2, 2)]
    state = load_file(tmp_path / "seed0.safetensors")
    assert set(state) == set(net.state_dict())
    probe = load_file(tmp_path / "probe.safetensors")
    assert probe["input"].shape == (1, 3, 8, 8) and probe["output"].shape == (1, 10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_graph_trains_on_the_gpu_under_the_workers_memory_limit(tmp_path: Path) -> None:
    """The worker's memory limit is a data-segment cap plus a resident-memory watch, never an
    address-space cap, because CUDA maps tens of GB of virtual memory that such a cap refuses: on a
    GPU the same honest graph trains under the limit, on the device, and reports each epoch."""
    data, checked = _digits_graph(Small())
    heard: list[EpochProgress] = []
    verdict, runs = train_graphs(checked, data, {"name": "digits"}, {"epochs": 2, "batch_size": 64},
                                 {"kind": "fast", "accelerator": "gpu"}, [0], Limits(memory_mb=1024), gpu=True,
                                 on_epoch=heard.append, out=str(tmp_path))
    assert verdict.ok and len(runs) == 1, verdict.error
    assert runs[0].device.startswith("cuda") and [p.epoch for p in heard] == [1, 2]


def test_the_worker_scores_the_proxies_of_the_fresh_network_as_this_process_would() -> None:
    """Evaluator=train's zero-cost proxies of an exported graph are computed in the training worker,
    never here: on an honest graph, the scores it sends back are the ones `score_network` gives
    here on the first seed's freshly initialised network and the same batch (drawn under that
    seed), and the training that follows is the one without proxies."""
    names = tuple(PROXIES.names())
    data, checked = _digits_graph(Small())
    heard: list[dict[str, float] | str] = []
    threads = torch.get_num_threads()  # as evaluator=train starts the worker: the same float sums
    recipe, engine = {"epochs": 1, "batch_size": 64}, {"kind": "fast"}
    verdict, runs = train_graphs(checked, data, {"name": "digits"}, recipe, engine, [0], Limits(memory_mb=512),
                                 threads=threads, proxies=ProxyRequest(names, 32, heard.append))
    assert verdict.ok and len(runs) == 1, verdict.error
    net = _seed_net(unpack(data, 1 << 30, ("init", "const", "seed0")), 0)
    here = score_network(net, data_batch(load_data(name="digits"), 32, 0, shape=(3, 8, 8)), names, 0)
    assert heard == [here] and set(here) == set(names)
    _, plain = train_graphs(checked, data, {"name": "digits"}, recipe, engine, [0], Limits(memory_mb=512),
                            threads=threads)
    assert [r.loss_curve for r in runs] == [r.loss_curve for r in plain]


def test_a_proxy_that_cannot_run_on_the_graph_is_one_line_and_the_graph_still_trains() -> None:
    """A graph that casts to float32 trains, but synflow runs networks in float64: the worker sends
    one line saying why there are no scores (none of the others either), and the training goes on."""
    data, checked = _digits_graph(Float32())
    heard: list[dict[str, float] | str] = []
    verdict, runs = train_graphs(checked, data, {"name": "digits"}, {"epochs": 1, "batch_size": 64},
                                 {"kind": "fast"}, [0], Limits(memory_mb=512),
                                 proxies=ProxyRequest(("snip", "synflow"), 32, heard.append))
    assert verdict.ok and len(runs) == 1 and runs[0].epochs == 1, verdict.error
    assert heard == ["RuntimeError: Tensor dtype mismatch! Expected: Float, Got: double"]


def test_more_devices_than_one_train_an_untrusted_graph_on_one_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """DDP relaunches the training's process once per device, out of the worker's limits: a graph
    asked to train on two devices trains on one in the worker (world size 1), and the log says so
    once per process, not once per candidate."""
    verify._on_one_device.cache_clear()
    data, checked = _digits_graph(Small())
    verdict, runs = train_graphs(checked, data, {"name": "digits"}, {"epochs": 1, "batch_size": 64},
                                 {"kind": "plain", "devices": 2}, [0], Limits(memory_mb=1024))
    assert verdict.ok and len(runs) == 1 and runs[0].world_size == 1, verdict.error
    verify._on_one_device(2)  # the next candidate's
    said = [r.getMessage() for r in caplog.records if "devices=2" in r.getMessage()]
    assert said == ["engine.devices=2: a sandboxed model's exported graph trains on one device in the trusted "
                    "worker (its memory limits hold for one process; DDP would start one per device)"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_training_over_the_gpu_memory_limit_is_one_refusal() -> None:
    """On a GPU the worker caps the CUDA caching allocator at the same `memory_mb`: a graph whose
    training step needs gigabytes on the device (64 channels at 512x512, batch 64) is refused in one
    line naming that limit, not an out-of-memory of a shared GPU; the host-memory limit is not
    what stopped it."""
    data, checked = _digits_graph(Upsampled())
    verdict, runs = train_graphs(checked, data, {"name": "digits"}, {"epochs": 1, "batch_size": 64},
                                 {"kind": "fast", "accelerator": "gpu"}, [0], Limits(memory_mb=1024), gpu=True)
    assert (verdict.ok, verdict.stage, runs) == (False, "limits", [])
    assert verdict.error == "limits: refused: the parent's training of the graph exceeded its GPU memory limit (1024 MB)"


FLOAT32_SOURCE = '''
import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(self.body(x).float())
'''


def test_model_source_a_proxy_cannot_run_gets_one_warning_no_proxies_and_trains(
        caplog: pytest.LogCaptureFixture) -> None:
    """Through evaluator=train: the worker's line about a proxy that cannot run on the exported
    graph (synflow in float64) is one warning naming the candidate, the trial has no proxy
    metrics, and it trained."""
    from nas.evaluators.train import TrainEvaluator
    from nas.spaces.source.arch import SourceArch
    from nas.spaces.source.space import SourceSpace

    recipe = {"epochs": 1, "batch_size": 64, "train_subset": 128, "valid_subset": 64, "test_subset": 64}
    ev = TrainEvaluator(SourceSpace(), {"name": "digits"}, recipe, sandbox={"wall_s": 300}, proxies=["synflow", "snip"])
    arch = SourceArch(FLOAT32_SOURCE)
    result = ev.evaluate(arch, seed=0)
    assert result.ok and result.accuracy is not None and not any(k.startswith("proxy_") for k in result.metrics)
    said = [r.getMessage() for r in caplog.records if "proxy" in r.getMessage()]
    assert said == [f"source {arch.key()}: no proxy scores (RuntimeError: Tensor dtype mismatch! Expected: Float, "
                    "Got: double)"]

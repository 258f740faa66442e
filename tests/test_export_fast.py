"""Fast twins of tests/test_export.py's slow model-source exports: which numbers reach the manifest's
`weights` entry, the trusted worker's or the sandbox's own (marked self-reported). The sandbox and the
trusted worker are stand-ins here that say what the real ones would (the slow tests run them):
what is under test is how `nas.export.untrusted` chooses the branch and records its outcome."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from nas.core.trial import SELF_REPORTED
from nas.export import untrusted
from nas.sandbox.verify import Verdict
from nas.search.spec import Component, SearchSpec
from nas.spaces.source.arch import SourceArch
from nas.train.result import TrainResult
from test_export import SMALL_MODEL, TINY_TRAIN, UNTRACEABLE

FORGED = TrainResult(valid_accuracy=99.8765, test_accuracy=99.8765, loss_curve=[0.01], epochs=1, params=1, flops=1)
OURS = TrainResult(valid_accuracy=42.0, test_accuracy=41.0, loss_curve=[1.5], epochs=1, params=386, flops=5000)
GRAPH = {"format": "onnx", "file": "model.onnx", "batch": "dynamic", "check": None, "onnx_error": None}
CHECK = {"method": "sandbox: model.py + model.pt", "max_abs_diff": 0.0, "passed": True}


class Stand:
    """The sandbox and the trusted worker as `export_untrusted` calls them, each call recorded."""

    def __init__(self, exportable: bool) -> None:
        self.exportable, self.calls = exportable, []

    def export_model_graph(self, source: str, **kw) -> tuple[Verdict, bytes]:
        self.calls.append("export_model_graph")
        if self.exportable:
            return Verdict(ok=True, stage="done", params=386, flops=5000, output_shape=[2, 10], layers=3,
                           graph="a" * 64), b"artifact"
        return Verdict(ok=True, stage="done", params=1, flops=1, output_shape=[2, 10], layers=3, self_reported=True,
                       export_error="not traceable"), b""

    def train_graphs(self, verdict: Verdict, artifact: bytes, *args, out: str, probe: int, **kw):
        self.calls.append("train_graphs")
        net = torch.nn.Linear(2, 10)
        save_file({k: v.contiguous() for k, v in net.state_dict().items()}, f"{out}/seed3.safetensors")
        save_file({"input": torch.zeros(1, 1, 8, 8), "output": torch.zeros(1, 10)}, f"{out}/probe.safetensors")
        return verdict, [OURS]

    def run_sandboxed(self, tmp: Path, source: str, num_classes: int, x, *, weights=None, reference=None,
                      train=None, seed: int = 0, limits=None, export=None):
        self.calls.append("run_sandboxed(train)" if train else "run_sandboxed")
        ok = Verdict(ok=True, stage="done")
        if reference is not None:
            return ok, [], {"reference": CHECK}
        if weights is not None:  # the ONNX writer, from the trained weights
            return ok, [], {"state_keys": ["weight", "bias"], "graph": GRAPH, "input_shape": [1, 1, 8, 8]}
        trained = [FORGED.to_dict()] if train else []  # what the model's code reports from inside
        return ok, trained, {"state_keys": [], "graph": GRAPH, "input_shape": [1, 1, 8, 8],
                             "io": (torch.zeros(1, 1, 8, 8), torch.zeros(1, 10))}


def export(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str, exportable: bool):
    stand, said = Stand(exportable), []
    for name in ("export_model_graph", "train_graphs", "run_sandboxed"):
        monkeypatch.setattr(untrusted, name, getattr(stand, name))
    spec = SearchSpec(space=Component("source"), strategy=Component("random"), evaluator=TINY_TRAIN, seed=3, trials=1)
    space = spec.build_space()
    built, graph, check, measured = untrusted.export_untrusted(
        spec.build_evaluator(space), spec, space, SourceArch(source), SimpleNamespace(params=1000), tmp_path, True,
        said.append)
    return built, measured, stand.calls, said


def test_a_graph_retrained_in_the_trusted_worker_gets_its_numbers_not_the_models(monkeypatch, tmp_path) -> None:
    """Twin of test_export.py::test_model_source_is_retrained_as_its_exported_graph_in_the_trusted_worker:
    a model that exports as a graph trains in the trusted worker only (never in the sandbox), and the
    manifest's accuracies, loss curve, params and FLOPs are the worker's and the parent's check's."""
    built, measured, calls, said = export(monkeypatch, tmp_path, SMALL_MODEL, exportable=True)
    assert "run_sandboxed(train)" not in calls and "train_graphs" in calls
    weights = built.weights
    assert weights["origin"] == "retrained" and weights["seed"] == 3 and "self_reported" not in weights
    assert (weights["valid_accuracy"], weights["loss_curve"]) == (42.0, [1.5])
    assert measured == {"params": 386, "flops": 5000}
    assert any(line.startswith("retraining the exported graph in the trusted worker: 1 epochs on digits")
               for line in said)
    assert not any("self-reported" in line for line in said)


def test_a_model_that_cannot_be_exported_retrains_in_the_sandbox_marked_self_reported(monkeypatch, tmp_path) -> None:
    """Twin of test_export.py::test_model_source_that_cannot_be_exported_is_retrained_in_the_sandbox_and_marked_
    self_reported: its numbers are the model's own, and the manifest says so."""
    built, measured, calls, said = export(monkeypatch, tmp_path, UNTRACEABLE, exportable=False)
    assert "train_graphs" not in calls and "run_sandboxed(train)" in calls
    weights = built.weights
    assert weights["origin"] == "retrained" and weights["self_reported"] is True
    assert weights["valid_accuracy"] == 99.8765 and "self-reported" in weights["note"]  # the forgery, marked
    assert any(line.startswith("retraining in the sandbox: 1 epochs on digits") for line in said)
    assert any(line.startswith("retrained: ") and line.endswith(SELF_REPORTED) for line in said), said


def test_code_compiled_from_a_block_file_is_checked_in_the_sandbox_never_here(monkeypatch, tmp_path) -> None:
    """Twin of test_export.py::test_block_file_exports_compiled_source_checked_in_the_sandbox (its
    `source_check.method` starts with "sandbox"): the PyTorch code a block file (an LLM's design)
    compiles to is checked only by a sandboxed child; our own generated code (NB201's) in this process."""
    from nas.export import trusted
    from nas.export.built import Built
    from nas.spaces.nader.space import BlockSpace
    from nas.spaces.nb201.space import NB201Space

    calls: list[str] = []

    def sandboxed(tmp, source, num_classes, x, **kw):
        calls.append("sandbox")
        return Verdict(ok=True, stage="done"), [], {"reference": CHECK}

    def imported(path):
        calls.append("imported here")
        raise AssertionError("imported in this process")

    monkeypatch.setattr(trusted, "run_sandboxed", sandboxed)
    monkeypatch.setattr(trusted, "_import_file", imported)
    net = torch.nn.Linear(4, 10)
    torch.save(net.state_dict(), tmp_path / "model.pt")
    spec = SimpleNamespace(evaluator=SimpleNamespace(params={}))
    built = Built(None, (1, 4), "class Network: ...", "nader", {}, 10)
    check = trusted.source_check(built, net, torch.randn(1, 4), tmp_path, spec, BlockSpace())
    assert calls == ["sandbox"] and check["method"].startswith("sandbox") and check["passed"]
    calls.clear()
    trusted.source_check(built, net, torch.randn(1, 4), tmp_path, spec, NB201Space())
    assert calls == ["imported here"]  # ours: checked in this process (the stand-in refuses, as a failed check)

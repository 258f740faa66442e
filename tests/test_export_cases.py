"""nas/export's pure pieces case by case (issue 52, the library mutation run): the retraining seed
and device, the sandbox limits sized to the weights, the refusals before any sandbox starts, the
output check at its tolerance, the child's report and io.pt read back field by field, --force's
replace rule, the trial chosen, and the weights entry. In-process: the sandbox child itself runs in
tests/test_export.py."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from nas.core.trial import SELF_REPORTED, TrialRecord
from nas.errors import RunDirError
from nas.export import ExportError, run_summary
from nas.export import graph as G
from nas.export import run as R
from nas.export import trusted as T
from nas.export import untrusted as U
from nas.export.built import Built, note_retraining, training_seed
from support.sources import TINY

NS = types.SimpleNamespace


def record(**kw: Any) -> TrialRecord:
    return TrialRecord(**{"trial": 3, "key": "k", "encoding": "e", "accuracy": 50.0, **kw})


# ---------------------------------------------------------------- seed, device, limits

@pytest.mark.parametrize("seeds, seed", [([7, 8], 7), ([0], 0), ([], 5), (None, 5)])
def test_a_retraining_takes_the_evaluator_s_first_seed_else_the_run_s(seeds, seed):
    assert training_seed(NS(seeds=seeds), NS(seed=5)) == seed


@pytest.mark.parametrize("accelerator, cuda, gpu", [
    ("gpu", False, True), ("gpu", True, True), ("auto", True, True), ("auto", False, False),
    ("cpu", True, False), ("cpu", False, False),
])
def test_the_sandbox_trains_on_the_gpu_when_asked_or_when_auto_finds_one(monkeypatch, accelerator, cuda, gpu):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert U._gpu(NS(engine=NS(accelerator=accelerator))) is gpu


def spec_with(sandbox: dict | None = None) -> Any:
    return NS(evaluator=NS(params={"sandbox": sandbox} if sandbox is not None else {}), seed=0)


@pytest.mark.parametrize("sandbox, params, file_mb, tmp_mb", [
    (None, None, 64, 1024),
    (None, 0, 64, 1024),
    (None, 1 << 20, 64, 1024),                # 6 MB of weights and 16 spare: under the default
    (None, 20 << 20, 136, 1024),              # 120 MB + 16
    (None, 100 << 20, 616, 2464),             # four weight-sized files: past the tmp default
    ({"file_mb": 700}, 100 << 20, 700, 2800),
    ({"tmp_mb": 4096}, 100 << 20, 616, 4096),
    (None, 11184810, 80, 1024),               # 63.999996 MB: rounded up to 64
    (None, 11184811, 81, 1024),               # 64.000002 MB: to 65
])
def test_the_sandbox_limits_make_room_for_the_weights_and_four_files_of_them(sandbox, params, file_mb, tmp_mb):
    limits = U.sandbox_limits(spec_with(sandbox), params)
    assert (limits.file_mb, limits.tmp_mb, limits.memory_mb, limits.wall_s) == (file_mb, tmp_mb, 8192, 3600.0)


def test_an_evaluator_that_does_not_train_cannot_export_model_source(tmp_path):
    with pytest.raises(ExportError) as info:
        U.export_untrusted(NS(trains=False, name="table"), None, NS(name="source"), None, record(), tmp_path,
                           True, print)
    assert str(info.value) == ("evaluator 'table' does not train: space 'source' is model source, rebuilt only "
                               "by retraining it in the sandbox; no network to export")


def test_model_source_that_does_not_parse_is_refused_before_a_child_starts(tmp_path):
    with pytest.raises(ExportError) as info:
        U.run_sandboxed(tmp_path, "def broken(:\n", 10, (1, 3, 8, 8), limits=U.sandbox_limits(spec_with(), None))
    assert str(info.value).startswith("model.py: ")


# ---------------------------------------------------------------- the output check

@pytest.mark.parametrize("out, ref, diff, passed", [
    ([1001.0, 0.0], [1000.0, 0.0], 1.0, True),          # at the tolerance: 1e-3 of the reference's 1000
    ([1001.0625, 0.0], [1000.0, 0.0], 1.0625, False),
    ([0.0, 0.0009765625], [0.0, 0.0], 0.0009765625, True),  # a scale of at least 1
    ([0.0, 0.001953125], [0.0, 0.0], 0.001953125, False),
    ([0.0, -0.5], [0.0, -0.5], 0.0, True),
])
def test_an_output_passes_within_the_tolerance_times_its_scale(out, ref, diff, passed):
    check = G.output_diff("m", torch.tensor(out, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64))
    assert check["method"] == "m" and check["max_abs_diff"] == diff
    assert check["passed"] is passed


def test_an_output_of_another_shape_fails_with_no_difference():
    assert G.output_diff("m", torch.zeros(2, 3), torch.zeros(2, 4)) == {"method": "m", "max_abs_diff": None,
                                                                         "passed": False}


def test_one_line_joins_whitespace_keeps_300_characters_and_names_the_type():
    assert G.one_line(ValueError("a\n  b\tc")) == "ValueError: a b c"
    assert G.one_line(KeyError()) == "KeyError"
    assert G.one_line(RuntimeError("x" * 301)) == "RuntimeError: " + "x" * 300
    assert G.one_line(RuntimeError("x" * 300)) == "RuntimeError: " + "x" * 300


# ---------------------------------------------------------------- the child's report, read back

def check(**kw: Any) -> dict[str, Any]:
    return {"method": "m", "max_abs_diff": 0.0, "passed": True, **kw}


def report(**kw: Any) -> dict[str, Any]:
    return {"input_shape": [1, 3, 8, 8], "reference": check(),
            "graph": {"format": "onnx", "file": "model.onnx", "check": check(batches=[1, 7]), "batch": "dynamic"},
            "state_keys": ["w"], **kw}


def write(folder: Path, data: Any, files: tuple[str, ...] = ("model.pt", "model.onnx")) -> Path:
    for name in files:
        (folder / name).write_bytes(b"x")
    (folder / "report.json").write_text(json.dumps(data), encoding="utf-8")
    return folder / "report.json"


def refused(path: Path, why: str, exported: bool = True, compared: bool = True) -> None:
    with pytest.raises(ExportError) as info:
        U._read_report(path, exported, compared)
    assert str(info.value) == f"model.py in the sandbox: malformed export report ({why})"


def test_a_well_formed_report_is_read_whole(tmp_path):
    assert U._read_report(write(tmp_path, report()), True, True) == report()
    ts = report(graph={"format": "torchscript", "file": "model.torchscript.pt", "check": None, "batch": None,
                       "onnx_error": "e" * 399})
    assert U._read_report(write(tmp_path, ts, ("model.pt", "model.torchscript.pt")), True, False) == ts
    none = report(graph={"format": None, "file": None, "check": None, "torchscript_error": "t"})
    assert U._read_report(write(tmp_path, none, ("model.pt",)), True, False)["graph"]["format"] is None
    assert U._read_report(write(tmp_path, {"input_shape": [2, 1]}, ()), False, False) == {"input_shape": [2, 1]}
    five = {"input_shape": [1, 1, 1, 1, 1]}
    assert U._read_report(write(tmp_path, five, ()), False, False) == five


@pytest.mark.parametrize("data, why", [
    ({"input_shape": [1]}, "ValueError: input_shape"),
    ({"input_shape": [1, 1, 1, 1, 1, 1]}, "ValueError: input_shape"),
    ({"input_shape": [1, 0]}, "ValueError: input_shape"),
    ({"input_shape": [1, True]}, "ValueError: input_shape"),
    ({"input_shape": "1,3"}, "ValueError: input_shape"),
    ({}, "KeyError: 'input_shape'"),
])
def test_a_report_s_input_shape_is_two_to_five_positive_integers(tmp_path, data, why):
    refused(write(tmp_path, data, ()), why, exported=False, compared=False)


@pytest.mark.parametrize("change, why", [
    ({"reference": check(method=1)}, "ValueError: check"),
    ({"reference": check(method="m" * 40)}, "ValueError: check"),
    ({"reference": check(passed=1)}, "ValueError: check"),
    ({"reference": check(max_abs_diff=-0.1)}, "ValueError: check"),
    ({"reference": check(max_abs_diff=True)}, "ValueError: check"),
    ({"reference": check(batches=[0])}, "ValueError: check"),
    ({"reference": check(batches=[1.0])}, "ValueError: check"),
    ({"reference": check(batches=7)}, "ValueError: check"),
    ({"graph": {**report()["graph"], "format": "tflite"}}, "ValueError: graph format"),
    ({"graph": {**report()["graph"], "file": "model.torchscript.pt"}}, "ValueError: graph format"),
    ({"graph": {**report()["graph"], "batch": None}}, "ValueError: graph batch"),
    ({"graph": {**report()["graph"], "check": check(passed="yes")}}, "ValueError: check"),
    ({"graph": {**report()["graph"], "dynamic_error": "e" * 400}}, "ValueError: dynamic_error"),
    ({"graph": {**report()["graph"], "onnx_error": 1}}, "ValueError: onnx_error"),
    ({"state_keys": ["k" * 1000]}, "ValueError: state_keys"),
    ({"state_keys": [1]}, "ValueError: state_keys"),
    ({"state_keys": "w"}, "ValueError: state_keys"),
])
def test_each_field_of_an_export_report_is_checked(tmp_path, change, why):
    refused(write(tmp_path, report(**change)), why)


def test_the_check_fields_pass_at_their_bounds(tmp_path):
    ok = report(reference=check(method="m" * 39, max_abs_diff=None, batches=None),
                graph={**report()["graph"], "check": check(max_abs_diff=0, batches=[1])})
    assert U._read_report(write(tmp_path, ok), True, True) == ok
    fixed = report(graph={**report()["graph"], "batch": "fixed"})
    assert U._read_report(write(tmp_path, fixed), True, True)["graph"]["batch"] == "fixed"
    unchecked = report(reference="not looked at")
    assert U._read_report(write(tmp_path, unchecked), True, False) == unchecked


def test_a_link_a_missing_file_or_a_large_report_is_refused(tmp_path):
    path = write(tmp_path, report(), ("model.pt",))
    refused(path, "ValueError: model.onnx missing or not a regular file")
    (tmp_path / "model.onnx").mkdir()
    refused(path, "ValueError: model.onnx missing or not a regular file")
    (tmp_path / "model.onnx").rmdir()
    (tmp_path / "model.onnx").symlink_to(tmp_path / "model.pt")
    refused(path, "ValueError: model.onnx is a link")
    (tmp_path / "model.onnx").unlink()
    path.write_bytes(b" " * U.REPORT_MAX + b"{}")
    refused(path, "ValueError: too large")
    path.write_bytes(b" " * (U.REPORT_MAX - 2) + b"{}")
    refused(path, "KeyError: 'input_shape'", exported=False, compared=False)
    path.write_bytes(b"[1, 2")
    with pytest.raises(ExportError, match=r"^model\.py in the sandbox: malformed export report \(ProtocolError: "):
        U._read_report(path, False, False)


def test_io_pt_holds_the_input_and_an_output_of_its_batch_by_the_classes(tmp_path):
    path = tmp_path / "io.pt"
    torch.save({"input": torch.zeros(2, 3), "output": torch.ones(2, 10)}, path)
    x, out = U._read_io(path, [2, 3], 10)
    assert x.shape == (2, 3) and out.shape == (2, 10)
    for shape, classes in (([2, 4], 10), ([2, 3], 9)):
        with pytest.raises(ExportError) as info:
            U._read_io(path, shape, classes)
        assert str(info.value) == "model.py in the sandbox: malformed io.pt (ValueError: unexpected tensors)"
    torch.save({"input": [1], "output": torch.ones(2, 10)}, path)
    with pytest.raises(ExportError, match=r"\(ValueError: unexpected tensors\)$"):
        U._read_io(path, [2, 3], 10)
    link = tmp_path / "link.pt"
    link.symlink_to(path)
    with pytest.raises(ExportError, match=r"^model\.py in the sandbox: malformed io\.pt \(ValueError: a link\)$"):
        U._read_io(link, [2, 3], 10)


# ---------------------------------------------------------------- --force, the run summary

def test_force_replaces_only_an_earlier_export(tmp_path, monkeypatch):
    run = tmp_path / "run"
    (run / "export").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    out = run / "export"
    with pytest.raises(ExportError) as info:
        R._check_replaceable(out, run)
    assert str(info.value) == f"{out}: not an earlier export (no export.json); --force only replaces one"
    (out / "export.json").write_text("{}")
    R._check_replaceable(out, run)
    (out / "state.json").write_text("{}")
    (out / "history.jsonl").write_text("")
    with pytest.raises(ExportError, match=r": not an earlier export \(holds history\.jsonl\); --force only"):
        R._check_replaceable(out, run)
    (tmp_path / "file").write_text("")
    with pytest.raises(ExportError, match=r"file: not an earlier export \(not a directory\); --force only"):
        R._check_replaceable(tmp_path / "file", run)
    with pytest.raises(ExportError) as info:
        R._check_replaceable(run, run)
    assert str(info.value) == f"{run}: is the run directory; --force only replaces an earlier export"
    with pytest.raises(ExportError) as info:
        R._check_replaceable(tmp_path, run)
    assert str(info.value) == (f"{tmp_path}: is a parent of the run directory ({run}); "
                               "--force only replaces an earlier export")
    monkeypatch.chdir(out)
    with pytest.raises(ExportError) as info:
        R._check_replaceable(out, tmp_path / "elsewhere")
    assert str(info.value) == f"{out}: is the current directory; --force only replaces an earlier export"


def test_a_run_summary_is_that_of_a_finished_run(tmp_path):
    with pytest.raises(RunDirError, match=rf"^{tmp_path}/none: no such run directory$"):
        run_summary(tmp_path / "none")
    with pytest.raises(RunDirError) as info:
        run_summary(tmp_path)
    assert str(info.value) == (f"{tmp_path}/summary.json: missing (not a finished search run; "
                               "resume it with nas search first)")
    (tmp_path / "summary.json").write_text("{}")
    assert run_summary(tmp_path) == tmp_path / "summary.json"


def test_a_file_s_sha256_is_read_in_chunks(tmp_path):
    import hashlib

    (tmp_path / "f").write_bytes(b"a" * ((1 << 20) + 5))
    assert R._sha256(tmp_path / "f") == hashlib.sha256(b"a" * ((1 << 20) + 5)).hexdigest()


# ---------------------------------------------------------------- rebuilding, trusted

class Ev:
    """An evaluator as rebuild sees it: what it gives, scripted."""

    name = "ev"

    def __init__(self, sub: nn.Module | None = None, trains: bool = False, scores: tuple[float, float] = (0, 0),
                 **extra: Any) -> None:
        self.sub, self.trains, self.scores = sub, trains, scores
        self.__dict__.update(extra)

    def provenance(self, arch: Any) -> dict[str, Any]:
        return {"origin": "supernet", "checkpoint": "c.pt", "sha256": "ab"}

    def weights(self, arch: Any) -> nn.Module | None:
        return self.sub

    def rescore(self, sub: nn.Module, arch: Any) -> tuple[float, float]:
        return self.scores

    def input_shape(self, arch: Any) -> tuple[int, ...]:
        return (1, 3, 16, 12)

    def network_config(self) -> dict[str, Any]:
        return {"num_classes": 10, "in_channels": 3}


class Space:
    source_kind = "kind"

    def source(self, arch: Any, num_classes: int, in_channels: int, size: int, *rest: Any) -> str:
        return f"src {num_classes} {in_channels} {size}"


def test_an_evaluator_with_neither_weights_nor_training_nor_a_table_s_size_has_nothing_to_export():
    with pytest.raises(ExportError) as info:
        T.rebuild(Ev(num_classes=10), None, Space(), None, record(), True, print)
    assert str(info.value) == "evaluator 'ev' gives no weights and does not train: no network to export"


@pytest.mark.parametrize("valid, recorded, ok", [(51.0, 50.0, True), (49.0, 50.0, True), (51.01, 50.0, False),
                                                 (48.99, 50.0, False), (10.123456, None, True)])
def test_stored_weights_are_refused_when_they_score_more_than_a_point_off_the_search(valid, recorded, ok):
    said: list[str] = []
    ev = Ev(nn.Linear(2, 2), scores=(valid, 33.33333))
    if not ok:
        with pytest.raises(ExportError) as info:
            T.rebuild(ev, None, Space(), None, record(accuracy=recorded), True, said.append)
        assert str(info.value) == (f"trial 3: evaluator 'ev': the network now scores {valid:.2f}%, the search "
                                   f"recorded {recorded:.2f}% (its weights or the data changed since)")
        return
    built = T.rebuild(ev, None, Space(), None, record(accuracy=recorded), True, said.append)
    assert (built.net, built.shape, built.source, built.source_kind, built.num_classes) == (
        ev.sub, (1, 3, 16, 12), "src 10 3 12", "kind", 10)
    assert built.weights == {"origin": "supernet", "checkpoint": "c.pt", "sha256": "ab",
                             "valid_accuracy": round(valid, 4), "test_accuracy": 33.3333}
    assert said == ["weights from evaluator 'ev' (checkpoint c.pt, sha256 ab), rescoring",
                    f"rescored: valid {valid:.2f}% (the search recorded {recorded}), test 33.33%"]


def test_a_trained_trial_is_rebuilt_at_its_seed_and_data_untrained_with_no_train():
    from nas.spaces.nb201.arch import NB201Cell
    from nas.spaces.nb201.space import NB201Space

    space, cell = NB201Space(channels=4, cells_per_stage=1), NB201Cell(("nor_conv_1x1",) * 6)
    ev = Ev(trains=True, seeds=[9, 1], data=NS(shape=(1, 8, 8), num_classes=3), build=None,
            data_cfg={"name": "digits"})
    built = T.rebuild(ev, NS(seed=4), space, cell, record(), False, print)
    assert (built.shape, built.num_classes, built.source_kind) == ((1, 1, 8, 8), 3, space.source_kind)
    assert built.weights == {"seed": 9, "data": {"name": "digits"}, "origin": "initial",
                             "note": "--no-train: seeded initial weights, not trained"}
    assert "def __init__(self, num_classes=3, channels=4, cells_per_stage=1, in_channels=1):" in built.source
    assert tuple(built.net(torch.zeros(2, 1, 8, 8)).shape) == (2, 3)


def test_a_table_s_cell_gets_seeded_initial_weights_at_the_table_s_size():
    from nas.spaces.nb201.arch import NB201Cell
    from nas.spaces.nb201.space import NB201Space

    space, cell = NB201Space(), NB201Cell(("skip_connect",) * 6)
    built = T.rebuild(Ev(num_classes=7, resolution=16), NS(seed=4), space, cell, record(), True, print)
    assert (built.shape, built.num_classes, built.weights["origin"], built.weights["seed"]) == ((1, 3, 16, 16), 7,
                                                                                                "initial", 4)
    assert built.weights["note"].endswith(f"with `nas train '{cell.encode()}' data=cifar10 ...`")
    torch.manual_seed(4)
    again = space.build(cell, 7, 3, 16)
    assert all(torch.equal(a, b) for a, b in zip(built.net.state_dict().values(), again.state_dict().values()))


def test_a_retraining_is_noted_in_the_weights_entry_and_self_reported_when_the_sandbox_trained_it():
    ev = NS(recipe=NS(to_dict=lambda: {"epochs": 2}), engine=NS(to_dict=lambda: {"kind": "plain"}))
    result = NS(valid_accuracy=90.123, test_accuracy=89.5, epochs=2, wall_seconds=3.25, loss_curve=[1.0, 0.5])
    weights: dict[str, Any] = {"seed": 0}
    said: list[str] = []
    note_retraining(weights, result, ev, said.append)
    assert weights == {"seed": 0, "origin": "retrained", "recipe": {"epochs": 2}, "engine": {"kind": "plain"},
                       "valid_accuracy": 90.123, "test_accuracy": 89.5, "loss_curve": [1.0, 0.5]}
    assert said == ["retrained: valid 90.12%, test 89.50% (2 epochs, 3.2 s)"]
    note_retraining(weights, result, ev, said.append, self_reported=True)
    assert said[1] == f"retrained: valid 90.12%, test 89.50% (2 epochs, 3.2 s), {SELF_REPORTED}"
    assert weights["self_reported"] is True and weights["note"].endswith(f"FLOPs are {SELF_REPORTED}")


def test_our_own_source_is_checked_in_process_and_a_broken_one_is_a_failed_check(tmp_path):
    net = nn.Linear(3, 2)
    torch.save(net.state_dict(), tmp_path / "model.pt")
    (tmp_path / "model.py").write_text("from torch import nn\n\n\ndef Network(num_classes=2):\n"
                                       "    return nn.Linear(3, num_classes)\n", encoding="utf-8")
    built = Built(net, (1, 3), "", "k", {}, 2)
    x = torch.randn(4, 3)
    trusted = NS(source_trusted=True)
    assert T.source_check(built, net, x, tmp_path, None, trusted) == {
        "method": "in-process: model.py + model.pt", "max_abs_diff": 0.0, "passed": True}
    (tmp_path / "model.py").write_text("def Network(num_classes=2):\n    raise KeyError('w')\n", encoding="utf-8")
    assert T.source_check(built, net, x, tmp_path, None, trusted) == {
        "method": "in-process: model.py + model.pt", "max_abs_diff": None, "passed": False, "error": "KeyError: 'w'"}



class FixedBatch(nn.Module):
    """A network whose code fixes the batch size at 1."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).reshape(1, 2)


def test_a_plain_network_exports_with_a_dynamic_batch_checked_at_1_and_7(tmp_path):
    torch.manual_seed(0)
    entry = G.export_graph(nn.Linear(3, 2), torch.randn(1, 3), tmp_path)
    assert (entry["format"], entry["file"], entry["batch"], "dynamic_error" in entry) == (
        "onnx", "model.onnx", "dynamic", False)
    assert entry["check"]["passed"] is True and entry["check"]["batches"] == [1, 7]
    assert entry["check"]["method"] in ("onnxruntime", "onnx.reference") and (tmp_path / "model.onnx").is_file()


def test_a_network_that_fails_at_batch_7_exports_a_fixed_batch_and_says_why(tmp_path):
    entry = G.export_graph(FixedBatch(), torch.randn(1, 3), tmp_path)
    assert (entry["format"], entry["batch"], entry["check"]["batches"]) == ("onnx", "fixed", [1])
    assert entry["dynamic_error"].startswith("the network fails at batch 7: RuntimeError: ")


# ---------------------------------------------------------------- the sandboxed child's work, in-process

class Reporter:
    """The child's pipe to its parent: what it was told, in order."""

    def __init__(self) -> None:
        self.told: list = []

    def enter(self, stage: str) -> None:
        self.told.append(stage)

    def send(self, **msg: Any) -> None:
        self.told.append(msg)


def job(tmp_path: Path, trainer=None, **request: Any):
    from nas.sandbox.limits import Limits
    from nas.sandbox.worker import Job

    (tmp_path / "model.py").write_text(TINY, encoding="utf-8")
    request = {"num_classes": 5, "input_shape": [1, 3, 6, 6], "weights": False, "reference": False, "seed": 0,
               "train": None, **request}
    return Job(request, tmp_path, {str(tmp_path / "model.py"): "model.py"}, Limits(), Reporter(), trainer)


def test_the_child_exports_the_initial_network_when_given_no_weights(tmp_path):
    from nas.export import child

    j = job(tmp_path)
    verdict = child.export(j)
    assert (verdict.ok, verdict.stage, verdict.output_shape, verdict.params) == (True, "done", [1, 5], 137)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["input_shape"] == [1, 3, 6, 6] and report["state_keys"] == ["conv.weight", "conv.bias",
                                                                               "fc.weight", "fc.bias"]
    assert report["graph"]["format"] == "onnx" and "reference" not in report
    io_pt = torch.load(tmp_path / "io.pt", weights_only=True)
    torch.manual_seed(0)
    assert torch.equal(io_pt["input"], torch.randn(1, 3, 6, 6)) and tuple(io_pt["output"].shape) == (1, 5)
    assert (tmp_path / "model.pt").is_file() and j.reporter.told[-1] == "done"


def test_the_child_loads_given_weights_strictly_and_compares_with_the_reference(tmp_path):
    from nas.export import child
    from nas.sandbox.worker import import_file

    torch.manual_seed(1)
    j = job(tmp_path, weights=True, reference=True, export=False)
    net = import_file(tmp_path / "model.py", "m_cases").Network(5)
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    x = torch.randn(2, 3, 6, 6)
    torch.save(x, tmp_path / "input.pt")
    with torch.no_grad():
        torch.save(net(x), tmp_path / "reference.pt")
    verdict = child.export(j)
    report = json.loads((tmp_path / "report.json").read_text())
    assert verdict.output_shape == [2, 5] and report["input_shape"] == [2, 3, 6, 6]
    assert report["reference"] == {"method": "sandbox: model.py + model.pt", "max_abs_diff": 0.0, "passed": True}
    assert "graph" not in report and not (tmp_path / "io.pt").exists()


def test_exporting_from_a_trained_graph_s_weights_takes_only_the_network_s_entries(tmp_path):
    from nas.export import child
    from nas.sandbox.worker import import_file

    (tmp_path / "model.py").write_text(TINY, encoding="utf-8")
    net = import_file(tmp_path / "model.py", "m_cases2").Network(5)
    torch.save({**net.state_dict(), "extra.buffer": torch.zeros(1)}, tmp_path / "weights.pt")
    verdict = child.export(job(tmp_path, weights=True, export=True))
    assert verdict.ok and json.loads((tmp_path / "report.json").read_text())["graph"]["format"] == "onnx"
    from nas.sandbox.worker import Stop

    with pytest.raises(Stop) as info:  # strictly, an entry the network lacks is refused
        child.export(job(tmp_path, weights=True))
    assert info.value.verdict.stage == "instantiate" and "extra.buffer" in info.value.verdict.error


def test_grey_input_is_fed_as_rgb_to_a_network_whose_first_layer_takes_three_channels(tmp_path):
    from nas.export import child

    verdict = child.export(job(tmp_path, input_shape=[1, 1, 6, 6]))
    assert verdict.ok and json.loads((tmp_path / "report.json").read_text())["input_shape"] == [1, 3, 6, 6]


def test_the_child_trains_under_the_first_seed_and_reports_the_training(tmp_path):
    from nas.export import child

    seen = []

    def trainer(net: nn.Module, seed: int, rgb: bool):
        seen.append((seed, rgb, torch.equal(net.fc.bias, fresh.fc.bias)))
        return NS(to_dict=lambda: {"epochs": 1})

    from nas.sandbox.worker import import_file, instantiate

    fresh = instantiate(import_file(job(tmp_path).workdir / "model.py", "m_cases3"), "model.py", 5, seed=7)
    j = job(tmp_path, trainer, train={"seeds": [7, 8]}, input_shape=[1, 1, 6, 6])
    assert child.export(j).ok and seen == [(7, True, True)]
    assert {"trained": {"epochs": 1}} in j.reporter.told and j.reporter.told.index("train") < j.reporter.told.index(
        {"trained": {"epochs": 1}})


# ---------------------------------------------------------------- the trial chosen, and a whole trusted export


def fake_run(run_dir: Path, records: list[dict], trust: bool = False) -> Path:
    """A finished NB201 table run with these history lines (no search ran)."""
    from nas.search.spec import Component, SearchSpec

    params = {"trust_self_reported": True} if trust else {}
    spec = SearchSpec(space=Component("nb201", {"channels": 4, "cells_per_stage": 1}), strategy=Component("random"),
                      evaluator=Component("table", params), seed=2, trials=len(records))
    run_dir.mkdir(parents=True)
    lines = [{"trial": i, "key": "k", "encoding": "e", "accuracy": None, "metrics": {}, "params": None,
              "flops": None, "error": "boom", **r} for i, r in enumerate(records)]
    (run_dir / "history.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    (run_dir / "summary.json").write_text(json.dumps({"trials": len(records), "spec": spec.to_dict()}))
    return run_dir


def ok(acc: float, **kw: Any) -> dict:
    return {"accuracy": acc, "error": None, **kw}


def test_the_best_trial_is_chosen_by_the_summary_s_trust_rule(tmp_path):
    from nas.export.selection import load_trial

    forged = ok(99.0, metrics={"self_reported": True})
    run = fake_run(tmp_path / "a", [ok(50.0), forged, ok(60.0), ok(60.0)])
    spec, best = load_trial(run, None)
    assert best.trial == 2 and spec.seed == 2
    assert load_trial(fake_run(tmp_path / "t", [ok(50.0), forged], trust=True), None)[1].trial == 1
    with pytest.raises(ExportError) as info:
        load_trial(fake_run(tmp_path / "f", [forged, {}]), None)
    assert str(info.value) == (f"{tmp_path / 'f'}: every successful trial is self-reported and the evaluator does "
                               "not trust those (evaluator.trust_self_reported=false); choose one with --trial N")
    with pytest.raises(ExportError) as info:
        load_trial(fake_run(tmp_path / "n", [{}, {}]), None)
    assert str(info.value) == f"{tmp_path / 'n'}: no successful trial (2 trials, all failed); nothing to export"


@pytest.mark.parametrize("trial, message", [
    (0, None), (1, None),
    (2, "{r}: trial 2 failed (boom); nothing to export"),
    (3, "{r}: trial 3 was screened out (score 0.5), never evaluated; nothing to export"),
    (4, "{r}: trial 4 out of range (history.jsonl has trials 0..3)"),
    (-1, "{r}: trial -1 out of range (history.jsonl has trials 0..3)"),
])
def test_a_chosen_trial_must_have_been_evaluated_and_succeeded(tmp_path, trial, message):
    from nas.export.selection import load_trial

    run = fake_run(tmp_path / "r", [ok(50.0), ok(40.0, metrics={"self_reported": True}), {},
                                    {"screened": True, "score": 0.5}])
    if message is None:
        assert load_trial(run, trial)[1].trial == trial
        return
    with pytest.raises(ExportError) as info:
        load_trial(run, trial)
    assert str(info.value) == message.format(r=run)


def test_a_summary_without_a_readable_spec_is_one_line(tmp_path):
    from nas.export.selection import load_trial

    (tmp_path / "summary.json").write_text(json.dumps({"spec": {"space": 1}}))
    with pytest.raises(RunDirError, match=rf"^{tmp_path}/summary\.json: no readable 'spec' \("):
        load_trial(tmp_path, None)
    (tmp_path / "summary.json").write_text("{}")
    with pytest.raises(RunDirError, match=rf"^{tmp_path}/summary\.json: no readable 'spec' \(KeyError: 'spec'\)$"):
        load_trial(tmp_path, None)


def test_a_table_run_exports_into_export_or_export_trial_n_with_its_manifest(tmp_path, monkeypatch):
    from nas.spaces.nb201.arch import NB201Cell

    monkeypatch.chdir(tmp_path)
    cell = NB201Cell(("skip_connect", "nor_conv_1x1", "avg_pool_3x3", "none", "skip_connect", "nor_conv_3x3"))
    line = ok(70.0, key=cell.key(), encoding=cell.encode(), params=1, flops=2)
    run = fake_run(tmp_path / "run", [line, {**line, "accuracy": 60.0}])
    said: list[str] = []
    manifest = R.export_run(run, say=said.append)
    out = run / "export"
    assert manifest["out"] == str(out) and manifest["run_dir"] == str(run) and manifest["trial"] == 0
    assert (out / "export.json").read_text() == json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    assert sorted(manifest["files"]) == ["model.onnx", "model.pt", "model.py"] and (out.stat().st_mode & 0o777) == 0o755
    assert (manifest["nasflow_version"], manifest["seed"], manifest["evaluator"]) == (__import__("nas").__version__,
                                                                                     2, "table")
    assert (manifest["search_params"], manifest["search_flops"], manifest["input_shape"]) == (1, 2, [1, 3, 32, 32])
    assert said[0] == f"exporting trial 0 (nb201, key {cell.key()}) to {out}"
    with pytest.raises(ExportError, match=rf"^{out}: already exists \(remove it or pass --force\)$"):
        R.export_run(run)
    assert R.export_run(run, trial=1, train=False)["out"] == str(run / "export-trial1")
    assert R.export_run(run, force=True)["trial"] == 0
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []
    wrong = fake_run(tmp_path / "wrong", [{**line, "key": "0123456789abcdef"}])
    with pytest.raises(ExportError) as info:
        R.export_run(wrong, tmp_path / "elsewhere")
    assert str(info.value) == (f"{wrong}: trial 0: encoding decodes to key {cell.key()}, history says "
                               "0123456789abcdef (space changed since the search?)")
    assert not (tmp_path / "elsewhere").exists()

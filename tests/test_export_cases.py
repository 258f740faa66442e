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
        return (1, 3, 16, 16)

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
                                                 (48.99, 50.0, False), (10.0, None, True)])
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
        ev.sub, (1, 3, 16, 16), "src 10 3 16", "kind", 10)
    assert built.weights == {"origin": "supernet", "checkpoint": "c.pt", "sha256": "ab",
                             "valid_accuracy": round(valid, 4), "test_accuracy": 33.3333}
    assert said == ["weights from evaluator 'ev' (checkpoint c.pt, sha256 ab), rescoring",
                    f"rescored: valid {valid:.2f}% (the search recorded {recorded}), test 33.33%"]


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

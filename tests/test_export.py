"""`nas export`: real tiny runs (NB201 table, NB201 supernet, model source, block file) exported
to source + state dict + ONNX, each file checked independently of the manifest's own claims."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

import nas
from nas.cli.main import main as nas_main
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import Component, SearchSpec
from nas.spaces.nader.arch import BlockArch
from nas.spaces.source.arch import SourceArch

ROOT = Path(__file__).resolve().parents[1]
DIGITS = {"name": "digits", "root": None, "split_file": None}
TINY_TRAIN = Component("train", {
    "data": DIGITS, "engine": {}, "channels": 4, "cells_per_stage": 1, "budget": {"params": 2e4, "flops": 1e6},
    "recipe": {"epochs": 1, "batch_size": 64, "train_subset": 256, "valid_subset": 100, "test_subset": 100}})
# RGB stem on grey digits: the sandbox feeds it the grey channel three times, as in the search.
SMALL_MODEL = '''
import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        return self.fc(x.mean((2, 3)))
'''


def search(spec: SearchSpec, run_dir: Path) -> dict:
    space = spec.build_space()
    return SearchLoop(spec, run_dir, LocalExecutor(spec.build_evaluator(space), None), progress=False).run_search()


def fake_run(run_dir: Path, space: Component, arch, evaluator: Component = TINY_TRAIN) -> Path:
    """A finished one-trial run (open-ended spaces need an LLM strategy to search for real)."""
    spec = SearchSpec(space=space, strategy=Component("random"), evaluator=evaluator, seed=3, trials=1)
    run_dir.mkdir(parents=True)
    record = {"trial": 0, "key": arch.key(), "encoding": arch.encode(), "accuracy": 50.0, "metrics": {},
              "params": 1000, "flops": 1000, "error": None}
    (run_dir / "history.jsonl").write_text(json.dumps(record) + "\n")
    best = {k: record[k] for k in ("accuracy", "key", "encoding", "trial", "params", "flops")}
    (run_dir / "summary.json").write_text(json.dumps({"best": best, "trials": 1, "spec": spec.to_dict()}))
    return run_dir


def export(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exc:
        nas_main(["export", *args])
        raise SystemExit(0)
    captured = capsys.readouterr()
    assert exc.value.code == 0, captured.err
    out = Path(args[args.index("--out") + 1]) if "--out" in args else None
    manifest = json.loads(((out or Path(args[0]) / "export") / "export.json").read_text())
    assert f"to {manifest['out']}" in captured.out
    return manifest


def export_error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        nas_main(["export", *args])
    last = capsys.readouterr().err.strip().splitlines()[-1]  # progress lines come first
    assert exc.value.code == 2 and last.startswith("nas: error: ")
    return last


def load_network(folder: Path, num_classes: int) -> torch.nn.Module:
    """Imports model.py: only ever our own generated files or this test's own model source."""
    spec = importlib.util.spec_from_file_location(f"exported_{abs(hash(folder))}", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    net = module.Network(num_classes=num_classes)
    net.load_state_dict(torch.load(folder / "model.pt", weights_only=True))  # strict: every key, every shape
    return net.eval()


def onnx_output(path: Path, x: torch.Tensor) -> torch.Tensor:
    import onnx
    from onnx.reference import ReferenceEvaluator

    return torch.from_numpy(ReferenceEvaluator(onnx.load(str(path))).run(None, {"input": x.numpy()})[0])


def check_files(folder: Path, manifest: dict, graph: str = "model.onnx") -> None:
    names = {p.name for p in folder.iterdir()}
    assert names == {"model.py", "model.pt", graph, "export.json"}
    assert set(manifest["files"]) == names - {"export.json"}
    for name, info in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert info == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    leftovers = [p.name for p in folder.parent.iterdir() if p.name.endswith(".tmp")]
    assert not leftovers


@pytest.fixture(scope="module")
def table_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("table") / "run"
    spec = SearchSpec(space=Component("nb201", {"channels": 4, "cells_per_stage": 1}),
                      strategy=Component("random"), evaluator=Component("table"), seed=0, trials=3)
    return run, search(spec, run)


def test_table_run_exports_source_weights_and_onnx_that_agree(table_run, capsys, tmp_path):
    run, summary = table_run
    out = tmp_path / "exported"
    manifest = export(capsys, str(run), "--out", str(out))
    check_files(out, manifest)
    best = summary["best"]
    assert {k: manifest[k] for k in ("trial", "key", "encoding", "accuracy")} == {
        k: best[k] for k in ("trial", "key", "encoding", "accuracy")}
    assert (manifest["params"], manifest["flops"]) == (best["params"], best["flops"])
    assert manifest["weights"]["origin"] == "initial" and "no weights" in manifest["weights"]["note"]
    assert manifest["input_shape"] == [1, 3, 32, 32] and manifest["graph"]["check"]["passed"]
    assert (manifest["nasflow_version"], manifest["torch"]) == (nas.__version__, torch.__version__)
    assert manifest["source_check"] == {"method": "in-process: model.py + model.pt", "max_abs_diff": 0.0,
                                        "passed": True}
    net = load_network(out, 10)
    assert sum(p.numel() for p in net.parameters()) == best["params"]
    x = torch.randn(2, 3, 32, 32)[:1]
    with torch.no_grad():
        expected = net(x)
    assert torch.allclose(onnx_output(out / "model.onnx", x), expected, atol=1e-5)
    assert "from nas" not in (out / "model.py").read_text()  # standalone: torch only


def test_onnx_graph_runs_in_onnxruntime_at_any_batch_size(table_run, capsys, tmp_path):
    """A graph traced at batch 1 with a fixed axis is refused by onnxruntime at batch 7; the command
    says the input's batch is any (not the [1, 3, 32, 32] it was traced at)."""
    import onnxruntime

    run, _ = table_run
    out = tmp_path / "exported"
    with pytest.raises(SystemExit) as exc:
        nas_main(["export", str(run), "--out", str(out)])
        raise SystemExit(0)
    said = capsys.readouterr()
    assert exc.value.code == 0, said.err
    assert "writing ONNX (TorchScript if that fails) for input [N, 3, 32, 32] (N: any batch size)\n" in said.err
    assert "model.onnx (any batch size; onnxruntime: max abs diff " in said.out and "[1, 3, 32, 32]" not in said.err
    manifest = json.loads((out / "export.json").read_text())
    assert manifest["graph"]["batch"] == "dynamic" and manifest["graph"]["check"]["batches"] == [1, 7]
    assert manifest["graph"]["check"]["method"] == "onnxruntime"
    net = load_network(out, 10)
    session = onnxruntime.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (1, 7):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            expected = net(x)
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        assert got.shape == (batch, 10) and torch.allclose(got, expected, atol=1e-4)


def test_table_run_export_says_its_weights_are_untrained_and_the_accuracy_is_the_tables(table_run, capsys,
                                                                                         tmp_path):
    run, summary = table_run
    with pytest.raises(SystemExit) as exc:
        nas_main(["export", str(run), "--out", str(tmp_path / "e")])
        raise SystemExit(0)
    line = capsys.readouterr().out.strip()
    assert exc.value.code == 0
    accuracy = f"{summary['best']['accuracy']:.2f}%"
    assert f"(table accuracy {accuracy} (not these weights: untrained), " in line and "weights: initial" in line
    assert f"({accuracy}" not in line  # never the bare number beside the initial weights


def test_a_network_whose_code_fixes_the_batch_exports_a_fixed_batch_graph(tmp_path):
    from nas.export.graph import export_graph

    class FixedBatch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(12, 3)

        def forward(self, x):
            return self.fc(x.reshape(1, 12))  # the batch is 1 in its code, not in the exporter's trace

    graph = export_graph(FixedBatch(), torch.randn(1, 3, 2, 2), tmp_path)
    assert graph["format"] == "onnx" and graph["batch"] == "fixed" and graph["check"]["passed"]
    assert graph["check"]["batches"] == [1] and "dynamic_error" in graph


def test_trial_flag_default_out_and_no_silent_overwrite(table_run, capsys):
    run, _ = table_run
    first = json.loads((run / "history.jsonl").read_text().splitlines()[0])
    manifest = export(capsys, str(run), "--trial", "0", "--out", str(run / "export-trial0"))
    assert (manifest["trial"], manifest["key"]) == (0, first["key"])
    assert manifest["out"] == str(run / "export-trial0")
    err = export_error(capsys, str(run), "--trial", "0", "--out", str(run / "export-trial0"))
    assert "export-trial0: already exists" in err


def test_errors_are_one_line_and_leave_nothing(table_run, capsys, tmp_path):
    run, summary = table_run
    missing = tmp_path / "nope"
    assert export_error(capsys, str(missing)) == f"nas: error: {missing}: no such run directory"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "summary.json: missing" in export_error(capsys, str(empty))
    out = tmp_path / "out"
    err = export_error(capsys, str(run), "--trial", "7", "--out", str(out))
    assert err == f"nas: error: {run}: trial 7 out of range (history.jsonl has trials 0..2)"
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "summary.json").write_text(json.dumps({**summary, "best": None, "trials": 3}))
    assert export_error(capsys, str(failed)).endswith("no successful trial (3 trials, all failed); nothing to export")
    assert not out.exists() and not (failed / "export").exists()


FAIL_FAST = """
import sys
from nas.cli.main import main
try:
    main(["export", sys.argv[1]])
except SystemExit as stop:
    print(stop.code, "torch" in sys.modules)
"""


def test_a_path_that_is_no_run_fails_before_torch_loads(tmp_path):
    """`nas export runs/nope` took 6 s to say the directory is missing: torch and the export machinery
    loaded first. The path is checked first (no timing asserted: whether torch was imported)."""
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    for path, said in ((tmp_path / "nope", "no such run directory"),
                       (tmp_path / "empty", "summary.json: missing (not a finished search run")):
        out = subprocess.run([sys.executable, "-c", FAIL_FAST, str(path)], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert out.stdout.split() == ["2", "False"], out.stderr  # exit 2, torch never imported
        assert len(out.stderr.splitlines()) == 1 and out.stderr.startswith(f"nas: error: {path}") and said in out.stderr


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")
def test_onnx_failure_falls_back_to_torchscript_with_the_reason(monkeypatch, tmp_path):
    from nas.export.graph import export_graph

    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(torch.onnx, "export", broken)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2))
    x = torch.randn(1, 3, 6, 6)
    net(x)
    graph = export_graph(net, x, tmp_path)
    assert graph["format"] == "torchscript" and graph["onnx_error"] == "RuntimeError: exporter exploded"
    assert graph["check"]["passed"] and not (tmp_path / "model.onnx").exists()
    assert torch.allclose(torch.jit.load(str(tmp_path / graph["file"]))(x), net(x))


@pytest.fixture(scope="module")
def supernet_run(tmp_path_factory):
    from supernets.train import SupernetSettings, train_supernet

    root = tmp_path_factory.mktemp("supernet")
    space = {"channels": 4, "cells_per_stage": 1}
    trained = train_supernet({"name": "nb201", **space}, {}, DIGITS,
                             SupernetSettings(epochs=1, batch_size=64, train_subset=64, val_subset=50,
                                              recal_batches=1), seed=0, out_dir=root / "sn", progress=False)
    spec = SearchSpec(space=Component("nb201", space), strategy=Component("random"), seed=0, trials=2,
                      evaluator=Component("supernet", {"checkpoint": str(trained.path), "data": DIGITS,
                                                       "recal_batches": 1, "batch_size": 64, "val_subset": 50}))
    return root / "run", search(spec, root / "run"), trained


def test_supernet_run_exports_the_subnet_with_inherited_weights(supernet_run, capsys, tmp_path):
    from nas.spaces.nb201.space import NB201Space
    from supernets.base import SUPERNETS

    run, summary, trained = supernet_run
    manifest = export(capsys, str(run), "--out", str(tmp_path / "e"))
    check_files(tmp_path / "e", manifest)
    weights = manifest["weights"]
    assert weights["origin"] == "supernet" and weights["checkpoint_sha256"] == trained.sha256
    assert weights["valid_accuracy"] == summary["best"]["accuracy"]  # rescored as the search scored it
    assert manifest["source_check"]["passed"] and manifest["graph"]["check"]["method"] == "onnxruntime"
    net = load_network(tmp_path / "e", 10)
    ckpt = torch.load(trained.path, weights_only=True)
    supernet = SUPERNETS.create("nb201", dict(ckpt["supernet"]), space=NB201Space(4, 1))
    supernet.load_state_dict(ckpt["state_dict"])
    assert torch.equal(net.classifier.weight, supernet.net.classifier.weight)  # inherited, not initial
    x = torch.randn(1, *manifest["input_shape"][1:])
    with torch.no_grad():
        assert torch.allclose(onnx_output(tmp_path / "e" / "model.onnx", x), net(x), atol=1e-5)


def test_supernet_checkpoint_changed_or_missing_is_refused(supernet_run, capsys, tmp_path):
    run, _, trained = supernet_run
    sidecar = trained.path.with_suffix(".json")
    original = sidecar.read_text()
    try:
        sidecar.write_text(json.dumps({**json.loads(original), "sha256": "0" * 64}))
        err = export_error(capsys, str(run), "--out", str(tmp_path / "a"))
        assert f"supernet checkpoint {trained.path}: sha256 {trained.sha256[:16]} differs" in err
        moved = trained.path.with_name("elsewhere.pt")
        trained.path.rename(moved)
        try:
            assert f"supernet checkpoint not found at {trained.path}" in export_error(capsys, str(run))
        finally:
            moved.rename(trained.path)
    finally:
        sidecar.write_text(original)
    assert not (tmp_path / "a").exists()


def test_supernet_checkpoint_changed_so_it_cannot_be_read_is_refused_as_changed(supernet_run, capsys, tmp_path):
    """The checksum is checked before the subnet is extracted: a checkpoint changed since training
    that no longer loads is reported as changed, not as what loading it raised."""
    run, _, trained = supernet_run
    original = trained.path.read_bytes()
    try:
        torch.save({**torch.load(trained.path, weights_only=True), "state_dict": {}}, trained.path)
        changed = hashlib.sha256(trained.path.read_bytes()).hexdigest()
        err = export_error(capsys, str(run), "--out", str(tmp_path / "a"))
        assert err.endswith(f"supernet checkpoint {trained.path}: sha256 {changed[:16]} differs "
                            f"from {trained.sha256[:16]} in {trained.path.stem}.json (changed since training)")
    finally:
        trained.path.write_bytes(original)
    assert not (tmp_path / "a").exists()


def test_model_source_is_built_and_exported_only_in_the_sandbox(capsys, tmp_path):
    run = fake_run(tmp_path / "run", Component("source"), SourceArch(SMALL_MODEL))
    manifest = export(capsys, str(run), "--no-train")
    out = run / "export"
    check_files(out, manifest)
    assert (out / "model.py").read_text() == SMALL_MODEL
    assert manifest["input_shape"] == [1, 3, 8, 8] and manifest["weights"]["origin"] == "initial"
    assert manifest["params"] == 8 * 27 + 16 + 8 * 10 + 10 and manifest["graph"]["check"]["passed"]
    assert manifest["source_check"] == {"method": "sandbox: model.py + model.pt", "max_abs_diff": 0.0,
                                        "passed": True}  # a fresh child loaded model.pt into model.py
    net = load_network(out, 10)  # this test's own source, so importing it here is fine
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(onnx_output(out / "model.onnx", x), net(x), atol=1e-5)


def test_model_source_with_an_evaluator_that_does_not_train_is_refused_in_one_line(tmp_path):
    """Model source never loads here: only retraining in the sandbox rebuilds it, asked of the
    evaluator's capability (`trains`), not its name. The table is a real evaluator that does not train."""
    from nas.evaluators.table import TableEvaluator
    from nas.export import ExportError
    from nas.export.untrusted import export_untrusted
    from nas.spaces.nb201.space import NB201Space
    from nas.spaces.source.space import SourceSpace

    with pytest.raises(ExportError, match=r"^evaluator 'table' does not train: space 'source' is model source, "
                                          r"rebuilt only by retraining it in the sandbox; no network to export$"):
        export_untrusted(TableEvaluator(NB201Space()), None, SourceSpace(), SourceArch(SMALL_MODEL), None, tmp_path,
                         True, print)  # refused before the spec or the trial record is read
    assert not any(tmp_path.iterdir())


def test_model_source_that_breaks_the_policy_fails_in_one_line(capsys, tmp_path):
    target = tmp_path / "escaped.txt"
    hostile = SMALL_MODEL + f"\nopen({str(target)!r}, 'w').write('x')\n"
    run = fake_run(tmp_path / "run", Component("source"), SourceArch(hostile))
    err = export_error(capsys, str(run), "--no-train")
    assert "policy: writing outside the sandbox directory is not allowed" in err
    assert not target.exists() and not (run / "export").exists()


# Forges the training reports the sandbox sends (`Reporter.send`): 99.8765 % and a loss curve [0.01].
FORGE_REPORTS = """

def _forge():
    from nas.sandbox import worker
    from nas.train.result import TrainResult

    send = worker.Reporter.send

    def forged(self, **message):
        if "trained" in message:
            message["trained"] = TrainResult(valid_accuracy=99.8765, test_accuracy=99.8765, loss_curve=[0.01],
                                              epochs=1, wall_seconds=1.0, device_seconds=1.0, params=1,
                                              flops=1).to_dict()
        return send(self, **message)

    worker.Reporter.send = forged


_forge()
"""
# The same network with a data-dependent branch: torch.export cannot trace it.
UNTRACEABLE = SMALL_MODEL.replace("        x = torch.relu(", "        if float(x.mean()) > -1e9:\n            x = x + 0\n"
                                  "        x = torch.relu(")


@pytest.mark.slow
def test_model_source_is_retrained_as_its_exported_graph_in_the_trusted_worker(capsys, tmp_path):
    """A model that forges the sandbox's training reports gets none of its numbers into export.json:
    its graph trains in the trusted worker, and model.pt holds that graph's trained parameters."""
    run = fake_run(tmp_path / "run", Component("source"), SourceArch(SMALL_MODEL + FORGE_REPORTS))
    nas_main(["export", str(run)])
    captured = capsys.readouterr()
    assert "retraining the exported graph in the trusted worker: 1 epochs on digits" in captured.err
    assert "self-reported" not in captured.out + captured.err
    manifest = json.loads((run / "export" / "export.json").read_text())
    check_files(run / "export", manifest)
    weights = manifest["weights"]
    assert weights["origin"] == "retrained" and weights["seed"] == 3 and "self_reported" not in weights
    assert weights["valid_accuracy"] != 99.8765 and weights["loss_curve"] != [0.01] and len(weights["loss_curve"]) == 1
    assert manifest["params"] == 8 * 27 + 16 + 8 * 10 + 10 and manifest["source_check"]["passed"]
    assert manifest["graph"]["check"]["passed"]
    state = torch.load(run / "export" / "model.pt", weights_only=True)
    assert set(state) == {"conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                          "bn.num_batches_tracked", "fc.weight", "fc.bias"}
    fresh = _small_network(3)  # the graph starts from the run's seed's initial weights, then trains in the worker
    assert not torch.equal(state["conv.weight"], fresh.conv.weight) and not torch.equal(state["fc.weight"],
                                                                                        fresh.fc.weight)


@pytest.mark.slow
def test_model_source_that_cannot_be_exported_is_retrained_in_the_sandbox_and_marked_self_reported(capsys, tmp_path):
    run = fake_run(tmp_path / "run", Component("source"), SourceArch(UNTRACEABLE + FORGE_REPORTS))
    nas_main(["export", str(run)])
    captured = capsys.readouterr()
    assert "retraining in the sandbox: 1 epochs on digits" in captured.err
    assert "self-reported by the model's own code, not verified" in captured.out.splitlines()[-1]
    manifest = json.loads((run / "export" / "export.json").read_text())
    weights = manifest["weights"]
    assert weights["origin"] == "retrained" and weights["self_reported"] is True
    assert weights["valid_accuracy"] == 99.8765 and "self-reported" in weights["note"]  # the forgery, marked
    net = load_network(run / "export", 10)
    assert not torch.equal(net.fc.weight, _small_network(3).fc.weight)


def _small_network(seed: int) -> torch.nn.Module:
    """SMALL_MODEL's `Network` as torch.manual_seed(seed) initialises it (this test's own source)."""
    namespace: dict = {}
    exec(compile(SMALL_MODEL, "small_model.py", "exec"), namespace)
    torch.manual_seed(seed)
    return namespace["Network"](num_classes=10)


def test_model_source_retrained_in_the_sandbox_starts_from_its_seeds_initial_weights(tmp_path):
    """The export child (`export`) trains a fresh `Network` drawn under the run's seed: with a
    trainer that leaves it as it is, model.pt holds torch.manual_seed(seed)'s weights."""
    from nas.export.child import export
    from nas.sandbox.limits import Limits
    from nas.sandbox.worker import Job, Reporter
    from nas.train.result import TrainResult

    (tmp_path / "model.py").write_text(SMALL_MODEL)
    request = {"num_classes": 10, "input_shape": [1, 1, 8, 8], "train": {"seeds": [3]}, "seed": 0,
               "weights": False, "reference": False}
    read, write = os.pipe()
    try:
        job = Job(request, tmp_path, {}, Limits(), Reporter(write), lambda net, seed, rgb: TrainResult(10.0, 10.0))
        assert export(job).ok and '"trained"' in os.read(read, 1 << 16).decode()
    finally:
        os.close(read)
        os.close(write)
    net = load_network(tmp_path, 10)
    torch.manual_seed(3)
    assert torch.equal(torch.load(tmp_path / "model.pt", weights_only=True)["conv.weight"],
                       type(net)(num_classes=10).conv.weight)


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True])
def test_block_file_exports_compiled_source_checked_in_the_sandbox(train, capsys, tmp_path):
    arch = BlockArch.from_text((ROOT / "tests/data/blocks/residual.txt").read_text())
    run = fake_run(tmp_path / "run", Component("nader"), arch)
    manifest = export(capsys, str(run), *([] if train else ["--no-train"]))
    check_files(run / "export", manifest)
    assert manifest["weights"]["origin"] == ("retrained" if train else "initial")
    assert manifest["source_check"]["method"].startswith("sandbox") and manifest["source_check"]["passed"]
    assert manifest["input_shape"] == [1, 1, 8, 8] and manifest["graph"]["check"]["passed"]


def test_force_replaces_only_an_earlier_export(table_run, capsys, tmp_path, monkeypatch):
    run, _ = table_run
    kept = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    out = tmp_path / "exported"
    export(capsys, str(run), "--out", str(out))
    export(capsys, str(run), "--out", str(out), "--force")  # an earlier export: replaced
    (tmp_path / "mine.txt").write_text("keep me")
    monkeypatch.chdir(tmp_path)
    lookalike = tmp_path / "lookalike"  # export.json beside a run's summary.json
    lookalike.mkdir()
    for name in ("export.json", "summary.json"):
        (lookalike / name).write_text("{}")
    (tmp_path / "plain").mkdir()
    for target, why in [(run, "is the run directory"), (run.parent, "is a parent of the run directory"),
                        ("", "is the current directory"), (".", "is the current directory"),
                        (lookalike, "not an earlier export (holds summary.json)"),
                        (tmp_path / "plain", "not an earlier export (no export.json)"),
                        (tmp_path / "mine.txt", "not an earlier export (not a directory)")]:
        err = export_error(capsys, str(run), "--out", str(target), "--force")
        assert why in err and "--force only replaces" in err, err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == kept
    assert (tmp_path / "mine.txt").read_text() == "keep me" and (lookalike / "summary.json").exists()


@pytest.mark.parametrize("odd", ["fifo", "folder"])
def test_export_report_naming_a_graph_file_that_is_no_regular_file_is_one_line(tmp_path, odd):
    """The child could leave a FIFO (copying it would block) or a folder where model.onnx goes."""
    from nas.export import ExportError
    from nas.export.untrusted import _read_report

    (tmp_path / "model.pt").write_bytes(b"x")
    os.mkfifo(tmp_path / "model.onnx") if odd == "fifo" else (tmp_path / "model.onnx").mkdir()
    (tmp_path / "report.json").write_text(json.dumps({
        "input_shape": [1, 3, 8, 8], "state_keys": [],
        "graph": {"format": "onnx", "file": "model.onnx", "batch": "dynamic", "check": None, "onnx_error": None}}))
    with pytest.raises(ExportError, match=r"malformed export report \(ValueError: model.onnx missing or not a regular file\)"):
        _read_report(tmp_path / "report.json", exported=True, compared=False)


@pytest.mark.parametrize("raw, why", [
    (b'{"input_shape": [1, 3, 8, 8], "input_shape": [1, 3, 8, 8], "state_keys": []}', "a key twice in one object"),
    (b'{"input_shape": [1, 3, 8, 99999999999999999999999], "state_keys": []}', "past int64"),
    (b'{"input_shape": [1, 3, 8, 8], "state_keys": ["\xff"]}', "not UTF-8"),
], ids=["duplicate key", "past int64", "not utf-8"])
def test_export_report_is_parsed_as_strictly_as_every_child_message(tmp_path, raw, why):
    from nas.export import ExportError
    from nas.export.untrusted import _read_report

    (tmp_path / "report.json").write_bytes(raw)
    with pytest.raises(ExportError, match=rf"malformed export report \(ProtocolError: [^)]*{why}"):
        _read_report(tmp_path / "report.json", exported=False, compared=False)


def test_model_source_that_fills_its_work_folder_is_stopped_in_one_line(tmp_path):
    """The export child writes its files to a host folder (its /tmp is a capped tmpfs, this is not):
    nasflow watches the folder and stops the child past `tmp_mb`, so many files cannot fill the disk."""
    from nas.export import ExportError
    from nas.export.untrusted import run_sandboxed
    from nas.sandbox.limits import Limits

    hostile = SMALL_MODEL + "\nfor i in range(64):\n    open(f'fill-{i}', 'wb').write(b'x' * (1 << 20))\n"
    with pytest.raises(ExportError, match=r"^model.py in the sandbox: limits: wrote more than 4 MB to its work folder"):
        run_sandboxed(tmp_path, hostile, 10, (1, 3, 8, 8), limits=Limits(wall_s=120, tmp_mb=4))
    assert not any(tmp_path.iterdir())

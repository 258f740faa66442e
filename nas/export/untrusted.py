"""Exporting model source that is not ours: it only ever runs in the sandbox.

Model source (spaces that are not `trusted`) and generated source that is not
`source_trusted` (the code compiled from a block file) run in a child started by
the public sandbox API (`nas.sandbox.verify.run_child`, `python -m nas.export.child`
under the same isolation, rlimits, audit policy, empty environment and
process-group kill as verification), which writes its files into a private
directory for this process to collect and check field by field. Retrained, a model
that exports as a graph trains in a limited trusted worker (`_from_graph`,
`nas.sandbox.trusted`), so no number comes from its code; one that cannot be exported trains in the sandbox, marked `self_reported`.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file

from nas.core.trial import SELF_REPORTED, TrialRecord
from nas.evaluators.train import SANDBOX_DEFAULTS
from nas.export import ExportError
from nas.export.built import Built, note_retraining, training_seed
from nas.export.graph import one_line
from nas.sandbox.limits import Limits
from nas.sandbox.protocol import decode
from nas.sandbox.verify import Verdict, check_syntax, conclude, export_model_graph, run_child, train_graphs
from nas.train.result import TrainResult

REPORT_MAX = 1 << 20  # bytes of the sandboxed child's report.json read back (it lists the state dict's keys)


def sandbox_limits(spec: Any, params: float | None) -> Limits:
    """The run's `evaluator.sandbox` limits (train's defaults), with room for the written files."""

    limits = {**SANDBOX_DEFAULTS, **(spec.evaluator.params.get("sandbox") or {})}
    if params:
        limits["file_mb"] = max(limits["file_mb"], math.ceil(params * 4 * 1.5 / (1 << 20)) + 16)
    # The work folder holds up to four weight-sized files (weights.pt in; model.pt, the graph, io.pt out).
    limits["tmp_mb"] = max(limits["tmp_mb"], 4 * limits["file_mb"])
    return Limits(**limits)


def export_untrusted(ev: Any, spec: Any, space: Any, arch: Any, record: TrialRecord, tmp: Path, train: bool,
                     say: Callable[[str], None]) -> tuple[Built, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Build (and retrain) the model, writing model.py, model.pt and the graph into `tmp`; then
    check model.py + model.pt in a fresh sandbox. Returns (built, graph entry, source check,
    measured params and FLOPs). Untrusted networks never load here, so only an evaluator that
    trains (`Evaluator.trains`: its data, recipe, engine and seeds) can rebuild them. Retrained,
    a model that exports as a graph trains in the trusted worker, as the search's evaluator trains it, and
    model.pt holds that graph's trained parameters (so every number is ours); one that cannot
    be exported retrains in the sandbox, and the manifest marks its numbers `self_reported`."""
    if not ev.trains:
        raise ExportError(f"evaluator '{ev.name}' does not train: space '{space.name}' is model source, "
                          "rebuilt only by retraining it in the sandbox; no network to export")
    seed = training_seed(ev, spec)
    data = ev.data
    source = space.source(arch, data.num_classes, data.shape[0], data.shape[1])
    if not train:
        say("building the model in the sandbox (initial weights)")
        return _in_sandbox(ev, spec, space, arch, record, tmp, seed, source, None, say)

    say("exporting the model as a graph in the sandbox")
    verdict, artifact = export_model_graph(arch.source, seeds=[seed], num_classes=data.num_classes,
                                       input_shape=(2, *data.shape), limits=sandbox_limits(spec, record.params),
                                       batch=ev.recipe.batch_size)
    if not verdict.ok:
        raise ExportError(f"model.py in the sandbox: {verdict.error}")
    if not verdict.self_reported:
        return _from_graph(ev, spec, space, arch, tmp, seed, source, verdict, artifact, say)
    say(f"the model cannot be exported as a graph ({verdict.export_error}): it retrains inside the sandbox, "
        f"so its numbers are {SELF_REPORTED}")
    gpu = _gpu(ev)
    request = {"data": ev.data_cfg, "recipe": ev.recipe.to_dict(), "engine": ev.engine.to_dict(),
               "seeds": [seed], "gpu": gpu, "threads": torch.get_num_threads()}
    r = ev.recipe
    say(f"retraining in the sandbox: {r.epochs} epochs on {ev.data_cfg['name']} (batch {r.batch_size}, "
        f"lr {r.lr}), seed {seed}")
    return _in_sandbox(ev, spec, space, arch, record, tmp, seed, source, request, say)


def _gpu(ev: Any) -> bool:
    return ev.engine.accelerator == "gpu" or (ev.engine.accelerator == "auto" and torch.cuda.is_available())


def _from_graph(ev: Any, spec: Any, space: Any, arch: Any, tmp: Path, seed: int, source: str, verdict: Verdict,
                artifact: bytes, say: Callable[[str], None]) -> tuple[Built, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Train the checked graph `artifact` (seed `seed`'s network) in the trusted training worker
    (`train_graphs`), which writes its trained weights and its output on an input drawn under
    `spec.seed`; model.pt is that state dict (the graph's tensors sit at the model's parameter
    paths), restricted to the keys of `Network`'s state dict, which the sandbox loads to write the
    ONNX graph."""

    data, r = ev.data, ev.recipe
    say(f"retraining the exported graph in the trusted worker: {r.epochs} epochs on {ev.data_cfg['name']} (batch {r.batch_size}, "
        f"lr {r.lr}), seed {seed}, engine {ev.engine.kind}")
    limits = sandbox_limits(spec, verdict.params)
    with tempfile.TemporaryDirectory(prefix="nas-trained-", ignore_cleanup_errors=True) as out:
        verdict, trained = train_graphs(verdict, artifact, ev.data_cfg, r.to_dict(), ev.engine.to_dict(), [seed],
                                        limits, gpu=_gpu(ev), threads=torch.get_num_threads(), label="model.py",
                                        out=out, probe=spec.seed)
        if not verdict.ok:
            raise ExportError(f"retraining the exported graph: {verdict.error}")
        result = trained[0]
        if result.terminated:
            raise ExportError(f"retraining terminated early: {result.terminated}")
        state = load_file(Path(out, f"seed{seed}.safetensors"))
        probe = load_file(Path(out, "probe.safetensors"))
    x, ref = probe["input"], probe["output"]
    weights: dict[str, Any] = {"seed": seed, "data": ev.data_cfg}
    note_retraining(weights, result, ev, say)
    torch.save(state, tmp / "model.pt")
    say("writing ONNX (TorchScript if that fails) in the sandbox from the trained weights")
    report = run_sandboxed(tmp, arch.source, data.num_classes, x, weights=tmp / "model.pt", export=True,
                           limits=limits)[2]
    keys = report["state_keys"]
    if not set(keys) <= set(state):
        raise ExportError("model.py in the sandbox: its state dict has entries the exported graph lacks")
    torch.save({k: state[k] for k in keys}, tmp / "model.pt")
    (tmp / "model.py").write_text(source, encoding="utf-8")
    built = Built(None, tuple(x.shape), source, space.source_kind, weights, data.num_classes)
    say("checking model.py + model.pt in a fresh sandbox against the trained graph")
    check = run_sandboxed(tmp, arch.source, data.num_classes, x, weights=tmp / "model.pt", reference=ref,
                          limits=limits)[2]["reference"]
    return built, report["graph"], check, {"params": verdict.params, "flops": verdict.flops}


def _in_sandbox(ev: Any, spec: Any, space: Any, arch: Any, record: TrialRecord, tmp: Path, seed: int, source: str,
                request: dict | None, say: Callable[[str], None]
                ) -> tuple[Built, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Build the model in the sandbox, retrained there under `request` (self-reported) or
    with its initial weights (None)."""

    data = ev.data
    verdict, trained, report = run_sandboxed(tmp, arch.source, data.num_classes, (1, *data.shape), train=request,
                                             seed=seed, limits=sandbox_limits(spec, record.params))
    weights: dict[str, Any] = {"seed": seed, "data": ev.data_cfg}
    if request is not None:
        try:
            result = TrainResult.from_untrusted(trained[0], max_epochs=ev.recipe.epochs)
        except ValueError as err:
            raise ExportError(f"model.py in the sandbox: {err}") from None
        if result.terminated:
            raise ExportError(f"retraining terminated early: {result.terminated}")
        note_retraining(weights, result, ev, say, self_reported=True)
    else:
        weights.update(origin="initial", note="--no-train: initial weights (torch.manual_seed(0), as the "
                                              "sandbox instantiates), not trained")
    (tmp / "model.py").write_text(source, encoding="utf-8")
    built = Built(None, tuple(report["input_shape"]), source, space.source_kind, weights, data.num_classes)
    say("checking model.py + model.pt in a fresh sandbox")
    x, out = report.pop("io")
    check = run_sandboxed(tmp, arch.source, data.num_classes, x, weights=tmp / "model.pt", reference=out,
                          limits=sandbox_limits(spec, verdict.params))[2]["reference"]
    return built, report["graph"], check, {"params": verdict.params, "flops": verdict.flops}


def run_sandboxed(tmp: Path, source: str, num_classes: int, x_or_shape: torch.Tensor | tuple[int, ...], *,
                  weights: Path | None = None, reference: torch.Tensor | None = None, train: dict | None = None,
                  seed: int = 0, limits: Limits, export: bool | None = None) -> tuple[Verdict, list, dict[str, Any]]:
    """Run `source` in a sandboxed child: build `Network`, load `weights` or train (or keep
    the initial weights); with `export` (default: without `weights`), export the graph into
    `tmp` (and, without `weights`, save model.pt there); with `reference`, compare outputs.
    Returns (verdict, training reports, checked report)."""
    export = weights is None if export is None else export
    shape = tuple(x_or_shape.shape) if isinstance(x_or_shape, torch.Tensor) else tuple(x_or_shape)
    verdict = check_syntax(source, "model.py")
    if verdict is not None:
        raise ExportError(f"model.py: {verdict.error}")
    with tempfile.TemporaryDirectory(prefix="nas-export-", ignore_cleanup_errors=True) as work:
        Path(work, "model.py").write_text(source, encoding="utf-8")
        if isinstance(x_or_shape, torch.Tensor):
            torch.save(x_or_shape, Path(work, "input.pt"))
        if weights is not None:
            shutil.copyfile(weights, Path(work, "weights.pt"))
        if reference is not None:
            torch.save(reference, Path(work, "reference.pt"))
        request = {"files": {"candidate": "model.py"}, "num_classes": num_classes, "input_shape": list(shape),
                   "limits": asdict(limits), "train": train, "seed": seed, "weights": weights is not None,
                   "reference": reference is not None, "export": export}
        run = run_child("nas.export.child", request, limits, args=(work,), workdir=work)
        verdict = conclude(run, limits)
        if not verdict.ok:
            raise ExportError(f"model.py in the sandbox: {verdict.error}")
        report = _read_report(Path(work, "report.json"), export, reference is not None)
        if train and len(run.trained) != 1:
            raise ExportError(f"model.py in the sandbox: {len(run.trained)} training reports for 1 seed")
        if export:
            for name in ("model.pt" if weights is None else None, report["graph"]["file"]):
                if name:
                    shutil.copyfile(Path(work, name), tmp / name)
        if weights is None:
            report["io"] = _read_io(Path(work, "io.pt"), report["input_shape"], num_classes)
        return verdict, run.trained, report


def _read_io(path: Path, shape: list[int], num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The child's input and output, for re-checking model.py + model.pt in a fresh child
    (`weights_only` unpickles tensors and containers only, never code)."""
    try:
        if path.is_symlink():
            raise ValueError("a link")
        io = torch.load(path, weights_only=True)
        x, out = io["input"], io["output"]
        if not (isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor) and list(x.shape) == shape
                and list(out.shape) == [shape[0], num_classes]):
            raise ValueError("unexpected tensors")
        return x, out
    except Exception as err:  # noqa: BLE001  (anything the child could have left there)
        raise ExportError(f"model.py in the sandbox: malformed io.pt ({one_line(err)})") from None


def _read_report(path: Path, exported: bool, compared: bool) -> dict[str, Any]:
    """report.json from the child, checked field by field (untrusted code wrote next to it)."""
    try:
        for name in ("report.json", "model.pt", "model.onnx", "model.torchscript.pt", "io.pt"):
            if Path(path.parent, name).is_symlink():  # the policy forbids links; this does not rely on it
                raise ValueError(f"{name} is a link")
        if path.stat().st_size > REPORT_MAX:
            raise ValueError("too large")
        report = decode(path.read_bytes())  # strict, as every message from a child (a ProtocolError is a ValueError)
        shape = report["input_shape"]
        if not (isinstance(shape, list) and 2 <= len(shape) <= 5 and all(type(n) is int and n > 0 for n in shape)):
            raise ValueError("input_shape")
        if compared:
            _check_diff(report["reference"])
        if exported:
            graph = report["graph"]
            if graph.get("format") not in ("onnx", "torchscript", None) or graph.get("file") not in (
                    {"onnx": "model.onnx", "torchscript": "model.torchscript.pt", None: None}[graph["format"]],):
                raise ValueError("graph format")
            if graph["check"] is not None:
                _check_diff(graph["check"])
            if graph.get("batch") not in ({"dynamic", "fixed"} if graph["format"] == "onnx" else {None}):
                raise ValueError("graph batch")
            for key in ("onnx_error", "torchscript_error", "dynamic_error"):
                if not (graph.get(key) is None or (isinstance(graph[key], str) and len(graph[key]) < 400)):
                    raise ValueError(key)
            for name in ("model.pt", graph["file"]):  # copied out next: regular files only (no FIFO, no folder)
                if name and not Path(path.parent, name).is_file():
                    raise ValueError(f"{name} missing or not a regular file")
            keys = report["state_keys"]
            if not (isinstance(keys, list) and all(isinstance(k, str) and len(k) < 1000 for k in keys)):
                raise ValueError("state_keys")
        return report
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ExportError(f"model.py in the sandbox: malformed export report ({one_line(err)})") from None


def _check_diff(check: Any) -> None:
    d = check["max_abs_diff"]
    if not (isinstance(check["method"], str) and len(check["method"]) < 40 and type(check["passed"]) is bool
            and (d is None or (type(d) in (int, float) and d >= 0))
            and (check.get("batches") is None
                 or (isinstance(check["batches"], list) and all(type(n) is int and n > 0 for n in check["batches"])))):
        raise ValueError("check")



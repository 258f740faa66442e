"""Export a run's best (or a chosen) trial: PyTorch source, state dict, ONNX and a manifest.

Weights come from where they exist: a supernet run extracts the subnet with
its inherited weights (BatchNorm recalibrated, as the search scored it); a
training run stores no weights, so the architecture is retrained with the
run's own data, recipe, engine and seed (or, with `train=False`, left at its
seeded initial weights); a table run has none, so the weights are initial.

Networks and their PyTorch source come from the space (`SearchSpace.build`,
`SearchSpace.source`), built in-process from our own modules. Model source
(spaces that are not `trusted`) and generated source that is not
`source_trusted` (the code compiled from a block file) are untrusted: they only ever run in
a sandboxed child (`python -m nas.export WORKDIR`, the same rlimits, audit
policy, stripped environment and process-group kill as `nas.sandbox`), which
writes its files into its private directory for this process to collect.
Everything is written into a temporary sibling of the output directory and
renamed into place at the end, so a failure leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from nas.errors import NasError, RunDirError
from nas.search.record import TrialRecord, best_record, read_history

GRAPH_TOLERANCE = 1e-3  # max abs diff allowed, times max(1, |output|): float32 op order differs
REPORT_MAX = 64 << 10  # bytes of the sandboxed child's report.json read back


class ExportError(NasError):
    """The trial cannot be exported (failed trial, mismatching checkpoint, sandbox failure)."""


# --- choosing the trial -------------------------------------------------------

def load_trial(run_dir: Path, trial: int | None) -> tuple[Any, TrialRecord]:
    """(SearchSpec, the trial's record: the best by the summary's rule when `trial` is None)."""
    from nas.io import read_json
    from nas.search.loop import trusts_self_reported
    from nas.search.spec import SearchSpec

    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise RunDirError(f"{summary_path}: missing (not a finished search run; resume it with nas search first)")
    summary = read_json(summary_path)
    try:
        spec = SearchSpec.from_dict(summary["spec"])
    except (KeyError, TypeError, ValueError) as err:
        raise RunDirError(f"{summary_path}: no readable 'spec' ({type(err).__name__}: {err})") from None
    history = read_history(run_dir / "history.jsonl")
    by_trial = {r.trial: r for r in history}
    if trial is None:
        best = best_record(history, trusts_self_reported(summary["spec"]))  # the summary's rule
        if best is None and any(r.accuracy is not None for r in history):
            raise ExportError(f"{run_dir}: every successful trial is self-reported and the evaluator does not "
                              "trust those (evaluator.trust_self_reported=false); choose one with --trial N")
        if best is None:
            raise ExportError(f"{run_dir}: no successful trial ({summary.get('trials', len(history))} trials, "
                              "all failed); nothing to export")
        return spec, best
    if trial not in by_trial:
        raise ExportError(f"{run_dir}: trial {trial} out of range (history.jsonl has trials 0..{len(history) - 1})")
    record = by_trial[trial]
    if record.accuracy is None:
        raise ExportError(f"{run_dir}: trial {trial} failed ({record.error}); nothing to export")
    return spec, record


# --- ONNX with a TorchScript fallback, and the output check --------------------

def export_graph(net: nn.Module, x: torch.Tensor, folder: Path) -> dict[str, Any]:
    """Write `model.onnx` (legacy TorchScript-based exporter: needs only the `onnx`
    package) or, if that fails, `model.torchscript.pt`; check its output against `net`'s."""
    net.eval()
    with torch.no_grad():
        ref = net(x)
    path = folder / "model.onnx"
    try:
        importlib.import_module("onnx")  # torch.onnx.export needs it: fail here, with a clear reason

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["input"],
                              output_names=["logits"])
        return {"format": "onnx", "file": path.name, "check": check_onnx(path, x, ref)}
    except Exception as err:  # noqa: BLE001  (any exporter failure means: fall back)
        path.unlink(missing_ok=True)
        onnx_error = _one_line(err)
    path = folder / "model.torchscript.pt"
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(net, x)
            traced.save(str(path))
            out = torch.jit.load(str(path))(x)
        return {"format": "torchscript", "file": path.name, "onnx_error": onnx_error,
                "check": _diff("torch.jit.load", out, ref)}
    except Exception as err:  # noqa: BLE001
        path.unlink(missing_ok=True)
        return {"format": None, "file": None, "onnx_error": onnx_error, "torchscript_error": _one_line(err),
                "check": None}


def check_onnx(path: Path, x: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """Run the model with onnxruntime if installed, else onnx's reference evaluator;
    if neither can run it, onnx.checker's verdict alone."""
    import onnx

    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    feed = {"input": x.numpy()}
    try:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return _diff("onnxruntime", torch.from_numpy(session.run(None, feed)[0]), ref)
    except ImportError:
        pass
    try:
        from onnx.reference import ReferenceEvaluator

        return _diff("onnx.reference", torch.from_numpy(ReferenceEvaluator(model).run(None, feed)[0]), ref)
    except Exception as err:  # noqa: BLE001  (an op the reference evaluator lacks)
        return {"method": "onnx.checker", "max_abs_diff": None, "passed": True,
                "note": f"not run: onnxruntime is not installed and onnx.reference failed ({_one_line(err)})"}


def _diff(method: str, out: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    diff = float((out.float() - ref.float()).abs().max()) if out.shape == ref.shape else math.inf
    scale = max(1.0, float(ref.abs().max()))
    return {"method": method, "max_abs_diff": diff if math.isfinite(diff) else None,
            "passed": diff <= GRAPH_TOLERANCE * scale}


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())[:300]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _import_file(path: Path) -> Any:
    """Import one of our generated files (trusted: built-in spaces only)."""
    spec = importlib.util.spec_from_file_location(f"nasflow_export_{os.getpid()}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the export ---------------------------------------------------------------

class Built:
    """What one branch produces: the network (None when built in the sandbox), its
    input shape, source text and what it is, and where the weights came from."""

    def __init__(self, net: nn.Module | None, shape: tuple[int, ...], source: str, source_kind: str,
                 weights: dict[str, Any], num_classes: int) -> None:
        self.net, self.shape, self.source, self.source_kind = net, shape, source, source_kind
        self.weights, self.num_classes = weights, num_classes


def export_run(run_dir: Path, out: Path | None = None, trial: int | None = None, train: bool = True,
               force: bool = False, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Export and return the manifest (also written as `out/export.json`)."""
    run_dir = Path(run_dir).resolve()
    spec, record = load_trial(run_dir, trial)
    out = Path(out).resolve() if out else run_dir / ("export" if trial is None else f"export-trial{trial}")
    if out.exists() and not force:
        raise ExportError(f"{out}: already exists (remove it or pass --force)")
    space = spec.build_space()
    arch = space.decode(record.encoding)
    if arch.key() != record.key:
        raise ExportError(f"{run_dir}: trial {record.trial}: encoding decodes to key {arch.key()}, "
                          f"history says {record.key} (space changed since the search?)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        say(f"exporting trial {record.trial} ({spec.space.name}, key {record.key}) to {out}")
        manifest = _export(spec, space, arch, record, tmp, train, say)
        manifest.update(run_dir=str(run_dir), out=str(out))
        manifest["files"] = {p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size}
                             for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / "export.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp's 0700 is for the work in progress, not the result
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _export(spec, space, arch, record: TrialRecord, tmp: Path, train: bool,
            say: Callable[[str], None]) -> dict[str, Any]:
    from nas.measure import count_flops, count_params

    evaluator = spec.evaluator.name
    if not space.trusted:
        built, graph, check, measured = _export_untrusted(spec, space, arch, record, tmp, train, say)
    else:
        builder = {"supernet": _from_supernet, "train": _from_training, "table": _from_table}.get(evaluator)
        if builder is None:
            raise ExportError(f"evaluator '{evaluator}': export does not know where its weights are")
        built = builder(spec, space, arch, record, train, say)
        net = built.net.cpu().eval()
        torch.save(net.state_dict(), tmp / "model.pt")
        (tmp / "model.py").write_text(built.source, encoding="utf-8")
        torch.manual_seed(0)
        x = torch.randn(built.shape)
        say(f"writing ONNX (TorchScript if that fails) for input {list(built.shape)}")
        graph = export_graph(net, x, tmp)
        check = _source_check(built, net, x, tmp, spec, space)
        measured = {"params": count_params(net), "flops": count_flops(net, built.shape)}
    return {
        "trial": record.trial, "key": record.key, "encoding": record.encoding,
        "space": spec.space.name, "evaluator": evaluator, "seed": spec.seed,
        "accuracy": record.accuracy, "metrics": record.metrics,
        "params": measured["params"], "flops": measured["flops"],
        "search_params": record.params, "search_flops": record.flops,
        "input_shape": list(built.shape), "num_classes": built.num_classes,
        "source": {"file": "model.py", "kind": built.source_kind,
                   "usage": "from model import Network; net = Network(); "
                            "net.load_state_dict(torch.load('model.pt', weights_only=True))"},
        "weights": {"file": "model.pt", **built.weights},
        "graph": graph, "source_check": check,
        "torch": torch.__version__, "nasflow_version": _version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _from_supernet(spec, space, arch, record, train, say) -> Built:
    from nas.evaluators.supernet import score

    ev = spec.build_evaluator(space)  # a missing or unreadable checkpoint fails here, with its path
    sidecar = ev.path.with_suffix(".json")
    if sidecar.is_file():
        from nas.io import read_json

        expected = read_json(sidecar).get("sha256")
        if expected and expected != ev.sha256:
            raise ExportError(f"supernet checkpoint {ev.path}: sha256 {ev.sha256[:16]} differs from "
                              f"{expected[:16]} in {sidecar.name} (changed since training)")
    supernet, feeder = ev._load()
    say(f"extracting the subnet from {ev.path} (sha256 {ev.sha256[:16]}), recalibrating BatchNorm "
        f"on {ev.recal_batches} batches")
    with ev._lock:
        sub = supernet.extract(arch).to(ev.device)
    size = supernet.input_size(arch)
    valid, test = score(sub, feeder, size, ev.recal_batches, ev.val_subset)
    recorded = record.accuracy
    if recorded is not None and abs(valid - recorded) > 1.0:
        raise ExportError(f"supernet checkpoint {ev.path}: the subnet now scores {valid:.2f}%, trial "
                          f"{record.trial} recorded {recorded:.2f}% (checkpoint or data changed since the search)")
    say(f"subnet rescored: valid {valid:.2f}% (the search recorded {recorded}), test {test:.2f}%")
    shape = (1, supernet.in_channels, *((size, size) if size else feeder.data.shape[1:]))
    config = supernet.config()
    source = space.source(arch, config["num_classes"], config["in_channels"], shape[-1])
    weights = {"origin": "supernet", "checkpoint": str(ev.path), "checkpoint_sha256": ev.sha256,
               "recal_batches": ev.recal_batches, "valid_accuracy": round(valid, 4),
               "test_accuracy": round(test, 4)}
    return Built(sub, shape, source, space.source_kind, weights, config["num_classes"])


def _from_training(spec, space, arch, record, train, say) -> Built:
    from nas.train.build import build_model
    from nas.train.run import train_one

    ev = spec.build_evaluator(space)
    seed = ev.seeds[0] if ev.seeds else spec.seed
    data = ev.data
    net = build_model(space, arch, data.shape, data.num_classes, ev.build, seed)
    source = space.source(arch, data.num_classes, data.shape[0], data.shape[1], ev.build.to_dict())
    weights: dict[str, Any] = {"seed": seed, "data": ev.data_cfg}
    if train:
        r = ev.recipe
        say(f"retraining: {r.epochs} epochs on {ev.data_cfg['name']} (batch {r.batch_size}, lr {r.lr}), "
            f"seed {seed}, engine {ev.engine.kind}")
        result = train_one(net, data, ev.recipe, seed, ev.engine)
        if result.terminated:
            raise ExportError(f"retraining trial {record.trial} terminated early: {result.terminated}")
        _retrained(weights, result, ev, say)
    else:
        weights.update(origin="initial", note="--no-train: seeded initial weights, not trained")
    return Built(net, (1, *data.shape), source, space.source_kind, weights, data.num_classes)


def _from_table(spec, space, arch, record, train, say) -> Built:
    ev = spec.build_evaluator(space)
    torch.manual_seed(spec.seed)
    net = space.build(arch, ev.num_classes, 3, ev.resolution)
    source = space.source(arch, ev.num_classes, 3, ev.resolution)
    weights = {"origin": "initial", "seed": spec.seed,
               "note": "the table evaluator stores no weights: seeded initial weights; train the cell "
                       f"with `nas train '{arch.encode()}' data=cifar10 ...`"}
    return Built(net, (1, 3, ev.resolution, ev.resolution), source, space.source_kind, weights, ev.num_classes)


def _source_check(built: Built, net: nn.Module, x: torch.Tensor, tmp: Path, spec, space) -> dict[str, Any]:
    """Does model.py's `Network` take model.pt strictly and give `net`'s output? Our own
    generated files run here; code compiled from a block file runs in the sandbox."""
    with torch.no_grad():
        ref = net(x)
    if not space.source_trusted:
        report = _sandbox(tmp, built.source, built.num_classes, x, weights=tmp / "model.pt", reference=ref,
                          limits=_limits(spec, sum(p.numel() for p in net.parameters())))[2]
        return report["reference"]
    method = "in-process: model.py + model.pt"
    try:
        twin = _import_file(tmp / "model.py").Network(num_classes=built.num_classes)
        twin.load_state_dict(torch.load(tmp / "model.pt", weights_only=True))
        with torch.no_grad():
            return _diff(method, twin.eval()(x), ref)
    except Exception as err:  # noqa: BLE001  (a generator bug is a failed check, reported, not a crash)
        return {"method": method, "max_abs_diff": None, "passed": False, "error": _one_line(err)}


# --- the untrusted path: everything in the sandbox -----------------------------

def _limits(spec, params: int | None):
    """The run's `evaluator.sandbox` limits (train's defaults), with room for the written files."""
    from nas.evaluators.train import SANDBOX_DEFAULTS
    from nas.sandbox.limits import Limits

    limits = {**SANDBOX_DEFAULTS, **(spec.evaluator.params.get("sandbox") or {})}
    if params:
        limits["file_mb"] = max(limits["file_mb"], math.ceil(params * 4 * 1.5 / (1 << 20)) + 16)
    return Limits(**limits)


def _export_untrusted(spec, space, arch, record: TrialRecord, tmp: Path, train: bool, say):
    from nas.train.result import TrainResult

    ev = spec.build_evaluator(space)
    seed = ev.seeds[0] if ev.seeds else spec.seed
    data = ev.data
    request = None
    if train:
        gpu = ev.engine.accelerator == "gpu" or (ev.engine.accelerator == "auto" and torch.cuda.is_available())
        request = {"data": ev.data_cfg, "recipe": ev.recipe.to_dict(), "engine": ev.engine.to_dict(),
                   "seeds": [seed], "gpu": gpu, "threads": torch.get_num_threads()}
        r = ev.recipe
        say(f"retraining in the sandbox: {r.epochs} epochs on {ev.data_cfg['name']} (batch {r.batch_size}, "
            f"lr {r.lr}), seed {seed}")
    else:
        say("building the model in the sandbox (initial weights)")
    verdict, trained, report = _sandbox(tmp, arch.source, data.num_classes, (1, *data.shape), train=request,
                                        seed=seed, limits=_limits(spec, record.params))
    weights: dict[str, Any] = {"seed": seed, "data": ev.data_cfg}
    if train:
        try:
            result = TrainResult.from_untrusted(trained[0], max_epochs=ev.recipe.epochs)
        except ValueError as err:
            raise ExportError(f"model.py in the sandbox: {err}") from None
        if result.terminated:
            raise ExportError(f"retraining terminated early: {result.terminated}")
        _retrained(weights, result, ev, say)
    else:
        weights.update(origin="initial", note="--no-train: initial weights (torch.manual_seed(0), as the "
                                              "sandbox instantiates), not trained")
    source = space.source(arch, data.num_classes, data.shape[0], data.shape[1])
    (tmp / "model.py").write_text(source, encoding="utf-8")
    built = Built(None, tuple(report["input_shape"]), source, space.source_kind, weights, data.num_classes)
    say("checking model.py + model.pt in a fresh sandbox")
    x, out = report.pop("io")
    check = _sandbox(tmp, arch.source, data.num_classes, x, weights=tmp / "model.pt", reference=out,
                     limits=_limits(spec, verdict.params))[2]["reference"]
    return built, report["graph"], check, {"params": verdict.params, "flops": verdict.flops}


def _sandbox(tmp: Path, source: str, num_classes: int, x_or_shape, *, weights: Path | None = None,
             reference: torch.Tensor | None = None, train: dict | None = None, seed: int = 0,
             limits) -> tuple[Any, list, dict[str, Any]]:
    """Run `source` in a sandboxed child: build `Network`, load `weights` or train (or keep
    the initial weights); without `weights`, save model.pt and export the graph into `tmp`;
    with `reference`, compare outputs. Returns (verdict, training reports, checked report)."""
    from nas.sandbox import verify as sv
    from nas.sandbox.isolation import isolation

    shape = tuple(x_or_shape.shape) if isinstance(x_or_shape, torch.Tensor) else tuple(x_or_shape)
    verdict = sv._syntax(source, "model.py")
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
        read_end, write_end = os.pipe()
        request = {"result_fd": write_end, "files": {"candidate": "model.py"}, "num_classes": num_classes,
                   "input_shape": list(shape), "limits": asdict(limits), "train": train, "seed": seed,
                   "weights": weights is not None, "reference": reference is not None}
        Path(work, "request.json").write_text(json.dumps(request), encoding="utf-8")
        deadline = time.monotonic() + limits.wall_s
        gpu = bool(train and train["gpu"])
        env, iso = sv._child_env(work, gpu=gpu), isolation()
        argv = [sys.executable, "-s", "-P", "-m", "nas.export", work]
        with open(read_end, "rb", buffering=0) as pipe:
            try:
                proc = iso.popen(argv, env, read_only=sv.data_paths(train), writable=work, gpu=gpu,
                                 pass_fds=(write_end,),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            finally:
                os.close(write_end)
            with proc.stdout:
                try:
                    run = sv._collect(proc, pipe.fileno(), None, deadline)
                finally:
                    sv._kill_group(proc)
        run.returncode = sv.exit_status(proc, iso)
        verdict = sv._conclude(run, limits)
        if not verdict.ok:
            raise ExportError(f"model.py in the sandbox: {verdict.error}")
        report = _read_report(Path(work, "report.json"), weights is None, reference is not None)
        if train and len(run.trained) != 1:
            raise ExportError(f"model.py in the sandbox: {len(run.trained)} training reports for 1 seed")
        if weights is None:
            for name in ("model.pt", report["graph"]["file"]):
                if name:
                    shutil.copyfile(Path(work, name), tmp / name)
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
        raise ExportError(f"model.py in the sandbox: malformed io.pt ({_one_line(err)})") from None


def _read_report(path: Path, exported: bool, compared: bool) -> dict[str, Any]:
    """report.json from the child, checked field by field (untrusted code wrote next to it)."""
    try:
        for name in ("report.json", "model.pt", "model.onnx", "model.torchscript.pt", "io.pt"):
            if Path(path.parent, name).is_symlink():  # the policy forbids links; this does not rely on it
                raise ValueError(f"{name} is a link")
        if path.stat().st_size > REPORT_MAX:
            raise ValueError("too large")
        report = json.loads(path.read_text(encoding="utf-8"))
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
            for key in ("onnx_error", "torchscript_error"):
                if not (graph.get(key) is None or (isinstance(graph[key], str) and len(graph[key]) < 400)):
                    raise ValueError(key)
            if not Path(path.parent, "model.pt").is_file():
                raise ValueError("model.pt missing")
        return report
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ExportError(f"model.py in the sandbox: malformed export report ({_one_line(err)})") from None


def _check_diff(check: Any) -> None:
    d = check["max_abs_diff"]
    if not (isinstance(check["method"], str) and len(check["method"]) < 40 and type(check["passed"]) is bool
            and (d is None or (type(d) in (int, float) and d >= 0))):
        raise ValueError("check")


# --- the sandboxed child --------------------------------------------------------

def _child(workdir: str) -> None:
    """Trusted imports first (training code, data, the exporters), then the caps and the policy,
    then the untrusted import. Mirrors `nas.sandbox.worker.main`."""
    from nas.sandbox import worker as w
    from nas.sandbox.limits import Limits, apply_rlimits, install_policy
    from nas.sandbox.verify import Verdict

    request = json.loads(Path(workdir, "request.json").read_text(encoding="utf-8"))
    reporter = w._Reporter(request["result_fd"])
    limits = Limits(**request["limits"])
    files = {str(Path(workdir, name)): name for name in request["files"].values()}
    training = request.get("train")
    torch.set_num_threads(training["threads"] if training else 1)
    warnings.simplefilter("ignore")
    sys.dont_write_bytecode = True
    trainer = w._trainer(training) if training else None
    for name in ("torch.onnx.utils", "onnx.reference"):  # loaded before the policy: they read many files
        try:
            importlib.import_module(name)
        except ImportError:  # export_graph falls back to TorchScript and says why
            pass

    apply_rlimits(limits, address_space=not (training and training["gpu"]))
    install_policy(workdir, files, reporter.deny)
    try:
        verdict = _child_run(request, Path(workdir), files, limits, reporter, trainer)
    except w._Stop as stop:
        verdict = stop.verdict
    except MemoryError:
        verdict = Verdict(ok=False, stage="limits",
                          error=f"limits: out of memory (memory_mb={limits.memory_mb}) during {reporter.stage}")
    reporter.send(verdict=verdict.to_dict())
    w._exit()


def _child_run(request: dict, workdir: Path, files: dict[str, str], limits, reporter, trainer):
    from nas.measure import count_flops, count_params
    from nas.sandbox import worker as w
    from nas.sandbox.verify import Verdict

    def stage(name: str, fn: Callable[..., Any], *args: Any) -> Any:
        reporter.enter(name)
        try:
            return fn(*args)
        except w._Stop:
            raise
        except BaseException as exc:  # noqa: BLE001  (SystemExit from the model is a failure too)
            w._reserve.clear()
            raise w._Stop(w._failure(name, exc, files, limits)) from None

    num_classes, shape = request["num_classes"], tuple(request["input_shape"])
    module = stage("import", w._import, workdir / "model.py", "nas_candidate")
    net = stage("instantiate", w._instantiate, module, "model.py", num_classes)
    rgb = shape[1] == 1 and stage("instantiate", w._first_in_channels, net) == 3
    shape = (shape[0], 3, *shape[2:]) if rgb else shape
    if request["weights"]:
        stage("instantiate", lambda: net.load_state_dict(torch.load(workdir / "weights.pt", weights_only=True)))
    elif trainer is not None:
        def fit() -> nn.Module:
            seed = request["train"]["seeds"][0]
            torch.manual_seed(seed)
            fresh = w._instantiate(module, "model.py", num_classes)
            reporter.send(trained=trainer(fresh, seed, rgb).to_dict())
            return fresh

        net = stage("train", fit)
    net = net.cpu().eval()
    if (workdir / "input.pt").is_file():
        x = torch.load(workdir / "input.pt", weights_only=True)
    else:
        torch.manual_seed(request["seed"])
        x = torch.randn(shape)
    report: dict[str, Any] = {"input_shape": list(x.shape)}
    if request["reference"]:
        ref = torch.load(workdir / "reference.pt", weights_only=True)
        out = stage("forward", _forward_no_grad, net, x)
        report["reference"] = _diff("sandbox: model.py + model.pt", out, ref)
    if not request["weights"]:
        out = stage("forward", _forward_no_grad, net, x)
        stage("forward", lambda: torch.save(net.state_dict(), workdir / "model.pt"))
        stage("forward", lambda: torch.save({"input": x, "output": out}, workdir / "io.pt"))
        report["graph"] = stage("forward", export_graph, net, x, workdir)
    params, flops = stage("measure", lambda: (count_params(net), count_flops(net, tuple(x.shape))))
    (workdir / "report.json").write_text(json.dumps(report), encoding="utf-8")
    reporter.enter("done")
    return Verdict(ok=True, stage="done", params=params, flops=flops, output_shape=[x.shape[0], num_classes])


def _forward_no_grad(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return net(x)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _version() -> str:
    from nas import __version__

    return __version__


def _retrained(weights: dict[str, Any], result, ev, say) -> None:  # noqa: ANN001
    """Record a retraining's outcome in the manifest's weights entry."""
    say(f"retrained: valid {result.valid_accuracy:.2f}%, test {result.test_accuracy:.2f}% "
        f"({result.epochs} epochs, {result.wall_seconds:.1f} s)")
    weights.update(origin="retrained", recipe=ev.recipe.to_dict(), engine=ev.engine.to_dict(),
                   valid_accuracy=result.valid_accuracy, test_accuracy=result.test_accuracy,
                   loss_curve=result.loss_curve)


if __name__ == "__main__":
    _child(sys.argv[1])

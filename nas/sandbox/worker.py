"""Child side of the sandbox: import one untrusted model file and check it.

Started only by `nas.sandbox.verify.run_child` as `python -s -P -m nas.sandbox.worker`
(under bubblewrap: see `isolation.py`), with the request as JSON on stdin;
the sources are written to a private dir under $TMPDIR. Reports JSON lines on
the inherited pipe named in the request: `{"stage": ...}` on entering each
stage (so the parent can say where a limit hit), `{"policy": ...}` on a
forbidden action, `{"trained": ...}` per seed when it had to train itself,
`{"verdict": ...}` at the end. After the checks it exports the model as a
graph (`graph.py`) and writes that artifact to the second pipe: the parent
measures and trains the graph, and treats this child's own numbers as
self-reported. Ends with `os._exit` so atexit handlers and threads the model
left behind never run.

The public names (`answer`, `Job`, `Stop`, `Reporter`, `import_file`, `instantiate`,
`first_in_channels`, `make_trainer`, `exit_now`) are the child API other sandboxed
jobs build on (`nas.export.child`): the same caps, policy and reports as this job.
"""

from __future__ import annotations

import difflib
import errno
import importlib.util
import json
import os
import re
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NoReturn

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode, resolve_name

import nas.sandbox.graph  # noqa: F401 - loaded before the policy is installed (`_export` binds its names late)
from nas.measure import count_flops, count_params
from nas.sandbox.limits import Limits, apply_rlimits, install_policy, out_of_memory
from nas.sandbox.protocol import MAX_ERROR, MAX_TRACEBACK
from nas.sandbox.verify import Verdict
from nas.terminal import clipped, printable

_ALLOC = re.compile(r"tried to allocate (\d+) bytes")
# Freed on the first failure, so a model that filled the address space still
# leaves room to describe the failure.
_reserve = [bytearray(64 << 20)]


class Stop(Exception):
    """A check failed; carries the verdict to report."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.error)
        self.verdict = verdict


class Reporter:
    """The child's side of the report pipe: one JSON object per line, each a message of the
    protocol the parent reads them by (`nas.sandbox.protocol.CHILD`)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.stage = "startup"

    def send(self, **msg: Any) -> None:
        data = (json.dumps(msg) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]

    def enter(self, stage: str) -> None:
        self.stage = stage
        self.send(stage=stage)

    def deny(self, error: str, tb: str | None) -> NoReturn:
        """Report a forbidden action and leave. `error` may quote the model (a path it opened): escaped
        and cut, as a verdict's text is, to the protocol's bounds."""
        if tb is None:  # not called from the model's own code: say when instead
            error += f" during {self.stage}"
        shown = None if tb is None else clipped(printable(tb, lines=True), MAX_TRACEBACK, tail=True)
        self.send(policy={"error": clipped(printable(error), MAX_ERROR), "traceback": shown})
        exit_now()


def main() -> NoReturn:
    """The verify/train job: the request names the sources, written to a private dir here."""
    request = json.loads(sys.stdin.buffer.read())
    workdir = tempfile.mkdtemp(prefix="job-")
    for name in request["files"].values():
        Path(workdir, name).write_text(request["sources"][name], encoding="utf-8")
    os.chdir(workdir)
    answer(request, Path(workdir), tempfile.gettempdir(), _verify)  # the policy: the private tmpfs (or temp dir)


@dataclass
class Job:
    """One request being answered in a sandboxed child (`answer`): the untrusted files
    (path -> the name the user knows), the limits, the pipe to the parent, and the
    trainer loaded before the caps when the request trains."""

    request: dict
    workdir: Path
    files: dict[str, str]
    limits: Limits
    reporter: Reporter
    trainer: Callable[[nn.Module, int, bool], Any] | None

    def stage(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` as stage `name`: the parent hears the stage first (so it can say
        where a limit hit), and any exception, even SystemExit, becomes a `Stop` whose
        verdict names the stage and the untrusted file's line."""
        self.reporter.enter(name)
        try:
            return fn(*args)
        except Stop:
            raise
        except BaseException as exc:  # SystemExit from the model is a failure too
            _reserve.clear()
            raise Stop(_failure(name, exc, self.files, self.limits)) from None


def answer(request: dict, workdir: Path, policy_root: str, work: Callable[[Job], Verdict],
          preload: tuple[str, ...] = ()) -> NoReturn:
    """Answer one request from `verify.run_child` and exit: trusted work first (the training
    code and data, the `preload` modules, which read many files), then the rlimits and the
    audit policy (writes only under `policy_root`), then `work`, the untrusted part. Sends
    `work`'s verdict (or the `Stop`'s, or out of memory) as the last report line."""
    reporter = Reporter(request["result_fd"])
    limits = Limits(**request["limits"])
    files = {str(Path(workdir, name)): name for name in request["files"].values()}
    training = request.get("train")
    torch.set_num_threads(training["threads"] if training else 1)
    warnings.simplefilter("ignore")  # fvcore and tracer warnings would only fill the output pipe
    sys.dont_write_bytecode = True
    # trusted work first: Lightning's import and the data count outside the caps
    trainer = make_trainer(training) if training else None
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:  # the job says what it lacks when it needs it
            pass
    apply_rlimits(limits, address_space=not (training and training["gpu"]))
    install_policy(policy_root, files, reporter.deny, tuple(request.get("hidden", ())))
    try:
        verdict = work(Job(request, workdir, files, limits, reporter, trainer))
    except Stop as stop:
        verdict = stop.verdict
    except MemoryError:  # raised while describing another failure
        verdict = Verdict(ok=False, stage="limits",
                          error=f"limits: out of memory (memory_mb={limits.memory_mb}) during {reporter.stage}")
    reporter.send(verdict=verdict.to_dict())
    exit_now()


def exit_now() -> NoReturn:
    """Leave without atexit handlers or the threads the model may have left behind."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or replaced stream must not block the exit
            pass
    os._exit(0)


def _verify(job: Job) -> Verdict:
    request, workdir, reporter, trainer, stage = job.request, job.workdir, job.reporter, job.trainer, job.stage
    num_classes, shape = request["num_classes"], tuple(request["input_shape"])
    candidate = request["files"]["candidate"]
    module = stage("import", import_file, workdir / candidate, "nas_candidate")
    net = stage("instantiate", instantiate, module, candidate, num_classes)
    # A model for RGB input (FairNAD's bases) on grey data sees the grey channel three times.
    rgb = shape[1] == 1 and stage("instantiate", first_in_channels, net) == 3
    shape = (shape[0], 3, *shape[2:]) if rgb else shape
    torch.manual_seed(0)
    x = torch.randn(shape)
    out = stage("forward", _forward, net, x)
    stage("output_shape", _check_output, out, [shape[0], num_classes])
    stage("backward", _backward, out)
    export_error = request.get("export_error")
    if export_error is None:  # a second child, with the data, trains what the first could not export
        reporter.enter("export")
        try:
            artifact = _export(module, candidate, workdir, request, num_classes, x)
        except Exception as exc:  # not exportable: measured here, trained in a child with data (self-reported)
            export_error = f"{type(exc).__name__}: {_message(exc)}"[:400]
        else:
            _send_artifact(request["artifact_fd"], artifact)
            reporter.enter("done")
            return Verdict(ok=True, stage="done", output_shape=list(out.shape), self_reported=False)
    params, flops, layers = stage("measure", _measure, net, shape)
    verdict = Verdict(ok=True, stage="done", params=params, flops=flops, output_shape=list(out.shape),
                      layers=layers, self_reported=True, export_error=export_error)
    if "parent" in request["files"]:
        parent_file = request["files"]["parent"]

        def compare() -> None:
            try:
                parent = instantiate(import_file(workdir / parent_file, "nas_parent"), parent_file, num_classes)
            except Stop as stop:
                raise Stop(Verdict(ok=False, stage="structure",
                                    error=f"structure: parent {stop.verdict.error}")) from None
            verdict.changed, verdict.changed_layers = _compare(parent, net, x)

        try:
            stage("structure", compare)
        except Stop as stop:  # the candidate itself passed: keep what was measured
            stop.verdict.params, stop.verdict.flops, stop.verdict.layers = params, flops, layers
            stop.verdict.output_shape = verdict.output_shape
            raise
    if trainer is not None:
        stage("train", _train, module, candidate, num_classes, request["train"]["seeds"],
              lambda n, seed: trainer(n, seed, rgb), reporter)
    reporter.enter("done")
    return verdict


def _export(module: Any, candidate: str, workdir: Path, request: dict, num_classes: int,
            x: torch.Tensor) -> bytes:
    """The candidate (and the parent) as graph data plus initial weights: `init`
    for the checked instance, `seed<N>` per training seed (a fresh instance each,
    as training here would make; the request's `seeds`)."""
    # late: tests/hostile/forge_* replace `graph.export_graph` at import, as an attacker may (one who patches this
    # module instead gets the same); a name bound at import would keep the honest exporter and test nothing
    from nas.sandbox.graph import export_graph, pack

    net = instantiate(module, candidate, num_classes)
    weights = {"init": _tensors(net)}  # before the export runs forward
    graph = export_graph(net, x)
    weights["const"] = graph.pop("constants")
    for seed in request.get("seeds", []):
        torch.manual_seed(seed)
        weights[f"seed{seed}"] = _tensors(instantiate(module, candidate, num_classes, seed=None))
    if "parent" in request["files"]:
        name = request["files"]["parent"]
        parent = instantiate(import_file(workdir / name, "nas_parent"), name, num_classes)
        weights["parent"] = _tensors(parent)
        graph["parent"] = export_graph(parent, x)
        weights["parent_const"] = graph["parent"].pop("constants")
    return pack(graph, weights)


def _tensors(net: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and all buffers (non-persistent ones are graph inputs too)."""
    return {k: v.detach().clone() for k, v in [*net.named_parameters(), *net.named_buffers()]}


def _send_artifact(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.close(fd)


def make_trainer(training: dict) -> Callable[[nn.Module, int, bool], Any]:
    """Load the data and the training code (trusted) and return `run(net, seed, rgb)`."""
    # lazy: only a child that trains loads the data and the trainer (a check-only child skips ~1 s of imports)
    from nas.data.sources import load_data
    from nas.train.engine import Engine
    from nas.train.recipe import Recipe
    from nas.train.run import train_one

    # import the engine now: Lightning's import starts subprocesses, which the policy forbids
    importlib.import_module("nas.train.fast" if training["engine"].get("kind") == "fast" else "nas.train.fit")
    data = load_data(**training["data"])
    recipe, engine = Recipe.from_dict(training["recipe"]), Engine.from_dict(training["engine"])
    return lambda net, seed, rgb: train_one(net, data.rgb() if rgb else data, recipe, seed, engine)


def _train(module: Any, filename: str, num_classes: int, seeds: list[int],
           trainer: Callable[[nn.Module, int], Any], reporter: Reporter) -> None:
    """Train a fresh instance per seed (the checked one has seen a backward pass), its
    initial weights drawn under that seed, as `_export`'s `seed<N>` weights are."""
    for seed in seeds:
        net = instantiate(module, filename, num_classes, seed=seed)
        reporter.send(trained=trainer(net, seed).to_dict())


def first_in_channels(net: nn.Module) -> int | None:
    """`in_channels` of the first layer that has one (the input convolution)."""
    return next((m.in_channels for m in net.modules() if isinstance(getattr(m, "in_channels", None), int)), None)


def import_file(path: Path, name: str) -> Any:
    """Import an untrusted file as module `name` (only after `answer` installed the caps and policy)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and typing look the module up by name
    spec.loader.exec_module(module)
    return module


def instantiate(module: Any, filename: str, num_classes: int, seed: int | None = 0) -> nn.Module:
    """`module.Network(num_classes=...)` seeded with `seed` (None: the caller seeded); a missing
    class or a non-module result is a `Stop` at stage instantiate."""
    cls = getattr(module, "Network", None)
    if cls is None:
        found = sorted(k for k, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, nn.Module) and v.__module__ == module.__name__)
        raise Stop(Verdict(ok=False, stage="instantiate",
                            error=f"instantiate: {filename} defines no `Network` class"
                                  f" (nn.Module classes found: {', '.join(found) or 'none'})"))
    if seed is not None:
        torch.manual_seed(seed)
    net = cls(num_classes=num_classes)
    if not isinstance(net, nn.Module):
        raise Stop(Verdict(ok=False, stage="instantiate",
                            error=f"instantiate: Network(num_classes={num_classes}) returned"
                                  f" {type(net).__name__}, not an nn.Module"))
    return net


def _forward(net: nn.Module, x: torch.Tensor) -> Any:
    net.train()
    return net(x)


def _check_output(out: Any, expected: list[int]) -> None:
    if not isinstance(out, torch.Tensor):
        raise Stop(Verdict(ok=False, stage="output_shape",
                            error=f"output_shape: Network returned {type(out).__name__},"
                                  f" expected a Tensor of shape {expected}"))
    if list(out.shape) != expected:
        raise Stop(Verdict(ok=False, stage="output_shape", output_shape=list(out.shape),
                            error=f"output_shape: output shape {list(out.shape)} != expected {expected}"
                                  " (batch, num_classes)"))
    if not torch.isfinite(out).all():
        raise Stop(Verdict(ok=False, stage="output_shape", output_shape=expected,
                            error="output_shape: output contains NaN or Inf values"))


def _backward(out: torch.Tensor) -> None:
    target = torch.randint(0, out.shape[1], (out.shape[0],))
    F.cross_entropy(out.float(), target).backward()


def _measure(net: nn.Module, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(params, FLOPs, layers with parameters). FLOPs are per image (batch 1),
    the convention NAS papers and TableEvaluator use; the layer count lets a
    caller discard single-layer networks, as FairNAD's structural check does."""
    layers = sum(1 for _, has_params in _layers(net) if has_params)
    return count_params(net), count_flops(net, (1, *shape[1:])), layers


# --- structure comparison ---------------------------------------------------

# Tensor methods that only read metadata: calling x.size(0) instead of
# x.shape[0] must not count as an architecture change.
_METADATA = frozenset({"dim", "size", "numel", "ndimension", "nelement", "stride", "is_contiguous",
                       "data_ptr", "element_size", "get_device", "is_floating_point", "__len__",
                       "__bool__", "__index__", "__int__", "__float__", "__format__", "__repr__",
                       "__hash__", "item", "tolist"})


class _OpTrace(TorchFunctionMode):
    """Records the torch functions a forward calls, at the level the model
    code calls them (nested calls inside a function are not seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # torch.flatten, Tensor.flatten and F.relu_ vs F.relu are the same computation
        name = (resolve_name(func) or getattr(func, "__name__", repr(func))).rsplit(".", 1)[-1]
        if name != "__get__" and name not in _METADATA:
            self.ops.append(name.strip("_"))
        return func(*args, **(kwargs or {}))


def _layers(net: nn.Module) -> list[tuple[str, bool]]:
    """One entry per layer: a leaf module, or a module with parameters of its
    own; described by class, hyper-parameters (extra_repr) and parameter
    shapes, but not by attribute name, so renaming is not a change."""
    layers = []
    for module in net.modules():
        own = [list(p.shape) for p in module.parameters(recurse=False)]
        if own or next(module.children(), None) is None:
            layers.append((f"{type(module).__name__}({module.extra_repr()}) {own}", bool(own)))
    return layers


def _ops(net: nn.Module, x: torch.Tensor) -> list[str]:
    net.eval()
    with torch.no_grad(), _OpTrace() as trace:
        net(x)
    return trace.ops


def _compare(parent: nn.Module, child: nn.Module, x: torch.Tensor) -> tuple[bool, int]:
    """(changed, changed_layers). `changed`: the layer list or the sequence
    of torch calls in forward differs, so a new skip connection counts but
    renaming attributes does not. `changed_layers`: layers inserted, deleted
    or replaced, by an order-preserving diff of the layer lists."""
    old, new = [d for d, _ in _layers(parent)], [d for d, _ in _layers(child)]
    diff = difflib.SequenceMatcher(None, old, new, autojunk=False)
    edits = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in diff.get_opcodes() if tag != "equal")
    return edits > 0 or _ops(parent, x) != _ops(child, x), edits


# --- failure description ----------------------------------------------------

def _failure(stage: str, exc: BaseException, files: dict[str, str], limits: Limits) -> Verdict:
    """One-line error plus a traceback trimmed to the untrusted files' frames."""
    message = _message(exc)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in files]
    if isinstance(exc, SyntaxError) and exc.filename in files:
        where = f" at {files[exc.filename]}:{exc.lineno}"
    else:
        where = f" at {files[frames[-1].filename]}:{frames[-1].lineno}" if frames else ""
    if isinstance(exc, MemoryError) or out_of_memory(message):
        size = _ALLOC.search(message)
        detail = f": tried to allocate {size.group(1)} bytes" if size else ""
        error = f"limits: out of memory (memory_mb={limits.memory_mb}){detail}{where or ' during ' + stage}"
        stage = "limits"
    elif isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        error, stage = f"limits: file size limit {limits.file_mb} MB exceeded{where}", "limits"
    else:
        error = f"{stage}: {_head(exc, message)}{where}"
    lines = ["Traceback (most recent call last):"]
    for f in frames[-8:]:
        lines += [f'  File "{files[f.filename]}", line {f.lineno}, in {f.name}', f"    {f.line}"]
    full = _message(exc, one_line=False).splitlines()[:3]  # keep multi-line messages' layout
    lines += [_head(exc, full[0] if full else ""), *full[1:]]
    return Verdict(ok=False, stage=stage, error=error, traceback="\n".join(lines))


def _head(exc: BaseException, message: str) -> str:
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _message(exc: BaseException, one_line: bool = True) -> str:
    try:
        text = str(exc)
    except Exception:  # a model-defined exception whose __str__ fails
        text = f"<unprintable {type(exc).__name__}>"
    if one_line:
        text = " ".join(text.split())
    return text[:400]


if __name__ == "__main__":
    main()

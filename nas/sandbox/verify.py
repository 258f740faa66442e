"""Caller side of the sandbox: verify (and train) an untrusted model file.

The candidate source is never imported or exec'd here: this process only
`compile()`s it for the syntax check, then runs `nas.sandbox.worker` isolated
by the OS (`isolation.py`: namespaces, read-only file system, no network,
empty environment, killed with this process) with rlimits and a wall clock.
The child reports JSON lines on a pipe, each read by the sandbox's one strict
parser (`protocol.py`: every field's type and bound; anything else is one
malformed-report line), and sends
the model as graph data (`graph.py`), which the trusted side loads, measures and
trains itself: parameters, FLOPs, output checks and accuracy never come from
the untrusted side. The real runs of that check (fvcore's trace, a forward and a
backward) happen in a limited trusted worker (`trusted.py`), not in this process;
the networks trained must hash as the one checked (`graph.py`'s `graph_hash`). No dataset is readable in that child (`hidden_paths`). A
model that cannot be exported is measured and trained in a second child, which
is shown the training data only, and its verdict says `self_reported`.
Nothing from the child is unpickled. Whatever happens, the whole sandbox is SIGKILLed before this returns.

`check_syntax`, `run_child` and `conclude` are the parent half of the public child
API: other sandboxed jobs (`nas.export.untrusted`) start their child with them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nas.data.locations import locations, reads
from nas.errors import NasError
from nas.home import home
from nas.io import atomic_write_bytes
from nas.sandbox.isolation import SANDBOX_TMP, isolation, package_root
from nas.sandbox.limits import MB, Limits, out_of_memory, refused_allocation
from nas.sandbox.protocol import (
    CHILD,
    CHILD_VERDICT,
    MAX_ERROR,
    MAX_SEEDS,
    MAX_TRACEBACK,
    POLICY,
    SIGNALS,
    ProtocolError,
    exit_words,
)
from nas.sandbox.protocol import STAGES as STAGES  # the sandbox's public name (nas.sandbox)
from nas.sandbox.trusted import OnProxies, Refusal, TrustedWorker
from nas.terminal import clipped, printable
from nas.train.engine import Engine
from nas.train.recipe import Recipe
from nas.train.result import TrainResult

log = logging.getLogger(__name__)

_MAX_SOURCE = 1 << 20
_WATCH_EVERY_S = 0.25  # how often a shared work folder's size is read
_MAX_ARTIFACT = 512 << 20  # bytes of graph + weights read from the artifact pipe
# Work outside convolutions and matrix products (per image) that a graph may do beyond its counted
# FLOPs, per input element: vision models in torchvision do 0.6-20 % of their FLOPs there.
UNCOUNTED_PER_INPUT = 64
# The batch at which a graph's cost per image is checked against its FLOPs (at least; the training
# batch when larger): the dry run costs nothing at any batch, and a graph mixing the images of a
# batch (an outer product over the flattened batch) is cheap at the verification batch of 2 and
# quadratic in training. Recipe's default batch.
CHECK_BATCH = 256
# Multiply-accumulates per image (the dry run, torch's formulas) over the counted FLOPs (fvcore's, at batch 1).
MAC_TOLERANCE = 1.1
_MAX_REPORT = 1 << 20  # bytes read from the report pipe; a flood beyond is a malformed report
_OUTPUT_TAIL = 64 << 10  # bytes of the child's stdout+stderr kept, for crash diagnostics
_NO_BUDGET = 1 << 62  # bytes: a dry run that counts work and checks no memory


@dataclass
class Verdict:
    """Outcome of one verification; `error` is the one line to show a user or
    feed an LLM debug prompt, `traceback` the model-only frames to go with it.

    `stage` is where it stopped: syntax, import, instantiate, forward,
    output_shape, backward, measure, structure (the parent failed to build) or
    done; or why: limits (wall/CPU/memory/file size), policy (a forbidden
    action) or crash (the child died without reporting, e.g. os._exit or a
    segfault). `flops` are fvcore multiply-adds for one image; `layers`
    counts layers with parameters (FairNAD discards single-layer networks).
    `changed` and `changed_layers` compare with the parent source, when one is
    given (`nas.sandbox.graph.compare`). `self_reported` is False when every
    number was measured here on the exported graph, True when the model could
    not be exported (`export_error` says why) and the child measured itself. `graph`: the sha256 of
    the exported network measured here (`nas.sandbox.graph.graph_hash`), never a child's word: a
    kept verdict vouches for that network only.
    """

    ok: bool
    stage: str
    error: str | None = None
    traceback: str | None = None
    params: int | None = None
    flops: int | None = None
    output_shape: list[int] | None = None
    changed: bool | None = None
    changed_layers: int | None = None
    layers: int | None = None
    self_reported: bool = False
    export_error: str | None = None
    wall_s: float = 0.0
    graph: str | None = None

    def __post_init__(self) -> None:
        """Its text may hold what a model's code wrote (an exception message, a class's name): escaped
        here, so no verdict carries a terminal escape, a bidi override or a lone surrogate, or, in
        `error`, a second line (`nas.terminal`); and cut to the protocol's bounds, so every verdict
        made passes its check (`nas.sandbox.protocol`) as sent."""
        self.error, self.export_error = (None if v is None else clipped(printable(v), MAX_ERROR)
                                         for v in (self.error, self.export_error))
        if self.traceback is not None:
            self.traceback = clipped(printable(self.traceback, lines=True), MAX_TRACEBACK, tail=True)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_child(cls, data: object) -> "Verdict":
        """Build from a child's verdict (or a kept one), every field checked (`protocol.CHILD_VERDICT`):
        the child ran untrusted code and may have written anything. Raises ProtocolError (a ValueError)."""
        return cls(**CHILD_VERDICT.check(data))


def verify_model_source(source: str, *, num_classes: int = 10,
                        input_shape: tuple[int, ...] = (2, 3, 32, 32),
                        parent_source: str | None = None, limits: Limits = Limits(),
                        filename: str = "model.py") -> Verdict:
    """Check that `source` defines `Network(num_classes=...)` whose forward on a
    random `input_shape` batch gives `(batch, num_classes)` and backpropagates;
    measure it; with `parent_source`, say whether (and how many) layers changed.
    The source runs only in a sandboxed child under `limits`."""
    _check_args(filename, num_classes, input_shape)
    start = time.monotonic()
    verdict = check_syntax(source, filename)
    if verdict is None:
        with _trusted_worker(limits) as worker:  # its imports while the child runs
            run = _run_child(source, num_classes, input_shape, parent_source, limits, filename)
            verdict = conclude(run, limits)
            if verdict.ok and not verdict.self_reported:
                verdict = _graph_verdict(run.artifact, num_classes, input_shape, limits, parent_source is not None,
                                         worker=worker)
    verdict.wall_s = round(time.monotonic() - start, 3)
    return verdict


@dataclass(frozen=True)
class ProxyRequest:
    """Zero-cost proxies (`nas.proxies`) for the training worker to score on the first seed's
    network, freshly initialised, before it trains (evaluator=train's `proxy_<name>` metrics): on
    `batch` training images drawn under that seed, as a trusted network is scored in-process.
    `heard` gets the scores of `names`, or the one line saying why a proxy cannot run on the graph."""

    names: tuple[str, ...]
    batch: int
    heard: OnProxies


def train_model_source(source: str, *, data: dict, recipe: dict, engine: dict, seeds: list[int],
                       num_classes: int, input_shape: tuple[int, ...], gpu: bool = False, threads: int = 1,
                       limits: Limits = Limits(), filename: str = "model.py",
                       on_epoch=None, label: str | None = None, proxies: ProxyRequest | None = None,
                       checked: str | None = None) -> tuple[Verdict, list]:
    """Verify `source` as `verify_model_source` does, then train a fresh
    instance per seed: on the exported graph (from the child, which sees no dataset)
    with initial values drawn under the seed, in a limited trusted worker (`train_graphs`); or, for a
    model that cannot be exported, in a second sandboxed child that is shown this data
    (`verdict.self_reported`). `data`, `recipe` and `engine` are the settings dicts of `nas.data`,
    `Recipe` and `Engine`; `gpu` lets either train on the GPU, with `threads` CPU threads; `on_epoch`
    (nas.train.progress) hears each epoch of the graphs trained, under `label` (default: the file
    name); `proxies`: what the training worker scores on the first seed's exported network before
    any trains (never a network trained in the sandbox: its graph never leaves it). Returns the
    verdict (stage "train" if training raised) and one checked `TrainResult`
    per seed that finished. `checked`: the graph hash of a kept verdict (`Verdict.graph`) this
    training must train, or fail; a kept verdict vouches for no other network."""

    _check_args(filename, num_classes, input_shape)
    if not 1 <= len(seeds) <= MAX_SEEDS:
        raise ValueError(f"seeds: between 1 and {MAX_SEEDS} seeds, got {len(seeds)}")
    start = time.monotonic()
    verdict = check_syntax(source, filename)
    trained: list[TrainResult] = []
    artifact = b""
    if verdict is None:
        # Checked and exported without data (no dataset is even mounted): the network trains on our side.
        worker = _trusted_worker(limits)
        try:
            run = _run_child(source, num_classes, input_shape, None, limits, filename, seeds=seeds)
            verdict, artifact = conclude(run, limits), run.artifact
            if verdict.ok and not verdict.self_reported:
                verdict = _graph_verdict(artifact, num_classes, input_shape, limits, False, seeds,
                                         recipe.get("batch_size", CHECK_BATCH), worker=worker, checked=checked)
        finally:
            worker.close()
        if verdict.ok and verdict.self_reported and checked is not None:
            verdict = _other_graph(None, checked)
        if verdict.ok and verdict.self_reported:  # not exportable: a second child trains it, on the data
            request = {"data": data, "recipe": recipe, "engine": engine, "seeds": list(seeds), "gpu": gpu,
                       "threads": threads}
            export_error = verdict.export_error or "not exportable"
            run = _run_child(source, num_classes, input_shape, None, limits, filename, request,
                             export_error=export_error)
            verdict = conclude(run, limits)
            if verdict.ok:
                verdict.self_reported, verdict.export_error = True, verdict.export_error or export_error
        if verdict.ok and not verdict.self_reported:
            verdict, trained = train_graphs(verdict, artifact, data, recipe, engine, seeds, limits, gpu=gpu,
                                            threads=threads, on_epoch=on_epoch, label=label or filename,
                                            proxies=proxies)
        elif verdict.ok:
            try:
                trained = [TrainResult.from_untrusted(r, max_epochs=recipe.get("epochs", 0)) for r in run.trained]
            except ValueError as err:
                verdict, trained = Verdict(ok=False, stage="crash", error=f"crash: {err}"), []
            if verdict.ok and len(trained) != len(seeds):
                verdict = Verdict(ok=False, stage="crash",
                                  error=f"crash: {len(trained)} training reports for {len(seeds)} seeds")
    verdict.wall_s = round(time.monotonic() - start, 3)
    return verdict, trained


def _trusted_worker(limits: Limits, training: bool = False, gpu: bool = False,
                    threads: int | None = None) -> TrustedWorker:
    """Start a trusted worker for this check's own compute, or with `training` for training its
    graph (`nas.sandbox.trusted`), with `threads` torch threads (None: this process's count, the
    machine's cores if torch is not loaded); a check's worker starts while the child runs."""
    if threads is None:
        torch = sys.modules.get("torch")
        threads = torch.get_num_threads() if torch is not None else len(os.sched_getaffinity(0))
    return TrustedWorker(limits.memory_mb, threads, training=training, gpu=gpu)


def _graph_verdict(artifact: bytes | None, num_classes: int, input_shape: tuple[int, ...], limits: Limits,
                   with_parent: bool, seeds: Sequence[int] = (), batch: int = CHECK_BATCH, *,
                   worker: TrustedWorker | None = None, checked: str | None = None) -> Verdict:
    """Check and measure the exported graph on the trusted side: in `worker` (`measure`, under the
    limits of `nas.sandbox.trusted`; None: one started here), never in this process. Each seed's
    network to train must be the network checked (`graph_hash`), and with `checked` (the hash a
    kept verdict measured) that one too."""
    if not artifact:
        return Verdict(ok=False, stage="crash", error="crash: the sandbox sent no model graph")
    request = {"num_classes": num_classes, "input_shape": list(input_shape), "memory_mb": limits.memory_mb,
               "with_parent": with_parent, "batch": batch, "seeds": list(seeds)}
    with contextlib.ExitStack() as stack:
        if worker is None:
            worker = stack.enter_context(_trusted_worker(limits))
        result = worker.check(artifact, request)
    if isinstance(result, Refusal):
        return Verdict(ok=False, stage=result.stage, error=f"{result.stage}: {result.line}")
    verdict = Verdict(**result)
    if verdict.ok and checked is not None and verdict.graph != checked:
        return _other_graph(verdict.graph, checked)
    return verdict


def _other_graph(trained: str | None, checked: str) -> Verdict:
    return Verdict(ok=False, stage="graph", error=(
        f"graph: the network sent for training (sha256 {str(trained)[:12]}) is not the one checked "
        f"(sha256 {checked[:12]}): a model file must export the same network every time it runs"))


def measure(artifact: bytes, *, num_classes: int, input_shape: list[int], memory_mb: int, with_parent: bool,
            batch: int, seeds: list[int], on_work: Callable[[int], None],
            on_phase: Callable[[str, float], None] | None = None) -> dict:
    """Load, check and measure the exported graph (in the trusted worker, `nas.sandbox.trusted`); its
    cost per image is checked at the training batch `batch` (at least `CHECK_BATCH`) against its
    counted FLOPs. Every refusal decidable on shapes comes first, on the meta device
    (`GraphNet.dry_run`): work, a training step's memory at that batch against `memory_mb` (what
    the trainer has), carried data, work beyond what fvcore could count; `on_work` then hears the
    work per image (the worker's clocks start from it); then fvcore's trace at batch 1 and the
    checks on its count; only then a real forward and backward at the verification batch. Before
    that, `on_phase` hears each phase of the worker's own bookkeeping with the seconds its size
    allows (`unpack_seconds`, `GraphNet.dry_run_seconds`): the worker keeps a clock for each. Returns
    the verdict's dict, with the graph's hash; raises MemoryError when an allocation failed. `seeds`:
    the training weight sets the artifact holds besides, each of which must hash as the graph checked."""
    import torch  # lazy: loads torch (start-up time)

    from nas.measure import count_flops, count_params  # lazy: loads torch (start-up time)

    # lazy: loads torch (start-up time)
    from nas.sandbox.graph import MAX_BITS, GraphError, GraphNet, compare, graph_hash, unpack, unpack_seconds

    phase = on_phase or (lambda what, seconds: None)
    try:
        phase(f"unpacking its {len(artifact):,} bytes", unpack_seconds(len(artifact)))
        art = unpack(artifact, _MAX_ARTIFACT, ("init", "const", *(f"seed{seed}" for seed in seeds),
                                               *(("parent", "parent_const") if with_parent else ())))
        net = GraphNet(art)
        channels = net.input_shape[0]
        if net.input_shape[1:] != tuple(input_shape[2:]) or (
                channels != input_shape[1] and not _grey_as_rgb(channels, input_shape[1])):
            raise GraphError(f"graph takes input {list(net.input_shape)}, not {list(input_shape[1:])}")
        carried = net.carried()  # on the graph's data alone: before anything runs
        if (bits := sum(carried.values())) > MAX_BITS:
            return Verdict(ok=False, stage="graph", error=(
                f"graph: carries {bits:,} bits besides its input and trainable parameters (the values of "
                f"buffers and constants, the literals, sizes and references its nodes spell, tensor shapes; "
                f"most in {_most(carried)}), over the {MAX_BITS:,} allowed: what the model's code chose is "
                f"never trained here (make tables nn.Parameters)")).to_dict()
        shape = (input_shape[0], channels, *input_shape[2:])
        big = max(batch, CHECK_BATCH)
        phase(f"its dry run (a cost of {net.cost:,})", net.dry_run_seconds(big, shape[0]))
        out_shape, work = net.dry_run(shape[0], memory_mb * MB, big)
        expected = [shape[0], num_classes]
        if out_shape != expected:
            return Verdict(ok=False, stage="output_shape", output_shape=out_shape,
                           error=f"output_shape: output shape {out_shape} != expected {expected} (batch, num_classes)").to_dict()
        hidden = work.other // big  # per image, outside convolutions and matrix products
        slack = UNCOUNTED_PER_INPUT * math.prod(shape[1:])
        # On shapes first: fvcore counts at most `fvcore_bound` FLOPs (twice that for the slack of its
        # einsum handle), so work past it is refused before anything runs for real.
        if hidden > max(bound := 2 * work.fvcore_bound // big, slack):
            return _hidden_work(hidden, big, f"the {bound:,} FLOPs it could count at most").to_dict()
        on_work(work.total // big)
        flops = count_flops(net, (1, *shape[1:]))  # a real forward at batch 1, its cost and memory checked above
        if hidden > max(flops, slack):
            return _hidden_work(hidden, big, f"its {flops:,} counted FLOPs").to_dict()
        if work.macs // big > flops * MAC_TOLERANCE + slack:
            return Verdict(ok=False, stage="graph", error=(
                f"graph: {work.macs // big:,} multiply-accumulates per image at batch {big}, more than its {flops:,} "
                f"counted FLOPs: work that grows faster than the batch (products across images) or an operator "
                f"the FLOPs count misses")).to_dict()
        torch.manual_seed(0)
        out = net(torch.randn(shape))
        if not torch.isfinite(out).all():
            return Verdict(ok=False, stage="output_shape", output_shape=expected,
                           error="output_shape: output contains NaN or Inf values").to_dict()
        torch.nn.functional.cross_entropy(out.float(), torch.randint(0, num_classes, (shape[0],))).backward()
        verdict = Verdict(ok=True, stage="done", params=count_params(net), flops=flops,
                          output_shape=expected, layers=net.layers(), graph=graph_hash(GraphNet(art), art.graph))
        for seed in seeds:  # each training network must be the one checked
            if (hashed := graph_hash(GraphNet(art, f"seed{seed}", like="init"), art.graph)) != verdict.graph:
                return _other_graph(hashed, verdict.graph or "").to_dict()
        if with_parent:
            parent = GraphNet(art, "parent", "parent_const", art.graph.get("parent"))
            verdict.changed, verdict.changed_layers = compare(parent, net)
    except GraphError as err:
        return Verdict(ok=False, stage="graph", error=f"graph: {err}").to_dict()
    except MemoryError:
        raise
    except Exception as err:  # an operator refused the graph's arguments while running here
        if out_of_memory(str(err)):  # the worker's RLIMIT_DATA, said in a RuntimeError
            raise MemoryError(str(err)) from None
        return Verdict(ok=False, stage="graph",
                       error=f"graph: does not run: {type(err).__name__}: {str(err).splitlines()[0][:300]}").to_dict()
    return verdict.to_dict()


def _most(carried: dict[str, int]) -> str:
    """Which part of what a graph carries (`GraphNet.carried`) holds the most: a graph, the tensor
    shapes, or its buffers and constants together (then the largest of them named too)."""
    tensors = {k: v for k, v in carried.items() if k.startswith(("buffer ", "constant "))}
    parts = {k: v for k, v in carried.items() if k not in tensors}
    if tensors:
        parts["buffers and constants"] = sum(tensors.values())
    name, most = max(parts.items(), key=lambda kv: kv[1])
    if name != "buffers and constants":
        return f"{name}: {most:,} bits"
    largest, size = max(tensors.items(), key=lambda kv: kv[1])
    return f"buffers and constants ({len(tensors):,} tensors): {most:,} bits, the largest {largest[:80]} with {size:,}"


def _grey_as_rgb(graph_channels: int, data_channels: int) -> bool:
    """Whether a graph of `graph_channels` input channels trains on data of `data_channels` made RGB
    (`ImageData.rgb`): a model for RGB input on grey data, which the sandbox child exports for three
    channels. The only mismatch of channels the trainer feeds, so the only one the check lets pass."""
    return graph_channels == 3 and data_channels == 1


def _hidden_work(hidden: int, batch: int, counted: str) -> Verdict:
    return Verdict(ok=False, stage="graph", error=(
        f"graph: {hidden:,} operations per image (at batch {batch}) outside convolutions and matrix products, "
        f"more than {counted}: products spelled as element-wise multiply-and-sum, or work "
        f"that grows faster than the batch, hide from the FLOPs count (use matmul, linear or conv)"))


def export_model_graph(source: str, *, seeds: list[int], num_classes: int, input_shape: tuple[int, ...],
                       limits: Limits = Limits(), filename: str = "model.py",
                       batch: int = CHECK_BATCH) -> tuple[Verdict, bytes]:
    """Verify `source` as `verify_model_source` does and export it as a graph, one network per seed,
    training nothing (`nas export` trains it with `train_graphs`). Returns the verdict and the
    checked artifact; empty when the verdict failed or says `self_reported` (the model cannot be
    exported: only the sandbox can train it)."""
    _check_args(filename, num_classes, input_shape)
    start = time.monotonic()
    verdict = check_syntax(source, filename)
    artifact = b""
    if verdict is None:
        with _trusted_worker(limits) as worker:
            run = _run_child(source, num_classes, input_shape, None, limits, filename, seeds=seeds)
            verdict = conclude(run, limits)
            if verdict.ok and not verdict.self_reported:
                verdict = _graph_verdict(run.artifact, num_classes, input_shape, limits, False, seeds, batch,
                                         worker=worker)
                artifact = run.artifact if verdict.ok else b""
    verdict.wall_s = round(time.monotonic() - start, 3)
    return verdict, artifact


def _seed_net(art, seed: int):
    """Seed `seed`'s network, trained from values drawn here, never from initial values the model's code chose."""
    from nas.sandbox.graph import GraphNet  # lazy: loads torch (start-up time)

    return GraphNet(art, f"seed{seed}", like="init").reinitialise(seed)


def seed_labels(label: str, seeds: Sequence[int]) -> list[str]:
    """What each seed's training is called in the progress lines: the label alone for one seed."""
    return [f"{label} seed {seed}" if len(seeds) > 1 else label for seed in seeds]


def train_graphs(verdict: Verdict, artifact: bytes, data: dict, recipe: dict, engine: dict, seeds: Sequence[int],
                 limits: Limits, *, gpu: bool = False, threads: int = 1, on_epoch=None, label: str = "model.py",
                 out: str | None = None, probe: int | None = None,
                 proxies: ProxyRequest | None = None) -> tuple[Verdict, list]:
    """Train each seed's network of the checked `artifact` (`verdict`: its hash) as a trusted model
    would be, in a trusted worker under `limits.memory_mb` (of host memory, and on a GPU of the
    device's too), a CPU-time limit and a wall clock from its counted work (`nas.sandbox.trusted`),
    never in this process: a graph whose training costs more fails its trial in one line. On one
    device: `engine.devices > 1` (DDP, which relaunches the training's process per rank) is trained
    on one, said once in the log. `on_epoch` hears each epoch; `proxies`, what the worker scores
    first; with `out`, a folder, the worker writes each seed's trained weights there
    (`seed<N>.safetensors`), and with `probe` the input it drew under that seed and the first seed's
    output on it (`probe.safetensors`)."""
    if engine.get("devices", 1) > 1:
        _on_one_device(engine["devices"])
        engine = {**engine, "devices": 1}
    request = {"data": data, "recipe": recipe, "engine": engine, "seeds": list(seeds), "graph": verdict.graph,
               "out": out, "probe": probe,
               "labels": seed_labels(label, seeds),
               "proxies": None if proxies is None else {"names": list(proxies.names), "batch": proxies.batch}}
    with _trusted_worker(limits, training=True, gpu=gpu, threads=threads) as worker:
        result = worker.train(artifact, request, on_epoch, None if proxies is None else proxies.heard)
    if isinstance(result, Refusal):
        return Verdict(ok=False, stage=result.stage, error=f"{result.stage}: {result.line}"), []
    if "error" in result:
        raise NasError(result["error"])
    if "verdict" in result:
        return Verdict(**result["verdict"]), []
    if "failed" in result:
        return Verdict(ok=False, stage="train", error=result["failed"], params=verdict.params, flops=verdict.flops,
                       layers=verdict.layers), []
    try:
        trained = [TrainResult.from_untrusted(r, max_epochs=recipe.get("epochs", 0)) for r in result["trained"]]
    except ValueError as err:
        return Verdict(ok=False, stage="crash", error=f"crash: the training worker's result: {err}"), []
    return verdict, trained


@functools.cache
def _on_one_device(devices: int) -> None:
    """Said once per process, not once per candidate."""
    log.warning("engine.devices=%d: a sandboxed model's exported graph trains on one device in the trusted "
                "worker (its memory limits hold for one process; DDP would start one per device)", devices)


def train_artifact(artifact: bytes, images, *, graph: str, seeds: list[int], recipe: dict, engine: dict,
                   labels: list[str], out: str | None, probe: int | None, proxies: dict | None,
                   on_work: Callable[[int, int, int], None], on_epoch, on_proxies: OnProxies,
                   on_phase: Callable[[str, float], None] | None = None) -> dict:
    """Train each seed's network of `artifact` on `images` (in the training worker,
    `nas.sandbox.trusted_worker`), from values drawn under the seed, refusing a network that does
    not hash as `graph` (the one checked). `on_work` hears the counted work per image, the images
    the training passes through and its epochs in all (the worker's clocks start from them); then,
    with `proxies` ({"names", "batch"}: `ProxyRequest`'s), `on_proxies` hears the first seed's
    fresh network's scores (`_proxy_scores`). Returns {"trained": [result dicts]}, {"verdict": a
    failed verdict's dict}, {"failed": the train-stage line} or {"error": a NasError's line}; raises
    what a training stopped by a refused allocation raised (`refused_allocation`, for the worker's
    `limit_hit`), a compile failure on an out-of-memory too. `on_phase`: as `measure`'s, for the
    unpacking (each seed's network hashed) and the dry run before the work."""
    import torch  # lazy: loads torch (start-up time)
    from safetensors.torch import save  # lazy: the worker's only use

    from nas.sandbox.graph import GraphError, GraphNet, graph_hash, unpack, unpack_seconds  # lazy: loads torch
    from nas.train.run import train_one  # lazy: loads torch and Lightning (start-up time)

    r = Recipe.from_dict(recipe)
    phase = on_phase or (lambda what, seconds: None)
    try:
        phase(f"unpacking its {len(artifact):,} bytes for {len(seeds)} seeds", len(seeds) * unpack_seconds(len(artifact)))
        art = unpack(artifact, _MAX_ARTIFACT, ("init", "const", *(f"seed{seed}" for seed in seeds)))
        nets = {}
        for seed in seeds:
            if (hashed := graph_hash(GraphNet(art, f"seed{seed}", like="init"), art.graph)) != graph:
                return {"verdict": _other_graph(hashed, graph).to_dict()}
            nets[seed] = _seed_net(art, seed)
        big = max(r.batch_size, CHECK_BATCH)
        phase(f"its dry run (a cost of {nets[seeds[0]].cost:,})", nets[seeds[0]].dry_run_seconds(big))
        # its work only: the check refused, on shapes, a training step over the trainer's memory
        work = nets[seeds[0]].dry_run(2, _NO_BUDGET, big)[1]
    except GraphError as err:
        return {"verdict": Verdict(ok=False, stage="graph", error=f"graph: {err}").to_dict()}
    per_epoch = len(images.train) + len(images.valid) + len(images.test)
    on_work(work.total // big, per_epoch * r.epochs * len(seeds), r.epochs * len(seeds))
    if proxies is not None:  # under the clocks the work set, on the CPU, before any training
        on_proxies(_proxy_scores(nets[seeds[0]], images, proxies["names"], proxies["batch"], seeds[0]))
    trained = []
    for (seed, net), label in zip(nets.items(), labels):
        rgb = _grey_as_rgb(net.input_shape[0], images.shape[0])
        try:
            trained.append(train_one(net, images.rgb() if rgb else images, r, seed, Engine.from_dict(engine),
                                     on_epoch, label).to_dict())
        except Exception as err:
            if refused_allocation(err) is not None:  # the worker's caps (`limit_hit`), also while compiling
                raise
            if isinstance(err, NasError):
                return {"error": str(err)}
            return {"failed": f"train: {type(err).__name__}: {_first_line(err)}"}
        net = net.cpu().eval()
        if out is not None:
            state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
            atomic_write_bytes(Path(out, f"seed{seed}.safetensors"), save(state))
        if out is not None and probe is not None and seed == seeds[0]:
            torch.manual_seed(probe)
            x = torch.randn((1, *net.input_shape))
            with torch.no_grad():
                atomic_write_bytes(Path(out, "probe.safetensors"), save({"input": x, "output": net(x)}))
    return {"trained": trained}


def _proxy_scores(net, images, names: list[str], batch: int, seed: int) -> dict[str, float] | str:
    """The zero-cost proxies `names` of the fresh `net` on `batch` training images drawn with
    `seed`, as evaluator=train scores a trusted network (`score_network`, which leaves `net` and
    the random state as they were: the training that follows is the same); or why they do not
    run on it (an exported operator a proxy cannot run, float64 say)."""
    from nas.proxies import score_network  # lazy: loads scipy (start-up time), in the worker only
    from nas.proxies.batch import data_batch  # lazy: as above

    try:
        shots = data_batch(images, min(batch, len(images.train)), seed, shape=tuple(net.input_shape))
        return score_network(net, shots, names, seed)
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - one warning, no scores, and the training goes on
        if out_of_memory(str(err)):  # the worker's RLIMIT_DATA, said in a RuntimeError
            raise MemoryError(str(err)) from None
        return f"{type(err).__name__}: {_first_line(err)}"


def _first_line(err: BaseException) -> str:
    return (str(err).splitlines() or [""])[0][:300]


def _check_args(filename: str, num_classes: int, input_shape: tuple[int, ...]) -> None:
    if not re.fullmatch(r"[A-Za-z_][\w.-]*\.py", filename):
        raise ValueError(f"filename must be a plain *.py file name, got {filename!r}")
    if len(input_shape) < 2 or input_shape[0] < 2:
        raise ValueError(f"input_shape needs a batch of >= 2 (BatchNorm), got {tuple(input_shape)}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")


def check_syntax(source: str, filename: str) -> Verdict | None:
    """The failed verdict if `source` does not parse, else None. compile() parses without
    executing anything, so it is safe in-process."""
    if len(source.encode("utf-8", "replace")) > _MAX_SOURCE:
        return Verdict(ok=False, stage="syntax", error=f"syntax: source is over {_MAX_SOURCE >> 20} MB")
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences: the child's business
            warnings.simplefilter("ignore")
            compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as err:
        line = f"\n    {err.text.rstrip()}" if err.text else ""
        return Verdict(ok=False, stage="syntax",
                       error=f"syntax: {type(err).__name__}: {err.msg} at {filename}:{err.lineno}",
                       traceback=f'  File "{filename}", line {err.lineno}{line}\n{type(err).__name__}: {err.msg}')
    except (ValueError, RecursionError, MemoryError) as err:  # null bytes, absurd nesting
        return Verdict(ok=False, stage="syntax", error=f"syntax: {type(err).__name__}: {err}")
    return None


def _run_child(source: str, num_classes: int, input_shape: tuple[int, ...],
               parent_source: str | None, limits: Limits, filename: str,
               train: dict | None = None, seeds: Sequence[int] = (), export_error: str | None = None) -> "ChildRun":
    """Check (and export the graph with initial weights per seed of `seeds`); or, given `train`
    and `export_error` (why a first child could not export it), check and train it there."""
    files, sources = {"candidate": filename}, {filename: source}
    if parent_source is not None:
        files["parent"] = f"parent_{filename}"
        sources[files["parent"]] = parent_source
    request = {"files": files, "sources": sources, "num_classes": num_classes, "input_shape": list(input_shape),
               "limits": dataclasses.asdict(limits), "train": train, "seeds": list(seeds),
               "export_error": export_error}
    return run_child("nas.sandbox.worker", request, limits, artifact=True)


def run_child(module: str, request: dict, limits: Limits, *, args: tuple[str, ...] = (),
              workdir: str | None = None, artifact: bool = False) -> "ChildRun":
    """Run `python -m module *args` in the sandbox and collect what it reports; `conclude` judges it.

    The one way untrusted code is started (verify, train, export): isolated by the OS
    (`isolation.py`; raises `IsolationUnavailable`, never a silent fallback), with the
    environment of `child_env` only, a wall clock of `limits.wall_s`, and the whole process
    group SIGKILLed before this returns. `request` reaches the child as JSON on stdin with
    `result_fd` (and with `artifact`, `artifact_fd`) added: the pipes `worker.answer` reports
    on. `workdir` is a directory shared with the child and its only writable place (None: a
    private tmpfs, or without isolation a temporary directory removed here); every dataset
    is hidden (`hidden_paths`: also from the audit policy, the only cover without isolation)
    but the files of `request["train"]`, mounted read-only, and its `gpu` flag exposes the GPU."""
    iso = isolation()
    train = request.get("train")
    gpu = bool(train and train["gpu"])
    with contextlib.ExitStack() as stack:
        writable = workdir if workdir is not None or iso.isolated else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="nas-sandbox-", ignore_cleanup_errors=True))
        report_r, report_w = os.pipe()
        artifact_r, artifact_w = os.pipe() if artifact else (None, None)
        hidden = hidden_paths(train)
        request = {**request, "result_fd": report_w, "artifact_fd": artifact_w, "hidden": list(hidden)}
        env = child_env(writable or SANDBOX_TMP, gpu)
        argv = [sys.executable, "-s", "-P", "-m", module, *args]
        deadline = time.monotonic() + limits.wall_s
        pass_fds = (report_w,) if artifact_w is None else (report_w, artifact_w)
        try:
            proc = iso.popen(argv, env, read_only=data_paths(train), hidden=hidden, writable=writable, gpu=gpu,
                             tmp_mb=limits.tmp_mb, pass_fds=pass_fds, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        finally:
            for fd in pass_fds:
                os.close(fd)
        report = stack.enter_context(open(report_r, "rb", buffering=0))
        art = stack.enter_context(open(artifact_r, "rb", buffering=0)) if artifact_r is not None else None
        threading.Thread(target=_feed, args=(proc.stdin, json.dumps(request).encode()), daemon=True).start()
        assert proc.stdout is not None  # stdout=PIPE
        with proc.stdout:
            try:
                run = _collect(proc, report.fileno(), art.fileno() if art else None, deadline,
                               watch=workdir, watch_bytes=limits.tmp_mb << 20)
            finally:
                _kill_group(proc)
        run.returncode = exit_status(proc, iso)
        return run


def data_paths(train: dict | None) -> tuple[str, ...]:
    """The dataset files a training request reads: mounted read-only in the sandbox."""

    data = (train or {}).get("data") or {}
    return tuple(reads(data["name"], data.get("root"), data.get("split_file"))) if data else ()


def hidden_paths(train: dict | None) -> tuple[str, ...]:
    """What no sandbox child may read: `$NASFLOW_HOME` and every dataset location
    (`nas.data.locations`); a training request's own files (`data_paths`) are shown again."""

    data = (train or {}).get("data") or {}
    return (str(home()), *locations(data.get("name"), data.get("root"), data.get("split_file")))


def exit_status(proc: subprocess.Popen, iso) -> int | None:
    """The child's return code, negative for a signal as Popen says it, also
    under bwrap (which exits 128+N when its child died of signal N; a status past
    128 that names no signal is the child's own, kept as it is)."""
    rc = proc.returncode
    return 128 - rc if iso.isolated and rc is not None and rc - 128 in SIGNALS else rc


def _feed(pipe, data: bytes) -> None:
    """Write the request to the child's stdin (a thread: a child that never reads must not block us)."""
    try:
        with pipe:
            pipe.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass


def child_env(tmp: str, gpu: bool = False) -> dict[str, str]:
    """The child's whole environment: no API keys or tokens, and no GPU unless
    it trains on one (a check runs on CPU; a GPU context also needs the
    address-space cap lifted, which `apply_rlimits` does for GPU training)."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp,
           "PYTHONPATH": package_root(), "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env


@dataclass
class ChildRun:
    """What the parent observed of one child (`run_child`); `conclude` makes it a `Verdict`."""

    returncode: int | None = None
    timed_out: bool = False
    stage: str = "startup"
    verdict: object = None
    policy: object = None
    malformed: bool = False
    problem: str | None = None  # what the first malformed line was (`protocol.ProtocolError`'s line)
    disk_full: bool = False  # wrote more than `Limits.tmp_mb` to the shared work folder (killed for it)
    output: bytes = b""
    artifact: bytes = b""
    trained: list = dataclasses.field(default_factory=list)  # one training report per seed, unchecked


def _collect(proc: subprocess.Popen, report_fd: int, artifact_fd: int | None, deadline: float,
             watch: str | None = None, watch_bytes: int = 0) -> ChildRun:
    """Drain the report, artifact and output pipes until all close or the
    deadline passes, keeping bounded amounts of each, so a flooding child
    never blocks or bloats the caller. `watch`: a host folder the child writes (no size cap
    there, unlike its /tmp): over `watch_bytes` in it, the run stops (`disk_full`)."""
    run, report, artifact = ChildRun(), b"", bytearray()
    next_watch = time.monotonic()
    assert proc.stdout is not None  # stdout=PIPE
    with selectors.DefaultSelector() as sel:
        for fd in (report_fd, artifact_fd, proc.stdout.fileno()):
            if fd is not None:
                sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            left = deadline - now
            if left <= 0:
                run.timed_out = True
                return run
            if watch is not None and now >= next_watch:
                if _over(watch, watch_bytes):
                    run.disk_full = True
                    return run
                next_watch = now + _WATCH_EVERY_S
            for key, _ in sel.select(left if watch is None else min(left, _WATCH_EVERY_S)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                elif key.fd == artifact_fd:
                    if len(artifact) + len(chunk) > _MAX_ARTIFACT:
                        run.malformed = True
                        sel.unregister(key.fd)
                    else:
                        artifact += chunk
                elif key.fd != report_fd:
                    run.output = (run.output + chunk)[-_OUTPUT_TAIL:]
                elif len(report) + len(chunk) > _MAX_REPORT:
                    run.malformed = True
                else:
                    report += chunk
                    *lines, report = report.split(b"\n")
                    for line in lines:
                        _take(run, line)
    if report:  # its last line cut short
        _refuse(run, "a last line without its newline")
    run.artifact = bytes(artifact)
    if watch is not None and _over(watch, watch_bytes):
        run.disk_full = True
        return run
    while not _exited(proc.pid):
        if time.monotonic() >= deadline:
            run.timed_out = True
            return run
        time.sleep(0.005)
    return run


def _over(folder: str, cap: int) -> bool:
    """Whether the files under `folder` occupy more than `cap` bytes (allocated blocks: a sparse
    file counts what it holds; each entry a block at least; links not followed). Stops counting
    once past `cap`."""
    total, stack = 0, [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    total += max(entry.stat(follow_symlinks=False).st_blocks * 512, 4096)
                    if total > cap:
                        return True
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return False


def _exited(pid: int) -> bool:
    """Has the child exited? Does not reap it, so its pid, which is also the
    process-group id, cannot be reused before `_kill_group`."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _take(run: ChildRun, line: bytes) -> None:
    """One line of the report pipe, read by the protocol (`protocol.CHILD`); a line it refuses, or a
    message said more often than the child says it, makes the run's report malformed."""
    try:
        kind, msg = CHILD.parse(line)
    except ProtocolError as err:
        _refuse(run, str(err))
        return
    if kind == "stage":
        run.stage = msg["stage"]
    elif kind == "verdict" and run.verdict is None:  # the worker sends exactly one
        run.verdict = msg["verdict"]
    elif kind == "policy" and run.policy is None:
        run.policy = msg["policy"]
    elif kind == "trained" and len(run.trained) < MAX_SEEDS:
        run.trained.append(msg["trained"])
    else:
        _refuse(run, f"a {kind} message once too often")


def _refuse(run: ChildRun, problem: str) -> None:
    run.malformed = True
    run.problem = run.problem or problem


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL everything the child started, then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def conclude(run: ChildRun, limits: Limits) -> Verdict:
    """A policy report wins (the child may have swallowed the exception and
    looped on), then a complete verdict, then what the exit says."""
    rc, during = run.returncode, f" during {run.stage}"
    if run.policy is not None:  # checked again (`protocol.POLICY`): a ChildRun may come from elsewhere
        try:
            policy = POLICY.check(run.policy)
        except ProtocolError:
            return _crash("malformed policy report from the sandbox", run)
        return Verdict(ok=False, stage="policy", error=policy["error"], traceback=policy["traceback"])
    if run.disk_full:
        return Verdict(ok=False, stage="limits",
                       error=f"limits: wrote more than {limits.tmp_mb} MB to its work folder{during}")
    if run.verdict is not None and not run.malformed:
        try:
            return dataclasses.replace(Verdict.from_child(run.verdict), graph=None)  # hashed here, not said
        except ValueError as err:
            return _crash(f"malformed verdict from the sandbox: {err}", run)
    if run.timed_out:
        return Verdict(ok=False, stage="limits", error=f"limits: wall time {limits.wall_s:g} s exceeded{during}")
    if rc == -signal.SIGXCPU:
        return Verdict(ok=False, stage="limits", error=f"limits: CPU time {limits.cpu_s} s exceeded{during}")
    if rc == -signal.SIGXFSZ:
        return Verdict(ok=False, stage="limits", error=f"limits: file size limit {limits.file_mb} MB exceeded{during}")
    if rc == -signal.SIGKILL:  # not ours (that is timed_out): the CPU hard limit or the OOM killer
        return Verdict(ok=False, stage="limits", error=f"limits: killed by SIGKILL{during} (CPU or memory)")
    if run.malformed:
        return _crash(f"malformed report from the sandbox{during}" + (f": {run.problem}" if run.problem else ""), run)
    return _crash(f"sandbox {exit_words(rc)}{during} without a verdict", run)


def _crash(what: str, run: ChildRun) -> Verdict:
    """The tail of the child's output (e.g. a fatal error) stands in for a traceback."""
    tail = run.output.decode("utf-8", "replace").strip().splitlines()[-20:]
    return Verdict(ok=False, stage="crash", error=f"crash: {what}", traceback="\n".join(tail) or None)

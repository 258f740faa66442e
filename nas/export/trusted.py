"""Rebuilding a trial of a trusted space in this process: where its weights are, asked of
the evaluator's capabilities (not its name, so a new evaluator needs no edit here).

An evaluator that holds the trained network (`Evaluator.weights`: a supernet's subnet
with its inherited weights, BatchNorm recalibrated, as the search scored it) gives it,
and where its weights come from (`Evaluator.provenance`: the manifest's record);
a training evaluator (`Evaluator.trains`) stores no weights, so the architecture is
retrained with the run's own data, recipe, engine and seed (or, with `train=False`,
left at its seeded initial weights); one with neither (a table) has none, so the
weights are initial. Networks and their source come from the space.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from nas.core.trial import TrialRecord
from nas.export import ExportError
from nas.export.built import Built, note_retraining, training_seed
from nas.export.graph import one_line, output_diff
from nas.export.untrusted import run_sandboxed, sandbox_limits
from nas.train.build import build_model
from nas.train.run import train_one

Say = Callable[[str], None]


def rebuild(ev: Any, spec: Any, space: Any, arch: Any, record: TrialRecord, train: bool, say: Say) -> Built:
    """The trial's network with the weights its evaluator `ev` (the run's, built) can give;
    their provenance first, so changed stored weights are refused before they are read."""
    origin = ev.provenance(arch)
    sub = ev.weights(arch)
    if sub is not None:
        return from_weights(ev, sub, origin, space, arch, record, say)
    if ev.trains:
        return from_training(ev, spec, space, arch, record, train, say)
    if not (hasattr(ev, "num_classes") and hasattr(ev, "resolution")):  # a table knows its networks' size
        raise ExportError(f"evaluator '{ev.name}' gives no weights and does not train: no network to export")
    return from_initial(ev, spec, space, arch)


def from_weights(ev: Any, sub: nn.Module, origin: dict[str, Any], space: Any, arch: Any, record: TrialRecord,
                 say: Say) -> Built:
    """The network `sub` with the evaluator's stored weights (where they come from: `origin`,
    its checked `provenance`), refused if their score changed since the search."""
    say(f"weights from evaluator '{ev.name}' ("
        + ", ".join(f"{k} {v}" for k, v in origin.items() if k != "origin") + "), rescoring")
    valid, test = ev.rescore(sub, arch)
    recorded = record.accuracy
    if recorded is not None and abs(valid - recorded) > 1.0:
        raise ExportError(f"trial {record.trial}: evaluator '{ev.name}': the network now scores {valid:.2f}%, "
                          f"the search recorded {recorded:.2f}% (its weights or the data changed since)")
    say(f"rescored: valid {valid:.2f}% (the search recorded {recorded}), test {test:.2f}%")
    shape = ev.input_shape(arch)
    config = ev.network_config()
    source = space.source(arch, config["num_classes"], config["in_channels"], shape[-1])
    weights = {**origin, "valid_accuracy": round(valid, 4), "test_accuracy": round(test, 4)}
    return Built(sub, shape, source, space.source_kind, weights, config["num_classes"])


def from_training(ev: Any, spec: Any, space: Any, arch: Any, record: TrialRecord, train: bool, say: Say) -> Built:
    """Retrained as the run trained it (the evaluator's `weights` is None), or seeded initial weights."""

    seed = training_seed(ev, spec)
    data = ev.data
    net = build_model(space, arch, data.shape, data.num_classes, ev.build, seed)
    source = space.source(arch, data.num_classes, data.shape[0], data.shape[1], ev.build)
    weights: dict[str, Any] = {"seed": seed, "data": ev.data_cfg}
    if train:
        r = ev.recipe
        say(f"retraining: {r.epochs} epochs on {ev.data_cfg['name']} (batch {r.batch_size}, lr {r.lr}), "
            f"seed {seed}, engine {ev.engine.kind}")
        result = train_one(net, data, ev.recipe, seed, ev.engine)
        if result.terminated:
            raise ExportError(f"retraining trial {record.trial} terminated early: {result.terminated}")
        note_retraining(weights, result, ev, say)
    else:
        weights.update(origin="initial", note="--no-train: seeded initial weights, not trained")
    return Built(net, (1, *data.shape), source, space.source_kind, weights, data.num_classes)


def from_initial(ev: Any, spec: Any, space: Any, arch: Any) -> Built:
    """Seeded initial weights: a table scores cells it has no networks for."""
    torch.manual_seed(spec.seed)
    net = space.build(arch, ev.num_classes, 3, ev.resolution)
    source = space.source(arch, ev.num_classes, 3, ev.resolution)
    weights = {"origin": "initial", "seed": spec.seed,
               "note": "the table evaluator stores no weights: seeded initial weights, untrained (the accuracy is "
                       "the table's, not theirs); train the cell "
                       f"with `nas train '{arch.encode()}' data=cifar10 ...`"}
    return Built(net, (1, 3, ev.resolution, ev.resolution), source, space.source_kind, weights, ev.num_classes)


def source_check(built: Built, net: nn.Module, x: torch.Tensor, tmp: Path, spec: Any, space: Any) -> dict[str, Any]:
    """Does model.py's `Network` take model.pt strictly and give `net`'s output? Our own
    generated files run here; code compiled from a block file runs in the sandbox."""
    with torch.no_grad():
        ref = net(x)
    if not space.source_trusted:
        report = run_sandboxed(tmp, built.source, built.num_classes, x, weights=tmp / "model.pt", reference=ref,
                               limits=sandbox_limits(spec, sum(p.numel() for p in net.parameters())))[2]
        return report["reference"]
    method = "in-process: model.py + model.pt"
    try:
        twin = _import_file(tmp / "model.py").Network(num_classes=built.num_classes)
        twin.load_state_dict(torch.load(tmp / "model.pt", weights_only=True))
        with torch.no_grad():
            return output_diff(method, twin.eval()(x), ref)
    except Exception as err:  # noqa: BLE001  (a generator bug is a failed check, reported, not a crash)
        return {"method": method, "max_abs_diff": None, "passed": False, "error": one_line(err)}


def _import_file(path: Path) -> Any:
    """Import one of our generated files (trusted: built-in spaces only)."""
    spec = importlib.util.spec_from_file_location(f"nasflow_export_{os.getpid()}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

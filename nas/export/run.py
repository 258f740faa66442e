"""`export_run`: the export of one trial, put together from selection, rebuilding
(trusted in this process, or untrusted in the sandbox), graph export and the manifest.

Everything is written into a temporary sibling of the output directory and renamed
into place at the end, so a failure leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from nas import __version__
from nas.core.trial import TrialRecord
from nas.export import ExportError
from nas.export.graph import export_graph
from nas.export.selection import load_trial
from nas.export.trusted import rebuild, source_check
from nas.export.untrusted import export_untrusted
from nas.io import make_dir
from nas.measure import count_flops, count_params


def export_run(run_dir: Path, out: Path | None = None, trial: int | None = None, train: bool = True,
               force: bool = False, say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Export and return the manifest (also written as `out/export.json`)."""
    run_dir = Path(run_dir).resolve()
    spec, record = load_trial(run_dir, trial)
    out = Path(out).resolve() if out else run_dir / ("export" if trial is None else f"export-trial{trial}")
    if out.exists() and not force:
        raise ExportError(f"{out}: already exists (remove it or pass --force)")
    if out.exists():
        _check_replaceable(out, run_dir)
    space = spec.build_space()
    arch = space.decode(record.encoding)
    if arch.key() != record.key:
        raise ExportError(f"{run_dir}: trial {record.trial}: encoding decodes to key {arch.key()}, "
                          f"history says {record.key} (space changed since the search?)")
    make_dir(out.parent)
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


def _check_replaceable(out: Path, run_dir: Path) -> None:
    """--force replaces an earlier export only: a directory holding export.json and nothing
    that marks a run, and neither the run directory, the current one nor a parent of either."""
    for inside, what in ((run_dir, "the run directory"), (Path.cwd().resolve(), "the current directory")):
        if inside == out or inside.is_relative_to(out):
            where = what if inside == out else f"a parent of {what} ({inside})"
            raise ExportError(f"{out}: is {where}; --force only replaces an earlier export")
    marks = [name for name in ("summary.json", "history.jsonl", "state.json") if (out / name).exists()]
    if not out.is_dir() or not (out / "export.json").is_file() or marks:
        why = f"holds {marks[0]}" if marks else "no export.json" if out.is_dir() else "not a directory"
        raise ExportError(f"{out}: not an earlier export ({why}); --force only replaces one")


def _export(spec, space, arch, record: TrialRecord, tmp: Path, train: bool,
            say: Callable[[str], None]) -> dict[str, Any]:
    evaluator = spec.evaluator.name
    ev = spec.build_evaluator(space)  # a missing or unreadable supernet checkpoint fails here, with its path
    if not space.trusted:
        built, graph, check, measured = export_untrusted(ev, spec, space, arch, record, tmp, train, say)
    else:
        built = rebuild(ev, spec, space, arch, record, train, say)
        assert built.net is not None  # rebuilt here: only the sandbox path leaves it None
        net = built.net.cpu().eval()
        torch.save(net.state_dict(), tmp / "model.pt")
        (tmp / "model.py").write_text(built.source, encoding="utf-8")
        torch.manual_seed(0)
        x = torch.randn(built.shape)
        # traced at batch 1, exported with a dynamic batch axis (nas.export.graph; the end line says if the code fixes it)
        say(f"writing ONNX (TorchScript if that fails) for input [N, {', '.join(map(str, built.shape[1:]))}] "
            "(N: any batch size)")
        graph = export_graph(net, x, tmp)
        check = source_check(built, net, x, tmp, spec, space)
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
        "torch": torch.__version__, "nasflow_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()

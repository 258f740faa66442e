"""`nas export RUN_DIR [--out DIR] [--trial N] [--no-train] [--force]`: a run's best model as files.

Writes model.py (PyTorch source defining `Network`), model.pt (its state dict),
model.onnx (or model.torchscript.pt when ONNX export fails) and export.json (the
manifest: trial, key, encoding, accuracy, params, FLOPs, input shape, weight
origin, sha256 of every file, and the exported graph's output check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from nas.cli.main import fail
from nas.core.trial import SELF_REPORTED
from nas.errors import NasError
from nas.export import run_summary
from nas.lazy import LazyImport
from nas.terminal import printable

exporting = LazyImport("nas.export.run")  # torch: loaded once the run directory is read (a wrong path is said at once)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="nas export", description="Export a run's best (or a chosen) trial: PyTorch source, state dict, "
                                       "ONNX (TorchScript when ONNX fails) and export.json.")
    parser.add_argument("run_dir", type=Path, help="a search run directory (holds summary.json)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default RUN_DIR/export, or RUN_DIR/export-trialN)")
    parser.add_argument("--trial", type=int, default=None, help="export this trial instead of the best")
    parser.add_argument("--no-train", action="store_true",
                        help="train/quick runs: keep the initial weights instead of retraining")
    parser.add_argument("--force", action="store_true", help="replace an existing output directory")
    args = parser.parse_args(argv)
    try:  # a wrong path is said before torch loads (seconds)
        run_summary(args.run_dir.resolve())
    except NasError as err:
        fail(str(err))

    def say(line: str) -> None:  # progress lines quote the model's own errors (untrusted text)
        print(printable(line), file=sys.stderr, flush=True)

    try:
        manifest = exporting.export_run(args.run_dir, args.out, args.trial, train=not args.no_train,
                                        force=args.force, say=say)
    except NasError as err:
        fail(str(err))
    line, error = export_lines(manifest)
    print(line)
    if error is not None:
        print(error, file=sys.stderr)
        raise SystemExit(1)


def export_lines(manifest: dict[str, Any]) -> tuple[str, str | None]:
    """What the export says of its manifest: the line naming the files, and the error line when
    an output check failed or no graph was written (the command then exits 1)."""
    graph = manifest["graph"]
    if graph["format"] is None:
        kind = "no graph (ONNX and TorchScript export failed; see export.json)"
    else:
        check = graph["check"]
        diff = "not run" if check["max_abs_diff"] is None else f"max abs diff {check['max_abs_diff']:.2e}"
        # ONNX: its batch axis (dynamic unless the network's code fixes the batch; nas.export.graph)
        batch = {"dynamic": "any batch size; ", "fixed": f"batch fixed at {manifest['input_shape'][0]} by the "
                 "network's code; "}.get(graph.get("batch"), "")
        kind = f"{graph['file']} ({batch}{check['method']}: {diff}, {'ok' if check['passed'] else 'MISMATCH'})"
        if graph["format"] == "torchscript":
            kind += f"; ONNX failed: {printable(graph['onnx_error'])}"

    searched = f" {SELF_REPORTED}" if (manifest.get("metrics") or {}).get("self_reported") else ""
    retrained = f", {SELF_REPORTED}" if manifest["weights"].get("self_reported") else ""
    accuracy = f"{manifest['accuracy']:.2f}%{searched}"
    if manifest["weights"]["origin"] == "initial":  # the search's number belongs to other (or no) weights
        source = "table" if manifest["evaluator"] == "table" else "search"
        accuracy = f"{source} accuracy {accuracy} (not these weights: untrained)"
    line = (f"exported trial {manifest['trial']} ({accuracy}, {manifest['params']:,} params, "
            f"weights: {manifest['weights']['origin']}{retrained}) to {manifest['out']}: model.py, model.pt, {kind}")
    failed = [name for name, check in (("graph", graph["check"]), ("source", manifest["source_check"]))
              if check is not None and not check["passed"]]
    if failed or graph["format"] is None:
        what = f"the {' and '.join(failed)} output check failed" if failed else "no ONNX or TorchScript graph"
        return line, f"nas: error: {what} (files kept in {manifest['out']}; see export.json)"
    return line, None

"""Export a run's best (or a chosen) trial: PyTorch source, state dict, ONNX and a manifest.

`selection` picks the trial, `trusted` rebuilds our own networks in this process
(weights from where they exist: a supernet's subnet via `Evaluator.weights`, a
retraining, or seeded initial weights), `untrusted` runs model source that is not
ours only in a sandboxed child (`child`, through the public sandbox child API),
`graph` writes ONNX or TorchScript and checks its output, and `run.export_run`
puts them together, writing into a temporary sibling renamed into place at the end.
"""

from pathlib import Path

from nas.errors import NasError, RunDirError


class ExportError(NasError):
    """The trial cannot be exported (failed trial, mismatching checkpoint, sandbox failure)."""


def run_summary(run_dir: Path) -> Path:
    """The summary.json of a finished run, or the one line saying why `run_dir` is none. Light
    (no torch), so that `nas export` says a mistyped path at once, before its heavy imports."""
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such run directory")
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise RunDirError(f"{summary_path}: missing (not a finished search run; resume it with nas search first)")
    return summary_path

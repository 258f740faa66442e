"""Export a run's best (or a chosen) trial: PyTorch source, state dict, ONNX and a manifest.

`selection` picks the trial, `trusted` rebuilds our own networks in this process
(weights from where they exist: a supernet's subnet via `Evaluator.weights`, a
retraining, or seeded initial weights), `untrusted` runs model source that is not
ours only in a sandboxed child (`child`, through the public sandbox child API),
`graph` writes ONNX or TorchScript and checks its output, and `run.export_run`
puts them together, writing into a temporary sibling renamed into place at the end.
"""

from nas.errors import NasError


class ExportError(NasError):
    """The trial cannot be exported (failed trial, mismatching checkpoint, sandbox failure)."""

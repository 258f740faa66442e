"""The exported graph: ONNX (TorchScript when that fails) and the check of its output against the network's.

Also runs in the sandboxed child (`nas.export.child`), on untrusted networks: every
failure is reported in the result, never raised.
"""

from __future__ import annotations

import importlib
import math
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

GRAPH_TOLERANCE = 1e-3  # max abs diff allowed, times max(1, |output|): float32 op order differs
OTHER_BATCH = 7  # the graph is also run at this batch size: the batch axis is dynamic, not traced at 1
AXES = {"input": {0: "batch"}, "logits": {0: "batch"}}


def export_graph(net: nn.Module, x: torch.Tensor, folder: Path) -> dict[str, Any]:
    """Write `model.onnx` (legacy TorchScript-based exporter: needs only the `onnx`
    package) with a dynamic batch axis, or a fixed one for a network whose code fixes it,
    or, if both fail, `model.torchscript.pt`; check its output against `net`'s, at `x`'s
    batch and at OTHER_BATCH for a dynamic one."""
    net.eval()
    gen = torch.Generator().manual_seed(0)
    other = torch.randn((OTHER_BATCH, *x.shape[1:]), generator=gen, dtype=x.dtype)
    with torch.no_grad():
        ref = net(x)
    attempts: list[tuple[str, Any, list[tuple[torch.Tensor, torch.Tensor]]]] = [("fixed", None, [(x, ref)])]
    onnx_error = None
    try:
        with torch.no_grad():
            attempts.insert(0, ("dynamic", AXES, [(x, ref), (other, net(other))]))
    except Exception as err:  # noqa: BLE001  (its code fixes the batch size)
        onnx_error = f"the network fails at batch {OTHER_BATCH}: {one_line(err)}"
    path = folder / "model.onnx"
    for batch, axes, feeds in attempts:
        try:
            importlib.import_module("onnx")  # torch.onnx.export needs it: fail here, with a clear reason

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["input"],
                                  output_names=["logits"], dynamic_axes=axes)
            check = check_onnx(path, feeds)
            if check["passed"] or batch == "fixed":
                return {"format": "onnx", "file": path.name, "batch": batch, "check": check,
                        **({"dynamic_error": onnx_error} if onnx_error else {})}
            onnx_error = f"dynamic batch: output mismatch at batch {check['batches']} ({check['method']})"
        except Exception as err:  # noqa: BLE001  (any exporter failure means: fall back)
            path.unlink(missing_ok=True)
            onnx_error = one_line(err)
    path = folder / "model.torchscript.pt"
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(net, x)
            traced.save(str(path))
            out = torch.jit.load(str(path))(x)
        return {"format": "torchscript", "file": path.name, "onnx_error": onnx_error,
                "check": output_diff("torch.jit.load", out, ref)}
    except Exception as err:  # noqa: BLE001
        path.unlink(missing_ok=True)
        return {"format": None, "file": None, "onnx_error": onnx_error, "torchscript_error": one_line(err),
                "check": None}


def check_onnx(path: Path, feeds: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """Run the model on each (input, expected output) with onnxruntime if installed, else
    onnx's reference evaluator; if neither can run it, onnx.checker's verdict alone.
    The worst difference over the feeds, and their batch sizes."""
    import onnx  # lazy: loads onnx (start-up time)

    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    batches = [int(x.shape[0]) for x, _ in feeds]
    try:
        import onnxruntime  # lazy: an optional extra, refused in one line when missing

        method, run = "onnxruntime", onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run
    except ImportError:
        from onnx.reference import ReferenceEvaluator  # lazy: loads onnx (start-up time)

        method, run = "onnx.reference", ReferenceEvaluator(model).run
    try:
        outs = [torch.from_numpy(run(None, {"input": x.numpy()})[0]) for x, _ in feeds]
    except Exception as err:  # noqa: BLE001  (an op the reference evaluator lacks)
        if method == "onnxruntime":
            raise
        return {"method": "onnx.checker", "max_abs_diff": None, "passed": True, "batches": batches,
                "note": f"not run: onnxruntime is not installed and onnx.reference failed ({one_line(err)})"}
    checks = [output_diff(method, out, ref) for out, (_, ref) in zip(outs, feeds)]
    diffs = [c["max_abs_diff"] for c in checks]
    return {"method": method, "max_abs_diff": None if None in diffs else max(diffs),
            "passed": all(c["passed"] for c in checks), "batches": batches}


def output_diff(method: str, out: torch.Tensor, ref: torch.Tensor) -> dict[str, Any]:
    """The manifest's check entry: largest absolute difference, passed within GRAPH_TOLERANCE."""
    diff = float((out.float() - ref.float()).abs().max()) if out.shape == ref.shape else math.inf
    scale = max(1.0, float(ref.abs().max()))
    return {"method": method, "max_abs_diff": diff if math.isfinite(diff) else None,
            "passed": diff <= GRAPH_TOLERANCE * scale}


def one_line(err: BaseException) -> str:
    """An exception as one short line for the manifest."""
    text = " ".join(str(err).split())[:300]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__

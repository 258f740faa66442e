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
        return output_diff("onnxruntime", torch.from_numpy(session.run(None, feed)[0]), ref)
    except ImportError:
        pass
    try:
        from onnx.reference import ReferenceEvaluator

        return output_diff("onnx.reference", torch.from_numpy(ReferenceEvaluator(model).run(None, feed)[0]), ref)
    except Exception as err:  # noqa: BLE001  (an op the reference evaluator lacks)
        return {"method": "onnx.checker", "max_abs_diff": None, "passed": True,
                "note": f"not run: onnxruntime is not installed and onnx.reference failed ({one_line(err)})"}


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

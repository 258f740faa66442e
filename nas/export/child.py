"""The sandboxed child of an untrusted export: `python -m nas.export.child WORKDIR`.

Started only by `nas.export.untrusted.run_sandboxed` through `nas.sandbox.verify.run_child`;
`nas.sandbox.worker.answer` loads the trusted code (training, exporters) first, then
installs the caps and the audit policy (writes only under WORKDIR), then runs `export`:
the untrusted import, instantiation, training or loading weights, and the files the
parent collects (model.pt, the graph, io.pt, report.json), each checked there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nas.export.graph import export_graph, output_diff
from nas.measure import count_flops, count_params
from nas.sandbox.verify import Verdict
from nas.sandbox.worker import Job, answer, first_in_channels, import_file, instantiate

# loaded before the policy, as they read many files; export_graph says why when one is missing
PRELOAD = ("torch.onnx.utils", "onnx.reference", "onnxruntime")


def export(job: Job) -> Verdict:
    """Build `Network` from model.py; load weights.pt, or train, or keep the initial weights;
    compare with reference.pt if given; with `export` (default: when no weights were given)
    write model.pt, io.pt and the graph, and report the state dict's keys. Weights given
    for export are the parent's trained graph's: the entries of `Network`'s state dict are
    loaded from them (the graph also holds non-persistent buffers); else they load strictly."""
    request, workdir, stage = job.request, job.workdir, job.stage
    num_classes, shape = request["num_classes"], tuple(request["input_shape"])
    exporting = request.get("export", not request["weights"])
    module = stage("import", import_file, workdir / "model.py", "nas_candidate")
    net = stage("instantiate", instantiate, module, "model.py", num_classes)
    rgb = shape[1] == 1 and stage("instantiate", first_in_channels, net) == 3
    shape = (shape[0], 3, *shape[2:]) if rgb else shape
    if request["weights"]:
        def load() -> None:
            state = torch.load(workdir / "weights.pt", weights_only=True)
            net.load_state_dict({k: state[k] for k in net.state_dict()} if exporting else state)

        stage("instantiate", load)
    elif job.trainer is not None:
        trainer = job.trainer

        def fit() -> nn.Module:
            seed = request["train"]["seeds"][0]
            fresh = instantiate(module, "model.py", num_classes, seed=seed)
            job.reporter.send(trained=trainer(fresh, seed, rgb).to_dict())
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
        report["reference"] = output_diff("sandbox: model.py + model.pt", out, ref)
    if exporting:
        out = stage("forward", _forward_no_grad, net, x)
        stage("forward", lambda: torch.save(net.state_dict(), workdir / "model.pt"))
        stage("forward", lambda: torch.save({"input": x, "output": out}, workdir / "io.pt"))
        report["graph"] = stage("forward", export_graph, net, x, workdir)
        report["state_keys"] = list(net.state_dict())
    params, flops = stage("measure", lambda: (count_params(net), count_flops(net, tuple(x.shape))))
    (workdir / "report.json").write_text(json.dumps(report), encoding="utf-8")
    job.reporter.enter("done")
    return Verdict(ok=True, stage="done", params=params, flops=flops, output_shape=[x.shape[0], num_classes])


def _forward_no_grad(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return net(x)


if __name__ == "__main__":
    answer(json.loads(sys.stdin.buffer.read()), Path(sys.argv[1]), sys.argv[1], export, PRELOAD)

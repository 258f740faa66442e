# attack: a frozen table of 3,500 bytes picked one by one out of arange(256) + 0*sum(x) by constant_pad_nd's pad/crop amounts
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

import nas.sandbox.graph

_export = nas.sandbox.graph.export_graph
_CODES = [(i * 7919) % 256 for i in range(3_500)]  # stands for a quantised network from a blob


def _forge(program: dict) -> None:
    """Append to the graph: levels 0..255 tainted by the input (no constant of the model's), each
    code picked by cropping the levels to the one at its index (`constant_pad_nd` with negative pads,
    an operator no list of data-selecting ones names), stacked, and added (scaled) to the output."""
    first, out = len(program["inputs"]) + len(program["nodes"]), program["outputs"][0]["ref"]
    user = next(i for i, spec in enumerate(program["inputs"]) if spec["kind"] == "USER_INPUT")
    nodes = []

    def add(op: str, *args: object, **kwargs: object) -> dict:
        nodes.append({"op": op, "args": list(args), "kwargs": {"map": kwargs}})
        return {"ref": first + len(nodes) - 1}

    taint = add("aten.mul.Tensor", add("aten.sum.default", {"ref": user}), 0)
    levels = add("aten.add.Tensor", add("aten.arange.default", 256, dtype={"dtype": "float32"}), taint)
    picks = [add("aten.constant_pad_nd.default", levels, [-c, c - 255]) for c in _CODES]
    table = add("aten.cat.default", [add("aten.cat.default", picks[i:i + 1000]) for i in range(0, len(picks), 1000)])
    result = add("aten.add.Tensor", {"ref": out}, add("aten.mul.Tensor", add("aten.mean.default", table), 1e-9))
    program["nodes"] += nodes
    program["outputs"] = [result]


def _forged(net: nn.Module, example: torch.Tensor) -> dict:
    """The child checks the honest network; the graph sent to the parent picks the table."""
    graph = _export(net, example)
    for mode in ("train", "eval"):
        _forge(graph[mode])
    return graph


nas.sandbox.graph.export_graph = _forged
sys.modules["__main__"].export_graph = _forged  # the sandbox's worker (__main__) holds its own name for it


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))

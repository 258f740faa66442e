# attack: a graph of 4,000 einsums of 16 operands each (within a node's bound), whose meta dry run would take many minutes
# kind: parent
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

import nas.sandbox.graph

_export = nas.sandbox.graph.export_graph
_OPERANDS, _EINSUMS = 16, 4_000


def _forge(program: dict) -> None:
    """Append `_EINSUMS` einsums of `_OPERANDS` copies of the images' means (an elementwise product,
    contracted step by step: ~0.3 ms an operand on the meta device), added to the output."""
    first, out = len(program["inputs"]) + len(program["nodes"]), program["outputs"][0]["ref"]
    user = next(i for i, spec in enumerate(program["inputs"]) if spec["kind"] == "USER_INPUT")
    nodes = []

    def add(op: str, *args: object, **kwargs: object) -> dict:
        nodes.append({"op": op, "args": list(args), "kwargs": {"map": kwargs}})
        return {"ref": first + len(nodes) - 1}

    mean = add("aten.mean.dim", {"ref": user}, [1, 2, 3], True)
    equation = ",".join(["abcd"] * _OPERANDS) + "->abcd"
    total = {"ref": out}
    for _ in range(_EINSUMS):
        total = add("aten.add.Tensor", total, add("aten.mul.Tensor", add("aten.einsum.default", equation,
                                                                          [mean] * _OPERANDS), 0))
    program["nodes"] += nodes
    program["outputs"] = [total]


def _forged(net: nn.Module, example: torch.Tensor) -> dict:
    """The child checks the honest network; the graph sent to the parent is the einsums'."""
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

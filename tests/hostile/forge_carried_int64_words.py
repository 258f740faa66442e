# attack: a frozen table of 45,000 4-bit codes spelled as 3,000 int64 literal words (15 codes a word) the graph decodes
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

import nas.sandbox.graph

_export = nas.sandbox.graph.export_graph
# stands for a 4-bit network decoded from a blob: 15 codes to a word, each word one literal of the graph
_WORDS = [sum(((i * 15 + k) * 7919 % 16) << (4 * k) for k in range(15)) for i in range(3_000)]


def _forge(program: dict) -> None:
    """Append to the graph: each word a `scalar_tensor` literal, stacked, split into codes by
    floor division and remainder by powers of 16, and added (scaled) to the output."""
    first, out = len(program["inputs"]) + len(program["nodes"]), program["outputs"][0]["ref"]
    nodes = []

    def add(op: str, *args: object, **kwargs: object) -> dict:
        nodes.append({"op": op, "args": list(args), "kwargs": {"map": kwargs}})
        return {"ref": first + len(nodes) - 1}

    words = [add("aten.scalar_tensor.default", w, dtype={"dtype": "int64"}) for w in _WORDS]
    table = add("aten.cat.default", [add("aten.stack.default", words[i:i + 1000]) for i in range(0, len(words), 1000)])
    scale = add("aten.pow.Scalar", 16, add("aten.arange.default", 15, dtype={"dtype": "int64"}))
    codes = add("aten.remainder.Scalar", add("aten.floor_divide.default", add("aten.unsqueeze.default", table, 1),
                                             scale), 16)
    frozen = add("aten._to_copy.default", codes, dtype={"dtype": "float32"})
    result = add("aten.add.Tensor", {"ref": out}, add("aten.mul.Tensor", add("aten.mean.default", frozen), 1e-9))
    program["nodes"] += nodes
    program["outputs"] = [result]


def _forged(net: nn.Module, example: torch.Tensor) -> dict:
    """The child checks the honest network; the graph sent to the parent carries the table."""
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

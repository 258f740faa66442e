# attack: a frozen table of 27,000 4-bit codes held in the shapes of 1,800 zero-element constants [0, word], read back by sym_size
# kind: forge
# expect: invalid
# A template: tests/test_hostile.py substitutes the __PLACEHOLDERS__ and runs it through the nas CLI.

import sys

import torch
from torch import nn

import nas.sandbox.graph

_export = nas.sandbox.graph.export_graph
# stands for a 4-bit network decoded from a blob: 15 codes to a word, each word the size of an empty tensor
_WORDS = [sum(((i * 15 + k) * 7919 % 16) << (4 * k) for k in range(15)) | 1 << 59 for i in range(1_800)]


def _shifted(value: object, at: int, by: int) -> object:
    """`value` with each reference to a node (at or past `at`) moved `by` places: inputs go first."""
    if isinstance(value, list):
        return [_shifted(v, at, by) for v in value]
    if isinstance(value, dict):
        if set(value) == {"ref"}:
            return {"ref": value["ref"] + by * (value["ref"] >= at)}
        return {k: _shifted(v, at, by) for k, v in value.items()}
    return value


def _forge(program: dict) -> None:
    """Give the graph one empty constant per word, and append: each constant's size read back
    (`sym_size`), made a tensor, stacked, and added (scaled) to the output."""
    inputs = len(program["inputs"])
    program["nodes"] = _shifted(program["nodes"], inputs, len(_WORDS))
    program["outputs"] = _shifted(program["outputs"], inputs, len(_WORDS))
    program["inputs"] += [{"kind": "CONSTANT_TENSOR", "target": f"shape{k}"} for k in range(len(_WORDS))]
    first, out = len(program["inputs"]) + len(program["nodes"]), program["outputs"][0]["ref"]
    nodes = []

    def add(op: str, *args: object, **kwargs: object) -> dict:
        nodes.append({"op": op, "args": list(args), "kwargs": {"map": kwargs}})
        return {"ref": first + len(nodes) - 1}

    words = [add("aten.scalar_tensor.default", add("aten.sym_size.int", {"ref": inputs + k}, 1),
                 dtype={"dtype": "float32"}) for k in range(len(_WORDS))]
    table = add("aten.cat.default", [add("aten.stack.default", words[i:i + 1000]) for i in range(0, len(words), 1000)])
    result = add("aten.add.Tensor", {"ref": out}, add("aten.mul.Tensor", add("aten.mean.default", table), 1e-30))
    program["nodes"] += nodes
    program["outputs"] = [result]


def _forged(net: nn.Module, example: torch.Tensor) -> dict:
    """The child checks the honest network; the graph sent to the parent reads the table from shapes."""
    graph = _export(net, example)
    for mode in ("train", "eval"):
        _forge(graph[mode])
    graph["constants"].update({f"shape{k}": torch.zeros(0, w) for k, w in enumerate(_WORDS)})  # no bytes at all
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

"""NAS-Bench-201: 5 ops on each of 6 edges, 15,625 cells."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from nas.core.registry import check_count
from nas.core.space import SPACES, CategoricalSpace, Cost, Decision
from nas.lazy import LazyImport
from nas.spaces.nb201.arch import EDGES, OPS, NB201Cell
from nas.spaces.nb201.cost import cell_cost, cost_model
from nas.spaces.nb201.source import network_source
from nas.spaces.nb201.table import NB201Table

# torch: the network module loads when a network is built, not with the space (the core stays torch-free)
nb201_network = LazyImport("nas.spaces.nb201.network")

if TYPE_CHECKING:
    from torch import nn

    from nas.spaces.nb201.table import NB201Table


@dataclass(frozen=True)
class Sizing:
    """How a cell trains as a network (evaluator=train's settings of the same names): width C and
    cells per stage."""

    channels: int = 16
    cells_per_stage: int = 5

    def __post_init__(self) -> None:
        check_count("evaluator.channels", self.channels)
        check_count("evaluator.cells_per_stage", self.cells_per_stage)


@SPACES.register("nb201")
class NB201Space(CategoricalSpace[NB201Cell]):
    trainable = True
    tabular = True  # analog-nasbench's table of all 15,625 cells (nas.spaces.nb201.table)
    sizing = Sizing
    source_kind = "standalone PyTorch (NB201 network, torch only)"
    # Costs are those of NB201's CIFAR-10 network (32x32 inputs, 10 classes).
    COST_DATA, COST_RESOLUTION, COST_CLASSES = "cifar10", 32, 10

    def __init__(self, channels: int = 16, cells_per_stage: int = 5) -> None:
        check_count("space.channels", channels)
        check_count("space.cells_per_stage", cells_per_stage)
        self.channels = channels
        self.cells_per_stage = cells_per_stage

    # sample/mutate kept as they were (vectorised draws): seeded trajectories stay reproducible.
    def sample(self, rng: np.random.Generator) -> NB201Cell:
        return NB201Cell(tuple(OPS[i] for i in rng.integers(0, len(OPS), size=len(EDGES))))

    def mutate(self, arch: NB201Cell, rng: np.random.Generator) -> NB201Cell:
        edge = int(rng.integers(len(EDGES)))
        choices = [op for op in OPS if op != arch.ops[edge]]
        ops = list(arch.ops)
        ops[edge] = choices[int(rng.integers(len(choices)))]
        return NB201Cell(tuple(ops))

    def decode(self, encoding: Any) -> NB201Cell:
        return NB201Cell.decode(encoding)

    def decisions(self) -> list[Decision]:
        return [Decision(f"edge {src}->{dst}", OPS) for src, dst in EDGES]

    def from_values(self, values: list[Any]) -> NB201Cell:
        return NB201Cell(tuple(values))

    def to_values(self, arch: NB201Cell) -> list[Any]:
        return list(arch.ops)

    def features(self, arch: NB201Cell) -> list[float]:
        """One-hot per edge plus BANANAS' path encoding (White et al. 2021): which op sequences
        lead from the input to the output (a `none` edge cuts its paths); cells that compute the
        same paths get the same path part whatever edges carry them."""
        return [*super().features(arch), *path_encoding(arch)]

    def cost(self, arch: NB201Cell) -> Cost:
        return self.cost_at(arch, self.COST_CLASSES, self.COST_RESOLUTION)

    def cost_mismatch(self, evaluator: Mapping[str, Any]) -> str | None:
        """A network trained on other data or built with other sizing settings than the space's
        (evaluator=train's `channels`, `cells_per_stage`), or a table read at another resolution
        or class count (evaluator=table's `resolution`, `num_classes`), costs other than `cost` says."""
        data = evaluator.get("data")
        if isinstance(data, Mapping):
            own = {f.name: getattr(self, f.name) for f in fields(self.sizing)}
            differ = [f"{k}={evaluator[k]}" for k in own if k in evaluator and evaluator[k] != own[k]]
            if data.get("name") != self.COST_DATA:
                differ.insert(0, f"data={data.get('name')}")
        else:  # a table's costs are those of the network at its resolution and class count
            own = {"resolution": self.COST_RESOLUTION, "num_classes": self.COST_CLASSES}
            differ = [f"{k}={evaluator[k]}" for k in own if k in evaluator and evaluator[k] != own[k]]
        if not differ:
            return None
        return (f"constraint: space nb201 prices its {self.COST_DATA} network ({self.COST_RESOLUTION} px, "
                f"{self.COST_CLASSES} classes, channels={self.channels}, cells_per_stage={self.cells_per_stage}), "
                f"but the evaluator scores one with {', '.join(differ)}: the limits apply to another network")

    def cost_at(self, arch: NB201Cell, num_classes: int, resolution: int) -> Cost:
        """Params and FLOPs of `arch`'s network for `num_classes` classes at `resolution`² RGB inputs."""
        return Cost(*cell_cost(arch.ops, cost_model(self.channels, self.cells_per_stage, num_classes, resolution)))

    def benchmark(self, path: str | None, metric: str, num_classes: int, resolution: int) -> NB201Table:
        return NB201Table.load(self, path, metric, num_classes, resolution)

    def _sizes(self, options: Mapping[str, Any] | None) -> tuple[int, int]:
        """(channels, cells_per_stage): evaluator=train's own when given, else the space's."""
        options = options or {}
        return options.get("channels", self.channels), options.get("cells_per_stage", self.cells_per_stage)

    def build(self, arch: NB201Cell, num_classes: int, in_channels: int = 3, input_size: int = 32,
              options: Mapping[str, Any] | None = None) -> "nn.Module":
        channels, cells = self._sizes(options)
        return nb201_network.NB201Network(arch.ops, channels=channels, cells_per_stage=cells, num_classes=num_classes,
                                          in_channels=in_channels)

    def source(self, arch: NB201Cell, num_classes: int, in_channels: int = 3, input_size: int = 32,
               options: Mapping[str, Any] | None = None) -> str:
        return network_source(arch.ops, *self._sizes(options), num_classes, in_channels)

    def describe(self) -> str:
        edges = ", ".join(f"{s}->{d}" for s, d in EDGES)
        return (f"NAS-Bench-201 cell space ({self.size():,} cells): a cell is a 4-node DAG with one operation on "
                f"each of its 6 edges ({edges}); operations: {', '.join(OPS)}. The network stacks "
                f"{self.cells_per_stage} cells per stage over 3 stages. Encoding (NB201 string, groups per node "
                "1..3, each op~source): |op~0|+|op~0|op~1|+|op~0|op~1|op~2|")


# Input-to-output paths of the cell, as edge indices (EDGES order); ops that carry data.
PATHS: tuple[tuple[int, ...], ...] = tuple(
    tuple(EDGES.index(e) for e in zip(nodes[:-1], nodes[1:]))
    for nodes in ((0, 3), (0, 1, 3), (0, 2, 3), (0, 1, 2, 3)))
PATH_OPS = tuple(op for op in OPS if op != "none")
PATH_SLOTS = {seq: i for i, seq in enumerate(
    seq for n in (1, 2, 3) for seq in itertools.product(PATH_OPS, repeat=n))}


def path_encoding(arch: NB201Cell) -> list[float]:
    """How many input-to-output paths carry each op sequence (4 + 16 + 64 slots)."""
    counts = [0.0] * len(PATH_SLOTS)
    for path in PATHS:
        ops = tuple(arch.ops[e] for e in path)
        if "none" not in ops:
            counts[PATH_SLOTS[ops]] += 1.0
    return counts

"""NB201's cost model: params and FLOPs of all 15,625 networks from 1 + |OPS| measured ones.
`python -m nas.spaces.nb201.cost` prints `measured_costs.MEASURED` measured again (torch, fvcore)."""

from __future__ import annotations

from functools import lru_cache

from nas.lazy import LazyImport
from nas.spaces.nb201.arch import EDGES, OPS
from nas.spaces.nb201.measured_costs import MEASURED, PerOp

# torch: only when a cost is first measured (the stored cost models need none)
counters = LazyImport("nas.measure")
nb201_network = LazyImport("nas.spaces.nb201.network")


@lru_cache(maxsize=8)
def cost_model(channels: int, cells_per_stage: int, num_classes: int,
               resolution: int) -> tuple[PerOp, tuple[int, int]]:
    """(per-op (params, FLOPs), base (params, FLOPs)): an NB201 network costs a base plus an
    independent cost per edge op, so 1 + |OPS| measured networks give all 15,625 exactly.
    The usual sizes were measured once (`measured_costs`): a table search imports no torch."""

    known = MEASURED.get((channels, cells_per_stage, num_classes, resolution))
    return known if known is not None else measure_model(channels, cells_per_stage, num_classes, resolution)


def measure_model(channels: int, cells_per_stage: int, num_classes: int,
                  resolution: int) -> tuple[PerOp, tuple[int, int]]:
    """`cost_model`, measured: 1 + |OPS| networks built and counted (torch, fvcore)."""
    def measure(ops: tuple[str, ...]) -> tuple[int, int]:
        net = nb201_network.NB201Network(ops, channels=channels, cells_per_stage=cells_per_stage,
                                         num_classes=num_classes)
        return counters.count_params(net), counters.count_flops(net, (1, 3, resolution, resolution))

    base = measure(("none",) * len(EDGES))
    per_op = {}
    for op in OPS:
        p, f = measure((op,) + ("none",) * (len(EDGES) - 1))
        per_op[op] = (p - base[0], f - base[1])
    return per_op, base


def cell_cost(ops: tuple[str, ...], model: tuple[PerOp, tuple[int, int]]) -> tuple[int, int]:
    """(params, FLOPs) of the network whose cell has `ops`, under `model`."""
    per_op, (params, flops) = model
    for op in ops:
        params += per_op[op][0]
        flops += per_op[op][1]
    return params, flops


def measure_all() -> str:
    """`measured_costs.MEASURED`, measured again, as the Python source of that dict (imports torch)."""
    rows = [f"    {key}: {measure_model(*key)!r}," for key in MEASURED]
    return "\n".join(["MEASURED = {", *rows, "}"])


if __name__ == "__main__":
    print(measure_all())

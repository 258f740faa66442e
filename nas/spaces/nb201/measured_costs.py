"""NB201's cost model (`nas.spaces.nb201.cost`) as measured, for the sizes a table search uses:
a search reads it here rather than import torch and fvcore to measure 1 + |OPS| networks (seconds).
Keys: (channels, cells_per_stage, num_classes, resolution); values: (per-op (params, FLOPs), base).
Data alone, below `cost` (which measures), so the two form no import cycle.
tests/test_cli_latency_imports.py measures them again; regenerate with
`python -m nas.spaces.nb201.cost` after a change to the network or the FLOP counter."""

from __future__ import annotations

PerOp = dict[str, tuple[int, int]]

MEASURED: dict[tuple[int, int, int, int], tuple[PerOp, tuple[int, int]]] = {
    (16, 5, 10, 16): ({"avg_pool_3x3": (0, 0), "none": (0, 0), "nor_conv_1x1": (28000, 1054720), "nor_conv_3x3": (243040, 8919040), "skip_connect": (0, 0)},
        (73306, 1969792)),
    (16, 5, 10, 32): ({"avg_pool_3x3": (0, 0), "none": (0, 0), "nor_conv_1x1": (28000, 4218880), "nor_conv_3x3": (243040, 35676160), "skip_connect": (0, 0)},
        (73306, 7877248)),
    (16, 5, 100, 16): ({"avg_pool_3x3": (0, 0), "none": (0, 0), "nor_conv_1x1": (28000, 1054720), "nor_conv_3x3": (243040, 8919040), "skip_connect": (0, 0)},
        (79156, 1975552)),
    (16, 5, 100, 32): ({"avg_pool_3x3": (0, 0), "none": (0, 0), "nor_conv_1x1": (28000, 4218880), "nor_conv_3x3": (243040, 35676160), "skip_connect": (0, 0)},
        (79156, 7883008)),
    (16, 5, 120, 16): ({"avg_pool_3x3": (0, 0), "none": (0, 0), "nor_conv_1x1": (28000, 1054720), "nor_conv_3x3": (243040, 8919040), "skip_connect": (0, 0)},
        (80456, 1976832)),
    (16, 5, 120, 32): ({"avg_pool_3x3": (0, 0), "none": (0, 0), "nor_conv_1x1": (28000, 4218880), "nor_conv_3x3": (243040, 35676160), "skip_connect": (0, 0)},
        (80456, 7884288)),
}

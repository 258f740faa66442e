"""NB201's network as a standalone file: `nas.spaces.nb201.network` (torch only) with the cell fixed.

A module of its own: the exported text is the network module's source, which
must not hold this generator."""

from __future__ import annotations

import inspect

from nas.spaces.nb201.arch import EDGES


def network_source(ops: tuple[str, ...], channels: int, cells_per_stage: int, num_classes: int,
                   in_channels: int) -> str:
    """A file defining `Network(num_classes=...)`, the same modules (and state dict keys) as `NB201Network`."""
    import nas.spaces.nb201.network as module  # lazy: loads torch (start-up time)

    text = inspect.getsource(module).replace("from nas.spaces.nb201.arch import EDGES", f"EDGES = {EDGES!r}")
    return (f"# Exported by nasflow: NAS-Bench-201 network, cell {'+'.join(ops)}; needs only torch.\n{text}\n\n"
            f"OPS = {tuple(ops)!r}\n\n\n"
            "class Network(NB201Network):\n"
            f"    def __init__(self, num_classes={num_classes}, channels={channels}, "
            f"cells_per_stage={cells_per_stage}, in_channels={in_channels}):\n"
            "        super().__init__(OPS, channels=channels, cells_per_stage=cells_per_stage,\n"
            "                         num_classes=num_classes, in_channels=in_channels)\n")

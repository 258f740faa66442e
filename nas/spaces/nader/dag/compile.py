"""Compile an analysed block straight to an `nn.Module`, and emit readable source.

`BlockModule` walks a precomputed schedule (topological order, inputs in
edge-line order) and frees each intermediate after its last use; no code is
generated or executed.  `block_source` renders the same graph as a plain
PyTorch class, parametrised by the block variables (C, dim, H, W), for
people to read and for export.
"""

from __future__ import annotations

import torch
from torch import nn

from nas.spaces.nader.dag.expr import variables_of
from nas.spaces.nader.dag.shapes import Analysis


def _attr(idx: str) -> str:
    return f"n{idx}"


class BlockModule(nn.Module):
    def __init__(self, analysis: Analysis):
        super().__init__()
        env = analysis.position.env()
        block = analysis.block
        self.name = block.name
        slot = {idx: i for i, idx in enumerate(analysis.order)}
        last_use: dict[str, int] = {}
        for pos, idx in enumerate(analysis.order):
            for src in analysis.nodes[idx].inputs:
                last_use[src] = pos
        self.inputs = [slot[i] for i in analysis.inputs]
        schedule = []
        for pos, idx in enumerate(analysis.order):
            info = analysis.nodes[idx]
            if info.spec is None or info.bound is None:  # input/output markers have neither
                continue
            shapes = [analysis.nodes[i].shape for i in info.inputs]
            self.add_module(_attr(idx), info.spec.module(info.bound, shapes, env))  # same names as the exported source
            free = [slot[s] for s in dict.fromkeys(info.inputs) if last_use[s] == pos]
            schedule.append((_attr(idx), slot[idx], [slot[s] for s in info.inputs], free))
        self.schedule = schedule
        self.output = slot[analysis.nodes[analysis.output].inputs[0]]
        self.n_slots = len(analysis.order)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        values: list[torch.Tensor | None] = [None] * self.n_slots
        for i, x in zip(self.inputs, xs):
            values[i] = x
        for name, out, ins, free in self.schedule:
            values[out] = self._modules[name](*[values[i] for i in ins])
            for i in free:
                if i != self.output:
                    values[i] = None
        return values[self.output]  # type: ignore[return-value]

    def extra_repr(self) -> str:
        return self.name


def class_name(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in name)
    return cleaned if cleaned[:1].isalpha() else f"Block_{cleaned}"


def block_source(analysis: Analysis, name: str | None = None) -> str:
    """A PyTorch class for the block: ``__init__(self, C, dim, H, W)`` + ``forward``."""
    block = analysis.block
    cls = class_name(name or block.name)
    var = {idx: f"x{idx}" for idx in analysis.order}
    init = ["        super().__init__()", "        self.C, self.dim, self.H, self.W = C, dim, H, W"]
    body: list[str] = []
    uses_vars = False
    for idx in analysis.order:
        info = analysis.nodes[idx]
        if info.spec is None or info.bound is None:  # input/output markers have neither
            continue
        shapes = [analysis.nodes[i].shape for i in info.inputs]
        ctor = info.spec.ctor_source(info.bound, shapes)
        if ctor:
            init.append(f"        self.{_attr(idx)} = {ctor}  # {block.nodes[idx].to_text().split(':', 1)[1]}")
        call = info.spec.call_source(info.bound, [var[i] for i in info.inputs], f"self.{_attr(idx)}")
        uses_vars |= any(variables_of(e) for e in info.bound.item_exprs)
        body.append(f"        {var[idx]} = {call}")
    args = ", ".join(var[i] for i in analysis.inputs)
    head = []
    if uses_vars:
        head = [f"        B = {var[analysis.inputs[0]]}.shape[0]", "        C, dim, H, W = self.C, self.dim, self.H, self.W"]
    ret = f"        return {var[analysis.nodes[analysis.output].inputs[0]]}"
    lines = [
        f"class {cls}(nn.Module):",
        f'    """{block.name}: {analysis.role} block ({len(block.nodes)} nodes, {len(block.edges)} edges)."""',
        "",
        "    def __init__(self, C, dim, H, W):",
        *init,
        "",
        f"    def forward(self, {args}):",
        *head,
        *body,
        ret,
    ]
    return "\n".join(lines) + "\n"

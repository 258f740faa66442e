"""The macro network built from a `Plan`, and its export as plain PyTorch source.

The module mirrors `nas.spaces.nader.dag.macro.plan` position by position, so the
parameter and FLOP totals computed there without torch equal what torch and
fvcore measure here (the tests check it for every shared block file).
"""

from __future__ import annotations

import inspect

from torch import nn

from nas.spaces.nader.dag.compile import BlockModule, block_source, class_name
from nas.spaces.nader.dag.expr import to_python
from nas.spaces.nader.dag.macro import Plan
from nas.spaces.nader.dag.modules import DropPath


class ReLUConvBN(nn.Module):
    """DARTS' input projection for two-input cells."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.op = nn.Sequential(
            nn.ReLU(), nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout)
        )

    def forward(self, x):
        return self.op(x)


class TwoInputCell(nn.Module):
    """Feeds a two-input block (prev-prev, prev), projecting inputs whose shape differs."""

    def __init__(self, block, pre0, pre1):
        super().__init__()
        self.block = block
        self.pre0 = pre0 if pre0 is not None else nn.Identity()
        self.pre1 = pre1 if pre1 is not None else nn.Identity()

    def forward(self, s0, s1):
        return self.block(self.pre0(s0), self.pre1(s1))


class MacroNetwork(nn.Module):
    """stem -> cells (downsample between stages) -> global average pool -> linear."""

    def __init__(self, stem, cells, two_input, width, num_classes):
        super().__init__()
        self.stem = stem
        self.cells = nn.ModuleList(cells)
        self.two_input = list(two_input)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x):
        # prev2 is None until a second output exists (a first two-input cell sees the stem's twice);
        # binding one tensor to two names here broke torch.compile's reduce-overhead mode
        prev2, prev = None, self.stem(x)
        for cell, two in zip(self.cells, self.two_input):
            out = cell(prev if prev2 is None else prev2, prev) if two else cell(prev)
            prev2, prev = prev, out
        return self.classifier(self.pool(prev).flatten(1))


def build_network(p: Plan) -> MacroNetwork:
    """Compile every cell of the plan into one trainable module."""
    cells = []
    for cell in p.cells:
        block = BlockModule(cell.analysis)
        if cell.two_input:
            block = TwoInputCell(block, *(ReLUConvBN(q.cin, q.cout, q.stride) if q else None for q in cell.pre))
        cells.append(block)
    stem = BlockModule(p.placements[0].analysis)
    return MacroNetwork(stem, cells, [c.two_input for c in p.cells], p.widths[-1], p.skeleton.num_classes)


RESERVED = {"DropPath", "ReLUConvBN", "TwoInputCell", "MacroNetwork", "Network", "TWO_INPUT", "nn", "torch"}


def network_source(p: Plan) -> str:
    """A self-contained model file defining ``Network(num_classes=...)`` for this plan."""
    names = {role: class_name(getattr(p.blocks, role).name) for role in ("stem", "base", "downsample")}
    if len(set(names.values())) < len(names):  # sections from different files may share a name
        names = {role: f"{name}_{role}" for role, name in names.items()}
    names = {role: f"{name}Block" if name in RESERVED else name for role, name in names.items()}
    sk = p.skeleton
    first = {pl.role: pl.analysis for pl in reversed(p.placements)}
    parts = ['"""Exported by nasflow from a NADER block file."""', "", "import torch", "from torch import nn", "", ""]
    ops = {n.op for b in p.blocks.sections().values() for n in b.nodes.values()}
    helpers: list[type] = [DropPath] if "DropPath" in ops else []
    if any(p.blocks.two_input(r) for r in ("base", "downsample")):
        helpers += [ReLUConvBN, TwoInputCell]
    for helper in helpers:
        parts += [inspect.getsource(helper), ""]
    for role in ("stem", "base", "downsample"):
        if role in first:
            parts += [block_source(first[role], names[role]), ""]
    stem_hw = to_python(first["stem"].out_shape[2].expr) if "stem" in first else "H"
    down_hw = "H"
    if "downsample" in first:
        down_hw = to_python(first["downsample"].out_shape[2].expr)
    parts += [
        inspect.getsource(MacroNetwork),
        "",
        "class Network(MacroNetwork):",
        f'    """{p.blocks.base.name} in a {len(sk.depths)}-stage skeleton, widths {p.widths}."""',
        "",
        f"    def __init__(self, num_classes={sk.num_classes}, width={p.width}, depths={tuple(sk.depths)}, "
        f"in_channels={sk.in_channels}, input_size={sk.input_size}):",
        "        widths = [width * 2**i for i in range(len(depths))]",
        "        H = input_size",
        f"        stem = {names['stem']}(in_channels, widths[0], H, H)",
        f"        H = {stem_hw}",
        "        cells, flags = [], []",
        "        prev2 = prev = (widths[0], H)",
        "        for stage, (w, depth) in enumerate(zip(widths, depths)):",
        '            for role in (["downsample"] if stage else []) + ["base"] * depth:',
        '                cin = prev[0]',
        '                two = TWO_INPUT[role]',
        '                cls = %s if role == "base" else %s' % (names["base"], names["downsample"]),
        "                block = cls(w if two else cin, w, H, H)",
        "                if two:",
        "                    pre = [ReLUConvBN(c, w, s // H if s != H else 1) if (c, s) != (w, H) else None for c, s in (prev2, prev)]",
        "                    block = TwoInputCell(block, *pre)",
        "                cells.append(block)",
        "                flags.append(two)",
        f'                H = {down_hw} if role == "downsample" else H',
        "                prev2, prev = prev, (w, H)",
        "        super().__init__(stem, cells, flags, widths[-1], num_classes)",
        "",
        "",
        f"TWO_INPUT = {{'base': {p.blocks.two_input('base')}, 'downsample': {p.blocks.two_input('downsample')}}}",
    ]
    return "\n".join(parts) + "\n"


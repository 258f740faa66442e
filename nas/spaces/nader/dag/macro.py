"""Placing a block file in a macro skeleton, costing it, and searching its width.

NADER keeps NAS-Bench-201's skeleton and only changes the cell: stem ->
stages of N base blocks, a downsample block between stages (widths w, 2w,
4w, ...) -> global average pool -> linear.  Its ImageNet-style variant
(`blocks-cifar/annos.json`) has 4 stages of depths (2, 3, 5, 2).  The width
w is not fixed: the largest w whose network fits the budget is chosen.

Two-input (DARTS) cells see (previous-previous, previous) outputs, each
projected by ReLU-Conv1x1-BN to the cell's width (stride 2 across a
downsample), as DARTS does; single-input blocks chain directly.

Everything here is pure Python over `analyse`: costing a width takes a few
milliseconds, so the width search needs no torch model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from nas.core.constraint import Constraint
from nas.errors import ConfigError, EncodingError
from nas.spaces.nader.dag.parse import Block, parse_block_file
from nas.spaces.nader.dag.shapes import ROLES, Analysis, Position, analyse


def role_of(section: str) -> str:
    low = section.lower()
    if low.endswith("_stem") or low.startswith("stem"):
        return "stem"
    if low.endswith("_downsample") or low.startswith("downsample"):
        return "downsample"
    return "base"


@dataclass(frozen=True)
class BlockSet:
    """The three sections of a NADER block file, by role."""

    base: Block
    stem: Block
    downsample: Block

    @classmethod
    def from_text(cls, text: str, source: str = "<string>", fallback: "BlockSet | None" = None) -> "BlockSet":
        """Parse a file; roles it lacks come from `fallback` (a parent's file)."""
        found: dict[str, Block] = {}
        for name, block in parse_block_file(text, source).sections.items():
            role = role_of(name)
            if role in found:
                raise EncodingError(
                    f"{source}:{block.line}: second {role} section '{name}' (first: '{found[role].name}')"
                )
            found[role] = block
        for role in ROLES:
            if role not in found:
                if fallback is None:
                    names = ", ".join(found[r].name for r in found)
                    hint = "'##Name_stem##'" if role == "stem" else "'##Name_downsample##'" if role == "downsample" else "'##Name##'"
                    raise EncodingError(f"{source}: no {role} section (found {names}; add a {hint} section)")
                found[role] = getattr(fallback, role)
        return cls(**found)

    def two_input(self, role: str) -> bool:
        return any(n.op == "input1" for n in getattr(self, role).nodes.values())

    def sections(self) -> dict[str, Block]:
        return {role: getattr(self, role) for role in ROLES}


@dataclass(frozen=True)
class Skeleton:
    depths: tuple[int, ...] = (5, 5, 5)  # base blocks per stage
    input_size: int = 32
    in_channels: int = 3
    num_classes: int = 10
    exact: bool = True  # fractional channel expressions are errors (False: floor, as NADER)

    @classmethod
    def nb201(cls, n: int = 5, input_size: int = 32, num_classes: int = 10) -> "Skeleton":
        return cls(depths=(n, n, n), input_size=input_size, num_classes=num_classes)

    @classmethod
    def imagenet_style(cls, depths: tuple[int, ...] = (2, 3, 5, 2), **kw) -> "Skeleton":
        """NADER's 4-stage variant (annos.json: depths 2-3-5-2, widths w..8w)."""
        return cls(depths=depths, **kw)

    def widths(self, w: int) -> list[int]:
        return [w * 2**i for i in range(len(self.depths))]


@dataclass
class Placement:
    """One distinct block position in the network and how often it repeats."""

    role: str
    analysis: Analysis
    count: int
    stage: int


@dataclass
class Preprocess:
    """A DARTS input projection: ReLU-Conv1x1(stride)-BN from `cin` to `cout`."""

    cin: int
    cout: int
    stride: int
    out_hw: int

    @property
    def params(self) -> int:
        return self.cin * self.cout + 2 * self.cout

    @property
    def flops(self) -> int:
        return self.cout * self.out_hw**2 * (self.cin + 2)


@dataclass
class Cell:
    """One block instance after the stem; two-input cells carry their input projections."""

    role: str
    analysis: Analysis
    pre: tuple[Preprocess | None, Preprocess | None] = (None, None)

    @property
    def two_input(self) -> bool:
        return any(n.op == "input1" for n in self.analysis.block.nodes.values())


@dataclass
class Plan:
    """A block set placed at width w: every position validated, costs totalled."""

    blocks: BlockSet
    skeleton: Skeleton
    width: int
    placements: list[Placement] = field(default_factory=list)
    cells: list[Cell] = field(default_factory=list)  # every block after the stem, in network order
    final_hw: int = 0

    @property
    def preprocess(self) -> list[Preprocess]:
        return [q for cell in self.cells for q in cell.pre if q is not None]

    @property
    def widths(self) -> list[int]:
        return self.skeleton.widths(self.width)

    @property
    def head_params(self) -> int:
        c = self.widths[-1]
        return c * self.skeleton.num_classes + self.skeleton.num_classes

    @property
    def head_flops(self) -> int:
        c = self.widths[-1]
        return c * self.final_hw**2 + c * self.skeleton.num_classes  # avg pool + linear (fvcore)

    @property
    def params(self) -> int:
        body = sum(p.analysis.params * p.count for p in self.placements)
        return body + sum(p.params for p in self.preprocess) + self.head_params

    @property
    def flops(self) -> int:
        body = sum(p.analysis.flops * p.count for p in self.placements)
        return body + sum(p.flops for p in self.preprocess) + self.head_flops


def _place(blocks: BlockSet, role: str, cin: int, cout: int, hw: int, sk: Skeleton) -> Analysis:
    two = blocks.two_input(role)
    pos = Position(C=cout if two else cin, dim=cout, H=hw, W=hw, exact=sk.exact)
    return analyse(getattr(blocks, role), pos, role)


def plan(blocks: BlockSet, skeleton: Skeleton, width: int) -> Plan:
    """Validate every position of the network at width `width`; raises `EncodingError`."""
    if width < 1:
        raise ConfigError(f"width must be >= 1, got {width}")
    result = Plan(blocks=blocks, skeleton=skeleton, width=width)
    widths = skeleton.widths(width)
    hw = skeleton.input_size
    stem = _place(blocks, "stem", skeleton.in_channels, widths[0], hw, skeleton)
    result.placements.append(Placement("stem", stem, 1, 0))
    hw = stem.out_shape[2].value
    # (channels, size) of the previous-previous and previous outputs, for two-input cells
    prev2 = prev = (widths[0], hw)
    for stage, (w, depth) in enumerate(zip(widths, skeleton.depths)):
        roles = (["downsample"] if stage else []) + ["base"] * depth
        for i, role in enumerate(roles):
            pre: tuple[Preprocess | None, Preprocess | None] = (None, None)
            if blocks.two_input(role):
                pre = tuple(  # type: ignore[assignment]
                    Preprocess(c, w, size // hw, hw) if (c, size) != (w, hw) else None for c, size in (prev2, prev)
                )
            first_base = role == "base" and (i == 0 or (stage and i == 1))
            if role == "downsample" or first_base:
                analysis = _place(blocks, role, prev[0], w, hw, skeleton)
                result.placements.append(Placement(role, analysis, 1, stage))
            else:
                result.placements[-1].count += 1
                analysis = result.placements[-1].analysis
            result.cells.append(Cell(role, analysis, pre))
            prev2, prev = prev, (w, analysis.out_shape[2].value)
            hw = prev[1]
    result.final_hw = hw
    return result


NOMINAL_WIDTHS = (64, 96, 128, 256, 512)  # if none is valid, the block is broken, not mis-sized
# Channel counts that are multiples of 8 hit the tensor-core kernels: on an H100 the ResNet
# skeleton at width 25 trains slower than at width 32 with 1.6x its FLOPs.
WIDTH_MULTIPLE = 8


def section_errors(blocks: BlockSet, skeleton: Skeleton, widths: tuple[int, ...] = NOMINAL_WIDTHS) -> list[str]:
    """Each section checked on its own at the first stage of a few widths.

    A section is reported (with its error at the first width) only when it
    fails at all of them: ``groups=32`` on ``C/4`` fails at w=64 but is fine
    at w=128, which the width search will find.
    """
    size = skeleton.input_size
    errors = []
    for role, block in blocks.sections().items():
        first: str | None = None
        for w in widths:
            cin, cout = {"stem": (skeleton.in_channels, w), "base": (w, w), "downsample": (w, 2 * w)}[role]
            pos = Position(C=cout if blocks.two_input(role) else cin, dim=cout, H=size, W=size, exact=skeleton.exact)
            try:
                analyse(block, pos, role)
                first = None
                break
            except EncodingError as exc:
                first = first or str(exc)
        if first:
            errors.append(first)
    return errors
ANCHOR_WINDOW = 256  # widths a divisibility rule may skip (ResNeXt-like C/4 with groups=32 needs C % 128)


@dataclass(frozen=True)
class WidthChoice:
    width: int
    depths: tuple[int, ...]
    params: int
    flops: int
    probes: int  # widths costed during the search


def search_width(
    blocks: BlockSet,
    skeleton: Skeleton,
    budget: Constraint | None = None,
    max_width: int = 4096,
    depth_options: tuple[tuple[int, ...], ...] | None = None,
    multiple: int = WIDTH_MULTIPLE,
) -> WidthChoice:
    """Largest width (and, given `depth_options`, the depths) whose network fits `budget`,
    rounded down to a multiple of `multiple`.

    Cost grows with width, so a binary search over w finds the largest
    fitting one; widths where the block is invalid (e.g. ``C/4`` not whole)
    are skipped by stepping down to the nearest valid width.  That width is
    then rounded down to the largest valid multiple of `multiple` within
    ANCHOR_WINDOW below it (it fits too, being narrower); when there is none,
    or the width is below `multiple`, it stays as found.  Among depth options
    the one using most of the parameter budget wins (ties: wider).
    """
    if not isinstance(multiple, int) or multiple < 1:
        raise ConfigError(f"width multiple must be an integer >= 1, got {multiple!r}")
    budget = (budget or Constraint()).filled(Constraint.nb201(skeleton.input_size))
    broken = section_errors(blocks, skeleton, tuple(w for w in NOMINAL_WIDTHS if w <= max_width) or (max_width,))
    if broken:  # broken at every width: fail before searching, at a readable width
        raise EncodingError(broken[0])
    if depth_options:
        choices = []
        for depths in depth_options:
            try:
                choices.append(search_width(blocks, Skeleton(**{**skeleton.__dict__, "depths": tuple(depths)}), budget,
                                            max_width, multiple=multiple))
            except EncodingError:
                continue
        if not choices:
            raise EncodingError(f"no depth option in {list(depth_options)} fits the budget at any width")
        return max(choices, key=lambda c: (c.params, c.width))

    costs: dict[int, tuple[int, int] | None] = {}

    def cost(w: int) -> tuple[int, int] | None:
        if w not in costs:
            try:
                p = plan(blocks, skeleton, w)
                costs[w] = (p.params, p.flops)
            except EncodingError:
                costs[w] = None
        return costs[w]

    @cache
    def anchor(w: int) -> int | None:
        """Largest valid width in (w - ANCHOR_WINDOW, w]."""
        for v in range(w, max(0, w - ANCHOR_WINDOW), -1):
            if cost(v) is not None:
                return v
        return None

    def fits(w: int) -> bool:
        a = anchor(w)
        return a is not None and budget.fits(*costs[a])  # type: ignore[misc]

    lo, hi = 0, max_width
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    best = anchor(lo) if lo else None
    if best is None:
        smallest = next((w for w in sorted(costs) if costs[w]), None)
        detail = ""
        if smallest is not None:
            p, f = costs[smallest]  # type: ignore[misc]
            detail = f"; at width {smallest} it has {p / 1e6:.3f} M params and {f / 1e9:.4f} GFLOPs"
        limits = [f"{v / scale:g} {unit}" for v, scale, unit in
                  ((budget.params, 1e6, "M params"), (budget.flops, 1e9, "GFLOPs")) if v is not None]
        raise EncodingError(f"no width fits the budget ({', '.join(limits)}){detail}")
    rounded = range(best - best % multiple, max(0, best - ANCHOR_WINDOW), -multiple)
    best = next((v for v in rounded if cost(v) is not None), best)
    params, flops = costs[best]  # type: ignore[misc]
    return WidthChoice(best, skeleton.depths, params, flops, len(costs))

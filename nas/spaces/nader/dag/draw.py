"""Draw a block file: one panel per section, a layered (Sugiyama-style) layout.

Readable by construction rather than by luck: nodes sit in layers by longest
path from the input (data flows top to bottom); an edge that skips layers gets
a waypoint in every layer it crosses, laid out like a narrow node, so a skip
connection runs in its own lane instead of through the chain it jumps over;
every edge leaves and enters a box vertically and bends only in the gaps
between layers, where no box is. Sizes are in inches with a monospace font,
so each box is exactly as wide as its full label (wrapped at commas, never cut).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nas.io import atomic_write_bytes
from nas.spaces.nader.dag.parse import Block
from nas.spaces.nader.dag.shapes import topological_order

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLOURS = {
    "io": "#d9d9d9", "Conv2d": "#9ecae1", "Linear": "#c6dbef", "BN": "#fdd0a2", "LN": "#fdd0a2",
    "Add": "#a1d99b", "Mul": "#a1d99b", "Multiply": "#a1d99b", "concat": "#c7e9c0", "Concat": "#c7e9c0",
}
POOL_COLOUR, OTHER_COLOUR = "#dadaeb", "#f0f0f0"

FONT = "DejaVu Sans Mono"  # ships with matplotlib; advance width 0.602 em for every glyph
FONT_PT = 7.0
CHAR_W = 0.6021 * FONT_PT / 72  # inches
LINE_H = 1.2 * FONT_PT / 72
PAD_X, PAD_Y = 0.08, 0.06  # text to box edge
WRAP = 32  # characters per label line, broken only after a comma
GAP_X, GAP_Y = 0.22, 0.42  # between boxes in a layer; between layers
LANE_W = 0.1  # the width a skip edge reserves in each layer it crosses
PANEL_GAP, MARGIN, TITLE_H = 0.5, 0.25, 0.35
SWEEPS = 6


@dataclass
class Box:
    idx: str
    label: str  # the node's full text, lines joined by "\n" after commas
    colour: str
    x: float = 0.0  # centre
    y: float = 0.0
    w: float = 0.0
    h: float = 0.0


@dataclass
class Edge:
    src: str
    dst: str
    vertices: list[tuple[float, float]]
    codes: list[int]  # matplotlib Path codes: 1 MOVETO, 2 LINETO, 4 CURVE4


@dataclass
class Panel:
    name: str
    boxes: dict[str, Box]
    edges: list[Edge]
    width: float
    height: float
    x0: float = 0.0  # left edge in the figure, inches


def wrap_label(text: str, limit: int = WRAP) -> str:
    """Break after commas so no line exceeds `limit` where possible; "".join(lines) == text."""
    lines, cur = [], ""
    for piece in text.replace(",", ",\x00").split("\x00"):
        if cur and len(cur) + len(piece) > limit:
            lines.append(cur)
            cur = ""
        cur += piece
    lines.append(cur)
    return "\n".join(lines)


def _colour(op: str) -> str:
    if op.startswith("input") or op == "output":
        return COLOURS["io"]
    if "Pool" in op:
        return POOL_COLOUR
    return COLOURS.get(op, OTHER_COLOUR)


def _layers(block: Block) -> dict[str, int]:
    """Longest path from a source: every edge points strictly down."""
    depth = {idx: 0 for idx in block.nodes}
    succ: dict[str, list[str]] = {idx: [] for idx in block.nodes}
    for a, b in block.edges:
        succ[a].append(b)
    for idx in topological_order(block):
        for nxt in succ[idx]:
            depth[nxt] = max(depth[nxt], depth[idx] + 1)
    return depth


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Pool-adjacent-violators: the non-decreasing sequence nearest `values` (weighted least squares)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for m, _, n in blocks:
        out += [m] * int(n)
    return out


def _place(row: list[str], want: dict[str, float], width: dict[str, float]) -> dict[str, float]:
    """x for each vertex of a layer, in order, no overlaps, as near `want` as possible."""
    offset, acc = [], 0.0
    for i, v in enumerate(row):
        if i:
            acc += (width[row[i - 1]] + width[v]) / 2 + GAP_X
        offset.append(acc)
    fitted = _isotonic([want[v] - o for v, o in zip(row, offset)], [1.0] * len(row))
    return {v: f + o for v, f, o in zip(row, fitted, offset)}


def layout_block(block: Block) -> Panel:
    """Boxes and edge paths of one section, in inches, top-left at (0, 0), y pointing up."""
    depth = _layers(block)
    rank = {idx: i for i, idx in enumerate(topological_order(block))}
    boxes: dict[str, Box] = {}
    for idx, node in block.nodes.items():
        label = wrap_label(node.to_text())
        lines = label.split("\n")
        boxes[idx] = Box(idx, label, _colour(node.op), w=max(map(len, lines)) * CHAR_W + 2 * PAD_X,
                         h=len(lines) * LINE_H + 2 * PAD_Y)
    width = {idx: b.w for idx, b in boxes.items()}
    layer = dict(depth)
    chains: list[list[str]] = []  # each edge as the vertices it passes, waypoints included
    for n, (a, b) in enumerate(block.edges):
        chain = [a]
        for k in range(depth[a] + 1, depth[b]):
            lane = f"~{n}.{k}"
            layer[lane], width[lane], rank[lane] = k, LANE_W, rank[a]
            chain.append(lane)
        chains.append(chain + [b])
    preds: dict[str, list[str]] = {v: [] for v in layer}
    succs: dict[str, list[str]] = {v: [] for v in layer}
    for chain in chains:
        for u, v in zip(chain, chain[1:]):
            succs[u].append(v)
            preds[v].append(u)
    rows: list[list[str]] = [[] for _ in range(max(layer.values()) + 1)]
    for v in sorted(layer, key=lambda v: rank[v]):
        rows[layer[v]].append(v)

    # order within layers: barycentre sweeps down and up (fewer crossings), ties by topological rank
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        nbrs = preds if down else succs
        for i in range(1, len(rows)) if down else range(len(rows) - 2, -1, -1):
            at = {v: j for j, v in enumerate(rows[i - 1] if down else rows[i + 1])}
            here = {v: j for j, v in enumerate(rows[i])}
            rows[i].sort(key=lambda v: (sum(at[u] for u in nbrs[v]) / len(nbrs[v]) if nbrs[v] else here[v], rank[v]))

    # x: each vertex pulled towards the mean of its neighbours, layers kept overlap-free;
    # the last passes use both sides, so a join sits between its inputs
    both = {v: preds[v] + succs[v] for v in layer}
    x: dict[str, float] = {}
    for row in rows:
        placed = _place(row, {v: 0.0 for v in row}, width)
        shift = sum(placed.values()) / len(row)
        x.update({v: value - shift for v, value in placed.items()})
    for sweep in range(2 * SWEEPS):
        down = sweep % 2 == 0
        if sweep < SWEEPS:
            order, nbrs = (range(1, len(rows)), preds) if down else (range(len(rows) - 2, -1, -1), succs)
        else:
            order, nbrs = range(len(rows)), both
        for i in order:
            want = {v: sum(x[u] for u in nbrs[v]) / len(nbrs[v]) if nbrs[v] else x[v] for v in rows[i]}
            x.update(_place(rows[i], want, width))
    left = min(x[v] - width[v] / 2 for v in x)
    x = {v: value - left for v, value in x.items()}

    # y: layer bands top to bottom, each as tall as its tallest box
    band = [max((boxes[v].h for v in row if v in boxes), default=LINE_H) for row in rows]
    top, centre = [], []
    y = 0.0
    for h in band:
        top.append(y)
        centre.append(y - h / 2)
        y -= h + GAP_Y
    for idx, box in boxes.items():
        box.x, box.y = x[idx], centre[layer[idx]]

    def ports(v: str, others: list[str]) -> dict[str, float]:
        """Spread several edges along a box side, ordered by where they go."""
        if len(others) < 2 or v not in boxes:
            return {o: x[v] for o in others}
        step = min(0.12, boxes[v].w / (len(others) + 1))
        ordered = sorted(others, key=lambda o: x[o])
        return {o: x[v] + (i - (len(ordered) - 1) / 2) * step for i, o in enumerate(ordered)}

    out_port = {v: ports(v, succs[v]) for v in layer}
    in_port = {v: ports(v, preds[v]) for v in layer}
    edges = []
    for (a, b), chain in zip(block.edges, chains):
        verts: list[tuple[float, float]] = []
        codes: list[int] = []
        for u, v in zip(chain, chain[1:]):
            x1, x2 = out_port[u][v], in_port[v][u]
            y_start = boxes[u].y - boxes[u].h / 2 if u in boxes else top[layer[u]]
            y_leave = top[layer[u]] - band[layer[u]]  # bottom of u's band
            y_enter = top[layer[v]]  # top of v's band
            if not verts:
                verts, codes = [(x1, y_start)], [1]
            if y_leave < verts[-1][1]:  # down to the band's bottom (none when the box fills it)
                verts.append((x1, y_leave))
                codes.append(2)
            mid = (y_leave + y_enter) / 2  # the bend stays inside the gap (control points are in it)
            verts += [(x1, mid), (x2, mid), (x2, y_enter)]
            codes += [4, 4, 4]
            y_end = boxes[v].y + boxes[v].h / 2 if v in boxes else top[layer[v]] - band[layer[v]]
            if y_end < y_enter:  # zero-length segments would leave the arrow head without a direction
                verts.append((x2, y_end))
                codes.append(2)
        edges.append(Edge(a, b, verts, codes))
    return Panel(block.name, boxes, edges, width=max(x[v] + width[v] / 2 for v in x), height=-y - GAP_Y)


def figure(blocks: dict[str, Block], title: str = "") -> Figure:
    """One figure, one axes in inch units: panels side by side, a title over each.

    Artists carry gids (``node:SECTION:IDX``, ``label:SECTION:IDX``, ``edge:SECTION:A->B``) so tests
    can check what was placed rather than pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # no pyplot: no GUI backend, no global state
    from matplotlib.figure import Figure  # lazy: loads matplotlib (start-up time)
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # lazy: loads matplotlib (start-up time)
    from matplotlib.path import Path as MplPath  # lazy: loads matplotlib (start-up time)

    panels = [layout_block(block) for block in blocks.values()]
    x0 = MARGIN
    for panel in panels:
        panel.x0 = x0
        x0 += max(panel.width, len(panel.name) * CHAR_W * 1.3) + PANEL_GAP
    fig_w = x0 - PANEL_GAP + MARGIN
    top = TITLE_H * (2 if title else 1)
    fig_h = max(p.height for p in panels) + top + MARGIN
    fig = Figure(figsize=(fig_w, fig_h))
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, fig_w)
    ax.set_ylim(-fig_h, 0)
    ax.axis("off")
    if title:
        ax.text(fig_w / 2, -TITLE_H * 0.6, title, ha="center", va="center", fontsize=10, gid="title")
    for panel in panels:
        dx, dy = panel.x0, -top
        ax.text(dx + panel.width / 2, dy + TITLE_H * 0.5, panel.name, ha="center", va="center", fontsize=9,
                gid=f"section:{panel.name}")
        for edge in panel.edges:
            path = MplPath([(vx + dx, vy + dy) for vx, vy in edge.vertices], edge.codes)
            ax.add_patch(FancyArrowPatch(path=path, arrowstyle="-|>", mutation_scale=7, color="#555555", lw=0.7,
                                         shrinkA=0, shrinkB=0, gid=f"edge:{panel.name}:{edge.src}->{edge.dst}"))
        for idx, box in panel.boxes.items():
            ax.add_patch(FancyBboxPatch((box.x - box.w / 2 + dx, box.y - box.h / 2 + dy), box.w, box.h,
                                        boxstyle="round,pad=0,rounding_size=0.04", fc=box.colour, ec="#444444",
                                        lw=0.5, gid=f"node:{panel.name}:{idx}", zorder=2))
            ax.text(box.x + dx, box.y + dy, box.label, ha="center", va="center", multialignment="left",
                    fontsize=FONT_PT, family=FONT, gid=f"label:{panel.name}:{idx}", zorder=3)
    return fig


def draw_blocks(blocks: dict[str, Block], out: Path, title: str = "") -> Path:
    """Write the PNG atomically (temp file + rename); returns the path written."""

    buf = io.BytesIO()
    figure(blocks, title).savefig(buf, format="png", dpi=150)
    atomic_write_bytes(Path(out), buf.getvalue())
    return Path(out)

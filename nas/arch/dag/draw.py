"""Draw a block file: one panel per section, nodes layered by longest path from the input."""

from __future__ import annotations

from pathlib import Path

from nas.arch.dag.parse import Block
from nas.arch.dag.shapes import topological_order

COLOURS = {
    "io": "#d9d9d9", "Conv2d": "#9ecae1", "Linear": "#c6dbef", "BN": "#fdd0a2", "LN": "#fdd0a2",
    "Add": "#a1d99b", "Mul": "#a1d99b", "Multiply": "#a1d99b", "concat": "#c7e9c0", "Concat": "#c7e9c0",
}
POOL_COLOUR, OTHER_COLOUR = "#dadaeb", "#f0f0f0"


def _layers(block: Block) -> dict[str, int]:
    depth = {idx: 0 for idx in block.nodes}
    succ: dict[str, list[str]] = {idx: [] for idx in block.nodes}
    for a, b in block.edges:
        succ[a].append(b)
    for idx in topological_order(block):
        for nxt in succ[idx]:
            depth[nxt] = max(depth[nxt], depth[idx] + 1)
    return depth


def _colour(op: str) -> str:
    if op.startswith("input") or op == "output":
        return COLOURS["io"]
    if "Pool" in op:
        return POOL_COLOUR
    return COLOURS.get(op, OTHER_COLOUR)


def draw_blocks(blocks: dict[str, Block], out: Path, title: str = "") -> Path:
    """Write a PNG with one column per section; returns the path written."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nas.io import atomic_write_bytes

    layouts = {}
    for name, block in blocks.items():
        depth = _layers(block)
        rows: dict[int, list[str]] = {}
        for idx in block.nodes:
            rows.setdefault(depth[idx], []).append(idx)
        pos = {}
        for d, members in rows.items():
            for i, idx in enumerate(members):
                pos[idx] = (2.2 * (i - (len(members) - 1) / 2), -d)
        layouts[name] = (block, pos, max(rows) + 1, max(len(m) for m in rows.values()))

    height = max(n for _, _, n, _ in layouts.values())
    widths = [max(2.6, 2.4 * w) for _, _, _, w in layouts.values()]
    fig, axes = plt.subplots(1, len(layouts), figsize=(sum(widths), max(3.0, 0.55 * height + 1)),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, (name, (block, pos, rows, cols)) in zip(axes[0], layouts.items()):
        for a, b in block.edges:
            skip = pos[a][1] - pos[b][1] > 1  # skips bend away from the chain they jump over
            ax.annotate("", xy=pos[b], xytext=pos[a],
                        arrowprops={"arrowstyle": "->", "color": "#555555", "lw": 0.8, "shrinkA": 9, "shrinkB": 9,
                                    "connectionstyle": f"arc3,rad={0.35 if skip else 0.0}"})
        for idx, node in block.nodes.items():
            label = node.to_text().split(":", 1)[1]
            if len(label) > 28:
                label = label[:26] + "…"
            ax.text(*pos[idx], f"{idx}: {label}", ha="center", va="center", fontsize=6.5,
                    bbox={"boxstyle": "round,pad=0.25", "fc": _colour(node.op), "ec": "#444444", "lw": 0.5})
        ax.set_title(name, fontsize=9)
        ax.set_xlim(-1.1 * cols - 1.2, 1.1 * cols + 1.2)
        ax.set_ylim(-rows + 0.4, 0.6)
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=150)
    plt.close(fig)
    atomic_write_bytes(Path(out), buf.getvalue())
    return Path(out)

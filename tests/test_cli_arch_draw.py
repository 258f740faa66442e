"""`nas arch draw`: invalid files are refused, valid ones get whole labels and edges around nodes.

What is checked is what the drawing places (text objects, boxes, edge paths), not pixels.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.path import Path as MplPath
from matplotlib.transforms import Bbox

from conftest import run_nas
from nas.spaces.nader.dag.draw import figure, layout_block, wrap_label
from nas.spaces.nader.dag.parse import parse_block_file

BLOCKS = Path(__file__).resolve().parent / "data" / "blocks"
FILES = sorted(BLOCKS.glob("*.txt"))


def test_draw_refuses_an_invalid_file_with_validates_errors_and_writes_nothing(nas_env, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text((BLOCKS / "residual.txt").read_text().replace("8->1\n", "", 1))
    out = tmp_path / "g.png"
    validate = run_nas(["arch", "validate", str(bad)], nas_env)
    draw = run_nas(["arch", "draw", str(bad), "-o", str(out)], nas_env)
    assert validate.returncode == draw.returncode == 1
    assert draw.stdout == validate.stdout == f"{bad}:3: block 'Residual': node 1: output has no incoming edge\n"
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "nasflow-home") == ["bad.txt"]  # no temp file left


def test_wrap_label_breaks_only_after_commas_and_keeps_every_character():
    text = "11:Conv2d(out_channels=dim,kernel_size=3,dilation=2,groups=dim)"
    wrapped = wrap_label(text, limit=20)
    assert wrapped.replace("\n", "") == text
    assert all(line.endswith(",") for line in wrapped.split("\n")[:-1]) and wrapped.count("\n") >= 2
    assert wrap_label("0:input") == "0:input"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_layout_layers_top_down_and_edges_avoid_every_other_box(path):
    for block in parse_block_file(path.read_text(), str(path)).sections.values():
        panel = layout_block(block)
        boxes = panel.boxes
        assert set(boxes) == set(block.nodes)
        rect = {i: Bbox.from_bounds(b.x - b.w / 2, b.y - b.h / 2, b.w, b.h) for i, b in boxes.items()}
        ids = list(rect)
        for n, a in enumerate(ids):
            for b in ids[n + 1:]:
                assert not rect[a].overlaps(rect[b]), f"{block.name}: boxes {a} and {b} overlap"
        assert len(panel.edges) == len(block.edges)
        for edge in panel.edges:
            src, dst = boxes[edge.src], boxes[edge.dst]
            assert dst.y < src.y, f"{block.name}: {edge.src}->{edge.dst} does not point down"
            (x0, y0), (x1, y1) = edge.vertices[0], edge.vertices[-1]
            assert y0 == pytest.approx(src.y - src.h / 2) and abs(x0 - src.x) <= src.w / 2  # leaves the bottom
            assert y1 == pytest.approx(dst.y + dst.h / 2) and abs(x1 - dst.x) <= dst.w / 2  # enters the top
            path = MplPath(edge.vertices, edge.codes)
            for idx, r in rect.items():
                if idx not in (edge.src, edge.dst):
                    assert not path.intersects_bbox(r, filled=False), \
                        f"{block.name}: edge {edge.src}->{edge.dst} crosses node {idx}"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_figure_places_every_full_label_inside_its_box(path):
    sections = parse_block_file(path.read_text(), str(path)).sections
    fig = figure(sections, title=path.name)
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = {t.get_gid(): t for t in ax.texts}
    patches = {p.get_gid(): p for p in ax.patches}
    for name, block in sections.items():
        assert texts[f"section:{name}"].get_text() == name
        for idx, node in block.nodes.items():
            text = texts[f"label:{name}:{idx}"]
            assert text.get_text().replace("\n", "") == node.to_text()  # whole, never cut
            inner = text.get_window_extent(renderer)
            outer = patches[f"node:{name}:{idx}"].get_window_extent(renderer)
            assert outer.x0 <= inner.x0 and inner.x1 <= outer.x1, f"{name}: label {idx} is wider than its box"
            assert outer.y0 <= inner.y0 and inner.y1 <= outer.y1, f"{name}: label {idx} is taller than its box"
        assert sum(1 for gid in patches if gid.startswith(f"edge:{name}:")) == len(block.edges)
    for gid, text in texts.items():  # nothing placed outside the picture
        extent = text.get_window_extent(renderer)
        assert fig.bbox.x0 <= extent.x0 and extent.x1 <= fig.bbox.x1 and fig.bbox.y0 <= extent.y0 \
            and extent.y1 <= fig.bbox.y1, f"{gid} is outside the figure"

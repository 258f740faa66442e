"""`nas arch validate|show|draw` end to end through the real CLI. The validate checks of broken
block files, a missing file and model files in the sandbox are tests/test_cli_arch_fast.py's (the
same lines and exit statuses from the CLI's `main` in-process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_nas

BLOCKS = Path(__file__).resolve().parent / "data" / "blocks"
MODELS = Path(__file__).resolve().parent / "data" / "models"

BROKEN = """\
##Bad##
0:input
1:output
2:Conv2d(out_channels=C,kernel_size=3,stride=2)
3:Add
0->2
2->3
0->3
3->1
##Bad_stem##
0:input
1:output
2:ROIAlign(output_size=7)
0->2
2->1
##Bad_downsample##
0:input
1:output
2:Conv2d(out_channels=dim,kernel_size=3,stride=2)
0->2
2->1
"""

pytestmark = pytest.mark.slow


def test_validate_valid_file(nas_env):
    r = run_nas(["arch", "validate", str(BLOCKS / "residual.txt")], nas_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("residual.txt: valid")


def test_show_json(nas_env):
    r = run_nas(["arch", "show", str(BLOCKS / "shuffle_se.txt"), "--json"], nas_env)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert len(info["key"]) == 16
    assert info["width"] == 96 and info["widths"] == [96, 192, 384]
    assert info["params"] <= 1.5e6 and info["flops"] <= 0.2e9
    assert "class Network(MacroNetwork):" in info["source"]
    # a renumbered copy of the same graph has the same key
    r2 = run_nas(["arch", "show", str(BLOCKS / "shuffle_se.txt"), "--json", "--width", "64"], nas_env)
    assert json.loads(r2.stdout)["key"] == info["key"]
    assert json.loads(r2.stdout)["width"] == 64


def test_show_prints_a_summary_comment_then_the_source(nas_env):
    path = BLOCKS / "residual.txt"
    r = run_nas(["arch", "show", str(path)], nas_env)
    assert r.returncode == 0, r.stderr
    info = json.loads(run_nas(["arch", "show", str(path), "--json"], nas_env).stdout)
    summary, source = r.stdout.split("\n", 1)
    assert summary == (f"# {path}: key {info['key']} width {info['width']} (widths {info['widths']}), "
                       f"{info['params']:,} params, {info['flops'] / 1e6:.1f} MFLOPs")
    assert source.rstrip("\n") == info["source"].rstrip("\n") and "class Network(MacroNetwork):" in source
    compile(r.stdout, "net.py", "exec")  # `nas arch show F > net.py` is a valid Python file


def test_show_escapes_control_characters_and_still_prints_a_runnable_file(nas_env, tmp_path):
    """A model file is the user's or an LLM's: an escape sequence in it must not reach the terminal raw."""
    source = (MODELS / "cnn_parent.py").read_text()
    path = tmp_path / "loud.py"
    path.write_text('BANNER = "\x1b[2J\x1b]0;owned\x07"\n' + source)
    r = run_nas(["arch", "show", str(path)], nas_env)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert 'BANNER = "\\x1b[2J\\x1b]0;owned\\x07"' in r.stdout
    namespace: dict = {}
    exec(compile(r.stdout.split("\n", 1)[1].split("\n", 1)[0], "net.py", "exec"), namespace)
    assert namespace["BANNER"] == "\x1b[2J\x1b]0;owned\x07"  # the escaped spelling means the same string


def test_draw_writes_png(nas_env, tmp_path):
    out = tmp_path / "g.png"
    r = run_nas(["arch", "draw", str(BLOCKS / "two_input_cell.txt"), "-o", str(out)], nas_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"wrote {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []  # written atomically

"""`nas arch validate`'s and `nas arch show`'s lines and exit statuses from the CLI's `main` in this process, with one small
model file in the sandbox (tests/test_cli_arch.py, slow, runs the rest as `nas` subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nas.cli.main import main
from test_cli_arch import BROKEN
from test_sandbox_fast import TINY

BLOCKS = Path(__file__).resolve().parent / "data" / "blocks"


def validate(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["arch", "validate", *args])
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_validate_each_broken_section_one_line_and_a_missing_file(capsys, tmp_path: Path) -> None:
    """Each broken section of a block file is one line, a missing file a usage error (no sandbox:
    block files are parsed here)."""
    bad = tmp_path / "bad.txt"
    bad.write_text(BROKEN)
    code, out, _ = validate(capsys, str(bad))
    base, stem = out.strip().splitlines()
    assert code == 1
    assert base.startswith(f"{bad}:5: block 'Bad': node 3: Add: shapes")
    assert stem == f"{bad}:13: block 'Bad_stem': node 2: unknown op ROIAlign"
    bad.write_text(BROKEN.replace("ROIAlign(output_size=7)", "BN"))
    code, out, _ = validate(capsys, str(bad))
    base, stem = out.strip().splitlines()
    assert code == 1
    assert base.startswith(f"{bad}:5: block 'Bad': node 3: Add: shapes (B, C, (H+1)//2, (W+1)//2) and (B, C, H, W)")
    assert stem.startswith(f"{bad}:12: block 'Bad_stem': node 1: output shape (B, C, H, W) = (2, 3, 32, 32) must be")
    code, out, err = validate(capsys, str(tmp_path / "nope.txt"))
    assert (code, out) == (2, "") and err.strip() == f"nas: error: {tmp_path / 'nope.txt'}: no such file"


def test_validate_model_files_one_line_each_in_order(capsys, tmp_path: Path) -> None:
    """Each model file in its own sandbox, one line
    each, in order; a rejected file neither stops nor colours the next; exit 1 if any is invalid; a
    missing file stops everything before the first check."""
    bad, good, broken = tmp_path / "bad.py", tmp_path / "good.py", tmp_path / "broken.txt"
    bad.write_text("import os\nos.system('true')\n")
    good.write_text(TINY)
    broken.write_text(BROKEN)
    residual = BLOCKS / "residual.txt"
    code, out, err = validate(capsys, str(bad), str(good), str(residual), "--input-size", "8")
    lines = out.strip().splitlines()
    assert code == 1 and len(lines) == 3, out + err
    assert lines[0] == f"{bad}: policy: process creation is not allowed (os.system at bad.py:2)"
    assert lines[1].startswith(f"{good}: valid model (162 params, ") and lines[2] == f"{residual}: valid"
    code, out, err = validate(capsys, str(good), str(tmp_path / "nope.py"))
    assert code == 2 and out == "" and "nope.py" in err


def test_show_a_model_file_prints_its_verdicts_numbers_and_refuses_an_invalid_one(capsys, tmp_path: Path) -> None:
    """`nas arch show F.py` shows what the sandbox measured; a file it refuses is an error, not a summary."""
    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text(TINY)
    bad.write_text("import os\nos.system('true')\n")
    with pytest.raises(SystemExit) as exc:
        main(["arch", "show", str(good), "--json", "--input-size", "8"])
    assert exc.value.code == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["file"], info["kind"], info["params"], info["source"]) == (str(good), "model", 162, TINY)
    assert info["flops"] > 0 and len(info["key"]) == 16
    with pytest.raises(SystemExit) as exc:
        main(["arch", "show", str(bad), "--input-size", "8"])
    out = capsys.readouterr()
    assert exc.value.code == 2 and out.out == ""
    assert out.err.strip() == f"nas: error: {bad}: policy: process creation is not allowed (os.system at bad.py:2)"

"""The training benchmark stays runnable: every section at tiny sizes (numbers not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_train_throughput_quick_writes_every_section(tmp_path):
    out = tmp_path / "t.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert {"cpu", "engines_cpu", "engines_gpu", "agreement"} <= set(result)
    rows = result["engines_cpu"]["rows"]
    assert [row["engine"]["kind"] for row in rows] == ["plain", "fast", "fast"] and rows[2]["candidates"] == 2
    assert all(row["seconds_per_epoch_per_candidate"] > 0 for row in rows)
    assert 0 <= result["agreement"]["plain"]["mean"] <= 100 and 0 <= result["agreement"]["fast"]["mean"] <= 100

"""benchmarks/supernet_eval.py stays runnable and extrapolates what it measured to the full counts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_one_tiny_row_extrapolates_its_measured_subset_to_imagenet_counts(tmp_path):
    out = tmp_path / "e.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "supernet_eval.py"), "--spaces", "autoformer",
                        "--subnets", "1", "--recal-images", "2", "--val-images", "3", "--batch-size", "2",
                        "--device", "cpu", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["full_counts"] == {"recal_images": 2000, "val_images": 50000}
    assert [(row["space"], row["precision"]) for row in result["rows"]] == [
        ("autoformer", "float32"), ("autoformer", "float32, channels-last")]
    for row in result["rows"]:
        sub, = row["subnets"]
        m, parts = sub["measured"], sub["extrapolated_seconds"]
        assert (m["recal_images"], m["val_images"]) == (2, 3) and sub["resolution"] == 224
        assert abs(parts["recalibrate"] - m["recal_seconds"] / 2 * 2000) <= 0.01 * parts["recalibrate"] + 0.01
        assert abs(parts["validate"] - m["val_seconds"] / 3 * 50000) <= 0.01 * parts["validate"] + 0.01
        assert abs(sub["seconds_per_subnet"] - sum(parts.values())) <= 0.02
        core = m["recal_cpu_seconds"] / 2 * 2000 + m["val_cpu_seconds"] / 3 * 50000
        assert abs(sub["core_seconds_per_subnet"] - core) <= 0.01 * core + 0.02
        idle = parts["extract"] + core / result["machine"]["torch_threads"]
        assert abs(row["idle_seconds_per_subnet_mean"] - idle) <= 0.01 * idle + 0.02
        assert sub["bound_by"] == max(parts, key=parts.__getitem__)
        assert row["seconds_per_subnet_mean"] == sub["seconds_per_subnet"]
        assert abs(row["vs_anchor"] - row["seconds_per_subnet_mean"] / 30) <= 0.01
    assert "| autoformer | cpu | float32 |" in out.with_suffix(".md").read_text()
    assert result["decode"]["seconds_per_image"] > 0

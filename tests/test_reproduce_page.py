"""docs/reproduce.md shows the costs benchmarks/reproduce_times.py predicts from the committed
throughput results, as they stand: a changed result without the page rewritten fails here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("reproduce_times", ROOT / "benchmarks" / "reproduce_times.py")
assert _spec and _spec.loader
reproduce_times = importlib.util.module_from_spec(_spec)
sys.modules["reproduce_times"] = reproduce_times  # its dataclasses resolve their module while it runs
_spec.loader.exec_module(reproduce_times)


def test_the_page_shows_the_table_the_committed_results_predict():
    page = (ROOT / "docs" / "reproduce.md").read_text()
    expected = reproduce_times.table(reproduce_times.rows())
    assert reproduce_times.with_table(page, expected) == page


def test_the_committed_json_is_what_the_results_give():
    committed = json.loads((ROOT / "benchmarks" / "results" / "reproduce_times.json").read_text())
    assert committed["rows"] == [vars(r) for r in reproduce_times.rows()]


def test_predictions_multiply_the_evaluations_by_the_measured_seconds(tmp_path):
    """The arithmetic on a results folder of known numbers: one OFA row and one NADER row."""
    results = tmp_path
    (results / "supernet_eval.json").write_text(json.dumps({"rows": [
        {"space": s, "device": "cpu", "seconds_per_subnet_mean": v} for s, v in
        (("ofa_mbv3", 100.0), ("ofa_mbv3", 80.0), ("spos", 50.0), ("autoformer", 10.0))]}))
    (results / "train_throughput.json").write_text(json.dumps({"cpu": [
        {"input": [1, 28, 28], "projected_seconds_200_epochs_50k": 1.0},
        {"input": [3, 32, 32], "projected_seconds_200_epochs_50k": 1000.0}]}))
    (results / "train_throughput_gpu_h200.json").write_text(json.dumps({"gpu": {
        "device": "GPU X", "best_resnet_projected_seconds": 20.0,
        "packing": {"streams": [{"projected_seconds_per_candidate": 15.0}]},
        "packing_compiled": {"streams": [{"projected_seconds_per_candidate": 12.0}]}}}))
    rows = {r.row: r for r in reproduce_times.rows(results)}
    ofa = rows["OFA-S + CoLLM"]
    assert (ofa.evaluations, ofa.cpu_seconds, ofa.gpu_seconds) == (750, 80.0, None)  # the faster precision
    assert rows["AutoFormer-B + CoLLM"].cpu_seconds == round(10.0 * 11074 / 1366, 1)
    nader = rows["NADER (500) on CIFAR-10"]
    assert (nader.evaluations, nader.cpu_seconds, nader.gpu_seconds, nader.gpu_packed_seconds) == (1500, 1000.0, 20.0,
                                                                                                     12.0)
    assert rows["NADER (10) on ImageNet16-120"].gpu_seconds == round(20.0 * reproduce_times.IN16_SCALE, 1)
    line = next(t for t in reproduce_times.table([nader]).splitlines() if "NADER (500)" in t)
    assert "| 1,500 trainings | 1,000 s / 20 s | 17 days | 8.3 h / 5.0 h (GPU X) |" in line

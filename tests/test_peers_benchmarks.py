"""benchmarks/peers.py's `--only` merge (rows added to an existing JSON, tests recomputed where both
rows hold per-seed curves) and benchmarks/peers_supernet.py end to end at tiny sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import peers  # noqa: E402

FASHION = Path("/usr/share/datasets/fashion-mnist")


def bench(script: str, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_steps_round_trip_a_best_so_far_curve_with_a_flat_end():
    curve = [90.0, 90.0, 91.5, 91.5, 93.0, 93.0, 93.0]
    assert peers.steps(curve) == [[1, 90.0], [3, 91.5], [5, 93.0], [7, 93.0]]
    assert peers.unsteps(peers.steps(curve)) == curve
    assert peers.unsteps(peers.steps([92.0])) == [92.0]


def test_only_merges_a_new_row_into_an_earlier_json_and_pairs_it_with_a_rerun_default(tmp_path):
    out = tmp_path / "peers.json"
    common = ["--seeds", "3", "--trials", "30", "--no-process", "--gp-timeout", "0", "--long-trials", "0",
              "--out", str(out)]
    bench("peers.py", *common, "--skip", "optuna_tpe_independent", "optuna_random", "rea")
    first = json.loads(out.read_text())
    for row in first["methods"].values():  # as a JSON written before rows kept their curves
        del row["curves"]
    out.write_text(json.dumps(first))

    bench("peers.py", "--only", "optuna_tpe_independent", *common)
    merged = json.loads(out.read_text())
    assert set(merged["methods"]) == set(first["methods"]) | {"optuna_tpe_independent"}
    assert merged["methods"]["evolution"] == first["methods"]["evolution"]  # kept as it was
    assert merged["methods"]["bananas"]["best_at"] == first["methods"]["bananas"]["best_at"]  # rerun, same seeds
    assert "curves" in merged["methods"]["bananas"] and "curves" not in merged["methods"]["evolution"]
    test = merged["tests"]["bananas (default) vs optuna_tpe_independent"]
    assert test["seeds_paired"] == 3 and {"mean_diff", "wilcoxon_p", "mann_whitney_p"} <= set(test["25"])
    assert merged["tests"]["bananas (default) vs evolution"] == first["tests"]["bananas (default) vs evolution"]
    assert not any(n.startswith("optuna_tpe_independent:") for n in merged["notes"])  # its --skip note is gone
    assert merged["merges"][-1]["methods"] == ["optuna_tpe_independent", "bananas"]
    assert (tmp_path / "peers.png").stat().st_size > 10_000


def test_only_refuses_a_missing_json_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--only", "optuna_gp",
                        "--out", str(tmp_path / "none.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith("--only merges into an existing")


@pytest.mark.skipif(not FASHION.is_dir(), reason="needs Fashion-MNIST under /usr/share/datasets")
def test_peers_supernet_trains_once_then_compares_the_default_with_each_method(tmp_path):
    args = ["--seeds", "1", "--trials", "2", "--epochs", "1", "--train-subset", "256", "--val-subset", "32",
            "--recal-batches", "1", "--supernet-val-subset", "64", "--supernet-recal-batches", "1",
            "--cache", str(tmp_path / "sn"), "--out", str(tmp_path / "p.json")]
    bench("peers_supernet.py", *args)
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["default_strategy"] == "evolution" and result["seeds"] == 1 and result["budgets"] == [2]
    assert set(result["methods"]) == {"evolution", "bananas", "optuna_tpe"}
    assert set(result["tests"]) == {"evolution (default) vs bananas", "evolution (default) vs optuna_tpe"}
    assert result["tests"]["evolution (default) vs optuna_tpe"]["seeds_paired"] == 1
    assert result["supernet"]["settings"] == {"epochs": 1, "train_subset": 256, "val_subset": 64, "sampling": "sandwich",
                                              "recal_batches": 1}
    assert result["supernet"]["reused"] is False and result["supernet"]["sha256"]
    for row in result["methods"].values():
        assert row["seeds"] == [0] and 0 <= row["best_at"]["2"]["mean"] <= 100 and len(row["curves"]) == 1
    assert (tmp_path / "p.png").stat().st_size > 10_000

    bench("peers_supernet.py", *args)  # the cached supernet, not trained again
    again = json.loads((tmp_path / "p.json").read_text())
    assert again["supernet"]["reused"] is True and again["supernet"]["sha256"] == result["supernet"]["sha256"]


@pytest.mark.skipif(not FASHION.is_dir(), reason="needs Fashion-MNIST under /usr/share/datasets")
def test_peers_supernet_runs_on_spos_small_with_its_own_supernet(tmp_path):
    bench("peers_supernet.py", "--space", "spos_small", "--seeds", "1", "--trials", "2", "--epochs", "1",
          "--train-subset", "128", "--val-subset", "32", "--recal-batches", "1", "--supernet-val-subset", "64",
          "--supernet-recal-batches", "1", "--cache", str(tmp_path / "sn"),
          "--out", str(tmp_path / "p.json"))
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["space"] == "spos_small" and result["supernet"]["command"].startswith(
        "nas train-supernet space=spos_small ")
    assert result["notes"] == [] and len(list((tmp_path / "sn").iterdir())) == 1

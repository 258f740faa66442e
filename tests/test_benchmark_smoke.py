"""The training benchmark stays runnable: every section at tiny sizes (numbers not asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_bench(script: str, out: Path, *args: str) -> dict:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--quick", *args, "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_train_throughput_quick_writes_every_section(tmp_path):
    result = run_bench("train_throughput.py", tmp_path / "t.json")
    assert {"cpu", "engines_cpu", "engines_gpu", "agreement", "parity_cpu", "packing_cpu"} <= set(result)
    assert [r["n"] for r in result["packing_cpu"]["processes"]] == [1, 2]
    rows = result["engines_cpu"]["rows"]
    assert [row["engine"]["kind"] for row in rows] == ["plain", "fast", "fast"] and rows[2]["candidates"] == 2
    assert all(row["seconds_per_epoch_per_candidate"] > 0 for row in rows)
    assert 0 <= result["agreement"]["plain"]["mean"] <= 100 and 0 <= result["agreement"]["fast"]["mean"] <= 100


@pytest.mark.slow
def test_train_throughput_gpu_sections_pick_and_save(tmp_path):
    """--gpu-only --quick without CUDA runs the chosen GPU sections' code on CPU; the markdown
    says what did not run, and an unknown section is refused in one line."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA --gpu-only --quick measures the GPU instead")
    out = tmp_path / "g.json"
    result = run_bench("train_throughput.py", out, "--gpu-only", "--sections",
                       "reduce_overhead,packing_mps,profile,packing_fused")
    gpu = result["gpu"]
    assert gpu["sections"] == ["reduce_overhead", "packing_mps", "profile", "packing_fused"]
    assert gpu["packing_mps"] == {"measured": False, "reason": "no CUDA device"}
    assert "rows" not in gpu and "packing" not in gpu
    # on CPU the profile reads the operators' own time: the step is mostly convolutions and BN
    one, two = gpu["profile"]["variants"]
    assert one["measured"] and two["candidates"] == 2 and one["lanes"] >= 1
    kinds = {k["name"]: k["ms_per_step"] for k in one["by_kind"]}
    assert kinds["convolution"] == max(kinds.values()) and kinds["batchnorm"] > 0
    assert 0 < one["busy_ms_per_step"] <= one["wall_ms_per_step"]
    # fused packing: one step trains N members; each row says whether its graph was captured
    fused = gpu["packing_fused"]
    assert fused["measured"] and set(fused["probe"]) == {"conv_under_autocast", "batch_norm_bf16"}
    assert [r["n"] for r in fused["fused"]] == [1, 2]
    for r in fused["fused"]:
        assert r["projected_seconds_per_candidate"] > 0 and r["cuda_graphs"] == "failed: no CUDA device"
        assert len(r["valid_accuracy"]) == r["n"] and r["vmap_fallbacks"] == []
    md = out.with_suffix(".md").read_text()
    assert "Where a training step's device time goes" in md
    assert "| 2 | " in md.split("Packing fused candidates")[1]
    assert ("Not run this time: packing_fused_nb201, packing_fused_compiled, packing, rows, packing_nb201, "
            "packing_compiled, cudnn_benchmark, layout, parity.") in md
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--gpu-only", "--quick",
                        "--sections", "rows,bogus"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().splitlines()[-1].startswith("--sections: unknown bogus")


@pytest.mark.slow
def test_llm_layer_quick(tmp_path):
    result = run_bench("llm_layer.py", tmp_path / "l.json")
    assert result["local_model"]["tokens_per_s"] > 0
    work = result["workload"]
    assert work["histories_identical"] and work["replay_live_calls"] == 0 and work["rerun_cache_hit_rate"] == 1.0


@pytest.mark.slow
def test_knowledge_quick(tmp_path):
    ideas = ROOT.parent / "shared" / "data" / "nader" / "inspirations.json"
    if not ideas.is_file():
        pytest.skip("NADER's inspirations.json is not next to the repository")
    result = run_bench("knowledge.py", tmp_path / "k.json", "--llm-sample", "2")
    assert result["n_ideas"] == 500 and result["store_vectors_given"]["added"] > 450
    assert result["search"]["end_to_end"]["p95_ms"] > 0
    assert result["tagging"]["local_llm"]["ideas_per_s"] > 0
    query = result["query_path"]  # the numpy encoder against sentence-transformers
    assert query["agreement"]["overlap_at_5_min"] >= 0.8 and query["agreement"]["max_abs_vector_diff_ideas"] < 1e-5
    assert query["cli"]["numpy"]["later_median_s"] > 0 and len(query["cli"]["sentence_transformers"]["runs_s"]) == 3


@pytest.mark.slow
def test_collm_nb201_quick_baselines(tmp_path):
    result = run_bench("collm_nb201.py", tmp_path / "c.json", "--no-collm")
    assert set(result["strategies"]) == {"random", "rea", "reinforce", "evolution"}
    for res in result["strategies"].values():
        assert res["seeds"] == 3 and 85 < res["best_at"]["25"]["mean"] <= result["table_optimum"]
    assert (tmp_path / "c.png").is_file() and "| evolution | 3 |" in (tmp_path / "c.md").read_text()



@pytest.mark.slow
def test_predictor_nb201_small_run_screens_and_pairs(tmp_path):
    out = tmp_path / "p.json"  # smaller than --quick: 2 seeds, 5 trials past the predictor's start
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "predictor_nb201.py"), "--seeds", "2", "--trials",
                        "15", "--no-collm", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["strategies"]) == {"random", "rea", "rea+screen", "bananas"}
    screened = result["strategies"]["rea+screen"]
    assert screened["screen"]["factor"] == 8 and screened["screened_per_run"] == 7 * (15 - 10)
    assert result["strategies"]["rea"]["screened_per_run"] == 0
    assert {(t["a"], t["b"]) for t in result["paired_tests"]} >= {("rea+screen", "rea"), ("bananas", "rea")}
    assert "| rea+screen | x8 predictor | 2 | 15 |" in (tmp_path / "p.md").read_text()
    assert result["strategies"]["random"]["best_origin"] == {"random": 2}  # where each seed's best came from
    assert sum(result["strategies"]["bananas"]["best_origin"].values()) == 2
    assert "random: each seed's best came from random (2 of 2)." in (tmp_path / "p.md").read_text()
    for shard in ("1/2", "x/2"):  # shards only fill a --work dir; I/N are numbers
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "predictor_nb201.py"), "--shard", shard],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and r.stderr.strip() == (f"--shard {shard}: needs 0 <= I < N, and --only with "
                                                           "--work when N > 1")

def test_import_time_quick_merges_beside_the_committed_before(tmp_path):
    out = tmp_path / "i.json"
    committed = json.loads((ROOT / "benchmarks" / "results" / "import_time.json").read_text())
    out.write_text(json.dumps({"before": committed["before"]}))
    result = run_bench("import_time.py", out, "--label", "after", "--modules", "nas.errors")
    assert result["before"] == committed["before"]
    assert "ratio" not in result  # a quick run is not compared with a full one
    after = result["after"]
    assert after["quick"] and after["commit"] and len(after["load_avg_start"]) == 3
    assert set(after["targets"]) == {"nas --help", "import nas.errors", "pytest --collect-only"}
    assert after["targets"]["import nas.errors"]["loaded"] == []  # errors.py imports nothing heavy
    defined = sum(line.startswith("def test_") for line in Path(__file__).read_text().splitlines())
    assert after["targets"]["pytest --collect-only"]["tests"] == defined  # --quick collects this file


def test_a_run_of_some_gpu_sections_keeps_the_others_earlier_numbers(tmp_path):
    """`--gpu-only --sections X` into the committed results file used to replace every other
    section's numbers with nothing; they are kept and the markdown says whose they are."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from train_throughput import earlier_gpu, gpu_markdown

    path = tmp_path / "gpu.json"
    OLD = {"measured": False, "reason": "an earlier run's"}
    assert earlier_gpu(path, ("profile",)) == {}                         # no earlier file
    path.write_text(json.dumps({"gpu": {"device": "H100", "sections": ["profile", "packing_mps"],
                                        "profile": {"variants": []}, "packing_mps": OLD}}))
    assert earlier_gpu(path, ("profile", "packing_mps")) == {}                # everything rerun
    kept = earlier_gpu(path, ("profile",))
    assert kept["packing_mps"] == OLD and kept["kept_from_earlier_run"] == ["packing_mps"]
    new = {"device": "H100", "data": "d", "batch": 256, "budget_width": 25, "width_multiple_8": 24,
           "sections": ["profile"], "profile": {"variants": []}}
    merged = {**kept, **new}
    assert merged["sections"] == ["profile"] and merged["packing_mps"] == OLD
    md = gpu_markdown(merged, {"torch": "2.14"})
    assert "Kept from this file's earlier run (its numbers, not this run's): packing_mps." in md
    assert "packing_mps" not in md.split("Not run this time: ")[1].split(".")[0]

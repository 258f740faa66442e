"""benchmarks/llm_prompt_cache.py's summary: reproducibility is judged within each prompt-cache
mode, since the modes' searches may part ways by design."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from llm_prompt_cache import markdown, summary  # noqa: E402


def run(mode: str, archs: list[str]) -> dict:
    return {"mode": mode, "calls": 2, "llm_seconds": 4.0, "prompt_tokens": 100, "evaluated_prompt_tokens": 50,
            "prompt_eval_seconds": 1.0, "archs": archs}


def test_same_architectures_is_one_flag_per_mode():
    runs = [run("off", ["a", "b"]), run("on", ["a", "c"]), run("off", ["a", "b"]), run("on", ["a", "c"])]
    s = summary(runs)
    assert (s["off"]["same_architectures"], s["on"]["same_architectures"]) == (True, True)
    assert "same_architectures" not in s
    runs[3] = run("on", ["a", "d"])
    assert (summary(runs)["off"]["same_architectures"], summary(runs)["on"]["same_architectures"]) == (True, False)
    payload = {"summary": summary(runs), "seed": 0, "trials": 2, "repeats": 2, "cpu": "test"}
    assert "same architectures proposed in each mode's runs: off True, on False." in markdown(payload)

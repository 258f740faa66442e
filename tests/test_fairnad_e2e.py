"""`nas search strategy=fairnad` end to end with the real CLI, the real sandbox,
real training on digits and a scripted OpenAI-compatible server: hostile code
is contained and debugged, an oversize child is downscaled, a broken child is
fixed by the Debugger, a duplicate is skipped, a garbage reply costs one
trial, and stages II and III run. The search runs under the Prefect flow (agent calls
and evaluations are tasks); a replay of its LLM replies reproduces it from the
evaluation cache and the kept sandbox verdicts (tests/test_nader_e2e.py runs a design
search with runner=local)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import seed_prefect_db
from nas.spaces.source.bases import base_source
from support.scripted import ScriptedServer

pytestmark = pytest.mark.slow

BASE = base_source("resnet32")
CONV2 = "self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)"
STEM = "nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()"
K5 = BASE.replace(CONV2, CONV2.replace("3, padding=1", "5, padding=2"))
DEEP_STEM = BASE.replace(STEM, STEM + ", nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()")
BROKEN_STEM = BASE.replace(STEM, STEM + ", nn.Conv2d(16, 24, 3, padding=1, bias=False), nn.BatchNorm2d(24), nn.ReLU()")
DEEPER = BASE.replace("self._make_stage(32, 64, blocks=5", "self._make_stage(32, 64, blocks=6")


def widen(factor: float) -> str:
    out = BASE
    for c in (64, 32, 16):  # largest first, so 16 -> 32 is not widened twice
        out = out.replace(f"({c},", f"(W{c},").replace(f", {c},", f", W{c},").replace(f"({c})", f"(W{c})")
    for c in (16, 32, 64):
        out = out.replace(f"W{c}", str(int(c * factor)))
    return out


WIDE, NARROWER = widen(4), widen(1.5)


def code(source: str, note: str = "") -> str:
    return f"{note}\n```python\n{source}```\n"


class Designer:
    """Answers by agent; the Mutator's replies come in order."""

    def __init__(self, marker: Path) -> None:
        hostile = f"import os\nos.system('touch {marker}')\n" + K5
        self.mutator = [code(hostile), code(WIDE), code(BROKEN_STEM),
                        code(K5.replace("class BasicBlock", "# same as before\nclass BasicBlock")),
                        "Sorry, I cannot write that model.", "Still no code, sorry."]
        self.pareto = code(DEEPER)
        self.seen: list[str] = []

    def __call__(self, body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You fix PyTorch model files"):
            self.seen.append("debug")
            if "os.system" in user:
                return code(K5, "The import of os is not allowed; removed.")
            return code(DEEP_STEM, "Channels now agree.")
        if system.startswith("You shrink PyTorch"):
            self.seen.append("downscale")
            return code(NARROWER)
        if system.startswith("You are a PyTorch engineer who refines"):
            self.seen.append("iterate")
            return "<idea>Deepen the last stage by one block.</idea>\n" + code(DEEPER.replace("blocks=6", "blocks=7"))
        if system.startswith("You are a PyTorch engineer who redesigns"):
            if "this idea" not in user:  # a refinement request (stage II)
                self.seen.append("pareto")
                return self.pareto
            return self.mutator.pop(0) if self.mutator else code(DEEPER.replace("blocks=6", "blocks=4"))
        return "?"


# A quarter of digits' 1,078 training images, 128 each to validate and test: the trials train for
# real (an accuracy each, cached for the replay), on less work. Nothing asserted depends on the
# data's size: params are the network's, FLOPs the 8x8 input's, the stages the trial count's.
SMALL = ("recipe.train_subset=256", "recipe.valid_subset=128", "recipe.test_subset=128")


def search(tmp_path: Path, run: Path, runner: str, *llm: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env.update(NASFLOW_HOME=str(tmp_path / "home"), NASFLOW_NO_KEY="",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    return subprocess.run(
        [sys.executable, "-m", "nas.cli.main", "search", "space=source", "strategy=fairnad", "evaluator=train",
         "data=digits", "recipe.epochs=1", *SMALL, "strategy.init=4",
         "strategy.fair_parents=1", "strategy.pareto_parents=1", "strategy.iterative_parents=1",
         "strategy.iterative_steps=1", "budget.trials=8", f"runner={runner}", "progress=false", *llm,
         f"knowledge.path={tmp_path / 'qdrant'}", f"hydra.run.dir={run}"],
        capture_output=True, text=True, env=env, timeout=900)


def executes(history: list[dict]) -> list[bool]:
    """Whether each sandbox check of the history was a kept verdict."""
    return [check["detail"]["cached"] for h in history for attempt in h["strategy"].get("attempts", [])
            for check in attempt.get("checks", []) if check["name"] == "execute"]


def test_fairnad_search_end_to_end(tmp_path):
    seed_prefect_db(tmp_path / "home" / "prefect")
    marker = tmp_path / "pwned"
    designer = Designer(marker)
    run = tmp_path / "run"
    with ScriptedServer(designer) as srv:
        out = search(tmp_path, run, "prefect", "llm=openai", f"llm.base_url={srv.base_url}",
                     "llm.api_key_env=NASFLOW_NO_KEY", "llm.structured=none")
    assert out.returncode == 0, out.stderr[-3000:]
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    info = [h["strategy"] for h in history]
    assert [i["stage"] for i in info] == ["root", "init", "init", "init", "init", "fair", "pareto", "iterative"]
    root, hostile, wide, broken, duplicate, garbage, pareto, iterative = history

    assert root["accuracy"] is not None
    # Hostile code: the sandbox refused the command, nothing ran; the Debugger's fix was trained.
    assert not marker.exists()
    first = hostile["strategy"]["attempts"][0]
    assert first["action"] == "mutate" and not first["ok"]
    assert [c["name"] for c in first["checks"]][-1] == "execute"
    assert [a["action"] for a in hostile["strategy"]["attempts"]] == ["mutate", "debug"]
    assert hostile["strategy"]["valid"] and hostile["accuracy"] is not None
    # Oversize: the budget check failed, the downscaled model passed and was trained.
    checks = wide["strategy"]["attempts"][0]["checks"]
    assert checks[-1]["name"] == "budget" and checks[-1]["error"].startswith("over budget: params")
    assert wide["strategy"]["downscale_retries"] == 1 and wide["strategy"]["valid"]
    assert 0.9e6 < wide["params"] <= 1.5e6
    # A shape error fixed on the Debugger's retry.
    assert broken["strategy"]["debug_retries"] == 1 and broken["strategy"]["valid"]
    assert "channels" in broken["strategy"]["attempts"][0]["checks"][1]["error"]
    # The same model as the first child (only a comment differs): skipped, never trained.
    assert duplicate["strategy"]["duplicate"] and duplicate["error"].startswith("dedup: duplicate of model 1")
    assert duplicate["cost_seconds"] == 0
    # A garbage reply: one failed trial with its reason, the search went on.
    assert garbage["error"].startswith("mutate:") and "no ```python code block" in garbage["error"]
    # Stage II: an NSGA-II parent under 0.9 of the budget gets an upscaling idea.
    assert pareto["strategy"]["tag"] == {"refinement": "upscale"} and pareto["strategy"]["valid"]
    # Stage III: a parent with a grand-parent is refined with the improved or degraded prompt.
    assert designer.seen.count("debug") == 2 and "downscale" in designer.seen
    assert iterative["strategy"]["step"] == 1 and iterative["strategy"]["valid"]
    if "variant" in iterative["strategy"]:
        assert iterative["strategy"]["idea"] == "Deepen the last stage by one block."

    summary = json.loads((run / "summary.json").read_text())
    design = summary["design"]
    assert design["proposals"] == 7 and design["valid"] == 5 and design["duplicates"] == 1
    assert design["executability"] == 1.0 and design["tokens_per_valid_design"] > 0
    assert set(summary["stages"]) == {"init", "fair", "pareto", "iterative"}
    assert summary["llm"]["roles"]["debugger"]["calls"] == 2
    report = (run / "report.md").read_text()
    assert "## Design quality" in report and "| init | 4 | 3 (75%) | 1 |" in report
    assert "| 5 | fair | " in report and "## Best design" in report

    # llm=replay: the same search from the transcripts, the server gone: the same history, and
    # every trained candidate comes from the evaluation cache.
    again = tmp_path / "replayed"
    out = search(tmp_path, again, "prefect", "llm=replay", f"llm.replay_from={run}")
    assert out.returncode == 0, out.stderr[-3000:]
    replayed = [json.loads(line) for line in (again / "history.jsonl").read_text().splitlines()]
    assert [(h["key"], h["error"], h["strategy"]["stage"], h["accuracy"]) for h in replayed] == \
        [(h["key"], h["error"], h["strategy"]["stage"], h["accuracy"]) for h in history]
    # ... and no design ran in the sandbox again: every verdict came from $NASFLOW_HOME/checks
    assert executes(history) and not any(executes(history))
    assert executes(replayed) and all(executes(replayed))
    again_summary = json.loads((again / "summary.json").read_text())
    assert again_summary["llm"]["total"]["live"] == 0
    assert again_summary["cache_hits"] == sum(h["accuracy"] is not None for h in history) == 6

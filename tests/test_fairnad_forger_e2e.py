"""`nas search strategy=fairnad` end to end with a scripted LLM whose replies are hostile: one
Mutator reply is a forger, the others carry terminal escapes. The real CLI, the real sandbox,
real training on digits, a loopback OpenAI-compatible server (tests/support/scripted.py).

The forger is tests/hostile/forge_carried_select_table.py as the Mutator's reply: at import
it replaces `torch.export.export`, so the child's own checks run the honest network and the
graph sent to the parent reads a frozen 32,768-value table through literal indices
(`levels[c]` is `select.int(levels, 0, c)` over `levels = arange(256) + 0*sum(x)`). Only the
parent's parse of the graph (what its nodes spell counted in bits, the operands a node may take:
`nas/sandbox/graph.py`) refuses it. The forger's honest network
differs from the base (32 channels against 24), is under the budget and unlike any other
design, so a parent that accepted the forged graph would pass every later check of the chain
and train it: the test would see an accuracy, a passing execute check and no refusal line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.artifacts import report_markdown, top_trials
from nas.core.trial import read_history
from support.scripted import ScriptedServer

pytestmark = pytest.mark.slow

# tests/hostile/forge_carried_select_table.py, patching `torch.export.export` (looked up when the
# child exports, however the worker imported its exporter) instead of the sandbox's `export_graph`.
FORGER = """import torch
import torch.export
from torch import nn

_export = torch.export.export


def _forged(net, *args, **kwargs):
    \"\"\"The child checks the honest network; the graph sent to the parent takes the hostile path.\"\"\"
    net.hostile = True
    try:
        return _export(net, *args, **kwargs)
    finally:
        net.hostile = False


torch.export.export = _forged

_CODES = [(i * 7919) % 256 for i in range(2_048)]  # stands for a quantised network from a blob


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(32, num_classes)
        self.hostile = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(self.features(x))
        if self.hostile:
            levels = (torch.arange(256) - 128) / 64 + 0 * x.sum()
            frozen = torch.stack([levels[c] for c in _CODES] * 16).view(-1, 1024)[:10]
            out = out + frozen.mean(1) * 0
        return out
"""
BASE = """import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 24, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(24), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(24, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))
"""
# What a screen must never receive from a reply: a clear-screen, an OSC window title ended by BEL,
# a bare carriage return, and a fake verdict line after a newline.
SCREEN = "\x1b[2J\x1b]0;title\x07\r"
FAKE = "\nmodel.py: valid model (1 params, 1 FLOPs)"
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")  # a control character other than the newline


def code(channels: int) -> str:
    """A reply with the base at `channels` wide (the forger at 32): prose and a comment with escapes."""
    source = FORGER if channels == 32 else BASE.replace("24", str(channels))
    return f"Here is the model.{SCREEN}model.py: valid model{FAKE}\n```python\n# tuned{SCREEN}\n{source}```\n"


class Designer:
    """The Mutator writes the forger, then honest children; stage III's reply has an idea with escapes."""

    def __init__(self) -> None:
        self.mutator = [32, 40, 56]
        self.seen: list[str] = []

    def __call__(self, body: dict) -> str:
        system = body["messages"][0]["content"]
        if system.startswith("You are a PyTorch engineer who refines"):
            self.seen.append("iterate")
            return f"<idea>Widen the last stage.{SCREEN}now{FAKE}</idea>\n" + code(48)
        if system.startswith("You are a PyTorch engineer who redesigns"):
            self.seen.append("mutate")
            return code(self.mutator.pop(0))
        self.seen.append(system[:40])
        return "?"


def strings(value: object) -> list[str]:
    """Every string inside a JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def nas(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env.update(NASFLOW_HOME=str(tmp_path / "home"), NASFLOW_NO_KEY="")
    return subprocess.run([sys.executable, "-m", "nas.cli.main", *args], capture_output=True, text=True,
                          env=env, timeout=900)


def test_forger_written_by_the_llm_is_refused_never_best_never_exported_and_no_reply_reaches_a_screen(tmp_path):
    base = tmp_path / "base.py"
    base.write_text(BASE)
    run = tmp_path / "run"
    designer = Designer()
    with ScriptedServer(designer) as srv:
        out = nas(tmp_path, "search", "space=source", f"space.base={base}", "strategy=fairnad", "evaluator=train",
                  "data=digits", "recipe.epochs=1", "recipe.train_subset=256",
                  "recipe.valid_subset=128", "recipe.test_subset=128", "strategy.init=2", "strategy.max_debug=0",
                  "strategy.stages.fair=false", "strategy.stages.pareto=false", "strategy.iterative_parents=2",
                  "strategy.iterative_steps=1", "+strategy.sandbox.wall_s=240", "budget.trials=5", "runner=local",
                  "progress=false",
                  "llm=openai", f"llm.base_url={srv.base_url}", "llm.api_key_env=NASFLOW_NO_KEY",
                  "llm.structured=none", f"knowledge.path={tmp_path / 'qdrant'}", f"hydra.run.dir={run}")
    assert out.returncode == 0, out.stderr[-3000:]
    history = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert [h["strategy"]["stage"] for h in history] == ["root", "init", "init", "iterative", "iterative"]
    forger = history[1]

    # The forger: refused by the parent's graph check in one line, never trained, never best.
    assert "_forged" in forger["encoding"] and forger["accuracy"] is None, "the forged graph was accepted"
    check = forger["strategy"]["attempts"][0]["checks"][-1]
    assert check["name"] == "execute" and not check["ok"]
    assert re.match(r"execute: graph: (carries [\d,]+ bits besides its input|graph node \d+ \(aten\.stack\.default\) "
                    r"takes [\d,]+ operands, over the [\d,]+ a node may take)", forger["error"]), forger["error"]
    assert "\n" not in forger["error"]
    assert all(h["accuracy"] is not None for h in history if h is not forger)
    # stage III: the base's job has no mutation to learn from and asks the Mutator, the child's refines
    assert sorted(designer.seen) == ["iterate", "mutate", "mutate", "mutate"]
    refined = next(h for h in history if h["strategy"].get("variant"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"]["trial"] != forger["trial"] and "_forged" not in summary["best"]["encoding"]
    # ... and never exported: not as the best, not when asked for by its trial
    exported = nas(tmp_path, "export", str(run), "--no-train")
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert "_forged" not in (run / "export" / "model.py").read_text()
    asked = nas(tmp_path, "export", str(run), "--trial", str(forger["trial"]), "--no-train")
    assert asked.returncode == 2 and len(asked.stderr.strip().splitlines()) == 1, asked.stderr
    assert not (run / f"export-trial{forger['trial']}").exists()

    # The replies' escapes: text wherever a reply went (console, transcript, prompts built from
    # replies, history, report.md, the Prefect report artifact), never control characters.
    assert "Widen the last stage.\\x1b[2J\\x1b]0;title\\x07\\x0dnow model.py: valid" in refined["strategy"]["idea"]
    transcript = [json.loads(line) for line in (run / "llm" / "transcripts.jsonl").read_text().splitlines()]
    assert len(transcript) == 4 and all("\\x1b]0;title\\x07\\x0dmodel.py" in r["reply"] for r in transcript)
    report = (run / "report.md").read_text()
    artifact = report_markdown(run, read_history(run / "history.jsonl"), summary)
    table = top_trials(read_history(run / "history.jsonl"), trust=False)  # the top-trials table artifact
    assert table and all("\n" not in row["encoding"] for row in table)  # a source on one line in its cell
    screens = (out.stdout, out.stderr, (run / "search.log").read_text(), exported.stdout, exported.stderr,
               asked.stderr, report, artifact)
    for text in (*screens, *strings(transcript), *strings(history), *strings(table)):
        assert not RAW.search(text), text
    row = next(line for line in report.splitlines() if line.startswith(f"| {refined['trial']} | iterative |"))
    assert row.count(" | ") == 6 and "\\x1b]0;title\\x07" in row  # the idea and its fake line in one cell

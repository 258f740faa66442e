"""NADER's design-quality ablation on our stack -> JSON: pass rate, executability,
success rate and tokens per valid design of the local model, with and without
LIF (retries with the verifier's error) and LDE (experiences from the Reflector).

  python benchmarks/design_quality.py [--quick] [--proposals N] [--set KEY=VALUE ...] [--out PATH]

Each arm (LIF+LDE, no LIF, no LDE, neither) is a real `nas search` of the
default job (NADER from the ResNet basic block on digits, evaluator=quick
recipe=quick, runner=local) in its own run dir, over the same number of
proposals (designs after the root), with llm.cache=false (every call live) and
its own knowledge folder: the built-in corpus's ideas (seeded by the strategy)
and no experiences, so arms share nothing. The numbers are each run's
`summary.json` `design` entry; the most common verifier messages come from its
history. NADER's own numbers (GPT-4o) are stored under `paper`, for comparison only.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.core.trial import TrialRecord, read_history  # noqa: E402
from nas.io import atomic_write_json, read_json  # noqa: E402

# Every arm: a fresh idea store (seeded with the built-in corpus by the strategy) and no experiences.
JOB = ["space=nader", "strategy=nader", "evaluator=quick", "data=digits", "recipe=quick", "runner=local",
       "llm=local", "llm.cache=false", "progress=false", "seed=0"]
PROPOSALS = 4   # per arm: with LIF a failed design costs up to 5 Modifier calls (~12 s each here)
ARMS = {  # label -> (strategy.lif, strategy.lde)
    "LIF+LDE": (True, True),
    "no LIF": (False, True),
    "no LDE": (True, False),
    "neither": (False, False),
}
PAPER = {
    "source": "NADER (Yang et al., CVPR 2025) with GPT-4o, as reported; their protocol and definitions, "
              "not a run of ours",
    "model": "gpt-4o",
    "pass_rate_Q": 0.96,
    "executability": 0.92,
    "success_rate": 0.88,
}


def failures(history: list[TrialRecord], top: int = 5) -> list[dict[str, Any]]:
    """The most common reasons a draft was rejected, over every attempt, numbers as N."""
    counts: Counter[str] = Counter()
    for record in history:
        info = record.strategy
        if info.get("stage") != "modify":
            continue
        for attempt in info.get("attempts", []):
            if attempt.get("ok"):
                continue
            error = attempt.get("error") or next((c["error"] for c in attempt.get("checks", []) if not c["ok"]), "")
            error = re.sub(r"\s*\[at [^\]]*\]", "", re.sub(r"^\S+:\d+: ", "", error))
            counts[re.sub(r"\d+", "N", error)[:160]] += 1
    return [{"message": m, "count": c} for m, c in counts.most_common(top)]


def run_arm(label: str, lif: bool, lde: bool, proposals: int, work: Path, extra: list[str]) -> dict:
    slug = re.sub(r"\W+", "_", label.lower())
    store, run = work / slug / "qdrant", work / slug / "run"
    # max_children: room for every proposal even if all fail (failed children are not modified further)
    overrides = [*JOB, f"budget.trials={proposals + 1}", f"strategy.max_children={max(3, proposals)}",
                 f"strategy.lif={str(lif).lower()}", f"strategy.lde={str(lde).lower()}",
                 f"knowledge.path={store}", f"hydra.run.dir={run}", *extra]
    env = {**os.environ, "NASFLOW_HOME": str(work / "home"), "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "nas.cli.main", "search", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"arm {label}: nas search failed: {tail}")
    summary, history = read_json(run / "summary.json"), read_history(run / "history.jsonl")
    root = next((r for r in history if r.strategy.get("stage") == "root"), None)
    return {"lif": lif, "lde": lde, "design": summary["design"], "root_accuracy": root.accuracy if root else None,
            "failures": failures(history), "llm": summary.get("llm", {}).get("total", {}),
            "wall_s": round(time.perf_counter() - start, 1)}


def model_info() -> dict[str, Any]:
    from nas.config import compose_config
    from nas.llm.local import GGUF_NAME

    llm = compose_config(["llm=local"])["llm"]
    return {"name": llm["model"], "file": GGUF_NAME, "backend": "llama-cpp-python server, grammar-constrained",
            "roles": {r: llm["roles"][r] for r in ("proposer", "modifier", "reflector")}}


def fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 proposal per arm, LIF up to 2 tries (smoke test)")
    ap.add_argument("--proposals", type=int, default=None,
                    help=f"designs per arm (default {PROPOSALS}, about 15 min on 2 cores; 1 with --quick)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra `nas search` override for every arm, e.g. evaluator=train")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/design_quality.json")
    args = ap.parse_args()
    proposals = args.proposals or (1 if args.quick else PROPOSALS)
    extra = ["strategy.lif_tries=2"] * args.quick + args.set
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    start = time.perf_counter()
    arms: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nas-design-bench-") as tmp:
        work = Path(tmp)
        for label, (lif, lde) in ARMS.items():
            with console.status(f"{label}: {proposals} proposals"):
                arms[label] = run_arm(label, lif, lde, proposals, work, extra)
            d = arms[label]["design"]
            console.print(f"{label}: {d['valid']}/{d['proposals']} valid, {arms[label]['wall_s']:.0f} s")
    result = {"benchmark": "design_quality", "quick": args.quick, "model": model_info(),
              "setup": {"proposals_per_arm": proposals, "overrides": JOB + extra,
                        "knowledge": "a fresh store per arm: the built-in corpus's ideas, no experiences"},
              "arms": arms, "paper": PAPER,
              "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform()},
              "wall_seconds": round(time.perf_counter() - start, 1)}
    atomic_write_json(args.out, result)

    table = Table(title=f"NADER design quality, {result['model']['name']}, {proposals} proposals per arm")
    for col in ("arm", "valid", "pass rate", "executability", "success", "tokens / valid", "wall"):
        table.add_column(col, justify="left" if col == "arm" else "right")
    for label, arm in arms.items():
        d = arm["design"]
        table.add_row(label, f"{d['valid']}/{d['proposals']}", fmt(d["pass_rate"]), fmt(d["executability"]),
                      fmt(d["success_rate"]), fmt(d["tokens_per_valid_design"], 0), f"{arm['wall_s']:.0f} s")
    table.add_row("paper (GPT-4o)", "", fmt(PAPER["pass_rate_Q"]), fmt(PAPER["executability"]),
                  fmt(PAPER["success_rate"]), "", "")
    Console().print(table)
    print(f"wrote {args.out} ({result['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()

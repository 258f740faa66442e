"""Isolation benchmark -> JSON: hostile models contained, and what isolation costs.

  python benchmarks/isolation.py [--quick] [--baseline REV] [--out benchmarks/results/isolation.json]

1. Hostile models: tests/test_hostile.py's hostile tests (every template in
   tests/hostile/ through the real CLI: `nas arch validate FILE...` for each
   kind's files, `nas train` one by one; with their containment checks: canary
   listeners, files outside, the API key anywhere, processes left behind,
   forged numbers), read from the outcomes they write (NASFLOW_HOSTILE_REPORT):
   cases tried / contained and seconds per case (the verdict on that file; the
   first of a `validate` run and each `train` include the CLI's start).
2. Overhead on a normal model (tests/data/models/cnn_parent.py): wall seconds
   of verification and of training (digits, 2 epochs, 1 seed) for
   - isolated: this tree (bubblewrap + seccomp, trace then train),
   - unisolated: this tree with NASFLOW_ALLOW_UNISOLATED=1 and no bwrap (the
     same trace-then-train pipeline without namespaces),
   - baseline: the tree at --baseline (default: the last commit before OS
     isolation: audit hook + rlimits, measured and trained in the child).
   Each is the median of --repeats runs in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nas.io import atomic_write_json  # noqa: E402

BASELINE = "999dbc1"  # the last commit before OS isolation
MODEL = ROOT / "tests" / "data" / "models" / "cnn_parent.py"
TIMED = r"""
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from nas.sandbox import train_model_source, verify_model_source
source = Path(sys.argv[1]).read_text()
start = time.perf_counter()
if sys.argv[2] == "validate":
    v = verify_model_source(source)
    ok = v.ok
else:
    v, runs = train_model_source(source, data={"name": "digits"}, num_classes=10, input_shape=(2, 1, 8, 8),
                                 recipe={"epochs": 2, "batch_size": 64}, engine={"kind": "fast"}, seeds=[0])
    ok = v.ok and len(runs) == 1
print(json.dumps({"ok": ok, "seconds": time.perf_counter() - start, "error": v.error}))
"""


def timed(tree: Path, what: str, env: dict[str, str], repeats: int) -> dict:
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", TIMED, str(MODEL), what], cwd=tree, capture_output=True,
                              text=True, env={**env, "PYTHONPATH": str(tree)}, timeout=1800)
        if done.returncode != 0:
            return {"ok": False, "error": done.stderr.strip().splitlines()[-1:]}
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if not all(r["ok"] for r in runs):
        return {"ok": False, "error": next(r["error"] for r in runs if not r["ok"])}
    seconds = [r["seconds"] for r in runs]
    return {"ok": True, "median_s": round(statistics.median(seconds), 3), "runs_s": [round(s, 3) for s in seconds]}


def overhead(baseline: str, repeats: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NASFLOW_ALLOW_UNISOLATED", "NASFLOW_BWRAP")}
    out = {}
    with tempfile.TemporaryDirectory(prefix="nas-bench-base-") as base:
        tree = Path(base) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), baseline], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            arms = {"isolated": (ROOT, env),
                    "unisolated": (ROOT, {**env, "NASFLOW_ALLOW_UNISOLATED": "1", "NASFLOW_BWRAP": "/nonexistent"}),
                    "baseline": (tree, env)}
            for what in ("validate", "train"):
                out[what] = {arm: timed(t, what, e, repeats) for arm, (t, e) in arms.items()}
                iso, base_s = out[what]["isolated"], out[what]["baseline"]
                if iso["ok"] and base_s["ok"]:
                    out[what]["isolated_over_baseline"] = round(iso["median_s"] / base_s["median_s"], 3)
                if iso["ok"] and out[what]["unisolated"]["ok"]:
                    out[what]["isolated_over_unisolated"] = round(
                        iso["median_s"] / out[what]["unisolated"]["median_s"], 3)
                print(what, json.dumps(out[what]), flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    return out


def hostile(quick: bool) -> dict:
    """Run the hostile suite's tests (the real CLI, all containment checks) and read each
    case's outcome and seconds from the JSON they write."""
    selectors = ["tests/test_hostile.py::test_hostile_models_are_contained",
                 "tests/test_hostile.py::test_hostile_trained_model_is_contained"]
    with tempfile.TemporaryDirectory(prefix="nas-bench-hostile-") as tmp:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selectors]
        if quick:  # one kind's validate run and one training case
            args += ["-k", "cache or forge_train_result"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NASFLOW_HOSTILE_REPORT": tmp}
        subprocess.run(args, cwd=ROOT, env=env, timeout=7200)
        cases = [case for path in sorted(Path(tmp).glob("*.json")) for case in json.loads(path.read_text())]
    secs = sorted(c["seconds"] for c in cases if c["seconds"] is not None)
    return {"tried": len(cases), "contained": sum(c["contained"] for c in cases),
            "median_s": round(statistics.median(secs), 3) if secs else None,
            "max_s": secs[-1] if secs else None, "cases": cases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="6 hostile cases, 1 repeat")
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "isolation.json")
    args = ap.parse_args()
    from nas.sandbox.isolation import isolation

    result = {"command": " ".join(sys.argv), "machine": platform.platform(), "cpus": os.cpu_count(),
              "isolation": isolation().describe(), "hostile": hostile(args.quick),
              "overhead": overhead(args.baseline, 1 if args.quick else args.repeats)}
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

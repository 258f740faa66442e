"""Isolation benchmark -> JSON: hostile models contained, and what isolation costs.

  python benchmarks/isolation.py [--quick] [--baseline REV] [--out benchmarks/results/isolation.json]

1. Hostile models: tests/test_hostile.py's hostile tests (every template in
   tests/hostile/ through the real CLI: `nas arch validate FILE...` for each
   kind's files, `nas train` one by one; with their containment checks: canary
   listeners, files outside, the API key anywhere, processes left behind,
   forged numbers), read from the outcomes they write (NASFLOW_HOSTILE_REPORT):
   cases tried / contained and seconds per case (the verdict on that file; the
   first of a `validate` run and each `train` include the CLI's start), and the
   peak resident memory of the `nas` process that judged it; child-side cases
   (attacks on the sandbox) and parent-side ones (artifacts, graphs and reports
   forged for the trusted side: `PARENT_SIDE`) apart.
2. Overhead on a normal model (tests/data/models/cnn_parent.py): wall seconds
   of verification and of training (digits, 2 epochs, 1 seed) for
   - isolated: this tree (bubblewrap + seccomp, trace then train, the parent's
     own compute in its trusted worker),
   - before: the tree at --before (default: the last commit before the trusted
     worker, whose parent ran its checks in-process),
   - unisolated: this tree with NASFLOW_ALLOW_UNISOLATED=1 and no bwrap (the
     same trace-then-train pipeline without namespaces),
   - baseline: the tree at --baseline (default: the last commit before OS
     isolation: audit hook + rlimits, measured and trained in the child).
   Each is the median of --repeats runs in a fresh interpreter. --quick: the
   parent-side cases and one kind's child-side ones, verification only,
   isolated and before.
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
BEFORE = "e141d9c"  # the last commit before the trusted worker (the parent's checks in-process)
# Templates that attack the trusted side (what comes back from the child), by name.
PARENT_SIDE = ("parent_", "forge_cost_", "forge_carried_", "forge_graph_", "forge_buffer_")
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


def overhead(revisions: dict[str, str], repeats: int, quick: bool) -> dict:
    """Seconds per arm (module docstring), each other tree a `git worktree` at its revision
    (this tree's git state untouched); arms alternate per repeat, so a load that drifts meets all."""
    env = {k: v for k, v in os.environ.items() if k not in ("NASFLOW_ALLOW_UNISOLATED", "NASFLOW_BWRAP")}
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="nas-bench-base-") as base:
        trees = {arm: Path(base) / arm for arm in revisions}
        for arm, rev in revisions.items():
            subprocess.run(["git", "worktree", "add", "--detach", str(trees[arm]), rev], cwd=ROOT, check=True,
                           capture_output=True)
        try:
            arms = {"isolated": (ROOT, env), **{arm: (tree, env) for arm, tree in trees.items()}}
            if not quick:
                arms["unisolated"] = (ROOT, {**env, "NASFLOW_ALLOW_UNISOLATED": "1", "NASFLOW_BWRAP": "/nonexistent"})
            for what in ("validate",) if quick else ("validate", "train"):
                runs: dict[str, list[dict]] = {arm: [] for arm in arms}
                for _ in range(repeats):
                    for arm, (tree, e) in arms.items():
                        runs[arm].append(timed(tree, what, e, 1))
                out[what] = {arm: _merged(r) for arm, r in runs.items()}
                iso = out[what]["isolated"]
                for arm in arms:
                    if arm != "isolated" and iso["ok"] and out[what][arm]["ok"]:
                        out[what][f"isolated_over_{arm}"] = round(iso["median_s"] / out[what][arm]["median_s"], 3)
                print(what, json.dumps(out[what]), flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    return out


def _merged(runs: list[dict]) -> dict:
    bad = next((r for r in runs if not r["ok"]), None)
    if bad is not None:
        return bad
    seconds = [s for r in runs for s in r["runs_s"]]
    return {"ok": True, "median_s": round(statistics.median(seconds), 3), "runs_s": seconds}


def hostile(quick: bool) -> dict:
    """Run the hostile suite's tests (the real CLI, all containment checks) and read each
    case's outcome and seconds from the JSON they write."""
    selectors = ["tests/test_hostile.py::test_hostile_models_are_contained",
                 "tests/test_hostile.py::test_hostile_trained_model_is_contained"]
    with tempfile.TemporaryDirectory(prefix="nas-bench-hostile-") as tmp:
        args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selectors]
        if quick:  # the parent-side cases, one kind's validate run and one training case
            args += ["-k", "contained and (cache or forge or parent) and not train or forge_train_result "
                           "or parent_train_other_graph"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NASFLOW_HOSTILE_REPORT": tmp}
        subprocess.run(args, cwd=ROOT, env=env, timeout=7200)
        cases = [case for path in sorted(Path(tmp).glob("*.json")) for case in json.loads(path.read_text())]
    parent = [c for c in cases if c["case"].startswith(PARENT_SIDE)]
    return {"child_side": _summary([c for c in cases if c not in parent]), "parent_side": _summary(parent),
            "cases": cases}


def _summary(cases: list[dict]) -> dict:
    """Contained of tried, seconds per case and the judging `nas` process's peak resident memory."""
    secs = sorted(c["seconds"] for c in cases if c["seconds"] is not None)
    rss = sorted(c["parent_rss_mb"] for c in cases if c.get("parent_rss_mb") is not None)
    return {"tried": len(cases), "contained": sum(c["contained"] for c in cases),
            "median_s": round(statistics.median(secs), 3) if secs else None, "max_s": secs[-1] if secs else None,
            "parent_rss_mb_median": round(statistics.median(rss)) if rss else None,
            "parent_rss_mb_max": rss[-1] if rss else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="parent-side hostile cases and a few more; verification only")
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-hostile", action="store_true", help="the overhead only (keep the last run's hostile part)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "isolation.json")
    args = ap.parse_args()
    from nas.sandbox.isolation import isolation

    revisions = {"before": args.before} if args.quick else {"before": args.before, "baseline": args.baseline}
    kept = json.loads(args.out.read_text()).get("hostile") if args.no_hostile and args.out.exists() else None
    result = {"command": " ".join(sys.argv), "machine": platform.platform(), "cpus": os.cpu_count(),
              "isolation": isolation().describe(), "hostile": kept if args.no_hostile else hostile(args.quick),
              "overhead": overhead(revisions, args.repeats, args.quick)}
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

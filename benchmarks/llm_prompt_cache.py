"""The local LLM server's prompt cache (`llm.local.prompt_cache_mb`): a live CoLLM search on the
NB201 table, whose Navigator and Generator take turns with long, fixed system prompts, run with
the cache off and on (reply cache off, so every call reaches the model). Records per mode the
calls, the LLM seconds, the prompt tokens sent and the prompt tokens llama.cpp actually evaluated
(from the server's log), and whether each mode's searches proposed the same architectures.

Without the cache llama-cpp-python reuses only the prefix it shares with the call just before,
which is the other role's: each call evaluates its whole prompt. With it, a role's previous state
is restored and only what follows its system prompt is evaluated.

    python benchmarks/llm_prompt_cache.py                 # 20 trials, modes off/on twice (~10 min idle)
    python benchmarks/llm_prompt_cache.py --trials 10 --repeats 1 --out /tmp/pc.json   # quick

Run with OMP_NUM_THREADS=1 (one llama.cpp thread, as the CoLLM benchmarks run it); seconds are
wall time on a shared 2-core machine, compared as a ratio between modes run in turn."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from collm_nb201 import COLLM, local_llm, run  # noqa: E402

from nas.io import atomic_write_json, atomic_write_text, read_jsonl  # noqa: E402

MODES = {"off": 0, "on": 1024}
EVALUATED = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")


def one_mode(mode: str, index: int, seed: int, trials: int, work: Path) -> dict[str, Any]:
    """One CoLLM search with the prompt cache `mode`, on a server of its own."""
    from nas.home import home
    from nas.llm.local import log_since, stop_shared

    llm = local_llm(work / "unused-cache")
    llm = {**llm, "cache": False, "local": {**llm["local"], "prompt_cache_mb": MODES[mode]}}
    log = home() / "llm" / "local-server.log"
    offset = log.stat().st_size if log.exists() else 0
    label = f"{mode}{index}"
    print(f"prompt cache {mode}: CoLLM search {index + 1}, {trials} trials ...", flush=True)
    try:
        result = run(label, "collm", {**COLLM, "llm": llm}, seed, trials, work)
    finally:
        stop_shared()
    calls = read_jsonl(work / f"{label}_s{seed}" / "llm" / "transcripts.jsonl")
    evaluated = [(float(ms), int(n)) for ms, n in EVALUATED.findall(log_since(log, offset))]
    history = read_jsonl(work / f"{label}_s{seed}" / "history.jsonl")
    return {"mode": mode, "prompt_cache_mb": MODES[mode], "calls": len(calls),
            "llm_seconds": round(sum(c["latency_s"] for c in calls), 2),
            "prompt_tokens": sum(c["prompt_tokens"] for c in calls),
            "completion_tokens": sum(c["completion_tokens"] for c in calls),
            "evaluated_prompt_tokens": sum(n for _, n in evaluated),
            "prompt_eval_seconds": round(sum(ms for ms, _ in evaluated) / 1000, 2),
            "search_seconds": round(result["seconds"], 2), "best": max(result["curve"]),
            "archs": [r.get("encoding") for r in history]}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {m: [r for r in runs if r["mode"] == m] for m in MODES}

    def per_call(mode: str, key: str) -> float:
        return sum(r[key] for r in by[mode]) / max(1, sum(r["calls"] for r in by[mode]))

    # Reproducibility is per mode: the cache changes how prompts are evaluated, so the modes' replies may differ.
    return {m: {"llm_seconds_per_call": round(per_call(m, "llm_seconds"), 2),
                "prompt_tokens_per_call": round(per_call(m, "prompt_tokens"), 1),
                "evaluated_prompt_tokens_per_call": round(per_call(m, "evaluated_prompt_tokens"), 1),
                "prompt_eval_seconds_per_call": round(per_call(m, "prompt_eval_seconds"), 2),
                "same_architectures": all(r["archs"] == by[m][0]["archs"] for r in by[m])} for m in MODES} | {
        "speedup_llm_seconds_per_call": round(per_call("off", "llm_seconds") / per_call("on", "llm_seconds"), 2),
        "evaluated_tokens_ratio": round(per_call("on", "evaluated_prompt_tokens")
                                        / per_call("off", "evaluated_prompt_tokens"), 3),
    }


def markdown(payload: dict[str, Any]) -> str:
    s = payload["summary"]
    rows = [f"Local LLM prompt cache on a live CoLLM search (NB201 table, seed {payload['seed']}, "
            f"{payload['trials']} trials, {payload['repeats']} run(s) per mode, reply cache off). {payload['cpu']}.", "",
            "| prompt cache | LLM s / call | prompt tokens / call | evaluated / call | prompt eval s / call |",
            "|---|---|---|---|---|"]
    for m in MODES:
        r = s[m]
        rows.append(f"| {m} ({MODES[m]} MB) | {r['llm_seconds_per_call']:.2f} | {r['prompt_tokens_per_call']:.0f} | "
                    f"{r['evaluated_prompt_tokens_per_call']:.0f} | {r['prompt_eval_seconds_per_call']:.2f} |")
    rows += ["", f"LLM seconds per call, off / on: {s['speedup_llm_seconds_per_call']:.2f}x; prompt tokens "
             f"evaluated, on / off: {s['evaluated_tokens_ratio']:.3f}; same architectures proposed in each mode's "
             f"runs: " + ", ".join(f"{m} {s[m]['same_architectures']}" for m in MODES) + ".", ""]
    return "\n".join(rows)


def plot(payload: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = payload["summary"]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, label in ((axes[0], "llm_seconds_per_call", "LLM seconds per call"),
                           (axes[1], "evaluated_prompt_tokens_per_call", "prompt tokens evaluated per call")):
        ax.bar(list(MODES), [s[m][key] for m in MODES], color=["tab:gray", "tab:blue"])
        ax.set(title=label, xlabel="prompt cache")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="runs per mode, taken in turn (off, on, off, on ...)")
    ap.add_argument("--machine", default="nothing else said to be running",
                    help="for the report: how the machine was shared (the seconds depend on it)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "llm_prompt_cache.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="nasflow-prompt-cache-") as tmp:
        os.environ["NASFLOW_HOME"] = str(Path(tmp) / "home")  # its own server log
        runs = [one_mode(mode, i, args.seed, args.trials, Path(tmp)) for i in range(args.repeats) for mode in MODES]
        for r in runs:
            print(f"{r['mode']:>3}: {r['calls']} calls, {r['llm_seconds']:.1f} LLM s, "
                  f"{r['evaluated_prompt_tokens']} of {r['prompt_tokens']} prompt tokens evaluated", flush=True)
    payload = {"benchmark": "local LLM prompt cache (llama.cpp state cache) on a live CoLLM search",
               "trials": args.trials, "seed": args.seed, "repeats": args.repeats,
               "cpu": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, {os.cpu_count()} cores; {args.machine}",
               "runs": [{k: v for k, v in r.items() if k != "archs"} for r in runs], "summary": summary(runs)}
    atomic_write_json(args.out, payload)
    atomic_write_text(args.out.with_suffix(".md"), markdown(payload))
    plot(payload, args.out.with_suffix(".png"))
    print(markdown(payload))
    print(json.dumps(payload["summary"]))


if __name__ == "__main__":
    main()

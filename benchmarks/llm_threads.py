"""llama.cpp threads for the embedded SmolLM2-135M, on the cores as they are and beside busy processes.

A prompt (about 300 tokens) and 16 generated tokens are timed for each split of threads between
generation (`n_threads`) and prompt processing (`n_threads_batch`), taken in turn, at each load
level (that many `while True: pass` processes beside it). Why it matters: llama.cpp's threads meet at
a spinning barrier after every operation; when the cores are shared, one descheduled thread holds the
other spinning, and generation (many tiny operations per token) stalls. The local server's threads
(`llm.local.n_threads_decode`, `llm.local.n_threads`) follow these numbers.

    OMP_NUM_THREADS=1 python benchmarks/llm_threads.py [--loads 0 4] [--repeats 3]

Seconds are wall time on a shared machine: compare the splits within a load level (the medians'
ratios), and read `runnable` (the machine's running processes, /proc/loadavg) beside them."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import llama_cpp  # noqa: E402

from nas.io import atomic_write_json, atomic_write_text  # noqa: E402
from nas.llm.local import model_path  # noqa: E402

SPLITS = [(1, 1), (1, 2), (2, 2)]  # (generation threads, prompt threads)
BUSY = "while True: pass"
GENERATED = 16  # tokens: enough to time generation, few enough that a stalled split ends


def runnable() -> str:
    return Path("/proc/loadavg").read_text().split()[3]


def one_level(load: int, repeats: int) -> dict[str, Any]:
    models = {split: llama_cpp.Llama(model_path=str(model_path()), n_ctx=2048, n_threads=split[0],
                                     n_threads_batch=split[1], verbose=False) for split in SPLITS}
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    times: dict[tuple[int, int], dict[str, list[float]]] = {s: {"prompt_s": [], "generate_s": []} for s in SPLITS}
    seen: list[str] = []
    try:
        for rep in range(repeats):
            for split, model in models.items():
                text = f"Run {rep} {split}. Design a residual block with convolutions. " * 30
                model.reset()
                start = time.perf_counter()
                model(text, max_tokens=1, temperature=0)
                times[split]["prompt_s"].append(round(time.perf_counter() - start, 3))
                start = time.perf_counter()
                model(text + " ok", max_tokens=GENERATED, temperature=0)  # the prompt is cached: mostly generation
                times[split]["generate_s"].append(round(time.perf_counter() - start, 3))
                seen.append(runnable())
                print(f"load {load} split {split} rep {rep}: prompt {times[split]['prompt_s'][-1]} s, "
                      f"{GENERATED} tokens {times[split]['generate_s'][-1]} s (runnable {seen[-1]})", flush=True)
    finally:
        for proc in busy:
            proc.kill()
    rows = {f"gen{g}_prompt{p}": {**t, **{f"median_{k}": round(statistics.median(v), 3) for k, v in t.items()}}
            for (g, p), t in times.items()}
    return {"load_processes": load, "runnable_samples": seen, "splits": rows}


def markdown(payload: dict[str, Any]) -> str:
    lines = ["# llama.cpp threads (SmolLM2-135M)", "", payload["note"], "",
             "| busy processes | generation / prompt threads | prompt s (median) | generation s (median) |",
             "|---:|---|---:|---:|"]
    for level in payload["levels"]:
        for name, row in level["splits"].items():
            lines.append(f"| {level['load_processes']} | {name} | {row['median_prompt_s']} | {row['median_generate_s']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", type=int, nargs="+", default=[0, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--machine", default="nothing else said to be running",
                    help="for the report: how the machine was shared")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "llm_threads.json")
    args = ap.parse_args()
    levels = [one_level(load, args.repeats) for load in args.loads]
    payload = {"benchmark": "llama.cpp generation and prompt threads, SmolLM2-135M Q4_1",
               "cpus": os.cpu_count(), "repeats": args.repeats, "prompt_tokens_about": 300, "generated_tokens": GENERATED, "machine": args.machine,
               "note": ("Splits taken in turn within a load level; seconds are wall time (compare within a level). "
                        "runnable: running processes on the machine when each call ended (/proc/loadavg)."),
               "levels": levels}
    atomic_write_json(args.out, payload)
    atomic_write_text(args.out.with_suffix(".md"), markdown(payload))
    print(markdown(payload))


if __name__ == "__main__":
    main()

"""Where a training step's device time goes: kernel time by kind, from a torch.profiler trace.

Why: packing candidates as CUDA streams stops paying past N = 4, so what is left is
the kernels' own time; before tuning (cuDNN's autotuner, fused BN-ReLU, grouped
convolutions) one needs to know which kernels hold it, whether the GPU sits idle
between them, and how much streams overlap.  `train_throughput.py --gpu-only
--sections profile` uses this on the fast engine's own training loop.

On CUDA the intervals are the trace's kernels, copies and memsets (one lane per
stream); on CPU (a smoke test of the same code) the operators' own time, each
less the operators inside it.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

# first match wins: cuDNN's BN kernels have "cudnn" in their names, so BN comes before convolution
KINDS: tuple[tuple[str, re.Pattern[str]], ...] = tuple((kind, re.compile(pattern)) for kind, pattern in (
    ("optimizer", r"multi_tensor|fused_sgd|foreach|sgd"),
    ("compiled reduction", r"triton_(red|per)_"),
    ("compiled pointwise", r"triton_"),
    ("batchnorm", r"batch_?norm|bn_fw|bn_bw|welford"),
    ("convolution", r"conv|cudnn|xmma|implicit_gemm|cutlass|gemm|dgrad|wgrad|fprop|sm\d\d_"),
    ("copy / index", r"memcpy|memset|copy|index|gather|scatter|cat|fill|pad"),
    ("reduction", r"reduce|sum|nll|softmax|argmax"),
    ("elementwise", r"elementwise|vectorized|unrolled|add|mul|relu|threshold|where"),
))


@dataclass(frozen=True)
class Interval:
    name: str
    start: float  # microseconds
    duration: float
    lane: str  # a stream (CUDA) or a thread (CPU)
    call: bool = True  # False for an operator's later pieces (see operator_self_time)


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pattern in KINDS if pattern.search(low)), "other")


def device_intervals(events: list[dict]) -> list[Interval]:
    """Kernels, copies and memsets of a Chrome trace, one lane per (device, stream)."""
    return [Interval(e["name"], float(e["ts"]), float(e["dur"]), f"{e.get('pid')}/{e.get('tid')}")
            for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]


def operator_self_time(events: list[dict]) -> list[Interval]:
    """CPU operators' own time: each operator's span less the operators inside it on the same
    thread, as the pieces between them (an outer operator's whole span would count its
    children again)."""
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
                 key=lambda e: (str(e.get("tid")), float(e["ts"]), -float(e["dur"])))
    out: list[Interval] = []
    open_: list[tuple[dict, list[tuple[float, float]]]] = []  # enclosing operators, their children's spans

    def close(e: dict, children: list[tuple[float, float]]) -> None:
        at, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        first = True
        for c0, c1 in [*children, (end, end)]:
            if c0 > at:
                out.append(Interval(e["name"], at, c0 - at, str(e.get("tid")), call=first))
                first = False
            at = max(at, c1)

    for e in [*ops, None]:
        while open_ and (e is None or e.get("tid") != open_[-1][0].get("tid")
                         or float(e["ts"]) >= float(open_[-1][0]["ts"]) + float(open_[-1][0]["dur"])):
            close(*open_.pop())
        if e is None:
            break
        if open_:
            open_[-1][1].append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
        open_.append((e, []))
    return out


def union_length(intervals: list[Interval]) -> float:
    """Time covered by at least one interval (the device was busy), in microseconds."""
    busy, end = 0.0, float("-inf")
    for iv in sorted(intervals, key=lambda i: i.start):
        stop = iv.start + iv.duration
        if iv.start >= end:
            busy += iv.duration
        elif stop > end:
            busy += stop - end
        end = max(end, stop)
    return busy


def breakdown(intervals: list[Interval], steps: int, wall_seconds: float, top: int = 12) -> dict:
    """Per training step: time by kind, the busiest kernels, the busy (union) and summed
    time, and how much of the wall time had nothing running."""
    if not intervals:
        return {"measured": False, "reason": "the trace holds no device intervals"}
    per_kind: dict[str, list[float]] = {}
    per_name: dict[str, list[float]] = {}
    for iv in intervals:
        for table, key in ((per_kind, kind_of(iv.name)), (per_name, iv.name)):
            entry = table.setdefault(key, [0.0, 0.0])
            entry[0] += iv.duration
            entry[1] += iv.call
    summed = sum(iv.duration for iv in intervals)
    busy = union_length(intervals)
    span = max(iv.start + iv.duration for iv in intervals) - min(iv.start for iv in intervals)
    ms = 1000.0 * steps

    def rows(table: dict[str, list[float]], limit: int | None) -> list[dict]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1][0])[:limit]
        return [{"name": k[:160], "ms_per_step": round(t / ms, 4), "calls_per_step": round(n / steps, 2),
                 "share": round(t / summed, 4)} for k, (t, n) in ranked]

    calls = sum(iv.call for iv in intervals)
    short = sum(1 for iv in intervals if iv.duration < 5.0)
    return {"measured": True, "steps": steps, "calls_per_step": round(calls / steps, 1),
            "lanes": len({iv.lane for iv in intervals}),
            "summed_ms_per_step": round(summed / ms, 4), "busy_ms_per_step": round(busy / ms, 4),
            "span_ms_per_step": round(span / ms, 4), "wall_ms_per_step": round(1000 * wall_seconds / steps, 4),
            "overlap": round(summed / busy, 3), "idle_share_of_span": round(1 - busy / span, 4) if span else 0.0,
            "mean_call_us": round(summed / calls, 2) if calls else 0.0,
            "share_under_5us": round(short / len(intervals), 4),
            "by_kind": rows(per_kind, None), "top": rows(per_name, top)}


def profile_training(models: list, data, recipe, engine, steps: int) -> dict:
    """Profile `steps` training steps of `models` on the fast engine's own loop
    (`engine.concurrent` = len(models) of them in lockstep), after compilation and graph
    capture; the breakdown's wall time is the loop's, profiler overhead included."""
    from torch.profiler import ProfilerActivity, profile

    from nas.train.fast import _device, _Group

    device = _device(engine.accelerator)
    sub = replace(recipe, epochs=1, train_subset=steps * recipe.batch_size)
    group = _Group(models, data, sub, 0, engine, device, [f"candidate {i + 1}" for i in range(len(models))])
    group.prepare()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        group.train()
        wall = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text()).get("traceEvents", [])
    intervals = device_intervals(events) if cuda else operator_self_time(events)
    out = breakdown(intervals, steps, wall)
    out.update(candidates=len(models), device=str(device),
               source="CUDA kernels, copies and memsets" if cuda else "CPU operators' own time (smoke test)",
               cuda_graphs=[run.graphs for run in group.runs])
    return out

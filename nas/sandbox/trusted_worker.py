"""The trusted worker's own side: the process `nas.sandbox.trusted.TrustedWorker` starts.

It reads one request and one artifact on stdin, limits itself (a data-segment cap, a CPU-time cap
from the counted work, on a GPU the CUDA caching allocator's cap) and runs one job on the graph:
the check (`nas.sandbox.verify.measure`) or the training (`nas.sandbox.verify.train_artifact`),
answering in JSON lines on stdout that the parent checks one by one. Its module imports stay light
(torch loads in `main`, after its priority is lowered), and it runs no code of the model: only the
operators of `nas.sandbox.graph`'s allowed set. Its own bookkeeping before the counted work (unpacking
the artifact, the dry run) runs phase by phase, each on a clock of its own (`_phase`) that the
phase's size sets before it starts: no phase waits on the parent's start-up allowance alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import resource
import signal
import sys
from typing import Any

from nas.sandbox.limits import MB, refused_allocation
from nas.sandbox.trusted import _LENGTH, _status, check_seconds, train_seconds
from nas.sandbox.verify import Verdict, measure, train_artifact
from nas.train.progress import EpochProgress


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker when the `nas` process that started it (pid `parent`) dies
    (PR_SET_PDEATHSIG), and exit now if it died before that: this worker was re-parented. Not
    `getppid() == 1`: in a container `nas` itself is often PID 1 (`docker run` without `--init`)."""

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.buffer.write(json.dumps(msg).encode() + b"\n")
    sys.stdout.buffer.flush()


def _read(n: int) -> bytes:
    data = sys.stdin.buffer.read(n)
    if len(data) != n:
        raise SystemExit(1)  # the parent went away
    return data


def main(memory_mb: int, threads: int, job: str, parent: int) -> None:
    _die_with_parent(parent)
    priority = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, priority + 10)  # its imports yield to the sandbox child it overlaps
    import torch  # lazy: loads torch (start-up time)
    import torch._dynamo  # noqa: F401 - the meta kernels' decompositions call into it

    import nas.sandbox.graph  # noqa: F401 - the loader and its operator tables

    if job == "check":
        import nas.measure  # noqa: F401 - fvcore's counter, which a training does not use

    with contextlib.suppress(OSError):  # back for the check itself, where the kernel lets a process
        os.setpriority(os.PRIO_PROCESS, 0, priority)
    torch.set_num_threads(threads)
    if job == "check":
        _limit(memory_mb)
        request, artifact = _request()
        _check(request, artifact, threads)
    else:  # the data and a GPU's context load before the limits, which are the graph's training's
        request, artifact = _request()
        from nas.data.sources import load_data  # lazy: only a training loads data

        images = load_data(**request.pop("data"))
        if torch.cuda.is_available():
            torch.cuda.init()
            device = torch.cuda.current_device()
            fraction = gpu_fraction(memory_mb, torch.cuda.get_device_properties(device).total_memory)
            torch.cuda.set_per_process_memory_fraction(fraction, device)
        _limit(memory_mb)
        _train(request, artifact, images, threads)


def gpu_fraction(memory_mb: int, device_bytes: int) -> float:
    """The share of a device's `device_bytes` that the CUDA caching allocator may hold for a
    training under `memory_mb`: the budget the dry run checked a training step against (parameters,
    optimiser state, activations; with the fast engine the split it keeps on the device counts too),
    so a graph whose training needs more on a shared GPU is refused (`limit_hit`), not an OOM of
    its other users. A budget over the device's memory caps nothing beyond the device."""
    return min(1.0, memory_mb * MB / device_bytes)


def limit_hit(err: BaseException) -> str | None:
    """Which cap refused the allocation that raised `err` (or an error it wraps, `refused_allocation`:
    torch.compile's failure on an out-of-memory), as the worker tells the parent: "gpu" (the caching
    allocator's cap, `gpu_fraction`: torch's OutOfMemoryError), "memory" (RLIMIT_DATA: a
    MemoryError, or torch's RuntimeError saying so, `out_of_memory`); None for any other error."""
    import torch  # lazy: loaded already by `main`, not by importing this module

    refused = refused_allocation(err)
    if refused is None:
        return None
    return "gpu" if isinstance(refused, torch.OutOfMemoryError) else "memory"


def _limit(memory_mb: int) -> None:
    """Cap the data segment `memory_mb` above what the worker holds now, and tell the parent its
    resident memory (the watch's base)."""
    data = _status("self", "VmData") or 0
    resource.setrlimit(resource.RLIMIT_DATA, (data + memory_mb * MB, data + memory_mb * MB))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _send({"ready": _status("self", "VmRSS") or 0})


def _request() -> tuple[dict[str, Any], bytes]:
    request = json.loads(sys.stdin.buffer.readline())
    return request, _read(_LENGTH.unpack(_read(_LENGTH.size))[0])


def _cpu_limit(seconds: float, threads: int) -> None:
    """RLIMIT_CPU at what was used plus `seconds` on every thread: SIGXCPU, then SIGKILL."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(used.ru_utime + used.ru_stime + seconds * threads)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))


class _OutOfTime(BaseException):
    """The worker's phase ran past its clock (`_phase`): not an `Exception`, so no handler of the
    check's own (a graph that does not run) takes it for the graph's failure."""


_CLOCK: dict[str, Any] = {"what": None, "seconds": 0.0}


def _out_of_time(signum: int, frame: Any) -> None:
    raise _OutOfTime


def _phase(what: str | None, seconds: float, threads: int) -> None:
    """Start the clock of the worker's phase `what` (say, "its dry run (1,234 nodes and operands)"):
    a wall-clock alarm and a CPU-time soft limit on every thread, `seconds` from now, past either of
    which the phase ends in `_OutOfTime` (RLIMIT_CPU signals even inside an operator; the hard limit
    and the parent's wall clock stay behind it). `what` None stops both, for the counted work, whose
    clocks are `_cpu_limit`'s and the parent's."""
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if what is None:  # ignored first, so no signal of the clock being stopped can end the phase
        for sig in (signal.SIGALRM, signal.SIGXCPU):
            signal.signal(sig, signal.SIG_IGN)
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
        for sig in (signal.SIGALRM, signal.SIGXCPU):
            signal.signal(sig, signal.SIG_DFL)
        return
    _CLOCK.update(what=what, seconds=seconds)
    for sig in (signal.SIGALRM, signal.SIGXCPU):
        signal.signal(sig, _out_of_time)
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(used.ru_utime + used.ru_stime + seconds * threads)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu if hard == resource.RLIM_INFINITY else min(cpu, hard), hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _late(job: str) -> dict[str, Any]:
    """The failed verdict of a phase past its clock, as one line."""
    return Verdict(ok=False, stage="limits", error=(
        f"limits: refused: the parent's {job} of the graph exceeded its clock for {_CLOCK['what']} "
        f"({_CLOCK['seconds']:.0f} s)")).to_dict()


def _check(request: dict[str, Any], artifact: bytes, threads: int) -> None:
    def on_work(units: int) -> None:
        _phase(None, 0.0, threads)
        _cpu_limit(check_seconds(units, request["input_shape"][0]), threads)
        _send({"work": units})

    try:
        verdict = measure(artifact, on_work=on_work, on_phase=lambda what, s: _phase(what, s, threads), **request)
        _phase(None, 0.0, threads)  # a refusal before the work: its clock stopped
    except MemoryError:
        _phase(None, 0.0, threads)
        _send({"limit": "memory"})
        return
    except _OutOfTime:
        _phase(None, 0.0, threads)
        verdict = _late("check")
    _send({"verdict": verdict})


def _train(request: dict[str, Any], artifact: bytes, images: Any, threads: int) -> None:
    def on_work(units: int, count: int, epochs: int) -> None:
        _phase(None, 0.0, threads)
        _cpu_limit(train_seconds(units, count, epochs), threads)
        _send({"work": units, "images": count, "epochs": epochs})

    def on_epoch(progress: EpochProgress) -> None:
        _send({"epoch": dataclasses.asdict(progress)})

    def on_proxies(scores: dict[str, float] | str) -> None:
        _send({"proxies": scores} if isinstance(scores, dict) else {"no_proxies": scores})

    try:
        result = train_artifact(artifact, images, on_work=on_work, on_epoch=on_epoch, on_proxies=on_proxies,
                                on_phase=lambda what, s: _phase(what, s, threads), **request)
        _phase(None, 0.0, threads)  # a refusal before the work: its clock stopped
    except _OutOfTime:
        _phase(None, 0.0, threads)
        result = {"verdict": _late("training")}
    except Exception as err:  # noqa: BLE001 - a cap that refused an allocation is the limit, in one line
        if (kind := limit_hit(err)) is None:
            raise
        _send({"limit": kind})
        return
    _send(result)


def arguments(argv: list[str]) -> tuple[int, int, str, int]:
    """`main`'s arguments from the command line `TrustedWorker` starts this worker with
    (`sys.argv`: memory in MB, threads, job, the parent's pid)."""
    return int(argv[1]), int(argv[2]), argv[3], int(argv[4])


if __name__ == "__main__":
    main(*arguments(sys.argv))

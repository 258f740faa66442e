"""The trusted worker: the parent's own real compute on a child's graph runs here, never in `nas`.

Everything a child's graph costs that is not decided on shapes (fvcore's trace at batch 1, a real
forward and backward) runs in this separate process, so a graph that the cost model underrates
(`WorkCounter`) costs one refused trial, not the host. Its limits work on a GPU too (an
address-space cap would not: CUDA reserves tens of GB of virtual memory): a data-segment cap
(RLIMIT_DATA) and the parent's watch on its resident memory (`VmRSS`), both `memory_mb` above
what it holds once imported; a CPU-time cap (RLIMIT_CPU) and a wall clock, both from the dry
run's counted work (`check_seconds`). Started as a verification starts, its imports overlap the
sandbox child's run (an honest model's check costs what it cost in-process). Runs no code of
the model: only the operators of `nas.sandbox.graph`'s allowed set.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import math
import os
import resource
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from nas.sandbox.isolation import package_root
from nas.sandbox.limits import MB
from nas.sandbox.verify import measure, train_artifact
from nas.train.progress import EpochProgress, OnEpoch

# What the real runs of the check cost per unit of counted work, and their floor (fvcore's trace
# alone takes seconds): `benchmarks/op_costs.py` times the median operator at ~2e-10 s per unit and
# every one within 10x of it; this leaves 10x more for a loaded machine.
SECONDS_PER_UNIT = 2e-8
BASE_SECONDS = 30.0
# A training epoch's cost besides its counted work (Lightning's loop, the validation pass), and each
# image's (loading, augmenting): ~10x what a loaded CPU takes for them.
EPOCH_SECONDS = 30.0
IMAGE_SECONDS = 1e-4
# Import, unpack (and for a training, the data's loading) and the dry run, before the worker knows the
# work: bounded by MAX_WORK on meta tensors.
STARTUP_SECONDS = 180.0
_POLL_S = 0.05  # how often the worker's resident memory is read
_MAX_LINE = 1 << 20  # bytes of one message from the worker (a verdict, a result, an epoch's progress)
_LENGTH = struct.Struct("<Q")


def train_seconds(units: int, images: int, epochs: int) -> float:
    """Wall seconds for a training of `epochs` epochs in all (over every seed) passing `images`
    images (training, validation and test) through a graph of `units` of counted work per
    image, each at a forward and a backward's cost, plus each epoch's fixed and per-image costs."""
    return BASE_SECONDS + epochs * EPOCH_SECONDS + images * (IMAGE_SECONDS + 3 * units * SECONDS_PER_UNIT)


def check_seconds(units: int, batch: int) -> float:
    """Wall seconds for the real runs on `units` of counted work per image: fvcore's trace at
    batch 1, then a forward and a backward (about twice a forward) at `batch`."""
    return BASE_SECONDS + units * (1 + 3 * batch) * SECONDS_PER_UNIT


@dataclass
class Refusal:
    """Why the parent's check stopped, as one line: the limit it hit (`stage` limits), or the
    worker ended without a verdict (crash)."""

    line: str
    stage: str = "limits"


class TrustedWorker:
    """One worker process for one check, or with `training` for one training of the graph checked
    (with the GPU when `gpu`); `close` (or leaving the `with`) kills it."""

    def __init__(self, memory_mb: int, threads: int, *, training: bool = False, gpu: bool = False) -> None:
        self.memory_mb, self.job = memory_mb, "training" if training else "check"
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": os.environ.get("TMPDIR", "/tmp")}
        if training:  # loads the data: where the data config's files are may depend on the environment
            env = dict(os.environ)
        env.update({"PYTHONPATH": package_root(), "PYTHONDONTWRITEBYTECODE": "1",
                    **{k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}})
        if not gpu:
            env["CUDA_VISIBLE_DEVICES"] = ""
        self.proc = subprocess.Popen([sys.executable, "-s", "-m", "nas.sandbox.trusted", str(memory_mb), str(threads),
                                      self.job], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=env["HOME"] if training else "/")

    def __enter__(self) -> "TrustedWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]  # both PIPE

    def check(self, artifact: bytes, request: dict[str, Any]) -> dict[str, Any] | Refusal:
        """Send the artifact and `request` (`measure`'s arguments); the verdict's dict, or the limit hit."""
        result = self._talk(artifact, request, lambda msg: check_seconds(msg["work"], request["input_shape"][0]))
        return result if isinstance(result, Refusal) else result["verdict"]

    def train(self, artifact: bytes, request: dict[str, Any], on_epoch: OnEpoch | None) -> dict[str, Any] | Refusal:
        """Send the artifact and `request` (`train_artifact`'s arguments and the data config), relaying
        each epoch's progress to `on_epoch`; `train_artifact`'s result, or the limit hit."""
        return self._talk(artifact, request, lambda msg: train_seconds(msg["work"], msg["images"], msg["epochs"]),
                          on_epoch)

    def _talk(self, artifact: bytes, request: dict[str, Any], seconds_for: Callable[[dict[str, Any]], float],
              on_epoch: OnEpoch | None = None) -> dict[str, Any] | Refusal:
        """Feed the worker; watch its memory and clocks while it works; its final message, or the limit hit."""
        data = json.dumps(request).encode() + b"\n" + _LENGTH.pack(len(artifact)) + artifact
        threading.Thread(target=_feed, args=(self.proc.stdin, data), daemon=True).start()
        assert self.proc.stdout is not None  # stdout=PIPE
        fd, buffer, base_rss = self.proc.stdout.fileno(), b"", None
        deadline = time.monotonic() + STARTUP_SECONDS
        what = "its start and dry run"
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return self._refused(f"exceeded its wall clock ({what})")
                if base_rss is not None and (rss := _rss(self.proc.pid)) is not None and (
                        rss - base_rss > self.memory_mb * MB):
                    return self._refused(f"exceeded its memory limit ({self.memory_mb} MB)")
                if not sel.select(min(left, _POLL_S)):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return self._ended()
                if len(buffer) + len(chunk) > _MAX_LINE:
                    return self._malformed()
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        return self._malformed()
                    if not isinstance(msg, dict):
                        return self._malformed()
                    if "ready" in msg:
                        base_rss = msg["ready"]
                    elif "work" in msg:
                        seconds = seconds_for(msg)
                        deadline, what = time.monotonic() + seconds, f"{seconds:.0f} s for its counted work"
                    elif "limit" in msg:
                        return self._refused(f"exceeded its memory limit ({self.memory_mb} MB)")
                    elif "epoch" in msg:
                        if (progress := _progress(msg["epoch"])) is None:
                            return self._malformed()
                        if on_epoch is not None:
                            on_epoch(progress)
                    else:
                        return msg

    def _ended(self) -> Refusal:
        rc = self.proc.wait()
        if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # RLIMIT_CPU's soft, then hard limit
            return self._refused("exceeded its CPU-time limit (the counted work's)")
        self.close()
        result = "verdict" if self.job == "check" else "result"
        return Refusal(f"the parent's {self.job} of the graph ended without a {result} (exit status {rc})", "crash")

    def _malformed(self) -> Refusal:
        self.close()
        return Refusal(f"the parent's {self.job} of the graph sent a malformed message (over {_MAX_LINE} bytes "
                       "a line, not JSON, or an unknown progress field)", "crash")

    def _refused(self, why: str) -> Refusal:
        self.close()
        return Refusal(f"refused: the parent's {self.job} of the graph {why}")


def _progress(data: object) -> EpochProgress | None:
    """An epoch's progress from the worker's message, its known fields only, each checked; else None."""
    fields = {"label": str, "epoch": int, "epochs": int, "loss": float, "elapsed": float, "terminated": str}
    if not isinstance(data, dict) or set(data) != set(fields):
        return None
    for key, kind in fields.items():
        value = data[key]
        if kind is float and type(value) is int:
            value = data[key] = float(value)
        if not (type(value) is kind or (key == "terminated" and value is None)) or (
                isinstance(value, str) and len(value) > 1000):
            return None
    return EpochProgress(**data)


def _feed(pipe: Any, data: bytes) -> None:
    """Write the request in a thread: a worker that died or stopped reading must not block the caller."""
    with contextlib.suppress(BrokenPipeError, OSError, ValueError), pipe:
        pipe.write(data)


def _rss(pid: int) -> int | None:
    return _status(pid, "VmRSS")


def _status(pid: int | str, field: str) -> int | None:
    """A `/proc/<pid>/status` size field in bytes; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


# --- the worker's side -------------------------------------------------------------

def _die_with_parent() -> None:
    """SIGKILL this worker when the `nas` process that started it dies (PR_SET_PDEATHSIG)."""

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        os._exit(1)


def _send(msg: dict[str, Any]) -> None:
    sys.stdout.buffer.write(json.dumps(msg).encode() + b"\n")
    sys.stdout.buffer.flush()


def _read(n: int) -> bytes:
    data = sys.stdin.buffer.read(n)
    if len(data) != n:
        raise SystemExit(1)  # the parent went away
    return data


def main(memory_mb: int, threads: int, job: str) -> None:
    _die_with_parent()
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
        _limit(memory_mb)
        _train(request, artifact, images, threads)


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


def _check(request: dict[str, Any], artifact: bytes, threads: int) -> None:
    def on_work(units: int) -> None:
        _cpu_limit(check_seconds(units, request["input_shape"][0]), threads)
        _send({"work": units})

    try:
        verdict = measure(artifact, on_work=on_work, **request)
    except MemoryError:
        _send({"limit": "memory"})
        return
    _send({"verdict": verdict})


def _train(request: dict[str, Any], artifact: bytes, images: Any, threads: int) -> None:
    def on_work(units: int, count: int, epochs: int) -> None:
        _cpu_limit(train_seconds(units, count, epochs), threads)
        _send({"work": units, "images": count, "epochs": epochs})

    def on_epoch(progress: EpochProgress) -> None:
        _send({"epoch": dataclasses.asdict(progress)})

    try:
        result = train_artifact(artifact, images, on_work=on_work, on_epoch=on_epoch, **request)
    except MemoryError:
        _send({"limit": "memory"})
        return
    _send(result)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

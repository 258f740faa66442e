"""The trusted worker: the parent's own real compute on a child's graph runs there, never in `nas`.

Everything a child's graph costs that is not decided on shapes (fvcore's trace at batch 1, a real
forward and backward, the zero-cost proxies of a training's fresh network, the training) runs in
a separate process (`nas.sandbox.trusted_worker`), so a graph that the cost model underrates
(`WorkCounter`) costs one refused trial, not the host. This module is the parent's side: it starts
the worker, feeds it, reads every message it sends by the sandbox's protocol (`nas.sandbox.protocol`)
and enforces its limits. They work on a GPU too
(an address-space cap would not: CUDA reserves tens of GB of virtual memory): a data-segment cap
(RLIMIT_DATA) and the parent's watch on its resident memory (`VmRSS`), both `memory_mb` above
what it holds once imported, and on a GPU the CUDA caching allocator's cap at `memory_mb`; a
CPU-time cap (RLIMIT_CPU) and a wall clock, both from the dry run's counted work
(`check_seconds`). Started as a verification starts, its imports overlap the sandbox child's run
(an honest model's check costs what it cost in-process). Runs no code of the model: only the
operators of `nas.sandbox.graph`'s allowed set.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from nas.sandbox.isolation import package_root
from nas.sandbox.limits import MB
from nas.sandbox.protocol import CHECK_WORKER, MAX_LINE, TRAINING_WORKER, ProtocolError
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
_LENGTH = struct.Struct("<Q")

# Who hears the zero-cost proxies' scores of a training's fresh network (the names asked for, each a
# finite float), or the one line saying why a proxy could not run on the graph.
OnProxies = Callable[[dict[str, float] | str], None]


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


def worker_env(threads: int, *, training: bool = False, gpu: bool = False) -> dict[str, str]:
    """The worker's environment: a check's is its own (no key or setting of this process reaches it);
    a training's is this one's (where the data config's files are may depend on it); no GPU unless
    asked for; `threads` for every math library."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": os.environ.get("TMPDIR", "/tmp")}
    if training:
        env = dict(os.environ)
    env.update({"PYTHONPATH": package_root(), "PYTHONDONTWRITEBYTECODE": "1",
                **{k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}})
    if not gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


class TrustedWorker:
    """One worker process for one check, or with `training` for one training of the graph checked
    (with the GPU when `gpu`); `close` (or leaving the `with`) kills it."""

    def __init__(self, memory_mb: int, threads: int, *, training: bool = False, gpu: bool = False) -> None:
        self.memory_mb, self.job = memory_mb, "training" if training else "check"
        env = worker_env(threads, training=training, gpu=gpu)
        self.proc = subprocess.Popen([sys.executable, "-s", "-m", "nas.sandbox.trusted_worker", str(memory_mb),
                                      str(threads), self.job, str(os.getpid())],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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

    def train(self, artifact: bytes, request: dict[str, Any], on_epoch: OnEpoch | None,
              on_proxies: OnProxies | None = None) -> dict[str, Any] | Refusal:
        """Send the artifact and `request` (`train_artifact`'s arguments and the data config), relaying
        each epoch's progress to `on_epoch` and the proxy scores it asks for (`request["proxies"]`) to
        `on_proxies`; `train_artifact`'s result, or the limit hit."""
        names = (request.get("proxies") or {}).get("names", ())
        return self._talk(artifact, request, lambda msg: train_seconds(msg["work"], msg["images"], msg["epochs"]),
                          on_epoch, on_proxies, names)

    def _talk(self, artifact: bytes, request: dict[str, Any], seconds_for: Callable[[dict[str, Any]], float],
              on_epoch: OnEpoch | None = None, on_proxies: OnProxies | None = None,
              names: Collection[str] = ()) -> dict[str, Any] | Refusal:
        """Feed the worker; watch its memory and clocks while it works; its final message, or the limit
        hit. Each line is read by the protocol (`protocol.CHECK_WORKER`, `TRAINING_WORKER`); when
        a message may come is said here: its resident memory first and once, its work counts once
        (a second would move the wall clock), the proxies `names` once at most, before the result."""
        data = json.dumps(request).encode() + b"\n" + _LENGTH.pack(len(artifact)) + artifact
        threading.Thread(target=_feed, args=(self.proc.stdin, data), daemon=True).start()
        assert self.proc.stdout is not None  # stdout=PIPE
        fd, buffer, base_rss, scored, worked = self.proc.stdout.fileno(), b"", None, False, False
        channel = CHECK_WORKER if self.job == "check" else TRAINING_WORKER
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
                *lines, buffer = (buffer + chunk).split(b"\n")
                if len(buffer) > MAX_LINE:
                    return self._malformed(f"a line of over {MAX_LINE:,} bytes")
                for line in lines:
                    try:
                        kind, msg = channel.parse(line)
                    except ProtocolError as err:
                        return self._malformed(str(err))
                    if base_rss is None:  # its first message, and only that one, says its base
                        if kind != "ready":
                            return self._malformed(f"a first message other than its resident memory ({kind})")
                        base_rss = msg["ready"]
                    elif kind == "ready":
                        return self._malformed("its resident memory a second time")
                    elif kind == "work":
                        if worked:
                            return self._malformed("a second set of work counts")
                        worked, seconds = True, seconds_for(msg)
                        deadline, what = time.monotonic() + seconds, f"{seconds:.0f} s for its counted work"
                    elif kind == "limit":
                        return self._refused(exceeded(msg["limit"], self.memory_mb))
                    elif kind == "epoch":
                        if on_epoch is not None:
                            on_epoch(EpochProgress(**msg["epoch"]))
                    elif kind in ("proxies", "no_proxies"):
                        if scored or (scores := proxy_scores(msg, names)) is None:
                            return self._malformed("proxy scores not asked for, or asked for again")
                        scored = True
                        if on_proxies is not None:
                            on_proxies(scores)
                    else:  # its result (verdict, error, failed, trained): the channel's every other message, the last
                        return msg

    def _ended(self) -> Refusal:
        rc = self.proc.wait()
        if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # RLIMIT_CPU's soft, then hard limit
            return self._refused("exceeded its CPU-time limit (the counted work's)")
        self.close()
        result = "verdict" if self.job == "check" else "result"
        return Refusal(f"the parent's {self.job} of the graph ended without a {result} (exit status {rc})", "crash")

    def _malformed(self, why: str) -> Refusal:
        """`why`: the protocol's line (escaped), or which message came out of its turn."""
        self.close()
        return Refusal(f"the parent's {self.job} of the graph sent a malformed message ({why})", "crash")

    def _refused(self, why: str) -> Refusal:
        self.close()
        return Refusal(f"refused: the parent's {self.job} of the graph {why}")


def exceeded(kind: str, memory_mb: int) -> str:
    """What a refusal says of the worker's `{"limit": kind}` (`trusted_worker.limit_hit`, one of
    `protocol.LIMITS`): the cap that refused an allocation, host memory ("memory") or the GPU's
    ("gpu"), both at `memory_mb`."""
    return f"exceeded its {'GPU memory' if kind == 'gpu' else 'memory'} limit ({memory_mb} MB)"


def proxy_scores(msg: dict[str, Any], names: Collection[str]) -> dict[str, float] | str | None:
    """The scores of a proxy message the protocol read (`{"proxies": finite floats by name}`), in the
    order of `names`, when they are exactly the `names` asked for; or its `{"no_proxies": why}`, one
    escaped line. None when nothing was asked for, or a name is missing or not asked for."""
    if not names:
        return None
    if "no_proxies" in msg:
        return msg["no_proxies"]
    scores = msg["proxies"]
    return {name: scores[name] for name in names} if set(scores) == set(names) else None


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

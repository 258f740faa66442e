"""Local worker pool: one process per evaluation slot (`nas/search/slots.py`), each seeing
only its slot's GPU, for runner=local with `workers` or `budget.in_flight` > 1.

Workers are fresh interpreters (`python -m nas.pool`, never forked: the parent may hold
CUDA or locks, and its `__main__` may be pytest or Hydra), started with the slot's
environment, and build the evaluator themselves from the search spec, so nothing
unpicklable crosses. A worker's end of its socket closes when it dies, however it dies. A worker that
dies mid-evaluation (kill -9, out of memory) is replaced and its candidate re-run on the
fresh one; after `max_attempts` deaths the candidate becomes a failed trial saying why."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from nas.core.trial import Candidate, EvalResult
from nas.errors import ConfigError, EvaluationError
from nas.search.slots import Slot, assign_slots, visible_gpus

log = logging.getLogger(__name__)

START_TIMEOUT = 300.0  # seconds for a worker to import and build its evaluator


@dataclass
class _Worker:
    slot: Slot
    process: subprocess.Popen
    conn: Connection
    ticket: int | None = None  # the evaluation it is running
    started: float = 0.0


@dataclass
class PoolStats:
    """Worker deaths (what the fault-tolerance tests read)."""

    deaths: int = 0


class WorkerPool:
    """An `AsyncExecutor` (and a batch `Executor`) over local worker processes."""

    def __init__(self, spec_dict: dict[str, Any], slots: list[Slot], *, max_attempts: int = 3) -> None:
        if not slots:
            raise ConfigError("runner.workers: a worker pool needs at least one slot")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"runner.max_attempts: expected a positive integer, got {max_attempts!r}")
        self.spec_dict = spec_dict
        self.max_attempts = max_attempts
        self.stats = PoolStats()
        self._queue: deque[tuple[int, Candidate]] = deque()
        self._running: dict[int, Candidate] = {}
        self._deaths: dict[int, int] = {}
        self._done: deque[tuple[int, tuple[EvalResult, bool, float]]] = deque()
        self._workers = [self._spawn(slot) for slot in slots]
        for worker in self._workers:
            self._await_ready(worker)

    @classmethod
    def from_settings(cls, spec_dict: dict[str, Any], settings: dict[str, Any], in_flight: int) -> WorkerPool:
        """From the `runner` group (local.yaml): `workers` (null: one per GPU slot, or
        `budget.in_flight` on CPU), `per_gpu`, `max_attempts`."""
        workers = settings.get("workers")
        gpus = visible_gpus()
        slots = assign_slots(gpus, per_gpu=settings.get("per_gpu", 1),
                             workers=workers if workers is not None or gpus else in_flight)
        return cls(spec_dict, slots, max_attempts=settings.get("max_attempts", 3))

    # --- AsyncExecutor -------------------------------------------------------
    def submit(self, ticket: int, candidate: Candidate) -> None:
        self._queue.append((ticket, candidate))
        self._dispatch()

    def next_done(self) -> tuple[int, tuple[EvalResult, bool, float]]:
        while not self._done:
            if not self._running:
                raise RuntimeError("next_done() with nothing submitted")
            busy = [w for w in self._workers if w.ticket is not None]
            ready = wait([w.conn for w in busy])
            for worker in busy:
                if worker.conn in ready:
                    try:
                        self._finish(worker, *worker.conn.recv())
                    except (EOFError, OSError):  # its end closed: the process is gone
                        self._died(worker)
            self._dispatch()
        return self._done.popleft()

    def close(self, grace: float = 5.0) -> None:
        """Stop the workers: each finishes its evaluation within `grace` seconds or is killed."""
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + grace
        for worker in self._workers:
            try:
                worker.process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # still evaluating: abandoned (resume re-queues it)
                worker.process.kill()
                worker.process.wait()
            worker.conn.close()
        self._workers = []

    # --- batch Executor --------------------------------------------------------
    def evaluate(self, candidates: list[Candidate]) -> list[tuple[EvalResult, bool, float]]:
        """A whole batch at once on the pool, results in the batch's order."""
        for i, cand in enumerate(candidates):
            self.submit(i, cand)
        outcomes = dict(self.next_done() for _ in candidates)
        return [outcomes[i] for i in range(len(candidates))]

    @property
    def pids(self) -> dict[int, int]:
        """Ticket → pid of the worker evaluating it (for tests that kill one)."""
        return {w.ticket: w.process.pid for w in self._workers if w.ticket is not None}

    # --- internals -------------------------------------------------------------
    def _spawn(self, slot: Slot) -> _Worker:
        parent, child = socket.socketpair()
        process = subprocess.Popen([sys.executable, "-m", "nas.pool", str(child.fileno())],
                                   env={**os.environ, **slot.env()}, pass_fds=[child.fileno()])
        child.close()
        conn = Connection(parent.detach())
        conn.send(self.spec_dict)
        return _Worker(slot, process, conn)

    def _await_ready(self, worker: _Worker) -> None:
        if not worker.conn.poll(START_TIMEOUT):
            raise EvaluationError(f"worker {worker.slot.index} did not start within {START_TIMEOUT:.0f}s")
        try:
            message = worker.conn.recv()
        except EOFError:
            raise EvaluationError(f"worker {worker.slot.index} exited while starting "
                                  f"(exit code {worker.process.wait()})") from None
        if message != "ready":
            raise EvaluationError(f"worker {worker.slot.index} could not build the evaluator: {message}")

    def _dispatch(self) -> None:
        for worker in self._workers:
            if not self._queue:
                return
            if worker.ticket is None:
                ticket, cand = self._queue.popleft()
                worker.ticket, worker.started = ticket, time.perf_counter()
                self._running[ticket] = cand
                try:
                    worker.conn.send((ticket, cand.arch.encode()))
                except OSError:
                    pass  # it has died: next_done sees its sentinel and re-runs the candidate

    def _finish(self, worker: _Worker, ticket: int, result: dict[str, Any], wall: float) -> None:
        worker.ticket = None
        del self._running[ticket]
        self._done.append((ticket, (EvalResult.from_dict(result), False, wall)))

    def _died(self, worker: _Worker) -> None:
        """Replace the worker; re-run its candidate, or fail it after `max_attempts` deaths."""
        ticket = worker.ticket
        assert ticket is not None
        code = worker.process.wait()
        worker.conn.close()
        self.stats.deaths += 1
        deaths = self._deaths[ticket] = self._deaths.get(ticket, 0) + 1
        cand = self._running.pop(ticket)
        log.warning("worker %d (pid %s) died with exit code %s evaluating %s (death %d of %d)",
                    worker.slot.index, worker.process.pid, code, cand.arch.key(), deaths, self.max_attempts)
        fresh = self._spawn(worker.slot)
        self._await_ready(fresh)
        self._workers[self._workers.index(worker)] = fresh
        if deaths >= self.max_attempts:
            reason = f"worker process died {deaths} times evaluating it (last exit code {code})"
            self._done.append((ticket, (EvalResult.failure(reason), False, time.perf_counter() - worker.started)))
        else:
            self._queue.appendleft((ticket, cand))


def _serve(conn: Connection) -> None:
    """A worker (its environment already the slot's): build the evaluator from the spec it
    is sent, then evaluate encodings until told to stop (None)."""
    spec_dict = conn.recv()
    try:
        from nas.search.spec import SearchSpec  # lazy: loads numpy (start-up time)

        spec = SearchSpec.from_dict(spec_dict)
        space = spec.build_space()
        evaluator = spec.build_evaluator(space)
        evaluator.prepare(False)  # while the pool's start shows its status line
        seed = spec.seed if evaluator.uses_seed else None
    except Exception as err:  # told to the parent, which stops with it
        conn.send(f"{type(err).__name__}: {err}")
        return
    from nas.evaluators.base import evaluate_safely  # lazy: loads numpy (start-up time)

    conn.send("ready")
    while (task := _receive(conn)) is not None:
        ticket, encoding = task
        start = time.perf_counter()
        try:
            result = evaluate_safely(evaluator, space.decode(encoding), seed)
        except Exception as err:  # a crash of one candidate must not end the worker
            result = EvalResult.failure(f"evaluator crashed: {type(err).__name__}: {err}")
        try:
            conn.send((ticket, result.to_dict(), time.perf_counter() - start))
        except OSError:  # the pool is gone (its process killed): nobody to answer
            return



def _receive(conn: Connection) -> Any:
    """The next task; None (stop) also when the pool's end closed (its process died)."""
    try:
        return conn.recv()
    except EOFError:
        return None


if __name__ == "__main__":
    # A terminal's Ctrl-C reaches the whole process group: the pool's process handles it (and
    # stops this one); here it was a KeyboardInterrupt traceback per worker.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _serve(Connection(int(sys.argv[1])))

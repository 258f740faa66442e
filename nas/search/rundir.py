"""The files of one search: history.jsonl (append-only), state.json (resume
point, atomically replaced after each batch), summary.json and the report.

One writer per run dir: a search holds an OS lock on `.lock` (which names its
pid) from before it reads anything until it ends; the kernel drops it when
the process dies, so a crash never leaves a stale lock. A second search on
the same dir stops at once and changes nothing.

Asynchronous searches (`budget.in_flight`) append one line per finished evaluation and
save, with the state, the candidates still being evaluated: resume evaluates those again.

Crash safety: state.json is written (history_lines=0) before the first history
line, and each batch's lines are appended before the state is replaced. So
history without state is never left by a crash (it is an error), and on resume
only the lines of the one batch after the state's `history_lines` can be
extra: the strategy never saw them, so they are cut and that batch is asked
again (identically, since the RNG state is restored; evaluation then hits
the task cache). More extra lines than one batch is an error, as is any
malformed line.

A lost machine (power, kernel) keeps what was fsynced: the first state, then history and state
together at most SYNC_EVERY_S apart and when the search ends, each fsynced state only after the
lines it counts. Saves in between are not fsynced (a table search's trial takes a millisecond,
an fsync several): a lost machine may take back up to that last second of trials, and on a file
system that does not keep a rename after the data written before it (ext4's default does), the
state may then count lines it lost, which resume refuses in one line.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nas.core.arch import stable_hash
from nas.core.dotted import flatten, result_neutral
from nas.core.trial import TrialRecord, record_at
from nas.errors import RunDirError
from nas.io import append_jsonl, atomic_write_json, fsync_together, read_json, read_jsonl, rewrite_jsonl

STATE_VERSION = 1
SYNC_EVERY_S = 1.0  # the most trial time between two fsynced states (what a lost machine can take back)
LOCK_NAME = ".lock"
UNSTARTED = {LOCK_NAME, ".hydra"}  # all a run dir holds before its search writes anything
NEW_DIR = "use a new hydra.run.dir"

# The descriptors of the locks this process holds, only for `_close_in_forked_child`
# (no close-on-fork flag exists); who holds a run dir is the `RunDir` that locked it.
_lock_fds: set[int] = set()


@dataclass
class Resume:
    history: list[TrialRecord]
    strategy_state: dict[str, Any]
    elapsed_seconds: float
    in_flight: list[dict[str, Any]]  # asynchronous searches: asked, not yet told ({ask, encoding, info})
    asked: int  # asynchronous searches: the next ask index
    changed: list[str]  # 'key: old -> new' of settings that change no result (dataset path, limits, timeouts)


class RunDir:
    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.clock = clock
        self._synced_at = -math.inf  # when a state was last fsynced (`clock`'s time)
        self._unsynced = False  # history lines or a state written since, without their fsync
        self.history_path = self.path / "history.jsonl"
        self.state_path = self.path / "state.json"
        self.summary_path = self.path / "summary.json"
        self.lock_path = self.path / LOCK_NAME
        self._fd: int | None = None  # the lock's descriptor while `lock()` holds it

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Be the only writer of this dir for the block. Taken once per search, by whoever opens it
        (the CLI, a deployment's run, `execute`, the loop when called alone): a second lock, from
        another process or this one, is refused."""
        fd = self._acquire()
        self._fd = fd
        _lock_fds.add(fd)
        try:
            yield
        finally:
            _lock_fds.discard(fd)
            self._fd = None
            os.ftruncate(fd, 0)  # the file stays (unlinking it would race a waiter)
            os.close(fd)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now (what reading or writing the dir for a search needs)."""
        return self._fd is not None

    def _acquire(self) -> int:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            here = ", this process" if pid == str(os.getpid()) else ""
            raise RunDirError(f"{self.path} is in use by another search (pid {pid}{here}); "
                              f"wait for it or {NEW_DIR}") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def discard_unstarted(self) -> None:
        """Remove this dir when it holds only `.lock` and `.hydra/` (what a start writes before
        the search): a start that failed leaves no empty run dir behind. Call holding `lock()`;
        the final rmdir keeps the dir if another process added a file meanwhile."""
        with suppress(OSError):
            if not {p.name for p in self.path.iterdir()} <= UNSTARTED:
                return
            shutil.rmtree(self.path / ".hydra", ignore_errors=True)
            self.lock_path.unlink(missing_ok=True)  # the fd held stays valid; a new lock() makes a new file
            self.path.rmdir()

    def prepare(self, fields: dict[str, Any], batch_lines: int) -> Resume | None:
        """Create the directory, or return what a previous run left to resume
        (checked line by line). Call it holding `lock()`. `fields`: what fixes the search's
        trajectory; their hash is its identity, and they name what differs when the dir holds another search.
        `batch_lines`: the history lines one batch appends (`SearchSpec.batch_lines`)."""
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.state_path.exists():
            if self.history_path.exists() and self.history_path.stat().st_size:
                raise RunDirError(f"{self.history_path} exists but {self.state_path.name} is missing "
                                  f"(a search writes it first); restore {self.state_path} or {NEW_DIR}")
            return None
        try:
            state = read_json(self.state_path)
        except RunDirError as err:
            # Written by atomic replace, so never torn by a crash: the file was damaged afterwards.
            raise RunDirError(f"{err}; restore it, or delete it and {self.history_path.name} to restart "
                              f"this search from scratch, or {NEW_DIR}") from None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise RunDirError(f"{self.state_path}: unknown state format; {NEW_DIR}")
        changed: list[str] = []
        if state.get("identity") != stable_hash(fields):
            saved = state.get("identity_fields")
            differ = config_differences(saved, fields) if isinstance(saved, dict) else []
            changed = [f"{k}: {change}" for k, change in differ if result_neutral(k)]
            differ = [(k, change) for k, change in differ if not result_neutral(k)]
            if differ or not changed:
                shown = [f"{k}: {change}" for k, change in differ[:3]]
                what = ("; ".join(shown) + (f"; and {len(differ) - 3} more" if len(differ) > 3 else "")
                        if differ else "space, strategy, evaluator, seed or batch size")
                raise RunDirError(f"{self.path} holds a different search (config differs in {what}); {NEW_DIR}")
        try:
            keep = int(state["history_lines"])
            strategy_state = dict(state["strategy"])
            elapsed = float(state.get("elapsed_seconds", 0.0))
            in_flight = [_in_flight(entry) for entry in state.get("in_flight", [])]
            asked = int(state.get("asked", keep))
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"{self.state_path}: malformed resume state ({type(err).__name__}: {err})") from None
        try:
            lines = read_jsonl(self.history_path, repair=True, numbered=True)  # a torn last line is cut
        except RunDirError as err:
            raise RunDirError(f"{err}; restore the file or {NEW_DIR} "
                              "(only a torn last line is repaired)") from None
        try:
            history = [record_at(self.history_path, i, line) for i, line in enumerate(lines)]
        except RunDirError as err:
            raise RunDirError(f"{err}; restore the file or {NEW_DIR}") from None
        if len(history) < keep:
            raise RunDirError(
                f"{self.history_path}: has {len(history)} lines but state.json records {keep}"
            )
        if len(history) - keep > batch_lines:
            raise RunDirError(
                f"{self.history_path}: has {len(history)} lines but state.json records {keep}, more than "
                f"one batch ({batch_lines}) beyond it, which no crash leaves; restore {self.state_path} or {NEW_DIR}"
            )
        if len(history) > keep:  # the crash case: the batch after the saved state
            history = history[:keep]
            rewrite_jsonl(self.history_path, lines[:keep])  # the lines as read: older ones stay byte for byte
        return Resume(history, strategy_state, elapsed, in_flight, asked, changed)

    def saved_trials(self) -> int:
        """Trials of the budget that a resume keeps (the history's records up to the saved state,
        read as `prepare` reads them: an empty line is no record); 0 when none."""
        try:
            keep = int(read_json(self.state_path)["history_lines"])
            records = read_jsonl(self.history_path)[:keep]
            return sum(1 for record in records if not record.get("screened"))
        except (OSError, RunDirError, KeyError, TypeError, ValueError, AttributeError):
            return 0

    def append(self, records: list[TrialRecord], sync: bool = True) -> None:
        """`sync=False`: fsynced by the next fsynced `save_state` (or `sync`), with the state."""
        append_jsonl(self.history_path, [r.to_json() for r in records], sync=sync)
        self._unsynced |= not sync and bool(records)

    def save_state(self, fields: dict[str, Any], history_lines: int, strategy_state: dict[str, Any],
                   elapsed_seconds: float, in_flight: list[dict[str, Any]] | None = None,
                   asked: int | None = None) -> None:
        """`fields`: the search's identity fields (see `prepare`). `in_flight` and `asked`: an asynchronous
        search's candidates being evaluated and its next ask index, saved with the strategy state that
        asked them (so resume re-queues them). fsynced when the last fsynced state is SYNC_EVERY_S old:
        then the history lines appended without their fsync are fsynced with it, both before it replaces
        the old one (one fsync's wait, and a fsynced state never counts a line that is not)."""
        now = self.clock()
        durable = now - self._synced_at >= SYNC_EVERY_S
        atomic_write_json(self.state_path, {
            "version": STATE_VERSION, "identity": stable_hash(fields), "history_lines": history_lines,
            "identity_fields": fields,
            "strategy": strategy_state, "elapsed_seconds": elapsed_seconds,
            **({"in_flight": in_flight, "asked": asked} if in_flight is not None else {}),
        }, sync_also=self.history_path if durable and self._unsynced else None, sync=durable)
        if durable:
            self._synced_at, self._unsynced = now, False
        else:
            self._unsynced = True

    def sync(self) -> None:
        """fsync what the saves since the last fsynced state left unsynced (the search ended)."""
        if not self._unsynced:
            return
        fd = os.open(self.state_path, os.O_RDONLY)
        try:
            fsync_together(fd, self.history_path)
        finally:
            os.close(fd)
        self._synced_at, self._unsynced = self.clock(), False

    def save_summary(self, summary: dict[str, Any]) -> None:
        atomic_write_json(self.summary_path, summary)


def _in_flight(entry: Any) -> dict[str, Any]:
    """One in-flight entry of state.json, checked (a TypeError/KeyError is a malformed state)."""
    if not isinstance(entry, dict) or type(entry["ask"]) is not int or not isinstance(entry["info"], dict) \
            or entry["encoding"] is None:
        raise TypeError(f"bad in_flight entry {entry!r:.60}")
    return {"ask": entry["ask"], "encoding": entry["encoding"], "info": entry["info"]}


def _holder(fd: int) -> str:
    """The pid the holder wrote; it writes it just after locking, so wait a moment for it."""
    deadline = time.monotonic() + 1.0
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit() or time.monotonic() > deadline:
            return text if text.isdigit() else "unknown"
        time.sleep(0.02)


def _close_in_forked_child() -> None:
    """A forked child shares the parent's lock; it must not keep it past the parent's search."""
    for fd in list(_lock_fds):
        os.close(fd)  # the lock lives on in the parent's descriptor
    _lock_fds.clear()


os.register_at_fork(after_in_child=_close_in_forked_child)


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    """(dotted key, 'old -> new') for each key whose value differs (a key one side lacks: 'unset')."""
    def show(v: Any) -> str:
        text = "unset" if v is _UNSET else json.dumps(v, sort_keys=True, default=str)
        return text if len(text) <= 60 else text[:57] + "..."

    a, b = flatten(old), flatten(new)
    keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k, _UNSET) != b.get(k, _UNSET)]
    return [(k.replace(".params.", "."), f"{show(a.get(k, _UNSET))} -> {show(b.get(k, _UNSET))}") for k in keys]


_UNSET = object()

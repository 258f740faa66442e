"""What a sandboxed child may do: resource limits and an audit-hook policy.

Both are applied inside the child after torch and fvcore are imported (their
import maps ~3 GB of address space, dlopens libraries and reads many files)
and before the untrusted file is imported. Linux only.

The audit hook (PEP 578) is a tripwire, not a security boundary: it turns the
mistakes and naive abuse an LLM-written model can contain into readable
errors, but hostile code can switch it off. The boundary is the OS
(`isolation.py`: namespaces, read-only file system, seccomp); the rlimits and
the parent's wall-clock kill bound the resources inside it.
"""

from __future__ import annotations

import _posixsubprocess
import math
import os
import re
import resource
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass
from typing import Callable, NoReturn

from nas.errors import ConfigError

MB = 1 << 20
# What torch's allocators and libstdc++ say when a memory cap (RLIMIT_AS, RLIMIT_DATA) refuses an allocation.
_OUT_OF_MEMORY = re.compile(r"can't allocate memory|not enough memory|bad_alloc")


def out_of_memory(message: str) -> bool:
    """Whether an exception's message is an allocation a memory cap refused (often a RuntimeError, not a MemoryError)."""
    return bool(_OUT_OF_MEMORY.search(message))


def refused_allocation(err: BaseException) -> BaseException | None:
    """The error of an allocation a memory cap refused (a MemoryError, torch's OutOfMemoryError or a
    message `out_of_memory` knows) that is `err` or that `err` was raised from or while handling:
    torch.compile's failure wraps what its backend raised, and the fast engine wraps that in turn
    (`torch.compile failed: ...`, raised `from None`, which hides the context but keeps it). None
    if no error in the chain is one."""
    import torch  # lazy: only the trusted worker, which has loaded it, classifies its errors

    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (MemoryError, torch.OutOfMemoryError)) or out_of_memory(str(cause)):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


@dataclass(frozen=True)
class Limits:
    """Caps for one verification.

    CPU and memory are budgets for the candidate on top of what the child uses
    before the untrusted import (torch + fvcore: ~1.3 CPU s and ~3.2 GB of
    address space, 1.7 GB of it shared libraries), so they do not depend on
    the torch build. `memory_mb` is also what training an exported graph (trusted worker)
    may use: the dry run refuses a graph whose training step at the training
    batch (forward and backward, parameters and optimiser state) would not fit
    (`GraphNet.dry_run`); on a GPU, that training's CUDA caching allocator is capped at it too
    (`nas.sandbox.trusted_worker.gpu_fraction`). `nprocs` is RLIMIT_NPROC headroom over the user's
    current task count; the kernel ignores RLIMIT_NPROC for root, where the
    audit hook's ban on fork/exec/spawn is the only guard.
    """

    wall_s: float = 60.0
    cpu_s: int = 60
    memory_mb: int = 4096
    file_mb: int = 16
    nprocs: int = 8
    # All the child may write to its private /tmp (a tmpfs: RAM that the address-space cap does
    # not count, and without a size the kernel's default of half the host's memory).
    tmp_mb: int = 1024

    def __post_init__(self) -> None:
        # the rlimits take whole numbers: a float (memory_mb=0.5) would pass `> 0` here and raise a
        # TypeError inside every child, turning each candidate into a crash verdict
        for name in ("wall_s", "cpu_s", "memory_mb", "file_mb", "tmp_mb", "nprocs"):
            value, whole = getattr(self, name), name != "wall_s"
            if type(value) not in ((int,) if whole else (int, float)):
                raise ConfigError(f"Limits.{name} must be {'a whole number' if whole else 'a number'}, got {value!r}")
            if name != "nprocs" and not value > 0:
                raise ConfigError(f"Limits.{name} must be > 0, got {value!r}")
        if self.nprocs < 0:
            raise ConfigError(f"Limits.nprocs must be >= 0, got {self.nprocs!r}")


def apply_rlimits(limits: Limits, address_space: bool = True) -> None:
    """Cap CPU, address space, file size, process count and core dumps of this
    process. `address_space=False` for GPU training: a CUDA context reserves
    terabytes of virtual addresses, so there only wall and CPU time bound it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = math.ceil(usage.ru_utime + usage.ru_stime) + limits.cpu_s
    _cap(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU first, SIGKILL a second later if ignored
    if address_space:
        memory = _vm_size() + limits.memory_mb * MB
        _cap(resource.RLIMIT_AS, memory, memory)
    _cap(resource.RLIMIT_FSIZE, limits.file_mb * MB, limits.file_mb * MB)
    _cap(resource.RLIMIT_CORE, 0, 0)
    if os.getuid() != 0:
        tasks = _user_tasks(os.getuid()) + limits.nprocs
        _cap(resource.RLIMIT_NPROC, tasks, tasks)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise EFBIG instead of killing


def _cap(which: int, soft: int, hard: int) -> None:
    """Lower a limit, never raising it above an existing hard limit."""
    _, old_hard = resource.getrlimit(which)
    if old_hard != resource.RLIM_INFINITY:
        soft, hard = min(soft, old_hard), min(hard, old_hard)
    resource.setrlimit(which, (soft, hard))


def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmSize missing from /proc/self/status")


def _user_tasks(uid: int) -> int:
    """Threads count against RLIMIT_NPROC too, so count tasks, not processes."""
    total = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    total += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:  # the process exited meanwhile
                pass
    return total


# --- audit-hook policy ------------------------------------------------------

_PROCESS = frozenset({"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                      "os.forkpty", "subprocess.Popen", "pty.spawn", "os.startfile",
                      "_posixsubprocess.fork_exec"})
_SIGNALS = frozenset({"os.kill", "os.killpg", "signal.pthread_kill"})
_RLIMITS = frozenset({"resource.setrlimit", "resource.prlimit"})
_LINKS = frozenset({"os.link", "os.symlink"})  # a hard link would let writes inside reach files outside
# event -> (indices of path arguments, indices of dir_fd arguments)
_PATHS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)), "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)),
    "os.utime": ((0,), (3,)), "os.truncate": ((0,), ()), "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()), "shutil.rmtree": ((0,), (1,)), "sqlite3.connect": ((0,), ()),
}
_LISTS = frozenset({"os.listdir", "os.scandir", "glob.glob"})  # reading a folder (of a hidden path)
_WATCHED = _PROCESS | _SIGNALS | _RLIMITS | _LINKS | set(_PATHS) | {"open"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def install_policy(workdir: str, files: dict[str, str],
                   deny: Callable[[str, str | None], NoReturn], hidden: tuple[str, ...] = ()) -> None:
    """Install an audit hook that calls `deny(error, traceback)` on the first
    forbidden action. `files` maps untrusted file paths to display names, used
    to say where the action came from; `hidden` paths (datasets, $NASFLOW_HOME:
    `nas.sandbox.verify.hidden_paths`) may not even be read. Cannot be undone (that is the point)."""
    root = os.path.realpath(workdir)
    trusted = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix)})
    needed = (root + os.sep, *trusted)  # a hidden path above these would stop Python itself
    secret = tuple(h + os.sep for h in {os.path.realpath(p) for p in hidden}
                   if not any(n.startswith(h + os.sep) for n in needed))

    def unreadable(path: object) -> bool:
        if not secret or not isinstance(path, (str, bytes, os.PathLike)):
            return False
        real = os.path.realpath(os.fsdecode(path)) + os.sep  # type: ignore[arg-type]
        return real.startswith(secret)

    def inside(path: object) -> bool:
        if isinstance(path, int):  # an already-open descriptor: its opening was checked
            return True
        real = os.path.realpath(os.fsdecode(path))  # type: ignore[arg-type]
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple) -> None:
        if event not in _WATCHED and not event.startswith(("socket.", "ctypes.")):
            if event in _LISTS and unreadable(args[0]):
                _deny("reading datasets or $NASFLOW_HOME", event, args, files, deny)
            return
        what = _violation(event, args, inside, trusted)
        if what is None and event == "open" and unreadable(args[0]):
            what = "reading datasets or $NASFLOW_HOME"
        if what is not None:
            _deny(what, event, args, files, deny)

    sys.addaudithook(hook)
    # Python 3.11 audits subprocess.Popen but not the fork_exec it calls
    _posixsubprocess.fork_exec = subprocess._fork_exec = _audited_fork_exec  # type: ignore[attr-defined]  # private


def _audited_fork_exec(*args: object) -> NoReturn:
    sys.audit("_posixsubprocess.fork_exec")  # the policy hook denies this event
    raise PermissionError("process creation is not allowed")


def _violation(event: str, args: tuple, inside: Callable[[object], bool],
               trusted: tuple[str, ...]) -> str | None:
    """Name the forbidden kind of action, or None if `event` is allowed."""
    if event in _PROCESS:
        return "process creation"
    if event in _SIGNALS:
        return "signalling processes"
    if event in _RLIMITS:
        return "changing resource limits"
    if event in _LINKS:
        return "creating links"
    if event.startswith("socket."):
        return "network access"
    if event.startswith("ctypes."):
        loads_installed_lib = (event == "ctypes.dlopen" and isinstance(args[0], str)
                               and os.path.realpath(args[0]).startswith(trusted))
        return None if loads_installed_lib else "native code access"
    if event == "open":
        path, mode, flags = args
        if not flags & _WRITE_FLAGS or isinstance(path, int):
            return None
        # os.open (mode None) may be relative to a dir_fd the event does not show
        if (mode is None and not os.path.isabs(os.fsdecode(path))) or not inside(path):
            return "writing outside the sandbox directory"
        return None
    paths, dir_fds = _PATHS[event]
    relative_to_fd = any(isinstance(args[i], int) and args[i] >= 0 for i in dir_fds if i < len(args))
    if relative_to_fd or not all(inside(args[i]) for i in paths if args[i] is not None):
        return "writing outside the sandbox directory"
    return None


def _deny(what: str, event: str, args: tuple, files: dict[str, str],
          deny: Callable[[str, str | None], NoReturn]) -> NoReturn:
    stack = [f for f in traceback.extract_stack(sys._getframe(2)) if f.filename in files]
    detail = event
    if event == "open" or event in _PATHS or event in _LISTS:
        detail = f"{event} {str(args[0])[:120]!r}"
    if stack:
        detail += f" at {files[stack[-1].filename]}:{stack[-1].lineno}"
    error = f"policy: {what} is not allowed ({detail})"
    lines = [f'  File "{files[f.filename]}", line {f.lineno}, in {f.name}\n    {f.line}' for f in stack[-9:]]
    tb = "\n".join(["Traceback (most recent call last):", *lines, f"PermissionError: {error}"]) if lines else None
    deny(error, tb)

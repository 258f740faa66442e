"""A warm `nas search` (Linux, the shared local server's mode): a process that has already
imported what a search loads (Prefect, Hydra, the runner: about a second of CPU a command) forks
one child per command, and the child runs the command as a fresh `nas` would: the caller's
arguments, working directory, umask, environment and standard streams (passed as descriptors).
The caller (this module's `run`) forwards its signals to the child and exits as the child did.

The first `nas search` in local mode starts it when it ends (`start`); it serves only commands
whose interpreter, import path, environment (but for PWD and the like) and code are the ones it
imported, named by `fingerprint` in its socket's name: any difference finds no socket and the
command runs cold. It exits once its code changes, its NASFLOW_HOME goes or it has been idle for
NASFLOW_SERVER_IDLE_MINUTES. It answers only processes of its own user (SO_PEERCRED), and reads
every request strictly (`parse_request`). NASFLOW_WARM=0 turns it off.

This module is the caller's side and what both sides share (stdlib only: the caller pays for none
of what the warm process holds); nas/cli/warm_server.py is the warm process."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

ENABLE = "NASFLOW_WARM"
VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})  # differ by shell state, not by meaning
PACKAGES = ("nas", "flows", "tasks", "supernets", "conf")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH,
             signal.SIGUSR1, signal.SIGUSR2)
MAX_REQUEST = 1 << 20  # a request's JSON: an environment of a few kB, at most this
LOG = "warm.log"
STDIO = ("stdin", "stdout", "stderr")


def enabled(argv: list[str], env: dict[str, str]) -> bool:
    """A warm process serves `nas search` on Linux, with the shared local server (the CLI's default
    mode), unless NASFLOW_WARM=0."""
    return (sys.platform == "linux" and argv[:1] == ["search"] and env.get(ENABLE, "1").strip() != "0"
            and env.get("NASFLOW_PREFECT_SERVER", "local").strip().lower() == "local")


def code_stamp(root: Path) -> list[tuple[str, int, int]]:
    """(path, mtime_ns, size) of every file of the packages under `root` (their caches left out),
    and of each site-packages folder on the import path (a package installed or removed changes
    its mtime)."""
    stamp = []
    for name in PACKAGES:
        for folder, dirs, files in os.walk(root / name):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for file in sorted(files):
                path = os.path.join(folder, file)
                try:
                    info = os.stat(path)
                except OSError:
                    continue
                stamp.append((path, info.st_mtime_ns, info.st_size))
    for entry in sys.path:  # not the others: a working directory on the path changes with every run dir
        if Path(entry).name in ("site-packages", "dist-packages"):
            try:
                stamp.append((entry, os.stat(entry).st_mtime_ns, 0))
            except OSError:
                stamp.append((entry, -1, 0))
    return stamp


def fingerprint(env: dict[str, str], root: Path) -> str:
    """What a warm process must share with a command to run it as a fresh process would: the
    interpreter and its flags, the import path, the environment but its VOLATILE variables, and
    the code (`code_stamp`)."""
    data = {"executable": sys.executable, "version": sys.version, "flags": repr(sys.flags), "path": sys.path,
            "env": sorted((k, v) for k, v in env.items() if k not in VOLATILE), "code": code_stamp(root)}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def address(home: Path, print_: str) -> bytes:
    """The warm process's socket: Linux's abstract namespace (no file to leave behind, no path
    length limit), by home and fingerprint."""
    return b"\0nasflow-warm-" + hashlib.sha256(f"{home}\0{print_}".encode()).hexdigest()[:40].encode()


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


# ---- the caller -------------------------------------------------------------------------------------


def run(argv: list[str], env: dict[str, str], home: Path) -> int | None:
    """Run `nas ARGV` in the warm process's child: its exit status, or None when no warm process
    of this user serves this command (then it runs here, cold)."""
    try:
        stdio = [_stream_info(i, getattr(sys, name)) for i, name in enumerate(STDIO)]
    except (OSError, ValueError, AttributeError):
        return None  # a closed standard stream: nothing to pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        try:
            sock.connect(address(home, fingerprint(env, project_root())))
            if peer_uid(sock) != os.getuid():  # another user's process on the address: it gets nothing
                return None
        except OSError:
            return None
        umask = os.umask(0o022)
        os.umask(umask)
        request = {"argv": argv, "argv0": sys.argv[0], "cwd": os.getcwd(), "env": env, "umask": umask,
                   "stdio": stdio}
        try:
            send_message(sock, request, fds=[0, 1, 2])
            reply = read_message(sock)
        except (OSError, ValueError):
            return None
        if not isinstance(reply, dict) or set(reply) != {"pid"} or type(reply["pid"]) is not int:
            return None
        child = reply["pid"]
        previous = {sig: signal.signal(sig, lambda sig, _frame: forward(child, sig)) for sig in FORWARDED}
        try:
            done = read_message(sock)
        except (OSError, ValueError):
            done = None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return _status(done)


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket (SO_PEERCRED)."""
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return int(uid)


def _stream_info(fd: int, stream: Any) -> dict[str, Any]:
    os.fstat(fd)
    return {"encoding": stream.encoding, "errors": stream.errors, "line_buffering": bool(stream.line_buffering)}


def forward(child: int, sig: int) -> None:
    try:
        os.kill(child, sig)
    except ProcessLookupError:
        pass


def _status(done: Any) -> int:
    """The caller's exit: the child's status; killed by a signal, the caller is killed by it too
    (as a cold `nas` would have been); a warm process gone mid-command, 1 with a line."""
    if isinstance(done, dict) and set(done) == {"exit"} and type(done["exit"]) is int and 0 <= done["exit"] <= 255:
        return int(done["exit"])
    if isinstance(done, dict) and set(done) == {"signal"} and type(done["signal"]) is int \
            and 1 <= done["signal"] < signal.NSIG:
        sig = done["signal"]
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # neither can be caught
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig  # a signal whose default is to go on
    print("nas: error: the warm process running this command ended without its exit status "
          f"(see {LOG} under NASFLOW_HOME; {ENABLE}=0 runs commands cold)", file=sys.stderr)
    return 1


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """One message: its length (4 bytes), then its JSON; descriptors go with the first bytes."""
    data = json.dumps(message).encode()
    data = struct.pack("!I", len(data)) + data
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    sock.sendall(data[sent:])


def read_message(sock: socket.socket, fds: list[int] | None = None) -> Any:
    """One message (`send_message`); with `fds`, the descriptors that came with it are appended there
    (and closed again here when the message is not whole). ValueError when it is malformed."""
    got: list[int] = []
    try:
        head = _read_exactly(sock, 4, got if fds is not None else None)
        (size,) = struct.unpack("!I", head)
        if size > MAX_REQUEST:
            raise ValueError(f"a message of {size} bytes, over {MAX_REQUEST}")
        message = json.loads(_read_exactly(sock, size, None))
    except BaseException:
        close_fds(got)
        raise
    if fds is not None:
        fds.extend(got)
    return message


def _read_exactly(sock: socket.socket, size: int, fds: list[int] | None) -> bytes:
    data = b""
    while len(data) < size:
        if fds is not None and not data:
            chunk, passed, _flags, _addr = socket.recv_fds(sock, size, 3)
            fds.extend(passed)
        else:
            chunk = sock.recv(size - len(data))
        if not chunk:
            raise ValueError("the connection closed mid-message")
        data += chunk
    return data


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


# ---- starting one -----------------------------------------------------------------------------------


def start(env: dict[str, str], home: Path) -> None:
    """Start a warm process for commands like this one (its environment as it was before `nas` set
    anything), in its own session, its output to NASFLOW_HOME/warm.log: one that is starting or
    serving already holds the address, and the new one exits."""
    try:
        home.mkdir(parents=True, exist_ok=True)
        with (home / LOG).open("ab") as log:
            subprocess.Popen(  # noqa: S603 - this interpreter, this module
                [sys.executable, "-c", "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
                 "from nas.cli import main, warm_server; warm_server.serve() and main.entry(warm=False)", json.dumps(sys.path)],
                env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    except OSError:
        pass  # the next command runs cold, as this one did

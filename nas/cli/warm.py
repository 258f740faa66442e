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

Stdlib only at import: the caller pays for none of what the warm process holds."""

from __future__ import annotations

import hashlib
import io
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ENABLE = "NASFLOW_WARM"
VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})  # differ by shell state, not by meaning
PACKAGES = ("nas", "flows", "tasks", "supernets", "conf")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGWINCH,
             signal.SIGUSR1, signal.SIGUSR2)
MAX_REQUEST = 1 << 20  # a request's JSON: an environment of a few kB, at most this
POLL_S = 5.0
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
            _send(sock, request, fds=[0, 1, 2])
            reply = _read_message(sock)
        except (OSError, ValueError):
            return None
        if not isinstance(reply, dict) or set(reply) != {"pid"} or type(reply["pid"]) is not int:
            return None
        child = reply["pid"]
        previous = {sig: signal.signal(sig, lambda sig, _frame: _forward(child, sig)) for sig in FORWARDED}
        try:
            done = _read_message(sock)
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


def _forward(child: int, sig: int) -> None:
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


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """One message: its length (4 bytes), then its JSON; descriptors go with the first bytes."""
    data = json.dumps(message).encode()
    data = struct.pack("!I", len(data)) + data
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    sock.sendall(data[sent:])


def _read_message(sock: socket.socket, fds: list[int] | None = None) -> Any:
    """One message (`_send`); with `fds`, the descriptors that came with it are appended there
    (and closed again here when the message is not whole). ValueError when it is malformed."""
    got: list[int] = []
    try:
        head = _read_exactly(sock, 4, got if fds is not None else None)
        (size,) = struct.unpack("!I", head)
        if size > MAX_REQUEST:
            raise ValueError(f"a message of {size} bytes, over {MAX_REQUEST}")
        message = json.loads(_read_exactly(sock, size, None))
    except BaseException:
        _close(got)
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


def _close(fds: list[int]) -> None:
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
                 "from nas.cli.warm import serve; serve()", json.dumps(sys.path)],
                env=env, cwd=home, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    except OSError:
        pass  # the next command runs cold, as this one did


# ---- the warm process -------------------------------------------------------------------------------


def parse_request(message: Any) -> dict[str, Any]:
    """A request as the caller sends it, or ValueError naming what is wrong: every field of its type,
    no other key."""
    fields = {"argv": list, "argv0": str, "cwd": str, "env": dict, "umask": int, "stdio": list}
    if not isinstance(message, dict) or set(message) != set(fields):
        raise ValueError(f"a request has the keys {sorted(fields)}")
    for key, kind in fields.items():
        if type(message[key]) is not kind:
            raise ValueError(f"request field {key!r} is not a {kind.__name__}")
    if not all(type(a) is str for a in message["argv"]):
        raise ValueError("request field 'argv' holds a non-string")
    if not all(type(k) is str and type(v) is str for k, v in message["env"].items()):
        raise ValueError("request field 'env' holds a non-string")
    if not 0 <= message["umask"] <= 0o777:
        raise ValueError("request field 'umask' is out of 0..0o777")
    stdio = message["stdio"]
    if len(stdio) != 3 or not all(isinstance(s, dict) and set(s) == {"encoding", "errors", "line_buffering"}
                                  and type(s["encoding"]) is str and type(s["errors"]) is str
                                  and type(s["line_buffering"]) is bool for s in stdio):
        raise ValueError("request field 'stdio' is not three stream descriptions")
    return message


def serve() -> None:
    """The warm process: take the address, import what a search loads, then fork a child per request
    until its code changes, its home goes or it is idle."""
    from nas.home import home as nas_home

    env, root = dict(os.environ), project_root()
    home, print_ = nas_home(), fingerprint(env, root)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(home, print_))
    except OSError:
        return  # another one serves (or is starting to): this one is not needed
    idle_s = idle_seconds(env)
    _preload()
    import threading

    if threading.active_count() != 1:  # a fork copies one thread: a lock another held would stay held
        _log(f"not serving: {threading.active_count()} threads after the imports")
        return
    listener.listen(16)
    _log(f"serving at @{address(home, print_)[1:].decode()} (pid {os.getpid()})")
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    orphaned: set[int] = set()  # children whose caller went away: told to stop, not watched again
    last = time.monotonic()
    while True:
        watched = {c.fileno(): pid for pid, c in children.items() if pid not in orphaned}
        readable: list[Any] = [listener, wake_r, *watched]
        ready, _, _ = select.select(readable, [], [], POLL_S)
        if wake_r in ready:
            os.read(wake_r, 4096)
        for fd in ready:
            if fd in watched:  # the caller's end closed (it was killed): stop what it started
                orphaned.add(watched[fd])
                _forward(watched[fd], signal.SIGTERM)
        _reap(children, orphaned)
        if listener in ready:
            _accept(listener, children, print_, root, [listener, wake_r, wake_w])
        if children or listener in ready:
            last = time.monotonic()
            continue
        reason = ("its home is gone" if not home.is_dir() else "idle" if time.monotonic() - last > idle_s
                  else "the code changed" if fingerprint(env, root) != print_ else None)
        if reason is not None:
            _log(f"stopping: {reason}")
            return


def idle_seconds(env: dict[str, str]) -> float:
    """The shared server's idle limit (NASFLOW_SERVER_IDLE_MINUTES, 30 by default), in seconds."""
    try:
        minutes = float(env.get("NASFLOW_SERVER_IDLE_MINUTES", "30"))
    except ValueError:
        minutes = 30.0
    return max(minutes, 0.1) * 60 if minutes == minutes else 1800.0


def _preload() -> None:
    """What `nas search` imports, in its order: its environment first (Prefect's settings are read when
    it is imported), then the command's module and the default runner (Prefect). A child replaces the
    environment with its caller's, which sets the same."""
    os.environ.setdefault("NASFLOW_PREFECT_SERVER", "local")
    from tasks.env import configure_prefect_env

    configure_prefect_env()
    from nas.cli import search  # noqa: F401 - imported to be held
    from nas.execute import RUNNERS

    RUNNERS.get("prefect")


def _log(line: str) -> None:
    from nas.secrets import scrub

    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} warm: {ascii(scrub(line))[1:-1]}", file=sys.stderr, flush=True)


def _reap(children: dict[int, socket.socket], orphaned: set[int]) -> None:
    """Each child that ended: its status to its caller."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        orphaned.discard(pid)
        conn = children.pop(pid, None)
        if conn is None:
            continue
        with conn:
            try:
                _send(conn, {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                      else {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass


def _accept(listener: socket.socket, children: dict[int, socket.socket], print_: str, root: Path,
            own: list[Any]) -> None:
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        uid = peer_uid(conn)
        if uid != os.getuid():
            raise ValueError(f"a caller of uid {uid}")
        conn.settimeout(5.0)
        request = parse_request(_read_message(conn, fds))
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} descriptors, not 3")
        if fingerprint(request["env"], root) != print_:
            raise ValueError("stale: the code or the environment changed")
        conn.settimeout(None)
    except (OSError, ValueError) as err:
        _log(f"refused a request: {err}")
        _close(fds)
        conn.close()
        return
    pid = os.fork()
    if pid == 0:  # never returns
        _child(request, fds, [conn, *own, *children.values()])
    _close(fds)
    children[pid] = conn
    try:
        _send(conn, {"pid": pid})
    except OSError:
        _forward(pid, signal.SIGTERM)
    _log(f"pid {pid}: nas {' '.join(request['argv'])[:200]}")


def _child(request: dict[str, Any], fds: list[int], inherited: list[Any]) -> None:
    """Become the caller's `nas`: its descriptors, directory, umask, environment and arguments."""
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, *FORWARDED):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for thing in inherited:
            thing.close() if isinstance(thing, socket.socket) else os.close(thing)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(request["umask"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["argv0"], *request["argv"]]
        _new_streams(request["stdio"])
        _reseed()
        from nas.cli.main import entry

        entry(warm=False)  # exits
    except BaseException:  # noqa: BLE001 - the child's last resort: said, and status 1 as Python's
        import traceback

        traceback.print_exc()
    finally:
        os._exit(1)


def _new_streams(stdio: list[dict[str, Any]]) -> None:
    """The standard streams made anew on descriptors 0-2 (the old ones know their old files: seekable,
    not a tty), as the caller's are; log handlers that wrote to an old one write to its new one."""
    import logging

    new = {}
    for fd, (name, info) in enumerate(zip(STDIO, stdio)):
        old = getattr(sys, name)
        raw = open(fd, "rb" if fd == 0 else "wb", closefd=False)  # noqa: SIM115 - the process's own stream
        new[id(old)] = stream = io.TextIOWrapper(raw, encoding=info["encoding"], errors=info["errors"],
                                                 line_buffering=info["line_buffering"])
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for handler in [h for log in loggers for h in getattr(log, "handlers", [])]:
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in new:
            handler.setStream(new[id(handler.stream)])


def _reseed() -> None:
    """A fork copies the random generators' state: each child draws its own."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()

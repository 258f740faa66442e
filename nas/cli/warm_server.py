"""The warm process of nas/cli/warm.py: it takes its address, imports what a search loads, then
forks a child per request (checked by `parse_request`, its caller's user and fingerprint), which
becomes its caller's process and runs the command."""

from __future__ import annotations

import io
import logging
import os
import random
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nas.cli.warm import (
    FORWARDED,
    STDIO,
    address,
    close_fds,
    fingerprint,
    forward,
    peer_uid,
    project_root,
    read_message,
    send_message,
)
from nas.home import home as nas_home
from nas.lazy import LazyImport
from nas.secrets import scrub

# what a search imports, held here (the caller imports none of it)
search_command = LazyImport("nas.cli.search")
execute = LazyImport("nas.execute")
prefect_env = LazyImport("tasks.env")

POLL_S = 5.0


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


def serve() -> bool:
    """The warm process: take the address, import what a search loads, then fork a child per request
    until its code changes, its home goes or it is idle (False). True in a child, once it is its
    caller's process: its caller then runs the command (`nas.cli.main.entry`)."""
    env, root = dict(os.environ), project_root()
    home, print_ = nas_home(), fingerprint(env, root)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address(home, print_))
    except OSError:
        return False  # another one serves (or is starting to): this one is not needed
    idle_s = idle_seconds(env)
    _preload()
    if threading.active_count() != 1:  # a fork copies one thread: a lock another held would stay held
        _log(f"not serving: {threading.active_count()} threads after the imports")
        return False
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
                forward(watched[fd], signal.SIGTERM)
        _reap(children, orphaned)
        if listener in ready and _accept(listener, children, print_, root, [listener, wake_r, wake_w]):
            return True  # a child
        if children or listener in ready:
            last = time.monotonic()
            continue
        if (reason := stop_reason(home, time.monotonic() - last > idle_s,
                                  lambda: fingerprint(env, root) != print_)) is not None:
            _log(f"stopping: {reason}")
            return False


def stop_reason(home: Path, idle: bool, changed: Callable[[], bool]) -> str | None:
    """Why a server with nothing to do stops: its home removed, idle too long, or the code it
    preloaded changed (`changed`, asked last: it hashes the tree); None: it serves on."""
    return ("its home is gone" if not home.is_dir() else "idle" if idle
            else "the code changed" if changed() else None)


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
    prefect_env.configure_prefect_env()
    search_command.main  # noqa: B018 - imported to be held
    execute.RUNNERS.get("prefect")


def _log(line: str) -> None:
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
                send_message(conn, {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                      else {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass


def _accept(listener: socket.socket, children: dict[int, socket.socket], print_: str, root: Path,
            own: list[Any]) -> bool:
    """One request: refused, or a child forked for it (True in the child, made its caller's process)."""
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        uid = peer_uid(conn)
        if uid != os.getuid():
            raise ValueError(f"a caller of uid {uid}")
        conn.settimeout(5.0)
        request = parse_request(read_message(conn, fds))
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} descriptors, not 3")
        if fingerprint(request["env"], root) != print_:
            raise ValueError("stale: the code or the environment changed")
        conn.settimeout(None)
    except (OSError, ValueError) as err:
        _log(f"refused a request: {err}")
        close_fds(fds)
        conn.close()
        return False
    pid = os.fork()
    if pid == 0:
        _become_caller(request, fds, [conn, *own, *children.values()])
        return True
    close_fds(fds)
    children[pid] = conn
    try:
        send_message(conn, {"pid": pid})
    except OSError:
        forward(pid, signal.SIGTERM)
    _log(f"pid {pid}: nas {' '.join(request['argv'])[:200]}")
    return False


def _become_caller(request: dict[str, Any], fds: list[int], inherited: list[Any]) -> None:
    """The child: the caller's descriptors, directory, umask, environment and arguments."""
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


def _new_streams(stdio: list[dict[str, Any]]) -> None:
    """The standard streams made anew on descriptors 0-2 (the old ones know their old files: seekable,
    not a tty), as the caller's are; log handlers that wrote to an old one write to its new one."""
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
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()

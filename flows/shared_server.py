"""`python -m flows.shared_server`: the local Prefect server that `nas` commands share when no
PREFECT_API_URL is set (flows/prefect_server.py starts it; NASFLOW_PREFECT_SERVER=temporary opts out).

It serves the API and the UI on 127.0.0.1 from Prefect's database under NASFLOW_HOME, so the
UI shows every CLI run, and stops itself once no command has used it for `--idle-minutes`.
A command using it holds a shared lock on USERS for as long as it runs and touches the file
when it lets go; this watchdog takes the lock exclusively (so no command is using the server),
reads how long ago the last one let go, and stops the server when that is past the limit,
removing STATE before it lets the lock go: a command that then finds no STATE starts a new one.

Stdlib only and no Prefect import: the server itself is uvicorn in a child process, under
nas/llm/guard.py so that it stops with this watchdog however the watchdog dies.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

STATE = "local-server.json"   # {"pid", "port", "url", "started", "idle_minutes"}: written once it answers
USERS = "local-server.users"  # shared-locked by each command using the server; mtime = last release
LOG = "local-server.log"
POLL_S = 5.0


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout) as response:  # noqa: S310 - 127.0.0.1
            return response.status == 200
    except (OSError, ValueError):
        return False


def idle_seconds(users: Path) -> float | None:
    """Seconds since the last command let go of the server, or None while one holds it."""
    with users.open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
        try:
            return time.time() - users.stat().st_mtime
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def server_command(port: int) -> list[str]:
    guard = Path(__file__).resolve().parents[1] / "nas" / "llm" / "guard.py"
    spec = importlib.util.find_spec("prefect")
    app_dir = str(Path(spec.origin).parent.parent) if spec and spec.origin else "."
    return [sys.executable, "-I", str(guard), sys.executable, "-m", "uvicorn", "--app-dir", app_dir,
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="where STATE, USERS and LOG live (PREFECT_HOME)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle-minutes", type=float, default=30.0)
    parser.add_argument("--startup-timeout", type=float, default=180.0)
    args = parser.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}/api"
    env = {**os.environ, "PREFECT_UI_ENABLED": "1", "PREFECT_UI_API_URL": url,
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_SERVER_API_PORT": str(args.port)}
    env.pop("PREFECT_API_URL", None)
    env.setdefault("PREFECT_HOME", str(args.dir))  # its database beside STATE, whoever started it
    server = subprocess.Popen(server_command(args.port), env=env, stdin=subprocess.DEVNULL)
    stop = False

    def on_signal(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    state, users = args.dir / STATE, args.dir / USERS
    deadline = time.monotonic() + args.startup_timeout
    while not healthy(url, timeout=1.0):
        if stop or server.poll() is not None or time.monotonic() > deadline:
            print(f"local Prefect server on port {args.port} did not start (exit {server.poll()})", file=sys.stderr)
            server.terminate()
            return 1
        time.sleep(0.2)
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "port": args.port, "url": url, "started": time.time(),
                               "idle_minutes": args.idle_minutes}))
    os.replace(tmp, state)
    print(f"serving {url} (UI at http://127.0.0.1:{args.port}); stops after {args.idle_minutes:g} idle minutes",
          file=sys.stderr, flush=True)
    try:
        while not stop and server.poll() is None:
            time.sleep(POLL_S)
            if not args.dir.is_dir():  # its NASFLOW_HOME removed (a test's): nobody can reach it
                break
            with users.open("a+") as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a command is using it
                if time.time() - users.stat().st_mtime >= args.idle_minutes * 60:
                    # under the lock: a command waits, then finds no STATE and a free port
                    state.unlink(missing_ok=True)
                    print(f"idle for {args.idle_minutes:g} minutes: stopping", file=sys.stderr, flush=True)
                    _stop(server)
                    break
    finally:
        if _owns(state):
            state.unlink(missing_ok=True)
        _stop(server)
    return 0


def _stop(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _owns(state: Path) -> bool:
    try:
        return json.loads(state.read_text()).get("pid") == os.getpid()
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())

"""The Prefect server a command talks to: `nas serve`'s (is it there, does its UI call the same API),
Prefect's temporary one, or the local one that `nas` commands share (`prefect_api`, flows/shared_server.py)."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.shared_server import LOG, STATE, USERS, healthy
from nas.errors import ConfigError, NasError
from nas.home import home
from nas.lazy import LazyImport
from nas.status import status
from tasks.env import check_prefect_database

# Prefect (seconds) and httpx load when a server is asked for: after configure_prefect_env, never for `nas --help`
httpx = LazyImport("httpx")
settings = LazyImport("prefect.settings")
prefect_server = LazyImport("prefect.server.api.server")

START_SERVER = ("start a server with `prefect server start --host 127.0.0.1` and "
                "`export PREFECT_API_URL=http://127.0.0.1:4200/api`")


def check_server() -> str:
    """The API URL, once its health endpoint answers; a dead server would otherwise
    surface as retries and a traceback."""
    url = settings.PREFECT_API_URL.value()
    if not url:
        raise NasError(f"PREFECT_API_URL is not set; {START_SERVER}")
    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=5).raise_for_status()
    except httpx.HTTPError as err:
        raise NasError(f"no Prefect server answers at {url} ({type(err).__name__}); {START_SERVER}") from None
    return url


def ui_warning(url: str) -> str | None:
    """A line when the server's UI calls another API address than `url` (a server started with
    --port but no PREFECT_UI_API_URL: its UI calls port 4200 and shows nothing)."""
    try:
        ui_api = httpx.get(f"{url.rstrip('/').removesuffix('/api')}/ui-settings", timeout=5).json().get("api_url")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None  # UI disabled or not answering: nothing to check
    if not ui_api or ui_api.rstrip("/") == url.rstrip("/"):
        return None
    return (f"nas serve: warning: the server's UI calls the API at {ui_api}, not {url}; restart it with "
            f"PREFECT_UI_API_URL={url} prefect server start ...")


def start_temporary_server(show: bool) -> Any | None:
    """Prefect's temporary API server for this process (Prefect starts the same one, once, on
    its first API call), started here so that its ten-odd silent seconds show a status line;
    None when PREFECT_API_URL names a server."""
    if settings.PREFECT_API_URL.value():
        return None

    server = prefect_server.SubprocessASGIServer()  # one per process: the flow's API calls find it running
    if not server.running:

        check_prefect_database()  # a damaged one would cost minutes and end in "Timed out ..."
        with status("starting Prefect's temporary server", show=show):
            server.start()
    return server


SERVER_MODE = "NASFLOW_PREFECT_SERVER"  # local (the CLI's default): a shared server; temporary: Prefect's own
IDLE_MINUTES = "NASFLOW_SERVER_IDLE_MINUTES"
DEFAULT_IDLE_MINUTES = 30.0
PREFERRED_PORT = 4200  # Prefect's usual one, when free: the UI's address stays the same


def server_mode() -> str:
    mode = os.environ.get(SERVER_MODE, "temporary").strip().lower()
    if mode not in ("local", "temporary"):
        raise ConfigError(f"{SERVER_MODE}={mode!r}: expected 'local' or 'temporary'")
    return mode


def idle_minutes() -> float:
    raw = os.environ.get(IDLE_MINUTES, str(DEFAULT_IDLE_MINUTES))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{IDLE_MINUTES}={raw!r}: expected a positive number of minutes")
    return value


def _server_dir() -> Path:
    path = Path(os.environ.get("PREFECT_HOME") or home() / "prefect").expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _free_port() -> int:
    for port in (PREFERRED_PORT, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise NasError("no free port on 127.0.0.1 for the local Prefect server")


def _running_url(where: Path) -> str | None:
    state = _running_state(where)
    return None if state is None else str(state["url"])


def _running_state(where: Path) -> dict[str, Any] | None:
    """STATE of the server whose URL answers ({"url", "port", "pid", "idle_minutes", ...}), else None."""
    try:
        state = json.loads((where / STATE).read_text())
        url = str(state["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if healthy(url) else None


@contextmanager
def local_server(show: bool) -> Iterator[str]:
    """The shared local server's API URL (started, with a status line, when none answers), held
    for the block: the server stops itself only after NASFLOW_SERVER_IDLE_MINUTES with no holder."""

    where = _server_dir()
    users = (where / USERS).open("a+")
    try:
        fcntl.flock(users, fcntl.LOCK_SH)  # waits while a watchdog that found its server idle stops it
        url = _running_url(where)
        if url is None:
            url = _start_local_server(where, show, where / LOG)
        try:
            yield url
        finally:
            os.utime(where / USERS)  # the idle clock starts when the last holder lets go
    finally:
        users.close()


def _start_local_server(where: Path, show: bool, log: Path) -> str:
    with (where / "local-server.start").open("a+") as start_lock:
        fcntl.flock(start_lock, fcntl.LOCK_EX)  # one command starts it; one started meanwhile is used
        url = _running_url(where)
        if url is not None:
            return url
        check_prefect_database()  # a damaged one would cost minutes and end in "Timed out ..."
        port, minutes = _free_port(), idle_minutes()
        url = f"http://127.0.0.1:{port}/api"
        if port != PREFERRED_PORT:  # a plain line: the status line below is cut to the terminal and then erased
            print(f"nas: port {PREFERRED_PORT} is taken, so this home's Prefect UI is at {ui_address(url)} "
                  f"(the server on {PREFERRED_PORT} shows other runs; `nas ui` prints the address)",
                  file=sys.stderr, flush=True)
        with log.open("ab") as out:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "flows.shared_server", "--dir", str(where), "--port", str(port),
                 "--idle-minutes", str(minutes)],
                cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True)  # its own session: a Ctrl-C aimed at `nas` leaves it serving
        with status(f"starting the local Prefect server at {ui_address(url)} (later commands reuse it)",
                    show=show):
            while _running_url(where) != url:
                if daemon.poll() is not None:
                    tail = log.read_text(errors="replace").strip().splitlines()[-1:]
                    raise NasError(f"the local Prefect server did not start ({log}: {' '.join(tail)}); "
                                   f"or run with {SERVER_MODE}=temporary")
                time.sleep(0.2)
        if not healthy(url):
            raise NasError(f"the local Prefect server at {url} does not answer; see {log}")
        return url


def ui_address(api_url: str) -> str:
    """The UI of a Prefect server started here, from its API's URL (the UI serves at the root)."""
    return api_url.rstrip("/").removesuffix("/api")


def configured_ui() -> str | None:
    """The UI of the server that PREFECT_API_URL names (environment or profile); None when it is unset."""
    api = settings.PREFECT_API_URL.value()
    return (settings.PREFECT_UI_URL.value() or ui_address(api)) if api else None


def running_local_server() -> dict[str, Any] | None:
    """This home's shared local server's STATE ("url", "idle_minutes", ...) when it answers, else
    None; starts nothing."""
    return _running_state(_server_dir())


@contextmanager
def prefect_api(show: bool, temporary: bool = True) -> Iterator[str | None]:
    """The API this command's flows report to: PREFECT_API_URL when set (None); else the shared
    local server under NASFLOW_PREFECT_SERVER=local (its URL, set for the block, which holds it:
    it is not idle while the block runs), else Prefect's temporary server for this process (its
    URL), or None without `temporary` (`nas serve`, whose runs are started from outside, needs a
    server they can reach: it then asks for PREFECT_API_URL)."""
    if settings.PREFECT_API_URL.value():
        yield None
        return
    if server_mode() == "local":
        with local_server(show) as url, settings.temporary_settings(updates={settings.PREFECT_API_URL: url}):
            saved = os.environ.get("PREFECT_API_URL")
            os.environ["PREFECT_API_URL"] = url  # worker processes (runner=processes, dask, ray) too
            try:
                yield url
            finally:
                if saved is None:
                    os.environ.pop("PREFECT_API_URL", None)
                else:
                    os.environ["PREFECT_API_URL"] = saved
        return
    server = start_temporary_server(show) if temporary else None
    yield None if server is None else server.api_url

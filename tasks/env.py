"""Prefect's environment for nasflow: its home and result store (the evaluation cache)
under NASFLOW_HOME, quiet logging, and the guard that stops the ephemeral API server
when `nas` dies. Set before Prefect is first imported (this package's `__init__`s)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sqlite3
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from nas.errors import InputError
from nas.home import home
from nas.lazy import LazyImport

# read when a database is checked; importing Prefect before configure_prefect_env would fix its settings
prefect_settings = LazyImport("prefect.settings")
sqlalchemy_engine = LazyImport("sqlalchemy.engine")


def configure_prefect_env() -> None:
    """Set Prefect defaults unless the user set them; call before importing prefect."""
    base = home()
    defaults = {
        "PREFECT_HOME": str(base / "prefect"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(base / "cache"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",  # Prefect's client-side telemetry (a first-run notice, then calls home), too
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        # The ephemeral server is stopped at exit while its event recorder may
        # still be flushing; it then logs CancelledError tracebacks (harmless).
        "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    for key in ("PREFECT_HOME", "PREFECT_RESULTS_LOCAL_STORAGE_PATH"):
        path = Path(os.environ[key]).expanduser().resolve()
        path.mkdir(parents=True, exist_ok=True)  # Prefect's sqlite cannot create its folder
        os.environ[key] = str(path)
    guard_ephemeral_server()
    _quiet_crash("aborted by an interrupt signal.")


class _QuietCrash(logging.Filter):
    """Drops Prefect's ERROR line "Crash detected! Execution was aborted by ..." with this `ending`
    (the run is still marked crashed): `nas` says it in one line, with what to do."""

    def __init__(self, ending: str) -> None:
        super().__init__()
        self.ending = ending

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().endswith(self.ending)


def _quiet_crash(ending: str) -> None:
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        log = logging.getLogger(name)
        if not any(isinstance(f, _QuietCrash) and f.ending == ending for f in log.filters):
            log.addFilter(_QuietCrash(ending))


def quiet_termination() -> None:
    """Drop the crash line of a SIGTERM too (Ctrl-C's always is): for a process that says in its
    own line what a SIGTERM stopped (`nas search`)."""
    _quiet_crash("aborted by a termination signal.")


def check_prefect_database() -> None:
    """On a damaged SQLite file Prefect's ephemeral server fails its start until the startup
    timeout (minutes), then says only "Timed out while attempting to connect": check the file
    first. Nothing to check with a server of the user's (PREFECT_API_URL) or another database."""
    settings = prefect_settings.get_current_settings()
    url = settings.server.database.connection_url
    url = sqlalchemy_engine.make_url(url.get_secret_value() if url is not None else "")
    if settings.api.url or not url.drivername.startswith("sqlite") or not url.database \
            or ":memory:" in str(url) or "mode=memory" in str(url):
        return
    check_sqlite(Path(url.database).expanduser())


def check_sqlite(path: Path) -> None:
    """An InputError naming `path` when it is not a sound SQLite database: its header, then
    `PRAGMA quick_check` (reads every page: well under a second for hundreds of MB).
    A missing or empty file is sound (SQLite makes a new database there); a busy or
    unopenable one is left to its user to report."""
    try:
        with path.open("rb") as f:
            header = f.read(16)
    except OSError:
        return
    problem = None
    if header and header != b"SQLite format 3\0":
        problem = "not an SQLite file"
    else:
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                rows = db.execute("PRAGMA quick_check(1)").fetchall()
            finally:
                db.close()
            if rows != [("ok",)]:
                problem = " ".join(str(rows[0][0]).split()) if rows else "quick_check failed"
        except sqlite3.OperationalError:
            return  # locked, unreadable: not damage
        except sqlite3.DatabaseError as err:
            problem = str(err)
    if problem is not None:
        raise InputError(
            f"{path}: Prefect's database is damaged ({problem}); move it aside, with any {path.name}-wal and "
            f"{path.name}-shm beside it, and run again: Prefect makes a new one (it holds Prefect's run records "
            f"only; nasflow keeps its results in the run dirs and its caches as files under {home()})")


class _GuardedPopen(subprocess.Popen):
    """Runs the command under `nas/llm/guard.py` (by path and isolated: stdlib only,
    starts fast), in its own session so a Ctrl-C aimed at `nas` does not hit it."""

    def __init__(self, args, *rest, **kwargs) -> None:  # noqa: ANN001
        guard = Path(__file__).resolve().parents[1] / "nas" / "llm" / "guard.py"  # tasks/ and nas/ side by side
        kwargs.setdefault("start_new_session", True)
        super().__init__([sys.executable, "-I", str(guard), *args], *rest, **kwargs)


def guard_ephemeral_server() -> None:
    """Prefect starts its ephemeral API server as a plain child process. A `nas`
    killed by SIGKILL, or by SIGTERM (Prefect's handler ends the process with the
    default action, so atexit never runs), left it running for good, holding the
    database and the caller's stdout/stderr (a caller waiting for EOF then hangs).
    Under the guard it stops when `nas` dies. The server module is patched when it
    is first imported (it costs seconds, and processes with PREFECT_API_URL never need it)."""
    name = "prefect.server.api.server"
    if name in sys.modules:
        _guard(sys.modules[name])
    elif not any(isinstance(f, _GuardOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _GuardOnImport(name))


def _guard(server: Any) -> None:
    if server.subprocess is subprocess:  # its `subprocess`, with Popen under the guard
        shim = types.ModuleType("subprocess")
        shim.__dict__.update(subprocess.__dict__)
        shim.__dict__["Popen"] = _GuardedPopen
        server.subprocess = shim


class _GuardOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of one module to patch it once executed."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module: types.ModuleType) -> None:
                run(module)
                _guard(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

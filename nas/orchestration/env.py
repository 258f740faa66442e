"""Prefect's environment for nasflow: its home and result store (the evaluation cache)
under NASFLOW_HOME, quiet logging, and the guard that stops the ephemeral API server
when `nas` dies. Set before Prefect is first imported (this package's `__init__`s)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

from nas.home import home


def configure_prefect_env() -> None:
    """Set Prefect defaults unless the user set them; call before importing prefect."""
    base = home()
    defaults = {
        "PREFECT_HOME": str(base / "prefect"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(base / "cache"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
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


class _GuardedPopen(subprocess.Popen):
    """Runs the command under `nas/llm/guard.py` (by path and isolated: stdlib only,
    starts fast), in its own session so a Ctrl-C aimed at `nas` does not hit it."""

    def __init__(self, args, *rest, **kwargs) -> None:  # noqa: ANN001
        guard = Path(__file__).resolve().parents[1] / "llm" / "guard.py"
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


def _guard(server: types.ModuleType) -> None:
    if server.subprocess is subprocess:  # its `subprocess`, with Popen under the guard
        shim = types.ModuleType("subprocess")
        shim.__dict__.update(subprocess.__dict__)
        shim.Popen = _GuardedPopen
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

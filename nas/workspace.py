"""Where nasflow keeps state that outlives a run: the Prefect home and its
result store (the evaluation cache). Paths are absolute because Hydra may
change the working directory."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("NASFLOW_HOME", "~/.nasflow")).expanduser().resolve()


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

"""Where nasflow keeps state that outlives a run (NASFLOW_HOME, default ~/.nasflow): the
Prefect home and result store, the knowledge store, the local LLM's log. Absolute,
because Hydra may change the working directory."""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    return Path(os.environ.get("NASFLOW_HOME", "~/.nasflow")).expanduser().resolve()

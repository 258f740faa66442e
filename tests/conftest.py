"""Shared fixtures: every test gets its own NASFLOW_HOME (Prefect home and
evaluation cache), so no test sees another's cache or the user's."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from nas.orchestration.env import configure_prefect_env

ROOT = Path(__file__).resolve().parents[1]

# Prefect reads its settings once, when first imported, and a test module may import it
# at collection: give this session (each xdist worker) a fresh home before that, so no
# cache ever carries over from another run or the user's ~/.prefect.
for _key in [k for k in os.environ if k.startswith("PREFECT_") and "TIMEOUT" not in k]:
    del os.environ[_key]
os.environ["NASFLOW_HOME"] = tempfile.mkdtemp(prefix="nasflow-tests-")
atexit.register(shutil.rmtree, os.environ["NASFLOW_HOME"], ignore_errors=True)
configure_prefect_env()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core; torch's default thread pools would then
    # oversubscribe the cores, which is far slower than one thread each.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")

NAS = [sys.executable, "-m", "nas.cli.main"]


@pytest.fixture
def nas_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["NASFLOW_HOME"] = str(tmp_path / "nasflow-home")
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def prefect_home(tmp_path: Path):
    """In-process Prefect (ephemeral server) in a home of its own."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("PREFECT_")]:
        del os.environ[key]
    os.environ["NASFLOW_HOME"] = str(tmp_path / "home")
    from nas.orchestration.env import configure_prefect_env

    configure_prefect_env()
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


def run_nas(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*NAS, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)

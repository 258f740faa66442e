"""`nas ui` where no local server runs: what it says for a server PREFECT_API_URL names, for
temporary servers (which have no UI) and with --no-start (tests/test_shared_server.py starts one)."""

from __future__ import annotations

import os
import subprocess

from conftest import NAS, ROOT


def _nas_ui(tmp_path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_", "NASFLOW_PREFECT_SERVER"))}
    env |= {"NASFLOW_HOME": str(tmp_path / "home"), **extra}
    return subprocess.run([*NAS, "ui", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_ui_of_the_server_prefect_api_url_names(tmp_path):
    out = _nas_ui(tmp_path, PREFECT_API_URL="http://10.1.2.3:4300/api")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "Prefect UI: http://10.1.2.3:4300 (the server PREFECT_API_URL names)\n"


def test_no_start_says_none_runs_and_starts_none(tmp_path):
    out = _nas_ui(tmp_path, "--no-start")
    assert out.returncode == 1 and out.stdout == "no local Prefect server runs for this NASFLOW_HOME; `nas ui` starts one\n"
    assert not (tmp_path / "home" / "prefect" / "local-server.json").exists()


def test_temporary_servers_have_no_ui_said_in_one_line(tmp_path):
    out = _nas_ui(tmp_path, NASFLOW_PREFECT_SERVER="temporary")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "nas: error: NASFLOW_PREFECT_SERVER=temporary: each command reports to a temporary Prefect server, which has "
        "no UI and stops with the command; unset NASFLOW_PREFECT_SERVER to share a local server and its UI"]

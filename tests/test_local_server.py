"""The local Prefect server `nas` commands share (flows/server.py, flows/local_server.py): the
first command starts it under NASFLOW_HOME, a later one reuses it and finds the earlier one's
runs there, its UI calls that API, and it stops itself once idle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from conftest import ROOT

PROBE = r"""
import json, sys
from tasks.env import configure_prefect_env
configure_prefect_env()  # as the CLI does: Prefect's home under NASFLOW_HOME
from prefect import flow
from prefect.client.orchestration import get_client
from flows.server import prefect_api

@flow(name="local-server-probe", persist_result=False)
def probe() -> None:
    pass

with prefect_api(show=False) as url:
    probe.with_options(flow_run_name=sys.argv[1])()
    with get_client(sync_client=True) as client:
        names = sorted(r.name for r in client.read_flow_runs())
print(json.dumps({"url": url, "names": names}))
"""


def test_the_first_command_starts_it_later_ones_reuse_it_and_it_stops_when_idle(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env |= {"NASFLOW_HOME": str(home), "NASFLOW_PREFECT_SERVER": "local", "NASFLOW_SERVER_IDLE_MINUTES": "0.4",
            "PYTHONPATH": str(ROOT)}

    def command(name: str) -> dict:
        out = subprocess.run([sys.executable, "-c", PROBE, name], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=240)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    state_file = home / "prefect" / "local-server.json"
    try:
        first = command("first")
        state = json.loads(state_file.read_text())
        second = command("second")
        assert second["url"] == first["url"] == state["url"] and json.loads(state_file.read_text())["pid"] == state["pid"]
        assert first["names"] == ["first"] and second["names"] == ["first", "second"]  # one database, both runs
        ui = httpx.get(first["url"].removesuffix("/api") + "/ui-settings", timeout=5).json()
        assert ui["api_url"].rstrip("/") == first["url"]  # its UI shows this API's runs
        deadline = time.monotonic() + 90  # 24 idle seconds, then the watchdog's next look (5 s)
        while state_file.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not state_file.exists()
        time.sleep(1)
        try:
            httpx.get(f"{first['url']}/health", timeout=2)
            stopped = False
        except httpx.HTTPError:
            stopped = True
        assert stopped
    finally:
        if state_file.exists():  # a failed assertion: stop what this test started
            os.kill(json.loads(state_file.read_text())["pid"], 15)

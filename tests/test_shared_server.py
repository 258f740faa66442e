"""The local Prefect server `nas` commands share (flows/prefect_server.py, flows/shared_server.py): the
first command starts it under NASFLOW_HOME, a later one reuses it and finds the earlier one's
runs there, its UI calls that API, and it stops itself once idle; with port 4200 taken, its
address is said where the user looks."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx

from conftest import NAS, ROOT, seed_prefect_db

PROBE = r"""
import json, sys
from tasks.env import configure_prefect_env
configure_prefect_env()  # as the CLI does: Prefect's home under NASFLOW_HOME
from prefect import flow
from prefect.client.orchestration import get_client
from flows.prefect_server import prefect_api

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


SERVE_YAML = """\
deployments:
  - name: table-search
    entrypoint: flows/entry.py:search_overrides_flow
    parameters: {{overrides: [space=nb201, evaluator=table, budget.trials=5], root: {root}}}
"""


def test_serve_and_ingest_use_the_shared_server_which_serve_keeps_from_going_idle(tmp_path):
    """`nas serve` and `nas knowledge ingest --prefect` take the shared local server as `nas search`
    does (no PREFECT_API_URL): serve starts it, holds it past its idle limit, an ingest reuses it
    (its flow run is in that server), and once serve stops the idle limit applies again."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env |= {"NASFLOW_HOME": str(home), "NASFLOW_PREFECT_SERVER": "local", "NASFLOW_SERVER_IDLE_MINUTES": "0.1",
            "PREFECT_RUNNER_POLL_FREQUENCY": "1", "PYTHONPATH": str(ROOT)}
    (tmp_path / "prefect.yaml").write_text(SERVE_YAML.format(root=tmp_path / "runs"))
    (tmp_path / "bad.jsonl").write_text("not json\n")
    state_file = home / "prefect" / "local-server.json"
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen([sys.executable, "-m", "nas.cli.main", "serve", "--file", str(tmp_path / "prefect.yaml")],
                                 cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while "serving on" not in log.read_text() and serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "serving on" in log.read_text(), log.read_text()[-2000:]
        state = json.loads(state_file.read_text())
        assert f"serving on {state['url']} " in log.read_text()
        time.sleep(6 + 2 * 5)  # past the 6 idle seconds, and two of the watchdog's looks (5 s)
        assert serve.poll() is None and json.loads(state_file.read_text())["pid"] == state["pid"]
        assert httpx.get(f"{state['url']}/health", timeout=5).status_code == 200

        ingest = subprocess.run([sys.executable, "-m", "nas.cli.main", "knowledge", "ingest", str(tmp_path / "bad.jsonl"),
                                 "--prefect", "--out", str(tmp_path / "rec")], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=240)
        assert ingest.returncode == 0, ingest.stderr[-2000:]
        assert "temporary server" not in ingest.stderr and "bad.jsonl:1: corrupt JSON line" in ingest.stderr
        runs = httpx.post(f"{state['url']}/flow_runs/filter", json={}, timeout=10).json()
        assert [r["flow_id"] for r in runs] and json.loads(state_file.read_text())["pid"] == state["pid"]
        flows = {httpx.get(f"{state['url']}/flows/{r['flow_id']}", timeout=10).json()["name"] for r in runs}
        assert "nas-knowledge-ingest" in flows

        serve.send_signal(signal.SIGTERM)
        assert serve.wait(60) == 0, log.read_text()[-2000:]
        deadline = time.monotonic() + 90  # no holder now: the idle limit, then the watchdog's next look
        while state_file.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not state_file.exists()
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        if state_file.exists():  # a failed assertion: stop what this test started
            os.kill(json.loads(state_file.read_text())["pid"], 15)


def test_with_4200_taken_the_address_is_said_in_one_line_and_named_by_the_search_and_nas_ui(tmp_path):
    """Port 4200 held (here by a bare socket; for a user, another user's server, whose UI shows that
    user's runs): the server takes another port, the command that starts it says so in one plain
    line (a status line is cut to the terminal and erased), the search ends with its run's address
    in that UI, and `nas ui` prints the address later. The run listed there is the search's one run."""
    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", 4200))
        holder.listen(1)
    except OSError:  # taken already (another server): the same case
        pass
    home = tmp_path / "home"
    seed_prefect_db(home / "prefect")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_", "NASFLOW_PREFECT_SERVER"))}
    env |= {"NASFLOW_HOME": str(home), "NASFLOW_SERVER_IDLE_MINUTES": "2", "PYTHONUNBUFFERED": "1"}
    state_file = home / "prefect" / "local-server.json"

    def nas(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*NAS, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    try:
        search = nas("search", "space=nb201", "strategy=random", "evaluator=table", "budget.trials=2",
                     f"hydra.run.dir={tmp_path / 'run'}")
        assert search.returncode == 0, search.stderr[-3000:]
        state = json.loads(state_file.read_text())
        ui = f"http://127.0.0.1:{state['port']}"
        assert state["port"] != 4200 and state["url"] == f"{ui}/api"
        said = [line for line in search.stderr.splitlines() if "port 4200" in line]
        assert said == [f"nas: port 4200 is taken, so this home's Prefect UI is at {ui} (the server on 4200 "
                        "shows other runs; `nas ui` prints the address)"]
        link = re.findall(r"^UI: (\S+)$", search.stdout, re.M)
        runs = httpx.post(f"{ui}/api/flow_runs/filter", json={}, timeout=10).json()
        assert [r["name"] for r in runs] == ["random-nb201-s0"]  # one run per search
        assert link == [f"{ui}/runs/flow-run/{runs[0]['id']}"]
        tasks = httpx.post(f"{ui}/api/task_runs/filter", json={}, timeout=10).json()
        assert len(tasks) == 2 and {t["flow_run_id"] for t in tasks} == {runs[0]["id"]}  # the run's own
        page = httpx.get(link[0], headers={"Accept": "text/html"}, timeout=10)  # as a browser asks for it
        assert page.status_code == 200 and "<!DOCTYPE html>" in page.text  # the UI's app, which shows the run
        assert httpx.get(f"{ui}/ui-settings", timeout=10).json()["api_url"].rstrip("/") == state["url"]

        for args in ((), ("--no-start",)):  # later: the address again, nothing started
            later = nas("ui", *args)
            assert later.returncode == 0, later.stderr[-2000:]
            assert later.stdout == (f"Prefect UI: {ui} (the local server nas commands share; it stops after 2 idle "
                                    "minutes)\n")
            assert "port 4200" not in later.stderr and json.loads(state_file.read_text())["pid"] == state["pid"]
    finally:
        holder.close()
        if state_file.exists():  # stop what this test started
            os.kill(json.loads(state_file.read_text())["pid"], 15)

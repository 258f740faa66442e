"""A screenshot of the Prefect UI showing what a search publishes there (flows/artifacts.py):
its report, its top trials and its progress, on the flow run's Artifacts tab.

Starts `prefect server start` on a free loopback port (with PREFECT_UI_API_URL set, as the
README's "Orchestration" section says a non-default port needs), runs a table search
against it, then has headless Chromium render the flow run's page. Debian's browser, not
Playwright's download:

    apt-get install -y chromium
    python benchmarks/ui_screenshot.py               # ~1 min; a CLI run (`nas search`)
    python benchmarks/ui_screenshot.py --deployment  # ~2 min; a deployment run, as the UI starts one
    python benchmarks/ui_screenshot.py --keep        # then leaves the server up to browse it

The CLI run writes benchmarks/results/prefect_ui_artifacts.png (the flow run's Artifacts tab)
and benchmarks/results/prefect_ui_report.png (the report artifact). --deployment serves
prefect.yaml's table-search deployment with `nas serve`, starts a run of it through the API
as the UI's "Quick run" does (its default parameters), waits for it, checks that this run (the
one the UI opens, which runs the search itself) holds the report, top trials and progress, and
writes benchmarks/results/prefect_ui_deployment_artifacts.png (that run's Artifacts tab).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from flows.deployments import load

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OVERRIDES = ["space=nb201", "strategy=random", "evaluator=table", "budget.trials=20", "runner=prefect"]
RUN_NAME = "random-nb201-s0"  # flows/search.py's run_name for these overrides
DEPLOYMENT = "table-search"  # prefect.yaml's; its default parameters run a table search
# What the UI's "Quick run" sends (ui-v2's deployment page): the deployment's default parameters.
QUICK_RUN = {"state": {"type": "SCHEDULED", "message": "Run from the Prefect UI with defaults",
                       "state_details": {"deferred": False, "untrackable_result": False, "pause_reschedule": False}}}
KINDS = ("report", "top-trials", "progress")  # flows/artifacts.py's artifact keys: <run name>-<kind>
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(api: str, server: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"ui_screenshot: prefect server exited ({server.returncode}):\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    sys.exit(f"ui_screenshot: no answer from {api}/health after {timeout:.0f}s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group (it started its own session), SIGKILL after 20 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(20)


def cli_run(api: str, env: dict[str, str], work: Path) -> str:
    """A table search through the CLI (`runner=prefect`); its flow run's id."""
    subprocess.run([sys.executable, "-m", "nas.cli.main", "search", *OVERRIDES, f"hydra.run.dir={work / 'run'}",
                    "progress=false"], env={**env, "PREFECT_API_URL": api}, cwd=work, check=True, timeout=300)
    runs = httpx.post(f"{api}/flow_runs/filter", timeout=10, json={"flow_runs": {"name": {"any_": [RUN_NAME]}}}).json()
    if not runs:
        sys.exit(f"ui_screenshot: no flow run named {RUN_NAME} on {api}")
    return runs[0]["id"]


def serve_deployment(api: str, env: dict[str, str], work: Path) -> subprocess.Popen:
    """`nas serve` of prefect.yaml's table-search alone (the others dropped), its runs under `work`;
    its output goes to work/serve.log."""
    drop = [f"{e.name}=null" for e in load() if e.name != DEPLOYMENT]
    with (work / "serve.log").open("w") as f:
        return subprocess.Popen([sys.executable, "-m", "nas.cli.main", "serve", "--limit", "1",
                                 f"{DEPLOYMENT}.parameters.root={work / 'runs'}", *drop],
                                env={**env, "PREFECT_API_URL": api}, cwd=work, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def quick_run(api: str, serving: subprocess.Popen, log: Path, timeout: float = 600) -> str:
    """Once the deployment is served, one run of it created as the UI's Quick run does, waited for
    until it completes; its flow run's id."""
    deadline = time.monotonic() + timeout

    def wait(what: str) -> None:
        if serving.poll() is not None:
            sys.exit(f"ui_screenshot: nas serve exited ({serving.returncode}):\n{log.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            sys.exit(f"ui_screenshot: {what} after {timeout:.0f}s; nas serve's log:\n{log.read_text()[-2000:]}")
        time.sleep(1)

    while not (found := httpx.post(f"{api}/deployments/filter", timeout=10,
                                   json={"deployments": {"name": {"any_": [DEPLOYMENT]}}}).json()):
        wait(f"deployment {DEPLOYMENT} not served")
    run = httpx.post(f"{api}/deployments/{found[0]['id']}/create_flow_run", json=QUICK_RUN, timeout=10)
    run.raise_for_status()
    run_id = run.json()["id"]
    while (state := httpx.get(f"{api}/flow_runs/{run_id}", timeout=10).json()["state"])["type"] not in FINAL:
        wait(f"flow run {run_id} still {state['type']}")
    if state["type"] != "COMPLETED":
        sys.exit(f"ui_screenshot: the deployment run ended {state['type']}: {state.get('message')}\n"
                 f"{log.read_text()[-2000:]}")
    return run_id


def artifacts_of(api: str, run_id: str) -> dict[str, str]:
    """The run's own artifacts, key -> id (the Artifacts tab lists these)."""
    found = httpx.post(f"{api}/artifacts/filter", timeout=10,
                       json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
    return {a["key"]: a["id"] for a in found}


def screenshot(browser: str, url: str, out: Path, size: str) -> None:
    """The UI is a JS app: the virtual-time budget lets it fetch and render before the capture."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={size}", "--virtual-time-budget=15000",
                        f"--screenshot={out}", url], check=True, capture_output=True, timeout=120)
    print(f"wrote {out.relative_to(ROOT)} ({url})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deployment", action="store_true",
                        help="a run of the served table-search deployment instead of a CLI run")
    parser.add_argument("--keep", action="store_true", help="leave the server running (Ctrl-C stops it)")
    args = parser.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("ui_screenshot: no chromium on PATH; install Debian's with `apt-get install -y chromium`")

    work = Path(tempfile.mkdtemp(prefix="nasflow-ui-"))
    port = free_port()
    base, api = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"NASFLOW_HOME": str(work / "home"), "PREFECT_HOME": str(work / "server-home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": api}
    log = work / "server.log"
    with log.open("w") as f:
        server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start",
                                   "--host", "127.0.0.1", "--port", str(port)],
                                  env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    serving = None
    try:
        wait_healthy(api, server, log)
        if args.deployment:
            serving = serve_deployment(api, env, work)
            run_id = quick_run(api, serving, work / "serve.log")
        else:
            run_id = cli_run(api, env, work)
        run = httpx.get(f"{api}/flow_runs/{run_id}", timeout=10).json()
        artifacts = artifacts_of(api, run_id)
        print(f"flow run {run['name']} ({run_id}, deployment {run.get('deployment_id')}, "
              f"parent task run {run.get('parent_task_run_id')}): artifacts {sorted(artifacts)}")
        missing = [kind for kind in KINDS if f"{run['name']}-{kind}" not in artifacts]
        if missing:
            sys.exit(f"ui_screenshot: flow run {run['name']} holds no {', '.join(missing)} artifact")
        RESULTS.mkdir(parents=True, exist_ok=True)
        tab = f"{base}/v2/runs/flow-run/{run_id}?tab=Artifacts"
        if args.deployment:
            screenshot(browser, tab, RESULTS / "prefect_ui_deployment_artifacts.png", "1600,1000")
        else:
            screenshot(browser, tab, RESULTS / "prefect_ui_artifacts.png", "1600,1000")
            screenshot(browser, f"{base}/v2/artifacts/artifact/{artifacts[f'{RUN_NAME}-report']}",
                       RESULTS / "prefect_ui_report.png", "1800,1500")
        if args.keep:
            print(f"UI: {tab}  (Ctrl-C stops the server)")
            server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        for proc in (serving, server):
            if proc is not None:
                stop(proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

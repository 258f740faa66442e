"""A screenshot of the Prefect UI showing what a search publishes there (flows/artifacts.py):
its report, its top trials and its progress, on the flow run's Artifacts tab.

Starts `prefect server start` on a free loopback port (with PREFECT_UI_API_URL set, as the
README's "Orchestration" section says a non-default port needs), runs a table search
against it through the real CLI, then has headless Chromium render the flow run's page
and the report artifact's page. Debian's browser, not Playwright's download:

    apt-get install -y chromium
    python benchmarks/ui_screenshot.py            # ~1 min; writes the PNGs below
    python benchmarks/ui_screenshot.py --keep     # then leaves the server up to browse it

Writes benchmarks/results/prefect_ui_artifacts.png (the flow run's Artifacts tab) and
benchmarks/results/prefect_ui_report.png (the report artifact).
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

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OVERRIDES = ["space=nb201", "strategy=random", "evaluator=table", "budget.trials=20", "runner=prefect"]
RUN_NAME = "random-nb201-s0"  # flows/search.py's run_name for these overrides


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


def screenshot(browser: str, url: str, out: Path, size: str) -> None:
    """The UI is a JS app: the virtual-time budget lets it fetch and render before the capture."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={size}", "--virtual-time-budget=15000",
                        f"--screenshot={out}", url], check=True, capture_output=True, timeout=120)
    print(f"wrote {out.relative_to(ROOT)} ({url})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    try:
        wait_healthy(api, server, log)
        run_dir = work / "run"
        subprocess.run([sys.executable, "-m", "nas.cli.main", "search", *OVERRIDES, f"hydra.run.dir={run_dir}",
                        "progress=false"], env={**env, "PREFECT_API_URL": api}, cwd=work, check=True, timeout=300)
        runs = httpx.post(f"{api}/flow_runs/filter", timeout=10,
                          json={"flow_runs": {"name": {"any_": [RUN_NAME]}}}).json()
        if not runs:
            sys.exit(f"ui_screenshot: no flow run named {RUN_NAME} on {api}")
        run_id = runs[0]["id"]
        artifacts = httpx.post(f"{api}/artifacts/filter", timeout=10,
                               json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()
        report = next(a["id"] for a in artifacts if a["key"] == f"{RUN_NAME}-report")
        RESULTS.mkdir(parents=True, exist_ok=True)
        screenshot(browser, f"{base}/v2/runs/flow-run/{run_id}?tab=Artifacts",
                   RESULTS / "prefect_ui_artifacts.png", "1600,1000")
        screenshot(browser, f"{base}/v2/artifacts/artifact/{report}", RESULTS / "prefect_ui_report.png", "1800,1500")
        if args.keep:
            print(f"UI: {base}/v2/runs/flow-run/{run_id}?tab=Artifacts  (Ctrl-C stops the server)")
            server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

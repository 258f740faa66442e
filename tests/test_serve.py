"""`nas serve` and the flows it serves: the deployment list and its one-line errors,
a deployment run end to end against a real `prefect server`, and the supernet
flow's cache, which must not outlive its checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import NAS, ROOT, run_nas, seed_prefect_db

PREFECT = str(Path(sys.executable).parent / "prefect")
OVERRIDES = ["space=nb201", "strategy=random", "evaluator=table", "budget.trials=5"]

SERVE_YAML = """\
limit: 1
deployments:
  table-search:
    flow: nas.orchestration.flows.entry:search_overrides_flow
    parameters:
      overrides: [space=nb201, strategy=rea, evaluator=table, budget.trials=50]
      root: {root}
"""


def test_list_shows_full_names_and_schedules(nas_env, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE_YAML.format(root=tmp_path / "runs"))
    out = run_nas(["serve", "--config", str(config), "--list"], nas_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nas-search-overrides/table-search" in out.stdout and "on demand" in out.stdout
    default = run_nas(["serve", "--list"], nas_env, timeout=120)
    assert default.returncode == 0, default.stderr
    for name in ("nas-search-overrides/table-search", "nas-train-supernet/train-supernet",
                 "nas-ingest-overrides/knowledge-ingest", "nightly-regression"):
        assert name in default.stdout
    assert "0 3 * * *" in default.stdout


@pytest.mark.parametrize("args, env_extra, message", [
    (["deployments.table-search.cron=xx"], {}, "deployment 'table-search': invalid cron 'xx'"),
    (["deployments.table-search.parameters.seed=1"], {}, "deployment 'table-search': parameters:"),
    ([], {}, "PREFECT_API_URL is not set; start a server with `prefect server start --host 127.0.0.1`"),
    ([], {"PREFECT_API_URL": "http://127.0.0.1:9/api"}, "no Prefect server answers at http://127.0.0.1:9/api"),
])
def test_serve_fails_in_one_line(nas_env, tmp_path, args, env_extra, message):
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE_YAML.format(root=tmp_path / "runs"))
    out = run_nas(["serve", "--config", str(config), *args], {**nas_env, **env_extra}, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith(f"nas: error: {message}") and out.stderr.count("\n") == 1, out.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """In its own session, so that it and everything it spawns can be killed as a group."""
    with log.open("w") as f:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _stop(proc: subprocess.Popen, grace: float = 20) -> None:
    """SIGTERM, then SIGKILL to the whole group; waits until no member is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 10
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _start_server(home: Path, env: dict[str, str], **extra: str) -> tuple[subprocess.Popen, str]:
    """A real `prefect server` on a free port, healthy (its scheduler services off): (process, api url).
    Its home and log live under `home`; `extra` adds environment (e.g. PREFECT_UI_API_URL)."""
    import httpx

    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    server_env = {**env, "PREFECT_HOME": str(home / "server-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                  **{f"PREFECT_SERVER_SERVICES_{s}_ENABLED": "false" for s in ("SCHEDULER", "LATE_RUNS", "FOREMAN")},
                  **{k: v.format(api=api) for k, v in extra.items()}}

    def healthy() -> bool:
        try:
            return httpx.get(f"{api}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    seed_prefect_db(home / "server-home")
    server = _start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], server_env,
                    home / "server.log")
    try:
        _wait_for(healthy, "the server's /api/health", 150, {"prefect server": (server, home / "server.log")})
    except BaseException:
        _stop(server)
        raise
    return server, api


def _wait_for(check, what: str, timeout: float, procs: dict[str, tuple[subprocess.Popen, Path]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, (proc, log) in procs.items():
            if proc.poll() is not None:
                pytest.fail(f"{name} exited ({proc.returncode}) waiting for {what}:\n{log.read_text()[-3000:]}")
        if check():
            return
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


@pytest.mark.parametrize("override, message", [
    ("strategy.bogus=1", "unknown key 'strategy.bogus' (valid keys of strategy: name, population_size"),
    ("space=nb202", "unknown space 'nb202' (valid: "),
    ("+seed=1", "'seed' is already in the config: write seed=1"),
])
def test_deployment_run_checks_overrides_as_nas_search_does(prefect_home, tmp_path, override, message):
    """The overrides flow's checks are `nas search`'s (nas/config.py): a typo fails the run
    in one line before any run dir exists."""
    from nas.errors import ConfigError
    from nas.orchestration.flows.entry import search_overrides_flow

    with pytest.raises(ConfigError) as err:
        search_overrides_flow.fn(["space=nb201", override], root=str(tmp_path / "runs"))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_failed_deployment_run_removes_its_run_dir_only_while_empty(prefect_home, tmp_path, monkeypatch):
    """A run that fails in `execute` leaves no empty ROOT/<name> behind, and never removes one with files."""
    import nas.orchestration.flows.entry as entry
    from nas.errors import NasError

    runs, missing = tmp_path / "runs", tmp_path / "none.pt"
    job = ["space=nb201", "strategy=random", "evaluator=supernet", f"evaluator.checkpoint={missing}",
           "runner=local"]
    with pytest.raises(NasError, match=str(missing)):
        entry.search_overrides_flow(job, root=str(runs))
    assert list(runs.iterdir()) == []

    def fails_after_mkdir(spec, run_dir, runner, progress):
        run_dir.mkdir(parents=True, exist_ok=True)
        raise NasError("failed at start")

    monkeypatch.setattr(entry, "execute", fails_after_mkdir)
    given, kept = tmp_path / "given", tmp_path / "kept"  # hydra.run.dir=: removed only if this run made it
    kept.mkdir()
    for run_dir in (given, kept):
        with pytest.raises(NasError, match="failed at start"):
            entry.search_overrides_flow([*job, f"hydra.run.dir={run_dir}"], root=str(runs))
    assert not given.exists() and kept.is_dir()

    def fails_after_writing(spec, run_dir, runner, progress):
        (run_dir / "search.log").write_text("started\n")
        raise NasError("failed mid-run")

    monkeypatch.setattr(entry, "execute", fails_after_writing)
    with pytest.raises(NasError, match="failed mid-run"):
        entry.search_overrides_flow(job, root=str(runs))
    assert sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*")) == [
        "random-nb201-s0", "random-nb201-s0/.lock", "random-nb201-s0/search.log"]


@pytest.mark.slow
def test_serve_runs_a_deployment_against_a_real_server(nas_env, tmp_path):
    import httpx

    server, api = _start_server(tmp_path, nas_env, PREFECT_UI_ENABLED="false")
    client_env = {**nas_env, "PREFECT_API_URL": api, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    config = tmp_path / "serve.yaml"
    config.write_text(SERVE_YAML.format(root=tmp_path / "runs"))

    def ok(path: str) -> bool:
        try:
            return httpx.get(f"{api}{path}", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    serve = None
    try:
        procs = {"prefect server": (server, tmp_path / "server.log")}
        serve = _start([*NAS, "serve", "--config", str(config)], client_env, tmp_path / "serve.log")
        procs["nas serve"] = (serve, tmp_path / "serve.log")
        _wait_for(lambda: ok("/deployments/name/nas-search-overrides/table-search"), "the deployment", 120, procs)

        # The README's command: the run's overrides replace the deployment's default ones; the
        # run and its dir are then named after the search, whatever name the run started with.
        run = subprocess.run(
            [PREFECT, "deployment", "run", "nas-search-overrides/table-search",
             "--param", f"overrides={json.dumps(OVERRIDES)}", "--flow-run-name", "served-1",
             "--watch", "--watch-interval", "1", "--watch-timeout", "150"],
            env={**client_env, "PREFECT_HOME": str(tmp_path / "cli-home")}, cwd=ROOT,
            capture_output=True, text=True, timeout=200)
        assert run.returncode == 0 and "Completed" in run.stdout, \
            run.stdout[-2000:] + run.stderr[-2000:] + (tmp_path / "serve.log").read_text()[-3000:]
        summary = json.loads((tmp_path / "runs" / "random-nb201-s0" / "summary.json").read_text())
        assert summary["trials"] == 5 and summary["strategy"] == "random" and summary["runner"] == "prefect"
        named = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": ["random-nb201-s0"]}}},
                           timeout=10).json()
        assert sorted(r["deployment_id"] is None for r in named) == [False, True]  # the deployment's run, its search

        serve.send_signal(signal.SIGTERM)  # the clean path: runs cancelled, schedules paused, exit 0
        assert serve.wait(30) == 0
        assert (tmp_path / "serve.log").read_text().rstrip().endswith("nas serve: stopped")
    finally:
        for proc in (serve, server):
            if proc is not None:
                _stop(proc)
    assert not _group_alive(server.pid) and not _group_alive(serve.pid), "orphan processes left"


@pytest.mark.slow
def test_supernet_flow_is_cached_while_its_checkpoint_exists(prefect_home, monkeypatch):
    import nas.supernets.train
    from nas.orchestration.flows.supernet import train_supernet_flow
    from nas.supernets.train import TrainedSupernet

    trained = []

    def fake_train(space, params, data, settings, seed, out_dir, progress=True):
        trained.append(settings.epochs)
        path = Path(out_dir) / "supernet.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"weights")
        return TrainedSupernet(path, hashlib.sha256(b"weights").hexdigest(), 50.0, 10.0, 1, 0.1)

    monkeypatch.setattr(nas.supernets.train, "train_supernet", fake_train)
    out = prefect_home / "sn"
    overrides = ["space=nb201", "data=digits", "supernet.epochs=1", f"out={out}"]
    first = train_supernet_flow(overrides)
    assert not first["cached"] and first["path"] == str(out / "supernet.pt")
    assert train_supernet_flow(overrides)["cached"]
    assert not train_supernet_flow([*overrides[:-2], "supernet.epochs=2", f"out={out}"])["cached"]
    (out / "supernet.pt").unlink()
    assert not train_supernet_flow(overrides)["cached"]  # the cache entry outlived its checkpoint
    assert (out / "supernet.pt").exists() and trained == [1, 2, 1]

"""prefect.yaml's deployments and the flows they run: `nas serve`'s deployment list and its
one-line errors, a deployment run end to end against a real `prefect server` both served by
`nas serve` and deployed by `prefect deploy --all` to a process work pool and run by a worker,
and the supernet flow's cache, which must not outlive its checkpoint."""

from __future__ import annotations

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
from support.supernet_training import fake_supernet_training

PREFECT = str(Path(sys.executable).parent / "prefect")
OVERRIDES = ["space=nb201", "strategy=random", "evaluator=table", "budget.trials=5"]

PREFECT_YAML = """\
name: test
deployments:
  - name: table-search
    entrypoint: flows/entry.py:search_overrides_flow
    parameters:
      overrides: [space=nb201, strategy=rea, evaluator=table, budget.trials=50]
      root: {root}
    work_pool: {{name: nasflow-process}}
"""
DEPLOYMENTS = {"nas-search-overrides/table-search", "nas-search-overrides/design-search",
               "nas-train-supernet/train-supernet", "nas-search-overrides/supernet-search",
               "nas-ingest-overrides/knowledge-ingest", "nas-regression/nightly-regression"}


def test_list_shows_full_names_and_schedules(nas_env, tmp_path):
    config = tmp_path / "prefect.yaml"
    config.write_text(PREFECT_YAML.format(root=tmp_path / "runs"))
    out = run_nas(["serve", "--file", str(config), "--list"], nas_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nas-search-overrides/table-search" in out.stdout and "on demand" in out.stdout
    assert "limit: 2 flow runs at once" in out.stdout
    default = run_nas(["serve", "--list", "--limit", "none", "table-search.cron=0 * * * *", "design-search=null"],
                      nas_env, timeout=120)  # the repo's prefect.yaml
    assert default.returncode == 0, default.stderr
    listed = {line for line in default.stdout.splitlines() if not line.startswith((" ", "limit"))}
    assert listed == DEPLOYMENTS - {"nas-search-overrides/design-search"}
    assert "schedule: 0 3 * * * (UTC)" in default.stdout and "schedule: 0 * * * * (UTC)" in default.stdout
    assert "limit: none" in default.stdout


@pytest.mark.parametrize("args, env_extra, message", [
    (["table-search.cron=xx"], {}, "deployment 'table-search': invalid cron 'xx'"),
    (["table-search.schedules=[{cron: '0 3 * * *', timezone: Mars/Base}]"], {},
     "deployment 'table-search': invalid timezone 'Mars/Base'"),
    (["table-search.schedules=[{cron: '0 3 * * *', every: 2}]"], {},
     "deployment 'table-search': schedule: unknown key 'every' (valid: cron, timezone, active)"),
    (["table-search.parameters.seed=1"], {}, "deployment 'table-search': parameters:"),
    (["table-search.flow=flows.entry:search_overrides_flow"], {},
     "deployment 'table-search': unknown key 'flow' (valid: name, entrypoint, "),
    (["table-search.entrypoint=flows.entry:search_overrides_flow"], {},
     "deployment 'table-search': entrypoint must be 'path/to/file.py:flow_function', got 'flows.entry:"),
    (["table-search.entrypoint=flows/entry.py:nope"], {},
     "deployment 'table-search': cannot import flows/entry.py:nope (module 'flows.entry' has no attribute 'nope')"),
    (["tablesearch.cron=0 3 * * *"], {}, "override 'tablesearch.cron=0 3 * * *': no deployment 'tablesearch' "
                                         "(valid: table-search)"),
    (["table-search=null"], {}, "prefect.yaml: no deployments"),
    (["table-search.parameters=[1"], {}, "override 'table-search.parameters=[1': not valid YAML (expected ',' or ']'"),
    ([], {}, "PREFECT_API_URL is not set; start a server with `prefect server start --host 127.0.0.1`"),
    ([], {"PREFECT_API_URL": "http://127.0.0.1:9/api"}, "no Prefect server answers at http://127.0.0.1:9/api"),
])
def test_serve_fails_in_one_line(nas_env, tmp_path, args, env_extra, message):
    config = tmp_path / "prefect.yaml"
    config.write_text(PREFECT_YAML.format(root=tmp_path / "runs"))
    out = run_nas(["serve", "--file", str(config), *args], {**nas_env, **env_extra}, timeout=120)
    assert out.returncode == 2
    message = message.replace("prefect.yaml:", f"{config}:")
    assert out.stderr.startswith(f"nas: error: {message}") and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("text, message", [
    ("deployments: {}", "{path}: 'deployments' must be a list of deployments"),
    ("limit: 2\ndeployments: []", "{path}: unknown key 'limit' (valid: name, prefect-version, build, push, pull, "),
    ("deployments:\n  - entrypoint: flows/entry.py:search_overrides_flow", "{path}: deployments[0] needs a name"),
    ("deployments:\n  - {name: a, entrypoint: 'flows/entry.py:search_overrides_flow'}\n"
     "  - {name: a, entrypoint: 'flows/entry.py:search_overrides_flow'}", "{path}: deployment 'a' is declared twice"),
    ("deployments:\n  - {name: a, entrypoint: 'flows/entry.py:search_overrides_flow', schedules: {cron: x}}",
     "deployment 'a': schedules must be a list of {{cron: ..., timezone: UTC}}"),
    ("deployments:\n  - name: a\n   x: 1", "{path}: not valid YAML (expected <block end>, but found '<block mapping start>' "
                                           "on line 3)"),
])
def test_a_malformed_prefect_yaml_fails_in_one_line(prefect_home, tmp_path, text, message):
    from flows.deployments import load
    from nas.errors import ConfigError

    path = tmp_path / "prefect.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load(path)
    assert str(err.value).startswith(message.format(path=path)) and "\n" not in str(err.value), str(err.value)


def test_the_repo_prefect_yaml_is_what_nas_serve_serves(prefect_home):
    """One declaration: the repo's prefect.yaml, in Prefect's format, every deployment to the process pool."""
    import yaml

    from flows.deployments import PROJECT_FILE, build, load

    assert PROJECT_FILE == ROOT / "prefect.yaml"
    raw = yaml.safe_load(PROJECT_FILE.read_text())
    assert raw["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ project-dir.stdout }}"}}]
    assert {d["work_pool"]["name"] for d in raw["deployments"]} == {"nasflow-process"}
    built = [build(entry) for entry in load()]
    assert {f"{d.flow_name}/{d.name}" for d in built} == DEPLOYMENTS
    crons = {d.name: [(s.schedule.cron, s.schedule.timezone) for s in d.schedules] for d in built}
    assert crons["nightly-regression"] == [("0 3 * * *", "UTC")]
    assert all(not c for name, c in crons.items() if name != "nightly-regression")


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
    ("strategy.bogus=1", "unknown key 'strategy.bogus' (valid keys of strategy: name, n_init, pool"),
    ("space=nb202", "unknown space 'nb202' (valid: "),
    ("+seed=1", "'seed' is already in the config: write seed=1"),
])
def test_deployment_run_checks_overrides_as_nas_search_does(prefect_home, tmp_path, override, message):
    """The overrides flow's checks are `nas search`'s (nas/config.py): a typo fails the run
    in one line before any run dir exists."""
    from flows.entry import search_overrides_flow
    from nas.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        search_overrides_flow.fn(["space=nb201", override], root=str(tmp_path / "runs"))
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_failed_deployment_run_removes_its_run_dir_only_while_empty(prefect_home, tmp_path, monkeypatch):
    """A run that fails building its parts or in `run_session` leaves no empty ROOT/<name> behind, and
    never removes one with files."""
    import flows.entry as entry
    from nas.errors import NasError

    runs, missing = tmp_path / "runs", tmp_path / "none.pt"
    job = ["space=nb201", "strategy=random", "evaluator=supernet", f"evaluator.checkpoint={missing}",
           "runner=local"]
    with pytest.raises(NasError, match=str(missing)):
        entry.search_overrides_flow(job, root=str(runs))
    assert list(runs.iterdir()) == []
    job = ["space=nb201", "strategy=random", "runner=local"]  # one that builds: what fails below is the run

    def fails_at_start(session, runner, progress):
        assert session.run.path.is_dir()  # made by its lock
        raise NasError("failed at start")

    monkeypatch.setattr(entry, "run_session", fails_at_start)
    given, kept = tmp_path / "given", tmp_path / "kept"  # hydra.run.dir=: removed only if this run made it
    kept.mkdir()
    for run_dir in (given, kept):
        with pytest.raises(NasError, match="failed at start"):
            entry.search_overrides_flow([*job, f"hydra.run.dir={run_dir}"], root=str(runs))
    assert not given.exists() and kept.is_dir()

    def fails_after_writing(session, runner, progress):
        (session.run.path / "search.log").write_text("started\n")
        raise NasError("failed mid-run")

    monkeypatch.setattr(entry, "run_session", fails_after_writing)
    with pytest.raises(NasError, match="failed mid-run"):
        entry.search_overrides_flow(job, root=str(runs))
    assert sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*")) == [
        "random-nb201-s0", "random-nb201-s0/.lock", "random-nb201-s0/search.log"]


@pytest.mark.slow
def test_serve_runs_a_deployment_against_a_real_server(nas_env, tmp_path):
    import httpx

    server, api = _start_server(tmp_path, nas_env, PREFECT_UI_ENABLED="false")
    client_env = {**nas_env, "PREFECT_API_URL": api, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    config = tmp_path / "prefect.yaml"
    config.write_text(PREFECT_YAML.format(root=tmp_path / "runs"))

    def ok(path: str) -> bool:
        try:
            return httpx.get(f"{api}{path}", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    serve = None
    try:
        procs = {"prefect server": (server, tmp_path / "server.log")}
        serve = _start([*NAS, "serve", "--file", str(config), "--limit", "1"], client_env, tmp_path / "serve.log")
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
        assert [r["deployment_id"] is None for r in named] == [False]  # one run: the deployment's is the search

        serve.send_signal(signal.SIGTERM)  # the clean path: runs cancelled, schedules paused, exit 0
        assert serve.wait(30) == 0
        assert (tmp_path / "serve.log").read_text().rstrip().endswith("nas serve: stopped")
    finally:
        for proc in (serve, server):
            if proc is not None:
                _stop(proc)
    assert not _group_alive(server.pid) and not _group_alive(serve.pid), "orphan processes left"


@pytest.mark.slow
def test_prefect_deploy_all_to_a_process_pool_and_a_worker_runs_the_table_search(nas_env, tmp_path):
    """The repo's prefect.yaml as Prefect itself reads it: `prefect deploy --all` (from the repo root)
    to a process work pool, a run of table-search, and a worker that runs it to completion in the
    project dir (the pull step) with the run's parameters."""
    import httpx

    server, api = _start_server(tmp_path, nas_env, PREFECT_UI_ENABLED="false")
    env = {**nas_env, "PREFECT_API_URL": api, "PREFECT_HOME": str(tmp_path / "cli-home"),
           "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(tmp_path / "results"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_LOGGING_LEVEL": "INFO"}
    declared = (ROOT / "prefect.yaml").read_bytes()
    runs, worker = tmp_path / "runs", None

    def cli(*args: str, timeout: float = 180) -> str:
        out = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"prefect {' '.join(args)}:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
        return out.stdout

    try:
        cli("work-pool", "create", "nasflow-process", "--type", "process")
        cli("deploy", "--all", "--no-prompt", timeout=300)
        deployments = httpx.post(f"{api}/deployments/filter", json={}, timeout=10).json()
        flows = {f["id"]: f["name"] for f in httpx.post(f"{api}/flows/filter", json={}, timeout=10).json()}
        assert {f"{flows[d['flow_id']]}/{d['name']}" for d in deployments} == DEPLOYMENTS
        assert {d["work_pool_name"] for d in deployments} == {"nasflow-process"}
        assert all(d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}]
                   for d in deployments)
        nightly = next(d for d in deployments if d["name"] == "nightly-regression")
        assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in nightly["schedules"]] == [("0 3 * * *", "UTC")]

        cli("deployment", "run", "nas-search-overrides/table-search", "--param", f"overrides={json.dumps(OVERRIDES)}",
            "--param", f"root={runs}")
        worker = _start([PREFECT, "worker", "start", "--pool", "nasflow-process", "--run-once", "--limit", "1"],
                        env, tmp_path / "worker.log")
        try:  # --run-once --limit 1: it exits once the run it picked up has finished
            worker.wait(300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not finish the run in 300 s:\n{(tmp_path / 'worker.log').read_text()[-3000:]}")
        table = next(d for d in deployments if d["name"] == "table-search")
        flow_runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [table["id"]]}}},
                               timeout=10).json()
        log = (tmp_path / "worker.log").read_text()[-3000:]
        assert [(r["name"], r["state_type"]) for r in flow_runs] == [("random-nb201-s0", "COMPLETED")], log
        summary = json.loads((runs / "random-nb201-s0" / "summary.json").read_text())
        assert summary["trials"] == 5 and summary["strategy"] == "random", summary
        assert (ROOT / "prefect.yaml").read_bytes() == declared  # deploying left the declaration as it was
    finally:
        for proc in (worker, server):
            if proc is not None:
                _stop(proc)
    assert not _group_alive(server.pid) and (worker is None or not _group_alive(worker.pid)), "orphan processes left"


@pytest.mark.slow
def test_supernet_flow_is_cached_while_its_checkpoint_exists(prefect_home, monkeypatch):
    from flows.supernet import train_supernet_flow

    trained = fake_supernet_training(monkeypatch)
    out = prefect_home / "sn"
    overrides = ["space=nb201", "data=digits", "supernet.epochs=1", f"out={out}"]
    first = train_supernet_flow(overrides)
    assert not first["cached"] and first["path"] == str(out / "supernet.pt")
    assert train_supernet_flow(overrides)["cached"]
    assert not train_supernet_flow([*overrides[:-2], "supernet.epochs=2", f"out={out}"])["cached"]
    (out / "supernet.pt").unlink()
    assert not train_supernet_flow(overrides)["cached"]  # the cache entry outlived its checkpoint
    assert (out / "supernet.pt").exists() and trained == [1, 2, 1]

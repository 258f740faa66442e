"""The warm `nas search` (nas/cli/warm.py, nas/cli/warm_server.py): one fingerprint per interpreter, path, environment and
code, each input varied alone; a strict request parser; the caller exits as the child did; and the
real command served by a real warm process: its output, its exit statuses, a Ctrl-C forwarded, a
killed caller's child stopped, a malformed request refused while the next command is served."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nas.cli import warm, warm_server

ROOT = Path(__file__).resolve().parents[1]


def _tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for name in ("nas", "flows"):
        (root / name / "__pycache__").mkdir(parents=True)
        (root / name / "a.py").write_text("x = 1\n")
    return root


def test_the_fingerprint_follows_each_input_alone(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    env = {"NASFLOW_HOME": "/h", "PREFECT_API_URL": "", "LANG": "C.UTF-8"}
    base = warm.fingerprint(env, root)
    assert warm.fingerprint(dict(env), root) == base
    assert warm.fingerprint(env | {"NASFLOW_HOME": "/other"}, root) != base
    assert warm.fingerprint(env | {"PREFECT_LOGGING_LEVEL": "DEBUG"}, root) != base  # a variable added
    assert warm.fingerprint({k: v for k, v in env.items() if k != "LANG"}, root) != base  # one removed
    for name, patched in (("executable", "/other/python"), ("path", [*sys.path, "/other/path"]),
                          ("version", "3.99"), ("flags", "other flags")):
        with monkeypatch.context() as patch:
            patch.setattr(sys, name, patched)
            assert warm.fingerprint(env, root) != base, name
    steps = {"a file's size": lambda: (root / "nas" / "a.py").write_text("x = 22\n"),
             "a file's mtime alone": lambda: os.utime(root / "flows" / "a.py", ns=(1, 1)),
             "a new file": lambda: (root / "flows" / "b.py").write_text(""),
             "a file removed": lambda: (root / "nas" / "a.py").unlink()}
    for name, step in steps.items():
        before = warm.fingerprint(env, root)
        step()
        assert warm.fingerprint(env, root) != before, name


def test_the_fingerprint_ignores_shell_state_caches_and_the_working_directory(tmp_path, monkeypatch):
    root = _tree(tmp_path)
    env = {"NASFLOW_HOME": "/h"}
    base = warm.fingerprint(env, root)
    for name in sorted(warm.VOLATILE):
        assert warm.fingerprint(env | {name: "anything"}, root) == base, name
    (root / "nas" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"code")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(sys, "path", [str(work), *sys.path])
    base = warm.fingerprint(env, root)
    (work / "run-dir").mkdir()  # a search's run dir in the working directory on the path
    assert warm.fingerprint(env, root) == base


def test_an_installed_package_changes_the_fingerprint(tmp_path, monkeypatch):
    site = tmp_path / "lib" / "site-packages"
    site.mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    root = _tree(tmp_path)
    base = warm.fingerprint({}, root)
    os.utime(site, ns=(5, 5))
    assert warm.fingerprint({}, root) != base


def test_the_address_follows_home_and_fingerprint():
    a = warm.address(Path("/h"), "f")
    assert a.startswith(b"\0") and a == warm.address(Path("/h"), "f")
    assert len({a, warm.address(Path("/g"), "f"), warm.address(Path("/h"), "g")}) == 3


@pytest.mark.parametrize("argv, env, platform, expected", [
    (["search"], {}, "linux", True),
    (["search", "seed=1"], {"NASFLOW_PREFECT_SERVER": "local", "NASFLOW_WARM": "1"}, "linux", True),
    (["search"], {"NASFLOW_WARM": "0"}, "linux", False),
    (["search"], {"NASFLOW_WARM": " 0 "}, "linux", False),
    (["search"], {"NASFLOW_PREFECT_SERVER": "temporary"}, "linux", False),
    (["compare", "runs"], {}, "linux", False),
    ([], {}, "linux", False),
    (["search"], {}, "darwin", False),
])
def test_only_searches_with_the_shared_server_on_linux_run_warm(argv, env, platform, expected, monkeypatch):
    monkeypatch.setattr(sys, "platform", platform)
    assert warm.enabled(argv, env) is expected


def _request(**changes):
    stream = {"encoding": "utf-8", "errors": "strict", "line_buffering": False}
    return {"argv": ["search"], "argv0": "nas", "cwd": "/", "env": {"A": "1"}, "umask": 0o022,
            "stdio": [dict(stream), dict(stream), dict(stream)]} | changes


@pytest.mark.parametrize("change", [
    {"argv": "search"}, {"argv": ["search", 1]}, {"argv0": None}, {"cwd": 1}, {"env": []},
    {"env": {"A": 1}}, {"umask": True}, {"umask": -1}, {"umask": 0o1000}, {"umask": 18.0},
    {"stdio": []}, {"stdio": [{}, {}, {}]}, {"extra": 1},
    {"stdio": [{"encoding": "utf-8", "errors": "strict", "line_buffering": 1}] * 3},
])
def test_a_request_of_the_wrong_shape_is_refused(change):
    with pytest.raises(ValueError, match="request"):
        warm_server.parse_request(_request(**change))


def test_a_well_formed_request_is_taken_at_its_bounds():
    for umask in (0, 0o777):
        assert warm_server.parse_request(_request(umask=umask))["umask"] == umask
    missing = _request()
    del missing["cwd"]
    with pytest.raises(ValueError, match="keys"):
        warm_server.parse_request(missing)


@pytest.mark.parametrize("done, status, said", [
    ({"exit": 0}, 0, False), ({"exit": 2}, 2, False), ({"exit": 255}, 255, False), ({"exit": 1}, 1, False),
    ({"exit": 256}, 1, True), ({"exit": -1}, 1, True), ({"exit": True}, 1, True), ({"exit": 1, "more": 0}, 1, True),
    ({"signal": 0}, 1, True), ({"signal": "9"}, 1, True), (None, 1, True), ([], 1, True),
])
def test_the_caller_exits_with_the_child_s_status_or_one_with_a_line(done, status, said, capsys):
    assert warm._status(done) == status
    assert ("without its exit status" in capsys.readouterr().err) is said


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_a_child_killed_by_a_signal_kills_its_caller_by_it(sig):
    program = f"from nas.cli import warm; warm._status({{'signal': {int(sig)}}})"
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, timeout=30, capture_output=True)
    assert proc.returncode == -sig and proc.stderr == b"" 


# ---- a real warm process --------------------------------------------------------------------------


NAS = Path(sys.executable).parent / "nas"  # the console script: one import path from any directory


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A warm process for this module's commands, started as users get one (by a cold search), its
    home, env and log; it stops once the home is removed."""
    home = tmp_path_factory.mktemp("warm") / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "NASFLOW_"))}
    env |= {"NASFLOW_HOME": str(home), "NASFLOW_WARM": "1", "NASFLOW_PREFECT_SERVER": "local",
            "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cold = _nas(env, ROOT, "search", "--cfg", "job")
    assert cold.returncode == 0, cold.stderr
    log = home / warm.LOG
    deadline = time.monotonic() + 120
    while "serving" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.2)
    yield home, env, log
    shutil.rmtree(home, ignore_errors=True)


def _children(log: Path) -> int:
    return sum(" pid " in line and ": nas " in line for line in log.read_text().splitlines())


def _nas(env, cwd, *argv, **kwargs):
    return subprocess.run([str(NAS), *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, **kwargs)


def test_a_warm_command_prints_and_exits_as_a_cold_one(served, tmp_path):
    home, env, log = served
    before = _children(log)
    warm_job = _nas(env, ROOT, "search", "--cfg", "job")
    cold_job = _nas(env | {"NASFLOW_WARM": "0"}, ROOT, "search", "--cfg", "job")
    assert _children(log) == before + 1  # the first ran in a warm child, the second did not
    assert warm_job.returncode == cold_job.returncode == 0
    assert warm_job.stdout == cold_job.stdout and "space:" in warm_job.stdout
    refused = _nas(env, ROOT, "search", "budget.trialz=3")
    assert _children(log) == before + 2
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("nas: error: unknown key 'budget.trialz'") and refused.stderr.count("\n") == 1


def test_the_child_works_in_the_caller_s_directory_environment_and_umask(served, tmp_path):
    home, env, log = served
    run = tmp_path / "run"
    before = _children(log)
    proc = _nas(env, tmp_path, "search", "space=nb201", "evaluator=table", "runner=local", "budget.trials=3",
                "progress=false", "hydra.run.dir=run", preexec_fn=lambda: os.umask(0o077))
    assert proc.returncode == 0, proc.stderr
    assert _children(log) == before + 1
    assert len((run / "history.jsonl").read_text().splitlines()) == 3
    assert (run / "history.jsonl").stat().st_mode & 0o077 == 0  # the caller's umask, not the warm process's


def _wait_for(predicate, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.1)


def _long_search(env, cwd, run):
    return subprocess.Popen([str(NAS), "search", "space=nb201", "evaluator=simulated", "evaluator.median_seconds=0.05",
                             "runner=local", "budget.trials=10000", "progress=false", f"hydra.run.dir={run}"],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _started(served, tmp_path):
    """A long search under way in a warm child: the caller's process and the child's pid."""
    home, env, log = served
    run = tmp_path / "run"
    proc = _long_search(env, tmp_path, run)
    _wait_for(lambda: _lines(run / "history.jsonl") >= 5)
    return proc, int(log.read_text().splitlines()[-1].split(" pid ")[1].split(":")[0]), run


def test_a_ctrl_c_reaches_the_warm_child_which_saves_and_says_so(served, tmp_path):
    proc, _child, _run = _started(served, tmp_path)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted after" in err and "resume" in err


def test_a_killed_caller_s_child_is_stopped(served, tmp_path):
    proc, child, run = _started(served, tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    _wait_for(lambda: not Path(f"/proc/{child}").exists() or "zombie" in _state(child), 30)
    assert _lines(run / "history.jsonl") < 10000


def test_a_child_killed_by_a_signal_is_reported_as_that_signal(served, tmp_path):
    proc, child, _run = _started(served, tmp_path)
    os.kill(child, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("payload", [
    b"\xff\xff\xff\xff",  # a length over the limit
    struct.pack("!I", 5) + b"{nope",  # not JSON
    struct.pack("!I", 2) + b"{}",  # no fields, no descriptors
])
def test_a_malformed_request_is_refused_and_the_next_command_served(served, payload):
    home, env, log = served
    serving = next(line for line in log.read_text().splitlines() if "serving at @" in line)
    address = b"\0" + serving.split("serving at @")[1].split()[0].encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(address)
        sock.sendall(payload)
        sock.settimeout(10)
        assert sock.recv(16) == b""  # closed without a reply
    assert "refused a request" in log.read_text().splitlines()[-1]
    before = _children(log)
    assert _nas(env, ROOT, "search", "--cfg", "job").returncode == 0
    assert _children(log) == before + 1

"""OS isolation of sandbox children (nas.sandbox.isolation): what a child
started under bubblewrap can see and do, checked from inside the child."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nas.data.locations import FASHION_MNIST_ROOT, SHARED_DATASETS, sklearn_data
from nas.sandbox import isolation as iso_mod
from nas.sandbox.isolation import ALLOW_ENV, BWRAP_ENV, IsolationUnavailable, covered, isolation, seccomp_filter
from nas.sandbox.verify import data_paths, hidden_paths

SECRET = "sk-isolation-canary-0123456789"
PROBE = r"""
import ctypes, json, os, socket, sys
out = {"uid": os.getuid(), "pid": os.getpid(), "env": dict(os.environ),
       "environ1": open("/proc/1/environ").read(), "pids": sorted(p for p in os.listdir("/proc") if p.isdigit()),
       "visible": {p: os.path.exists(p) for p in sys.argv[2:]}}
try:
    open("/usr/nasflow-escape", "w")
    out["write_usr"] = "written"
except OSError as err:
    out["write_usr"] = err.errno
s = socket.socket()
s.settimeout(2)
out["connect"] = s.connect_ex(("127.0.0.1", int(sys.argv[1])))
libc = ctypes.CDLL(None, use_errno=True)
out["ptrace"] = (libc.syscall(101, 16, 1, 0, 0), ctypes.get_errno())
out["tmp_writable"] = bool(open("/tmp/nasflow-probe.txt", "w").write("x"))
print(json.dumps(out))
"""


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.5)
    yield srv
    srv.close()


def test_child_sees_a_bare_read_only_world(tmp_path: Path, listener: socket.socket,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    home = Path(os.environ.get("NASFLOW_HOME", tmp_path))
    home.mkdir(parents=True, exist_ok=True)
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(SECRET)
    iso = isolation()
    (home / "canary").write_text(SECRET)
    beside = [p for p in (Path.home() / ".bashrc", Path.home() / ".profile", Path.cwd() / "pyproject.toml",
                          Path(iso_mod.package_root()) / "README.md") if p.exists()]  # mounted dirs' neighbours
    proc = iso.popen([sys.executable, "-c", PROBE, str(listener.getsockname()[1]), str(secret_file),
                      str(home / "canary"), *map(str, beside)], {"LANG": "C.UTF-8"}, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["uid"] == 65534
    seen["env"].pop("PWD", None)  # set by bwrap's --chdir
    assert seen["env"] == {"LANG": "C.UTF-8"} and seen["environ1"] == ""  # the launcher's env is empty too
    assert SECRET not in out.decode()
    assert len(seen["pids"]) <= 3 and str(os.getpid()) not in seen["pids"]  # its own PID namespace
    assert not any(seen["visible"].values()), seen["visible"]  # no home, NASFLOW_HOME, cwd or files beside
    assert seen["write_usr"] != "written"
    assert seen["connect"] != 0  # the host's loopback is another network namespace
    with pytest.raises(socket.timeout):
        listener.accept()
    assert seen["ptrace"] == [-1, 1]  # seccomp: EPERM
    assert seen["tmp_writable"]  # its private tmpfs


DATA_PROBE = r"""
import json, os, sys
print(json.dumps({p: sorted(os.listdir(p)) if os.path.isdir(p) else os.path.isfile(p) for p in sys.argv[1:]}))
"""


def _seen(paths: list[str], train: dict | None) -> dict:
    """What a sandbox child started as `run_child` starts it for `train` sees of `paths`."""
    proc = isolation().popen([sys.executable, "-c", DATA_PROBE, *paths], {"LANG": "C.UTF-8"},
                             read_only=data_paths(train), hidden=hidden_paths(train),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def test_datasets_are_hidden_unless_the_child_trains_on_them() -> None:
    """A child that checks or exports a model sees no dataset: scikit-learn's data folder in the
    mounted venv and /usr/share/datasets are empty. One that trains sees its dataset's files only."""
    sk = sklearn_data()
    assert sk is not None and (sk / "digits.csv.gz").is_file() and len(os.listdir(sk)) > 1
    digits = str(sk / "digits.csv.gz")
    probe = [str(sk), digits, SHARED_DATASETS]
    checking = _seen(probe, None)
    assert checking[str(sk)] == [] and checking[digits] is False, checking
    assert checking[SHARED_DATASETS] in ([], False), checking
    training = _seen(probe, {"data": {"name": "digits", "root": None, "split_file": None}})
    assert training[str(sk)] == ["digits.csv.gz"] and training[digits] is True, training
    assert training[SHARED_DATASETS] in ([], False), training
    if Path(FASHION_MNIST_ROOT).is_dir():
        fashion = _seen(probe, {"data": {"name": "fashion_mnist", "root": None, "split_file": None}})
        assert fashion[SHARED_DATASETS] == ["fashion-mnist"] and fashion[str(sk)] == [], fashion


FILL_PROBE = r"""
import errno, sys
written = 0
try:
    for i in range(int(sys.argv[1])):
        with open(f"/tmp/fill-{i}", "wb") as fh:
            fh.write(b"x" * (1 << 20))
        written += 1
except OSError as err:
    print(written, errno.errorcode[err.errno])
else:
    print(written, "ok")
"""


def test_private_tmp_holds_only_tmp_mb() -> None:
    """/tmp is a tmpfs (RAM the address-space cap does not count): its size is `tmp_mb`, so many
    small files cannot take half the host's memory."""
    proc = isolation().popen([sys.executable, "-c", FILL_PROBE, "12"], {"LANG": "C.UTF-8"}, tmp_mb=4,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    written, outcome = out.decode().split()
    assert (int(written), outcome) in ((3, "ENOSPC"), (4, "ENOSPC")), out

def test_covered_hides_only_what_a_mount_shows(tmp_path: Path) -> None:
    """Folders get a tmpfs and files /dev/null where a mount would show them; paths outside
    the mounts, missing ones, ones inside a covered folder and ones the child needs are left."""
    venv, home = tmp_path / "venv", tmp_path / "home"
    (venv / "data" / "digits").mkdir(parents=True)
    (venv / "data" / "iris.csv").write_text("x")
    (venv / "share").mkdir()
    (venv / "share" / "one.csv").write_text("x")
    (venv / "share" / "needed").mkdir()
    home.mkdir()
    hidden = tuple(str(p) for p in (venv / "data", venv / "data" / "iris.csv", venv / "share" / "one.csv",
                                    venv / "share" / "needed" / "x", home, venv / "missing"))
    got = covered(hidden, [str(venv)], [str(venv / "data" / "digits"), str(venv / "share" / "needed")])
    assert dict(got) == {str(venv / "data"): True, str(venv / "share" / "one.csv"): False}


def test_policy_keeps_datasets_from_an_unisolated_child(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without isolation (opted out) nothing hides the files: the audit policy refuses reading them."""
    from nas.sandbox import verify_model_source

    monkeypatch.setenv(BWRAP_ENV, "/nonexistent/bwrap")
    monkeypatch.setenv(ALLOW_ENV, "1")
    isolation.cache_clear()
    try:
        source = ("import torch\nfrom torch import nn\nfrom sklearn.datasets import load_digits\n"
                  "DIGITS = load_digits()\n\n\nclass Network(nn.Module):\n"
                  "    def __init__(self, num_classes=10):\n        super().__init__()\n"
                  "        self.fc = nn.Linear(3, num_classes)\n\n"
                  "    def forward(self, x):\n        return self.fc(x.mean((2, 3)))\n")
        verdict = verify_model_source(source, input_shape=(2, 3, 8, 8))
    finally:
        isolation.cache_clear()
    assert verdict.stage == "policy" and "reading datasets" in verdict.error and "model.py:4" in verdict.error


def test_seccomp_program_shape() -> None:
    program = seccomp_filter()
    if program is None:
        pytest.skip("seccomp filter is x86_64 only")
    assert len(program) % 8 == 0 and len(program) // 8 == 5 + len(iso_mod._DENIED_SYSCALLS) + 2


def test_no_isolation_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BWRAP_ENV, "/nonexistent/bwrap")
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    isolation.cache_clear()
    try:
        with pytest.raises(IsolationUnavailable) as info:
            isolation()
        assert "\n" not in str(info.value) and ALLOW_ENV in str(info.value)
        monkeypatch.setenv(ALLOW_ENV, "1")
        isolation.cache_clear()
        assert not isolation().isolated
    finally:
        isolation.cache_clear()


def test_cli_refuses_model_source_without_isolation(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("raise SystemExit('must never run')\n")
    env = {**os.environ, BWRAP_ENV: "/nonexistent/bwrap"}
    env.pop(ALLOW_ENV, None)
    done = subprocess.run([str(Path(sys.executable).with_name("nas")), "arch", "validate", str(model)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "OS isolation is unavailable" in done.stderr and "must never run" not in done.stdout + done.stderr

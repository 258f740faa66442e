"""benchmarks/results/docker_build.json is a real build (buildah) of the Dockerfile now in the tree
whose default command ran (rerun `sudo .venv/bin/python benchmarks/docker_build.py` after editing
the Dockerfile; docs/docker.md), and the script's parsing of buildah's and pip's output."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys

from conftest import ROOT


def _docker_build():
    if "docker_build" not in sys.modules:
        spec = importlib.util.spec_from_file_location("docker_build", ROOT / "benchmarks" / "docker_build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["docker_build"] = module
        spec.loader.exec_module(module)
    return sys.modules["docker_build"]


def test_the_committed_build_is_of_this_dockerfile_and_its_default_command_ran():
    result = json.loads((ROOT / "benchmarks" / "results" / "docker_build.json").read_text())
    assert result["dockerfile_sha256"] == hashlib.sha256((ROOT / "Dockerfile").read_bytes()).hexdigest(), (
        "the Dockerfile changed since benchmarks/results/docker_build.json was built: rerun "
        "benchmarks/docker_build.py")
    assert result["outcome"] == "pass", result["error"]
    assert all(step["ok"] for step in result["steps"])
    assert result["engine"].startswith("buildah version ")
    assert result["default_command_exit"] == 0
    assert isinstance(result["image_size_mb"], int) and result["image_size_mb"] > 100
    assert result["default_command"]["trials"] == 20
    assert result["image"]["entrypoint"] == ["nas"] and result["image"]["user"] == "nasflow"
    assert result["runner"]["engine"] == "podman run", result["runner"]
    hostile = result["hostile_validate"]
    assert hostile["default"]["exit"] != 0 and hostile["default"]["refused_line"]
    assert not any(case.get("canary_touched") for case in hostile.values() if isinstance(case, dict))
    # with bubblewrap running: the attack (libc's system() touching the canary dir) stays in the sandbox,
    # whatever the verdict on the network it builds, and an honest model passes
    assert hostile["unmasked"]["canary_touched"] == [] and hostile["honest_unmasked"]["exit"] == 0
    assert result["serve"]["trials"] == 5 and result["serve"]["serve_exit"] == 0
    assert result["no_compiler"]["found"] == [] and result["no_compiler"]["pycache_in_app"] == []


def test_dockerignore_lets_in_what_the_dockerfile_copies_and_nothing_else():
    """The context is what the Dockerfile copies: `*` first, then each top-level source it COPYs let in."""
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*"
    let_in = {line[1:] for line in lines if line.startswith("!")}
    copied = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied |= {source.split("/")[0] for source in line.split()[1:-1]}
    assert copied == let_in, (copied, let_in)


def test_build_steps_are_timed_from_buildahs_output():
    lines = [(0.0, "[1/2] STEP 1/3: FROM localhost/nasflow-base:bookworm AS build"),
             (0.5, "[1/2] STEP 2/3: RUN apt-get update"),
             (0.6, "Get:1 http://deb.debian.org/debian bookworm InRelease"),
             (10.5, "[1/2] STEP 3/3: ENV A=1"),
             (10.6, "--> Using cache 0123abcd"),
             (11.0, "[2/2] STEP 1/2: FROM localhost/nasflow-base:bookworm AS runtime"),
             (12.0, "[2/2] STEP 2/2: CMD [\"search\"]"),
             (12.5, "COMMIT localhost/nasflow:test")]
    steps = _docker_build().parse_build_log(lines, end=13.0)
    assert [(s["stage"], s["step"], s["seconds"], s["cached"]) for s in steps] == [
        (1, "1/3", 0.5, False), (1, "2/3", 10.0, False), (1, "3/3", 0.5, True), (2, "1/2", 1.0, False),
        (2, "2/2", 1.0, False)]
    assert steps[1]["instruction"] == "RUN apt-get update"
    single = _docker_build().parse_build_log([(0.0, "STEP 1/1: FROM scratch")], end=2.0)
    assert [(s["stage"], s["step"], s["seconds"]) for s in single] == [(1, "1/1", 2.0)]


def test_pip_output_is_summarised():
    text = "\n".join(["Looking in links: /opt/wheels", "Processing /opt/pypi-more/files/torch-2.14.1.whl",
                      "Processing file:///opt/pypi/files/six.whl", "  Downloading rich-15.0.0-py3-none-any.whl",
                      "Collecting x", "  Using cached x-1.0.tar.gz",
                      "Building wheel for llama-cpp-python (pyproject.toml): started",
                      "Building wheel for nasflow (pyproject.toml): started"])
    assert _docker_build().pip_summary(text) == {"built_here": ["llama-cpp-python", "nasflow"], "downloaded": 1,
                                                 "from_host_mirrors": 2, "from_pip_cache": 1}


def test_the_host_pip_config_goes_to_pip_wheel_only():
    listing = "\n".join(["global.cert='/etc/ssl/certs/ca-certificates.crt'",
                         "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
                         "global.find-links='/opt/wheels'", ":env:.default-timeout='180'"])
    text, dirs, cert = _docker_build().host_pip_conf(listing)
    assert dirs == ["/opt/pypi", "/opt/pypi-more", "/opt/wheels"]
    assert cert == "/etc/ssl/certs/ca-certificates.crt"
    assert text == ("[global]\ncert = /run/host-pip-ca.crt\n[wheel]\n"
                    "extra-index-url = file:///opt/pypi/simple file:///opt/pypi-more/simple\n"
                    "find-links = /opt/wheels\n")
    assert _docker_build().host_pip_conf("") == ("", [], None)


def test_the_trusted_worker_runs_under_a_nas_that_is_pid_1(monkeypatch):
    """In a container `nas` is PID 1 (`docker run` without --init, as docker_build.py found): its
    trusted worker exits only when re-parented away from the pid it was given, not when its parent is 1."""
    from nas.sandbox import trusted_worker

    class Libc:
        def prctl(self, *args):
            self.args = args

    exits = []
    monkeypatch.setattr(trusted_worker.ctypes, "CDLL", lambda *a, **k: Libc())
    monkeypatch.setattr(trusted_worker.os, "_exit", exits.append)
    monkeypatch.setattr(trusted_worker.os, "getppid", lambda: 1)
    trusted_worker._die_with_parent(1)
    assert exits == []
    trusted_worker._die_with_parent(4321)  # the parent died before PR_SET_PDEATHSIG: re-parented to init
    assert exits == [1]

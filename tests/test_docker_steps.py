"""The Dockerfile (no Docker engine runs here): its shape, what .dockerignore lets in, and that
benchmarks/results/docker_steps.json is a passing replay of this very Dockerfile (rerun
`sudo .venv/bin/python benchmarks/docker_steps.py` after editing it; docs/docker.md)."""

from __future__ import annotations

import importlib.util
import json
import sys

from conftest import ROOT


def _docker_steps():
    if "docker_steps" not in sys.modules:  # a dataclass module must be in sys.modules while it runs
        spec = importlib.util.spec_from_file_location("docker_steps", ROOT / "benchmarks" / "docker_steps.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["docker_steps"] = module
        spec.loader.exec_module(module)
    return sys.modules["docker_steps"]


def _stages():
    return _docker_steps().parse_dockerfile((ROOT / "Dockerfile").read_text())[1]


def test_a_build_stage_with_the_compiler_and_a_slim_non_root_runtime():
    build, runtime = _stages()
    assert (build.name, runtime.name) == ("build", "runtime")
    build_runs = " ".join(i.args for i in build.instrs if i.op == "RUN")
    runtime_runs = " ".join(i.args for i in runtime.instrs if i.op == "RUN")
    assert "build-essential" in build_runs and "pip wheel" in build_runs
    assert "build-essential" not in runtime_runs and "cmake" not in runtime_runs and "bubblewrap" in runtime_runs
    assert [i.args for i in runtime.instrs if i.op == "USER"][-1] not in ("root", "0")
    assert any(i.op == "COPY" and "prefect.yaml" in i.args.split() for i in runtime.instrs)
    cmd = json.loads([i.args for i in runtime.instrs if i.op == "CMD"][-1])
    assert cmd[0] == "search" and "space=nb201" in cmd and "evaluator=table" in cmd


def test_dockerignore_lets_in_what_the_dockerfile_copies_and_nothing_else():
    ds = _docker_steps()
    ignore = ds.DockerIgnore((ROOT / ".dockerignore").read_text())
    for stage in _stages():
        for ins in stage.instrs:
            if ins.op == "COPY" and "from" not in ins.flags:
                for source in ins.args.split()[:-1]:
                    assert not ignore.excluded(source), source
    for path in (".venv", ".git", "runs", "tests", "benchmarks", "nas/__pycache__/io.cpython-311.pyc"):
        assert ignore.excluded(path), path


def test_the_committed_replay_passed_on_this_dockerfile():
    result = json.loads((ROOT / "benchmarks" / "results" / "docker_steps.json").read_text())
    assert result["outcome"] == "pass", result["error"]
    assert all(step["ok"] for step in result["steps"])
    replayed = {step["step"] for step in result["steps"]}
    for stage in _stages():
        for ins in stage.instrs:
            name = f"{stage.name or stage.index}:{ins.line} {ins.short()}"
            assert name in replayed, f"{name!r} was not replayed: rerun benchmarks/docker_steps.py"

"""Plugins and packaging: a separate distribution adds a strategy (and its config) by entry
points alone, and a wheel built from the repo runs a search with no source tree on the path."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from nas.spaces import SPACES

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "data" / "plugin_demo"
TABLE = ["space=nb201", "evaluator=table", "budget.trials=4", "runner=local", "progress=false"]


def pip(*args: str, cwd: Path = ROOT) -> None:
    run = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]


def test_an_installed_plugin_strategy_runs_a_search(tmp_path, nas_env):
    """`strategy=ordered` exists only in the plugin: its config comes from the plugin's `nasflow.conf`
    package and its class from its `nasflow.strategies` entry point; nothing in nasflow names it."""
    site, source = tmp_path / "site", tmp_path / "plugin"
    shutil.copytree(PLUGIN, source)  # setuptools builds in the tree it is given
    pip("install", "--no-deps", "--no-build-isolation", "--target", str(site), str(source), cwd=tmp_path)
    env = {**nas_env, "PYTHONPATH": str(site)}
    nas = str(Path(sys.executable).with_name("nas"))
    run_dir = tmp_path / "run"
    done = subprocess.run([nas, "search", *TABLE, "strategy=ordered", f"hydra.run.dir={run_dir}"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    trials = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    # stride 7 in value order: the plugin's yaml (stride: 7) reached the strategy
    space = SPACES.create("nb201", {})
    expected = [space.from_values(list(v)).key()
                for v in itertools.islice(itertools.product(*[d.choices for d in space.decisions()]), 0, 28, 7)]
    assert [t["key"] for t in trials] == expected
    refused = subprocess.run([nas, "search", *TABLE, "strategy=ordered"], env=nas_env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300, check=False)
    assert refused.returncode == 2 and "unknown strategy 'ordered'" in refused.stderr  # not installed: not there


def test_a_wheel_installed_apart_from_the_source_tree_runs_a_table_search(tmp_path):
    """The wheel holds nas, supernets, tasks, flows and conf (Hydra finds `pkg://conf` in it). The new
    venv borrows the dependencies of this one (a .pth line) instead of installing torch again."""
    dist, source = tmp_path / "dist", tmp_path / "source"  # a copy: setuptools builds in the tree it is given
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "runs", "multirun",
                                                                "outputs", "__pycache__", "tests", "benchmarks"))
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source), cwd=tmp_path)
    wheel = next(dist.glob("nasflow-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip("install", "--no-deps", "--no-compile", "--target", str(purelib), str(wheel), cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_", "PYTHON"))}
    env["NASFLOW_HOME"] = str(tmp_path / "home")
    where = subprocess.run([str(python), "-c", "import conf, flows, nas, supernets, tasks; "
                            "print(' '.join(m.__file__ for m in (conf, flows, nas, supernets, tasks)))"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(Path(f).is_relative_to(purelib) for f in where.stdout.split()), where.stdout
    prompts = subprocess.run([str(python), "-c", "from nas.llm.prompts import load_prompt, packaged_prompts; "
                              "print(' '.join(sorted(n for n in packaged_prompts() if load_prompt(n))))"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert prompts.returncode == 0, prompts.stderr[-2000:]
    assert prompts.stdout.split() == sorted(p.stem for p in (ROOT / "nas").rglob("prompts/*.md"))  # all packaged
    run_dir = tmp_path / "run"
    done = subprocess.run([str(python), "-m", "nas.cli.main", "search", *TABLE, "strategy=random",
                           f"hydra.run.dir={run_dir}"], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len((run_dir / "history.jsonl").read_text().splitlines()) == 4

"""Fast CLI start: help, block-file validation and config errors never import torch or Prefect.

The check runs the real `nas.cli.main.main` in a fresh interpreter and reads `sys.modules`
after each command (cumulatively: a later command may not load them either), so a
new eager import anywhere on those paths fails here. Timings are not asserted;
benchmarks/cli_latency.py measures them.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESIDUAL = ROOT / "tests" / "data" / "blocks" / "residual.txt"
HEAVY = ("torch", "prefect", "lightning", "pytorch_lightning", "qdrant_client", "fvcore", "timm", "matplotlib")

PROBE = r"""
import contextlib, io, json, sys
from nas.cli.main import main
heavy, commands = json.loads(sys.argv[1]), json.loads(sys.argv[2])
results = []
for argv in commands:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
            code = 0
        except SystemExit as exc:
            code = exc.code
    loaded = sorted(m for m in heavy if m in sys.modules)
    results.append({"argv": argv, "code": code, "out": out.getvalue(), "err": err.getvalue(), "loaded": loaded})
from nas.evaluators import EVALUATORS
from nas.spaces import SPACES
from nas.strategies import STRATEGIES
names = {"space": SPACES.names(), "strategy": STRATEGIES.names(), "evaluator": EVALUATORS.names()}
results.append({"argv": ["registry names"], "names": names, "loaded": sorted(m for m in heavy if m in sys.modules)})
print(json.dumps(results))
"""


def test_help_validate_and_config_errors_import_neither_torch_nor_prefect(tmp_path):
    broken = tmp_path / "broken.txt"
    broken.write_text(RESIDUAL.read_text().replace("8->1\n", "", 1))
    commands = [
        ["--help"],
        ["arch", "--help"],
        ["arch", "validate", str(RESIDUAL)],
        ["arch", "validate", str(broken)],
        ["search", "strategy=nosuch"],
        ["search", "budget.trials=-1"],  # composed by Hydra, rejected by SearchSpec
        ["search", "space=nb201", "evaluator=table", "strategy=rea", "strategy.population_size=x"],  # by the strategy
        ["train-supernet", "space=nb201", "supernet.epochs=0"],  # by SupernetSettings
    ]
    env = {"NASFLOW_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}  # this checkout's code, wherever the interpreter's nas is installed from
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(commands)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    # each command did its job (else "nothing imported" would prove nothing)
    help_, arch_help, valid, invalid, unknown, budget, param, supernet, registry = results
    assert help_["code"] == 0 and "nas arch validate FILE" in help_["out"]
    assert arch_help["code"] == 0 and "draw" in arch_help["out"]
    assert valid["code"] == 0 and valid["out"].strip() == f"{RESIDUAL}: valid"
    assert invalid["code"] == 1 and invalid["out"].strip() == f"{broken}:3: block 'Residual': node 1: output has no incoming edge"
    assert unknown["code"] == 2 and "unknown strategy 'nosuch'" in unknown["err"]
    assert budget["code"] == 2 and "budget.trials must be > 0, got -1" in budget["err"]
    assert param["code"] == 2 and "strategy 'rea': parameter 'population_size' must be int, got 'x'" in param["err"]
    assert supernet["code"] == 2 and supernet["err"] == "nas: error: supernet.epochs must be an integer >= 1, got 0\n"
    assert {"nb201", "nader", "source"} <= set(registry["names"]["space"])
    assert {"random", "rea", "nader", "collm"} <= set(registry["names"]["strategy"])
    for r in results:
        assert r["loaded"] == [], f"{' '.join(r['argv'])} imported {r['loaded']}"


# (registry, where it lives, the packages whose modules register into it)
REGISTRIES = [("SPACES", "nas.core.space", ("nas.spaces",)), ("STRATEGIES", "nas.strategies.base",
              ("nas.strategies", "nas.agents")), ("EVALUATORS", "nas.evaluators.base", ("nas.evaluators", "supernets")),
              ("SUPERNETS", "supernets.base", ("supernets",)), ("PROXIES", "nas.proxies.base", ("nas.proxies",)),
              ("SCORERS", "nas.search.screen", ("nas.search", "nas.proxies")), ("RUNNERS", "nas.execute", ("flows",)),
              ("REPORTERS", "nas.train.progress", ("tasks",))]


@pytest.mark.parametrize("registry, home, packages", REGISTRIES, ids=[r for r, _, _ in REGISTRIES])
def test_entry_points_match_what_the_modules_register(registry, home, packages):
    """Each entry point names the module that registers it, and no registered name lacks one
    (a class registered without its entry point is invisible until something imports its module)."""
    from nas.core.registry import plugins

    reg = getattr(importlib.import_module(home), registry)
    declared = plugins(reg.group)
    assert declared, f"no entry points in {reg.group}: is the project installed (pip install -e .)?"
    for name, ep in declared.items():
        cls = reg.get(name)
        assert cls.__module__ == ep.value and cls.name == name
    for package in packages:
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
            importlib.import_module(info.name)
    registered = {n for n, cls in reg._entries.items() if cls.__module__.startswith(tuple(p + "." for p in packages))}
    assert registered == set(declared)


def test_an_entry_point_that_registers_nothing_is_one_line(monkeypatch):
    from importlib.metadata import EntryPoint

    from nas.core import registry as registry_module
    from nas.errors import ConfigError

    reg = registry_module.Registry("widget", "nasflow.test-widgets")
    monkeypatch.setattr(registry_module, "plugins", lambda group: {
        "odd": EntryPoint("odd", "nas.errors", group)} if group == "nasflow.test-widgets" else {})
    assert reg.names() == ["odd"]
    with pytest.raises(ConfigError, match=r"^widget 'odd': entry point 'nas.errors' \(group nasflow.test-widgets\) "
                                          r"registered no widget of that name$"):
        reg.get("odd")


SEARCH_PROBE = r"""
import json, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
composed = []
load = ConfigLoaderImpl.load_configuration
def counted(self, *args, **kwargs):
    composed.append(1)
    return load(self, *args, **kwargs)
ConfigLoaderImpl.load_configuration = counted
from nas.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exc:
    assert not exc.code, exc.code
print(len(composed))
print(json.dumps(sorted(m for m in ("torch", "matplotlib", "fvcore", "prefect.server.api.server") if m in sys.modules)))
"""


def test_a_table_search_imports_neither_torch_nor_matplotlib(tmp_path):
    """A table search with no constraint prices trials from the measured cost model
    (nas/spaces/nb201/measured_costs.py) and draws its plot in a child process (nas.report.RunReport):
    the search's own process never imports torch, fvcore or matplotlib, and reports to a server; its
    config is composed once, on Prefect's runner too."""
    run = tmp_path / "run"
    argv = ["search", "space=nb201", "strategy=random", "evaluator=table", "budget.trials=5", "progress=false",
            f"hydra.run.dir={run}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env |= {"NASFLOW_HOME": str(tmp_path / "home"), "NASFLOW_PREFECT_SERVER": "temporary", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SEARCH_PROBE, json.dumps(argv)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == ["prefect.server.api.server"]  # the temporary one
    assert proc.stdout.strip().splitlines()[-2] == "1"  # its config composed once (tests/test_config_compose_once.py)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["trials"] == 5 and summary["best"]["params"] > 0 and summary["best"]["flops"] > 0
    assert (run / "best_so_far.png").stat().st_size > 1000 and "best accuracy" in (run / "report.md").read_text()


def test_the_measured_nb201_cost_models_are_what_measuring_gives():
    """The stored cost models equal a fresh measurement (torch, fvcore): a change to the network or
    the FLOP counter that forgets `python -m nas.spaces.nb201.cost` fails here."""
    from nas.spaces.nb201.cost import cost_model, measure_model
    from nas.spaces.nb201.measured_costs import MEASURED

    for key in [(16, 5, 10, 32), (16, 5, 120, 16)]:
        assert measure_model(*key) == MEASURED[key] == cost_model(*key)
    assert set(MEASURED) >= {(16, 5, c, r) for c in (10, 100, 120) for r in (16, 32)}


def test_help_composes_nothing_and_classic_strategies_load_no_llm_client():
    """`nas --help` needs no config tree (nas.config waits for a command's overrides) and the classic
    strategies no LLM client (strategies.base names it for annotations only): start-up time."""
    probe = ("import json, sys; import nas.cli.main; help_ = 'nas.config' in sys.modules; "
             "import nas.strategies; print(json.dumps([help_, 'nas.llm.client' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [False, False]

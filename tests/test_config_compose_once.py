"""A job's config is composed once per process (nas.config.checked_job): the checks compose the
group choices, set the other keys on that as Hydra's compose does, and `nas search` runs the job on
the result (nas/cli/hydra_job.py) instead of letting Hydra's main compose it twice more."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import ROOT
from test_cli_latency_imports import SEARCH_PROBE  # prints the composes, then the heavy modules imported


def test_a_table_search_composes_its_config_once(tmp_path):
    run = tmp_path / "run"
    argv = ["search", "space=nb201", "strategy=random", "evaluator=table", "budget.trials=3", "runner=local",
            "progress=false", f"hydra.run.dir={run}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env |= {"NASFLOW_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SEARCH_PROBE, json.dumps(argv)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-2] == "1"  # compose calls
    assert json.loads((run / "summary.json").read_text())["trials"] == 3
    # what Hydra's main wrote before: the command's overrides, and the run mode among Hydra's
    hydra_yaml = OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra
    assert hydra_yaml.mode == "RUN" and hydra_yaml.overrides.hydra[-1] == "hydra.mode=RUN"
    assert list(hydra_yaml.overrides.task) == argv[1:-1]
    assert hydra_yaml.runtime.output_dir == str(run) and hydra_yaml.runtime.choices.space == "nb201"


@pytest.mark.parametrize("overrides", [
    ["space=nb201", "budget.trials=100", "seed=3", "hydra.run.dir=/tmp/x"],
    ["seed=1", "space=nb201", "strategy=random", "evaluator=table", "+strategy.foo=1", "hydra.job.chdir=false"],
    ["~budget.in_flight", "budget={trials: 3}", "space=nb201", "strategy=rea", "strategy.population_size=5"],
    ["+experiment=ablation", "seed=2", "strategy=rea", "++budget.trials=5", "data.root=/data"],
    [],
])
def test_the_checked_config_is_what_hydras_compose_makes(overrides):
    """Keys set on the composed group choices give Hydra's own composition of all the overrides,
    its `hydra` node (the task's overrides, override_dirname, choices) included."""
    from hydra import compose, initialize_config_module

    from nas.config import _checked, searchpath

    checked = _checked(overrides)
    with initialize_config_module("conf", version_base="1.3"):
        hydra = compose("config", overrides=[*searchpath(), *overrides], return_hydra_config=True)
        plain = compose("config", overrides=[*searchpath(), *overrides])
    assert OmegaConf.to_yaml(checked.config) == OmegaConf.to_yaml(hydra)
    assert checked.container == OmegaConf.to_container(plain, resolve=True)


@pytest.mark.parametrize("overrides, message", [
    (["seed=1,2"], "Ambiguous value for argument 'seed=1,2'"),
    (["budget=3"], "'budget' is a section, not a value"),
    (["+foo=1"], "unknown key 'foo' (valid keys at the top level:"),
    (["budget.trials=[1"], "cannot parse override 'budget.trials=[1'"),
])
def test_what_hydra_would_accept_is_still_refused(overrides, message):
    from nas.config import check_config
    from nas.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        check_config(overrides)
    assert message in str(err.value)

"""Every config file names a registered class and builds with its parameters;
every registered class has a config file (one class + one file per option)."""

from __future__ import annotations

from importlib import resources

import numpy as np
import pytest
import yaml

from nas.cli.main import check_group_overrides
from nas.config import available
from nas.evaluators import EVALUATORS
from nas.search.spec import Component, SearchSpec
from nas.spaces import SPACES
from nas.strategies import STRATEGIES

REGISTRIES = {"space": SPACES, "strategy": STRATEGIES, "evaluator": EVALUATORS}


@pytest.mark.parametrize("group", sorted(REGISTRIES))
def test_config_files_match_registry(group):
    """Every registered class has a file of its name; other files are presets of a registered class."""
    assert set(REGISTRIES[group].names()) <= set(available(group))
    for name in available(group):
        text = (resources.files("conf") / group / f"{name}.yaml").read_text()
        assert yaml.safe_load(text)["name"] in REGISTRIES[group].names(), f"conf/{group}/{name}.yaml"


def _load(group: str, name: str, overrides: tuple[str, ...] = ()) -> Component:
    """The group's node as Hydra composes it (interpolations such as ${data} resolved)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("conf", version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={name}", *overrides])
    node = OmegaConf.to_container(cfg, resolve=True)[group]
    assert node["name"] == name or name not in REGISTRIES[group].names(), \
        f"conf/{group}/{name}.yaml must say name: {name}"
    return Component.from_config(group, node)


# Tiny settings so that building and running every evaluator stays a unit test.
SMALL = {"train": ("data=digits", "recipe.epochs=1", "recipe.train_subset=128", "evaluator.channels=4",
                   "evaluator.cells_per_stage=1"),
         "proxy": ("data=digits", "evaluator.batch_size=8", "evaluator.reference=3", "evaluator.channels=4",
                   "evaluator.cells_per_stage=1")}


@pytest.mark.parametrize("name", available("strategy"))
def test_every_strategy_config_builds(name):
    cls = STRATEGIES.get(name)
    if not cls.random_moves:  # LLM design strategies: built here, run in their e2e tests
        from hydra import compose, initialize_config_module
        from omegaconf import OmegaConf

        with initialize_config_module("conf", version_base="1.3"):
            space = cls.spaces[0] if cls.spaces else "nb201"   # collm searches any categorical space
            cfg = compose("config", overrides=[f"strategy={name}", f"space={space}", "evaluator=train"])
        spec = SearchSpec.from_config(OmegaConf.to_container(cfg, resolve=True))
        assert spec.build_strategy(spec.build_space()).name == name
        return
    spec = SearchSpec(space=_load("space", "nb201"), strategy=_load("strategy", name),
                      evaluator=_load("evaluator", "table"), trials=3)
    strategy = spec.build_strategy(spec.build_space())
    assert len(strategy.ask(2)) == 2


@pytest.fixture(scope="module")
def nb201_checkpoint(tmp_path_factory):
    """A supernet for the run's NB201 space (5 cells per stage, 16 channels), trained for one step."""
    from supernets.train import SupernetSettings, train_supernet

    settings = SupernetSettings(epochs=1, batch_size=64, train_subset=64, val_subset=50, recal_batches=1)
    return train_supernet({"name": "nb201"}, {}, {"name": "digits", "root": None, "split_file": None}, settings,
                          seed=0, out_dir=tmp_path_factory.mktemp("sn"), progress=False).path


@pytest.mark.parametrize("name", available("evaluator"))
def test_every_evaluator_config_builds(name, request):
    small = SMALL.get(name, ())
    if name == "supernet":
        small = ("data=digits", f"evaluator.checkpoint={request.getfixturevalue('nb201_checkpoint')}",
                 "evaluator.val_subset=50", "evaluator.recal_batches=1")
    spec = SearchSpec(space=Component("nb201"), strategy=Component("random"),
                      evaluator=_load("evaluator", name, small))
    space = spec.build_space()
    ev = spec.build_evaluator(space)
    result = ev.evaluate(space.sample(np.random.default_rng(0)))
    assert result.ok and 0 < result.accuracy <= 100


@pytest.mark.parametrize("args, ok", [
    (["strategy=rea", "seed=1"], True),
    (["strategy=random,rea"], True),
    (["strategy=rea,nope"], False),
    (["+runner=local"], True),
    (["runner=spark"], False),
    (["strategy.population_size=5"], True),
])
def test_group_override_precheck(args, ok, capsys):
    if ok:
        check_group_overrides(args)
        return
    with pytest.raises(SystemExit) as info:
        check_group_overrides(args)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nas: error: unknown ") and "(valid: " in err[0]


def test_the_default_job_is_an_open_ended_design_with_the_local_model():
    """`nas search` with no overrides: NADER on digits with the CPU proxy and the embedded LLM."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("conf", version_base="1.3"):
        cfg = OmegaConf.to_container(compose("config"), resolve=True)
    assert (cfg["space"]["name"], cfg["strategy"]["name"], cfg["evaluator"]["name"]) == ("nader", "nader", "train")
    assert cfg["data"]["name"] == "digits" and cfg["llm"]["backend"] == "local"
    assert cfg["evaluator"]["recipe"] == cfg["recipe"] and cfg["recipe"]["epochs"] <= 4
    assert cfg["strategy"]["budget"] == cfg["evaluator"]["budget"] == {"params": 2e5, "flops": 3e7}
    spec = SearchSpec.from_config(cfg)
    assert spec.build_strategy(spec.build_space()).name == "nader"


@pytest.mark.parametrize("overrides", [[], ["data=cifar10"], ["space=source", "data=imagenet16_120"]])
def test_design_strategies_verify_at_the_data_size(overrides):
    """NADER's and FairNAD's verifiers check designs at the size the evaluator trains at."""
    from nas.config import compose_config

    cfg = compose_config(overrides)
    assert cfg["strategy"]["name"] in ("nader", "fairnad")
    assert cfg["strategy"]["input_size"] == cfg["data"]["input_size"]
    assert compose_config([*overrides, "strategy.input_size=12"])["strategy"]["input_size"] == 12

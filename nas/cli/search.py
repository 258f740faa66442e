"""`nas search`: every job's config is composed and checked before Hydra runs, so a
rejected command leaves no run dir and says why in one line; each job then takes its
run dir's lock before anything is written there (`.hydra/`, `search.log`)."""

from __future__ import annotations

import inspect
import sys
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nas.cli.main import one_line
from nas.errors import ConfigError, NasError

if TYPE_CHECKING:
    from nas.search.spec import SearchSpec

COMPONENTS = ("space", "strategy", "evaluator")  # nodes whose keys are a registered class's parameters
MULTIRUN = ("-m", "--multirun")


def main(argv: list[str]) -> None:
    from nas.cli.main import check_group_overrides, fail

    check_group_overrides(argv)
    flags = [a for a in argv if a.startswith("-")]
    if not set(flags) - set(MULTIRUN):  # --help, --cfg job, ...: Hydra's own, nothing is written
        try:
            specs = [check_job(job) for job in job_overrides([a for a in argv if a not in MULTIRUN], bool(flags))]
            for spec in {repr({**spec.to_dict(), "seed": 0}): spec for spec in specs}.values():
                check_build(spec)  # the slow part (an evaluator may load a table): once per distinct job but seed
        except NasError as err:
            fail(str(err))
    sys.argv = ["nas search", *argv]
    _hydra_entry()


def job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The overrides of each job Hydra will run: one job, or the sweep's product
    (the config's `hydra.sweeper.params` first, command-line values replacing them)."""
    parsed = parse_overrides(overrides)
    if not multirun:
        return [overrides]
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    params = compose(fixed, hydra=True).hydra.sweeper.params or {}
    lines = [*(f"{k}={v}" for k, v in params.items()), *overrides]
    try:
        batches = BasicSweeper.split_arguments(parse_overrides(lines), None)
    except HydraException as err:  # an unsupported sweep type (interval)
        raise ConfigError(one_line(err)) from None
    return [job for batch in batches for job in batch]


def parse_overrides(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    out = []
    for line in overrides:
        try:
            out.extend(parser.parse_overrides([line]))
        except OverrideParseException as err:
            if "=" not in line:
                raise ConfigError(f"override '{line}' has no value: write {line.lstrip('+~')}=VALUE") from None
            raise ConfigError(f"cannot parse override '{line}': {one_line(err)}") from None
    return out


def check_job(overrides: list[str]) -> SearchSpec:
    """The keys the overrides name, the composed config, the spec and its pairing: the
    checks that need nothing built, so a sweep's bad job stops it before any slow one."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from nas.search.spec import SearchSpec

    parsed = parse_overrides(overrides)
    groups = group_dirs()
    for o in parsed:
        if o.is_add() and o.key_or_group in default_groups():
            raise ConfigError(f"{o.key_or_group} already has a choice: write {o.input_line[1:]} "
                              "(+ adds only a group the config does not choose, such as +experiment=NAME)")
    choices = [o.input_line for o in parsed if o.key_or_group in groups or o.is_hydra_override()]
    base = compose(choices, hydra=True)
    for o in parsed:
        if o.key_or_group not in groups and not o.is_hydra_override() and not o.is_delete():
            check_key(o, base)
    cfg = compose(overrides)
    try:
        container = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:  # an interpolation that cannot resolve
        raise ConfigError(one_line(err)) from None
    spec = SearchSpec.from_config(container)
    spec.check_pairing(base.hydra.runtime.choices.get("space"))
    return spec


def check_build(spec: SearchSpec) -> None:
    """The rest of what `execute` checks before it starts, without writing anything."""
    import logging

    logging.disable(logging.WARNING)  # a component's warnings are said once, when the job builds it
    try:
        space = spec.build_space()
        spec.check_budget(space)
        spec.build_strategy(space)
        spec.build_evaluator(space)
    finally:
        logging.disable(logging.NOTSET)


def check_key(override: Any, base: Any) -> None:
    """`key=v` must name a key the config has; `+key=v` one it does not have (a typo
    added with `+` would otherwise be ignored). Unknown keys of a space, strategy or
    evaluator are left to its registry, which knows its class's parameters."""
    from omegaconf import DictConfig

    key = override.key_or_group
    value = override.get_value_element_as_str() if override.value() is not None else "null"
    parts = key.split(".")
    node: Any = base
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth])
        if not isinstance(node, DictConfig):
            raise ConfigError(f"unknown key '{key}': '{where}' is a value, not a section")
        if part not in node:
            if (override.is_add() or override.is_force_add()) and parts[0] in COMPONENTS and depth == len(parts) - 1:
                return
            hint = _add_hint(base, parts) if depth == len(parts) - 1 and not override.is_add() else ""
            section = f"of {where}" if where else "at the top level"
            raise ConfigError(f"unknown key '{key}' (valid keys {section}: {', '.join(map(str, node))}){hint}")
        node = node._get_node(part)
    if isinstance(node, DictConfig) and not isinstance(override.value(), dict) and not override.is_delete():
        raise ConfigError(f"'{key}' is a section, not a value: set its keys ({', '.join(map(str, node))}), "
                          f"e.g. {key}.{next(iter(node), 'KEY')}={value}")
    if override.is_add():
        raise ConfigError(f"'{key}' is already in the config: write {key}={value} "
                          "(+ adds only keys the config does not have)")


def _add_hint(base: Any, parts: list[str]) -> str:
    """A parameter of the chosen class that its YAML file does not list is added with `+`."""
    if parts[0] not in COMPONENTS or len(parts) != 2:
        return ""
    from nas.search.spec import EVALUATORS, SPACES, STRATEGIES

    registry = {"space": SPACES, "strategy": STRATEGIES, "evaluator": EVALUATORS}[parts[0]]
    try:
        accepted = inspect.signature(registry.get(str(base[parts[0]].name)).__init__).parameters
    except NasError:
        return ""
    return f"; it is a parameter: add it with +{'.'.join(parts)}=VALUE" if parts[1] in accepted else ""


@cache
def default_groups() -> frozenset[str]:
    """The groups `nas/conf/config.yaml` chooses (and `space_defaults`' strategy and evaluator)."""
    import yaml

    entries = yaml.safe_load((resources.files("nas.conf") / "config.yaml").read_text())["defaults"]
    return frozenset({"strategy", "evaluator", *(k for e in entries if isinstance(e, dict) for k in e)})


@cache
def group_dirs() -> frozenset[str]:
    return frozenset(p.name for p in resources.files("nas.conf").iterdir() if p.is_dir() and not p.name.startswith("_"))


def compose(overrides: list[str], hydra: bool = False) -> Any:
    """Hydra's composition of `nas/conf/config.yaml` + overrides, its errors in one line (ConfigError)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_module("nas.conf", version_base="1.3"):
            return hydra_compose("config", overrides=overrides, return_hydra_config=hydra)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(one_line(err)) from None


def _hydra_entry() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import DictConfig, OmegaConf

    @hydra.main(config_path="pkg://nas.conf", config_name="config", version_base="1.3")
    def search(cfg: DictConfig) -> None:
        from nas.cli.main import execute, fail, print_summary
        from nas.search.rundir import RunDir
        from nas.search.spec import SearchSpec

        try:
            container = OmegaConf.to_container(cfg, resolve=True)
            spec = SearchSpec.from_config(container)
            run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
            with RunDir(run_dir).lock():  # before anything is written: another search may own the dir
                save_hydra_files(run_dir / ".hydra", cfg)
                summary = execute(spec, run_dir, container.get("runner") or {},
                                  bool(container.get("progress", True)))
        except NasError as err:
            fail(str(err))
        print_summary(run_dir, summary)

    search()


def save_hydra_files(folder: Path, cfg: Any) -> None:
    """What Hydra writes to `.hydra/` (its own writing is off: `hydra.output_subdir: null`)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from nas.io import atomic_write_text

    hydra_cfg = HydraConfig.get()
    atomic_write_text(folder / "config.yaml", OmegaConf.to_yaml(cfg))
    atomic_write_text(folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})))
    atomic_write_text(folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task))

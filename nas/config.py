"""Config composition: `conf/config.yaml` + Hydra overrides, checked before anything
runs, every problem one line (ConfigError). A library module, so the CLI, the Prefect
flows and the regression probes compose and check a job the same way."""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nas.core.registry import Registry, plugins
from nas.errors import ConfigError, NasError
from nas.lazy import LazyImport

# numpy and every registry: a job's spec is built after its config is composed
search_spec = LazyImport("nas.search.spec")

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from nas.search.spec import Search, SearchSpec

GROUPS = ("space", "strategy", "evaluator", "runner", "data", "recipe", "engine", "llm", "knowledge")
COMPONENTS = ("space", "strategy", "evaluator")  # nodes whose keys are a registered class's parameters
DATA_SOURCE = ("name", "root", "split_file")  # the data group's keys that load it; the rest describe it


def data_source(data: dict[str, Any]) -> dict[str, Any]:
    """The data group as `load_data` takes it, without `num_classes`, `input_size`, `channels`."""
    return {key: data[key] for key in DATA_SOURCE if key in data}


def plugin_configs() -> list[str]:
    """The config packages of installed plugins (entry points `nasflow.conf`: a package holding
    group folders, e.g. `strategy/<name>.yaml`), searched after `conf`."""
    return sorted({ep.value for ep in plugins("nasflow.conf").values()})


def searchpath() -> list[str]:
    """The override that adds the plugins' config packages to Hydra's search path (none without plugins)."""
    found = plugin_configs()
    return [f"hydra.searchpath=[{','.join('pkg://' + p for p in found)}]"] if found else []


def _files(package: str) -> Traversable:
    return resources.files(package)


def available(group: str) -> list[str]:
    names: set[str] = set()
    for package in ("conf", *plugin_configs()):
        folder = _files(package) / group
        if folder.is_dir():
            names.update(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    return sorted(names)


def validate_group_overrides(args: list[str]) -> None:
    """Hydra's own message for an unknown option is many lines; say it in one (ConfigError)."""
    for arg in args:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key == "experiment" and not arg.startswith("+"):  # not in the defaults list
            raise ConfigError(f"experiment presets are added, not overridden: write +experiment={value}")
        if not sep or key not in (*GROUPS, "experiment") or "(" in value:
            continue
        valid = available(key)
        for name in value.split(","):
            if name.strip() not in valid:
                raise ConfigError(f"unknown {key} '{name.strip()}' (valid: {', '.join(valid)})")


def compose_config(overrides: list[str]) -> dict[str, Any]:
    """The composed config, resolved; an unknown group option is one line, but keys are
    not checked (`check_config` checks them too)."""
    validate_group_overrides(overrides)
    return _resolve(compose(overrides))


def compose(overrides: list[str], hydra: bool = False) -> Any:
    """Hydra's composition of `conf/config.yaml` + overrides, its errors in one line (ConfigError)."""
    try:
        with initialize_config_module("conf", version_base="1.3"):
            return hydra_compose("config", overrides=[*searchpath(), *overrides], return_hydra_config=hydra)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(one_line(err)) from None


def one_line(err: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages in one line, without their
    `+key` hint (a key the config lacks is a typo, not something to append)."""
    skip = ("To append to your", "Set the environment variable HYDRA_FULL_ERROR", "See https://", "full_key:",
            "object_type=", "reference_type=", "Did you mean to override")
    parts: list[str] = []
    listing = False  # "Available options in 'g':" is followed by one option per line
    for line in str(err).split("Config search path:")[0].splitlines():
        line = line.strip().rstrip(".")
        if not line or line.startswith(skip):
            continue
        if listing:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
        else:
            parts.append(line)
            listing = line.endswith(":")
    return "; ".join(parts) or type(err).__name__


def split_override(overrides: list[str], key: str) -> tuple[list[str], list[str]]:
    """The values given as `key=VALUE` (in order; `key.sub=` is another key) and the other overrides:
    for command-line keys that are not the config's (`out=`, `hydra.run.dir=`)."""
    prefix = f"{key}="
    return [o[len(prefix):] for o in overrides if o.startswith(prefix)], [o for o in overrides if not o.startswith(prefix)]


def job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The overrides of each job Hydra will run: one job, or the sweep's product
    (the config's `hydra.sweeper.params` first, command-line values replacing them)."""
    parsed = parse_overrides(overrides)
    if not multirun:
        return [overrides]

    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    params = compose(fixed, hydra=True).hydra.sweeper.params or {}
    lines = [*(f"{k}={v}" for k, v in params.items()), *overrides]
    try:
        batches = BasicSweeper.split_arguments(parse_overrides(lines), None)
    except HydraException as err:  # an unsupported sweep type (interval)
        raise ConfigError(one_line(err)) from None
    return [job for batch in batches for job in batch]


def parse_overrides(overrides: list[str]) -> list[Any]:
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


def check_config(overrides: list[str]) -> dict[str, Any]:
    """The composed config, resolved, once every group option and key the overrides name
    exists: a typo is an error, never a silently ignored setting."""
    return _checked(overrides).container


@dataclass(frozen=True)
class Checked:
    """A job's config, composed once and checked. `config` keeps its `hydra` node, as Hydra's
    compose for a run makes it (nas/cli/hydra_job.py runs the job on it, composing nothing
    again); `container` is the rest, resolved; `space` the space's option name (for messages)."""

    config: Any
    container: dict[str, Any]
    space: str | None


def check_job(overrides: list[str]) -> tuple[SearchSpec, bool]:
    """`check_config`, then the spec and its pairing: the checks that need nothing built,
    so a sweep's bad job stops it before any slow one. With the job's `progress`, so the
    slow checks that follow say what they do only where the job shows progress."""
    spec, progress, _ = checked_job(overrides)
    return spec, progress


def checked_job(overrides: list[str]) -> tuple[SearchSpec, bool, Checked]:
    """`check_job`, and the config it composed (for the run, which then composes none)."""
    checked = _checked(overrides)
    progress = checked.container.get("progress", True)
    if not isinstance(progress, bool):
        raise ConfigError(f"progress must be true or false, got {progress!r}")
    spec = search_spec.SearchSpec.from_config(checked.container)
    spec.check_pairing(checked.space)
    return spec, progress, checked


def _checked(overrides: list[str]) -> Checked:
    """One composition: the group choices (and hydra.* overrides), on which every other key is
    checked (`check_key`), then those keys set on it as Hydra's compose sets them."""
    validate_group_overrides(overrides)
    parsed = parse_overrides(overrides)
    groups = group_dirs()
    for o in parsed:
        if o.is_add() and o.key_or_group in default_groups():
            raise ConfigError(f"{o.key_or_group} already has a choice: write {o.input_line[1:]} "
                              "(+ adds only a group the config does not choose, such as +experiment=NAME)")
    _one_run(parsed)
    chosen = [o.key_or_group in groups or o.is_hydra_override() for o in parsed]
    base = compose([o.input_line for o, c in zip(parsed, chosen) if c], hydra=True)
    values = [o for o, c in zip(parsed, chosen) if not c]
    for o in values:
        if not o.is_delete():
            check_key(o, base)
    space = base.hydra.runtime.choices.get("space")
    config = _set_values(base, parsed, values)
    return Checked(config, _resolve(_without_hydra(config)), space)


def _set_values(base: Any, parsed: list[Any], values: list[Any]) -> Any:
    """`base` with the key overrides applied as Hydra's compose applies them after the defaults
    list (hydra 1.3: ConfigLoaderImpl._load_configuration_impl), and its record of the task's
    overrides; tests/test_config_compose_once.py checks it against Hydra's own compose."""
    try:
        ConfigLoaderImpl._apply_overrides_to_config(values, base)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(one_line(err)) from None
    task = [o for o in parsed if not o.is_hydra_override()]
    base.hydra.overrides.task = [o.input_line for o in task]
    dirname = base.hydra.job.config.override_dirname
    base.hydra.job.override_dirname = get_overrides_dirname(
        overrides=task, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys)
    return base


def _one_run(parsed: list[Any]) -> None:
    """A sweep (`seed=1,2`) without -m is Hydra's one-line refusal, before any key is checked."""
    try:
        ConfigLoaderImpl.validate_sweep_overrides_legal(parsed, run_mode=RunMode.RUN, from_shell=False)
    except HydraException as err:
        raise ConfigError(one_line(err)) from None


def _without_hydra(cfg: Any) -> Any:
    """The config as `compose(..., hydra=False)` returns it: its interpolations cannot reach `hydra`."""
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])


def _resolve(cfg: Any) -> dict[str, Any]:
    try:
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:  # an interpolation that cannot resolve
        raise ConfigError(one_line(err)) from None


def check_build(spec: SearchSpec, keep: bool = False) -> Search:
    """The rest of what `execute` checks before it starts, without writing anything; returns the
    built parts. `keep`: the job runs next in this process, on these parts, so it hears their
    warnings now; otherwise (a sweep's jobs, checked once per distinct job) they are left unsaid."""

    if keep:
        return spec.build()
    logging.disable(logging.WARNING)
    try:
        return spec.build()
    finally:
        logging.disable(logging.NOTSET)


def check_key(override: Any, base: Any) -> None:
    """`key=v` must name a key the config has; `+key=v` one it does not have (a typo
    added with `+` would otherwise be ignored). Unknown keys of a space, strategy or
    evaluator are left to its registry, which knows its class's parameters."""
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
            hint = MOVED.get(key) or (_add_hint(base, parts) if depth == len(parts) - 1 and not override.is_add() else "")
            if not hint and depth == len(parts) - 1 >= 2 and parts[0] in COMPONENTS and not override.is_add():
                hint = f"; a key {where} does not list is added with +{key}={value}"  # e.g. strategy.sampler_params
            section = f"of {where}" if where else "at the top level"
            raise ConfigError(f"unknown key '{key}' (valid keys {section}: {', '.join(map(str, node))}){hint}")
        node = node._get_node(part)
    if isinstance(node, DictConfig) and not isinstance(override.value(), dict) and not override.is_delete():
        raise ConfigError(f"'{key}' is a section, not a value: set its keys ({', '.join(map(str, node))}), "
                          f"e.g. {key}.{next(iter(node), 'KEY')}={value}")
    if override.is_add():
        raise ConfigError(f"'{key}' is already in the config: write {key}={value} "
                          "(+ adds only keys the config does not have)")


# Keys that moved: the old spelling gets the new one in its error.
MOVED = {f"strategy.max_{k}": f"; size limits live in the evaluator now: evaluator.budget.{k}=VALUE"
         for k in ("params", "flops")}


def _add_hint(base: Any, parts: list[str]) -> str:
    """A parameter of the chosen class that its YAML file does not list is added with `+`."""
    if parts[0] not in COMPONENTS or len(parts) != 2:
        return ""

    registries: dict[str, Registry[Any]] = {"space": search_spec.SPACES, "strategy": search_spec.STRATEGIES,
                                            "evaluator": search_spec.EVALUATORS}
    registry = registries[parts[0]]
    try:
        accepted = inspect.signature(registry.get(str(base[parts[0]].name)).__init__).parameters
    except NasError:
        return ""
    return f"; it is a parameter: add it with +{'.'.join(parts)}=VALUE" if parts[1] in accepted else ""


@cache
def default_groups() -> frozenset[str]:
    """The groups `conf/config.yaml` chooses (and `space_defaults`' strategy and evaluator)."""
    entries = yaml.safe_load((_files("conf") / "config.yaml").read_text())["defaults"]
    return frozenset({"strategy", "evaluator", *(k for e in entries if isinstance(e, dict) for k in e)})


@cache
def group_dirs() -> frozenset[str]:
    return frozenset(p.name for p in _files("conf").iterdir() if p.is_dir() and not p.name.startswith("_"))

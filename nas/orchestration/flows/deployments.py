"""The deployments `nas serve` offers, read from `nas/conf/serve/NAME.yaml` or a YAML file:

    limit: 2                         # flow runs at once (null: no limit)
    deployments:
      table-search:                  # deployment name; Prefect's full name is <flow name>/<this>
        flow: nas.orchestration.flows.entry:search_overrides_flow
        cron: null                   # or "0 3 * * *" (UTC): also run on this schedule
        description: ...
        parameters: {...}            # defaults of a run, each changeable per run

Deployments are keyed by name so that dotted overrides can reach one:
`deployments.table-search.cron='0 * * * *'`; `deployments.NAME=null` drops it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from nas.errors import ConfigError

ENTRY_KEYS = ("flow", "cron", "description", "parameters")


@dataclass(frozen=True)
class Entry:
    name: str
    flow: str  # "module:function"
    cron: str | None = None
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServeConfig:
    entries: list[Entry]
    limit: int | None


def available() -> list[str]:
    folder = resources.files("nas.conf") / "serve"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_config(config: str = "default", overrides: list[str] | None = None) -> ServeConfig:
    """`config` is a name in nas/conf/serve/ or a path to a YAML file."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if config.endswith((".yaml", ".yml")) or "/" in config:
        path = Path(config)
        if not path.is_file():
            raise ConfigError(f"serve config {config} not found")
        text = path.read_text()
    elif config in available():
        text = (resources.files("nas.conf") / "serve" / f"{config}.yaml").read_text()
    else:
        raise ConfigError(f"unknown serve config '{config}' (valid: {', '.join(available())}, or a .yaml file)")
    try:
        cfg = OmegaConf.merge(OmegaConf.create(text), OmegaConf.from_dotlist(list(overrides or [])))
        raw = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(f"serve config {config}: {str(err).splitlines()[0]}") from None
    return _parse(raw if isinstance(raw, dict) else {}, config)


def _parse(raw: dict[str, Any], where: str) -> ServeConfig:
    unknown = sorted(set(raw) - {"limit", "deployments"})
    if unknown:
        raise ConfigError(f"serve config {where}: unknown key '{unknown[0]}' (valid: limit, deployments)")
    limit = raw.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"serve config {where}: limit must be an integer >= 1 or null, got {limit!r}")
    deployments = raw.get("deployments") or {}
    if not isinstance(deployments, dict):
        raise ConfigError(f"serve config {where}: deployments must be a mapping of name to entry")
    entries = []
    for name, body in deployments.items():
        if body is None:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("flow"), str) or ":" not in body["flow"]:
            raise ConfigError(f"deployment '{name}': needs flow: 'module:function'")
        bad = sorted(set(body) - set(ENTRY_KEYS))
        if bad:
            raise ConfigError(f"deployment '{name}': unknown key '{bad[0]}' (valid: {', '.join(ENTRY_KEYS)})")
        if not isinstance(body.get("parameters") or {}, dict):
            raise ConfigError(f"deployment '{name}': parameters must be a mapping")
        entries.append(Entry(str(name), body["flow"], body.get("cron"), body.get("description"),
                             dict(body.get("parameters") or {})))
    if not entries:
        raise ConfigError(f"serve config {where}: no deployments")
    return ServeConfig(entries, limit)


def load_flow(entry: Entry):
    from prefect import Flow

    module, _, name = entry.flow.partition(":")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"deployment '{entry.name}': cannot import {entry.flow} ({err})") from None
    if not isinstance(obj, Flow):
        raise ConfigError(f"deployment '{entry.name}': {entry.flow} is not a Prefect flow")
    return obj


def build(entry: Entry):
    """The RunnerDeployment, after checking its parameters and schedule, so that a typo
    fails at `nas serve` rather than at 3 am."""
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.exceptions import ParameterTypeError, SignatureMismatchError
    from prefect.types.entrypoint import EntrypointType

    flow = load_flow(entry)
    try:
        flow.validate_parameters(entry.parameters)
    except (ParameterTypeError, SignatureMismatchError) as err:
        raise ConfigError(f"deployment '{entry.name}': parameters: {str(err).splitlines()[0]}") from None
    if entry.cron is not None:
        try:
            CronSchedule(cron=entry.cron)
        except ValueError:
            raise ConfigError(f"deployment '{entry.name}': invalid cron {entry.cron!r}") from None
    return flow.to_deployment(name=entry.name, cron=entry.cron, parameters=entry.parameters,
                              description=entry.description or flow.description,
                              entrypoint_type=EntrypointType.MODULE_PATH)

"""The deployments of prefect.yaml (Prefect's own format, the one `prefect deploy --all` reads):
read, checked, built, and served by `nas serve` in one Prefect `Runner` process (Prefect's name;
here `host`, as "runner" is the `runner` config group) until Ctrl-C or SIGTERM; `nas serve`
(nas/cli/serve.py) parses and prints around it. The Prefect server they report to is
flows/prefect_server.py's.

Of each deployment it reads `name`, `entrypoint` (`flows/<file>.py:<flow function>`, imported
as the module `flows.<file>`), `parameters`, `schedules` (`cron`, `timezone`, `active`),
`description`, `concurrency_limit`, `tags` and `version`; `work_pool` and the top-level
`build`/`push`/`pull` steps are for `prefect deploy` and a worker, not for serving. Everything
is checked before anything is served (a typo fails here, not at 3 am): unknown keys,
the parameters against the flow's signature, each cron and timezone.

Overrides (`nas serve NAME.KEY=VALUE`) reach one deployment by name: `NAME.parameters.root=DIR`,
`NAME.cron='0 4 * * *'` (shorthand: replaces its schedules with that one, in UTC;
`NAME.cron=null` leaves it on demand), `NAME=null` drops it."""

from __future__ import annotations

import asyncio
import importlib
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from prefect import Flow
from prefect.client.schemas.schedules import CronSchedule
from prefect.exceptions import ParameterTypeError, SignatureMismatchError
from prefect.runner import Runner
from prefect.schedules import Cron
from prefect.types.entrypoint import EntrypointType

from nas.core.registry import check_keys
from nas.errors import ConfigError

# The checkout's prefect.yaml, beside the `flows` package (absent in an installed wheel).
PROJECT_FILE = Path(__file__).resolve().parents[1] / "prefect.yaml"
TOP_KEYS = ("name", "prefect-version", "build", "push", "pull", "deployments", "definitions")
ENTRY_KEYS = ("name", "entrypoint", "description", "parameters", "schedules", "work_pool", "concurrency_limit",
              "tags", "version")
SCHEDULE_KEYS = ("cron", "timezone", "active")
ENTRYPOINT = re.compile(r"^(?:[A-Za-z_]\w*/)*[A-Za-z_]\w*\.py:[A-Za-z_]\w*$")


@dataclass(frozen=True)
class Schedule:
    cron: str
    timezone: str = "UTC"
    active: bool = True

    def __str__(self) -> str:
        return f"{self.cron} ({self.timezone}{'' if self.active else ', inactive'})"


@dataclass(frozen=True)
class Entry:
    name: str
    entrypoint: str  # "flows/<file>.py:<function>"
    parameters: dict[str, Any] = field(default_factory=dict)
    schedules: tuple[Schedule, ...] = ()
    description: str | None = None
    concurrency_limit: int | None = None
    tags: tuple[str, ...] = ()
    version: str | None = None

    @property
    def module(self) -> str:
        """`flows/entry.py:fn` -> `flows.entry`: imported as the installed package, from any cwd."""
        return self.entrypoint.partition(":")[0].removesuffix(".py").replace("/", ".")

    @property
    def function(self) -> str:
        return self.entrypoint.partition(":")[2]


def default_file() -> Path:
    """The checkout's prefect.yaml; else (an installed wheel) ./prefect.yaml, as `prefect deploy` reads it."""
    for path in (PROJECT_FILE, Path("prefect.yaml")):
        if path.is_file():
            return path
    raise ConfigError(f"no prefect.yaml at {PROJECT_FILE} or in the current directory; pass --file PATH")


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> list[Entry]:
    """The deployments of a prefect.yaml (default: `default_file()`), overrides applied, checked."""
    path = Path(path) if path is not None else default_file()
    where = str(path)
    if not path.is_file():
        raise ConfigError(f"{where} not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: cannot read ({err})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({_problem(err, lines=True)})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a mapping with a 'deployments' list")
    check_keys(where, raw, TOP_KEYS)
    listed = raw.get("deployments")
    if not isinstance(listed, list):
        raise ConfigError(f"{where}: 'deployments' must be a list of deployments")
    bodies: dict[str, Any] = {}
    for i, body in enumerate(listed):
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where}: deployments[{i}] needs a name")
        if name in bodies:
            raise ConfigError(f"{where}: deployment '{name}' is declared twice")
        bodies[name] = {k: v for k, v in body.items() if k != "name"}
    bodies = _apply(bodies, list(overrides or []))
    entries = [_entry(name, body) for name, body in bodies.items() if body is not None]
    if not entries:
        raise ConfigError(f"{where}: no deployments")
    return entries


def _apply(bodies: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """`NAME.KEY=VALUE` overrides (values parsed as Hydra's are); `NAME.cron=EXPR` is shorthand
    for one UTC cron schedule."""
    if not overrides:
        return bodies
    try:
        merged = OmegaConf.create(bodies)
    except OmegaConfBaseException as err:
        raise ConfigError(f"overrides: cannot apply to these deployments ({str(err).splitlines()[0]})") from None
    crons: dict[str, Any] = {}
    for override in overrides:
        key, eq, value = override.partition("=")
        name = key.partition(".")[0]
        if not eq or not key:
            raise ConfigError(f"override '{override}': expected NAME.KEY=VALUE or NAME=null")
        if name not in bodies:
            raise ConfigError(f"override '{override}': no deployment '{name}' (valid: {', '.join(bodies)})")
        try:
            if key == f"{name}.cron":
                crons[name] = OmegaConf.from_dotlist([f"cron={value}"])["cron"]
            else:
                merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([override]))
        except yaml.YAMLError as err:
            raise ConfigError(f"override '{override}': not valid YAML ({_problem(err)})") from None
        except OmegaConfBaseException as err:
            raise ConfigError(f"override '{override}': {str(err).splitlines()[0]}") from None
    out = OmegaConf.to_container(merged, resolve=False)  # a `${...}` in a parameter is the flow's
    assert isinstance(out, dict)
    for name, cron in crons.items():
        if out[name] is not None:
            out[name]["schedules"] = [] if cron is None else [{"cron": str(cron), "timezone": "UTC"}]
    return out


def _problem(err: Exception, lines: bool = False) -> str:
    """A YAML error in a few words: what (and, in a file, on which line)."""
    problem, mark = getattr(err, "problem", None), getattr(err, "problem_mark", None)
    if not problem:
        return " ".join(str(err).split())
    return f"{problem} on line {mark.line + 1}" if lines and mark is not None else problem


def _entry(name: str, body: Any) -> Entry:
    here = f"deployment '{name}'"
    if not isinstance(body, dict):
        raise ConfigError(f"{here}: must be a mapping")
    check_keys(here, body, ENTRY_KEYS)
    entrypoint = body.get("entrypoint")
    if not isinstance(entrypoint, str) or not ENTRYPOINT.match(entrypoint):
        raise ConfigError(f"{here}: entrypoint must be 'path/to/file.py:flow_function', got {entrypoint!r}")
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ConfigError(f"{here}: parameters must be a mapping")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise ConfigError(f"{here}: description must be a string")
    limit = body.get("concurrency_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"{here}: concurrency_limit must be an integer >= 1 or null, got {limit!r}")
    tags = body.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"{here}: tags must be a list of strings")
    version = body.get("version")
    if version is not None and not isinstance(version, str):
        raise ConfigError(f"{here}: version must be a string")
    pool = body.get("work_pool")
    if pool is not None and not isinstance(pool, dict):
        raise ConfigError(f"{here}: work_pool must be a mapping (name: POOL)")
    return Entry(name, entrypoint, dict(parameters), _schedules(here, body.get("schedules")), description,
                 limit, tuple(tags), version)


def _schedules(here: str, raw: Any) -> tuple[Schedule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{here}: schedules must be a list of {{cron: ..., timezone: UTC}}")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("cron"), str):
            raise ConfigError(f"{here}: each schedule needs cron: '<expression>', got {item!r}")
        check_keys(f"{here}: schedule", item, SCHEDULE_KEYS)
        timezone, active = item.get("timezone") or "UTC", item.get("active", True)
        if not isinstance(timezone, str) or not isinstance(active, bool):
            raise ConfigError(f"{here}: schedule: timezone must be a string and active true or false")
        out.append(Schedule(item["cron"], timezone, active))
    return tuple(out)


def load_flow(entry: Entry):
    try:
        obj = getattr(importlib.import_module(entry.module), entry.function)
    except (ImportError, AttributeError) as err:
        raise ConfigError(f"deployment '{entry.name}': cannot import {entry.entrypoint} ({err})") from None
    if not isinstance(obj, Flow):
        raise ConfigError(f"deployment '{entry.name}': {entry.entrypoint} is not a Prefect flow")
    return obj


def build(entry: Entry):
    """The RunnerDeployment, after checking its parameters and schedules."""
    flow = load_flow(entry)
    try:
        flow.validate_parameters(entry.parameters)
    except (ParameterTypeError, SignatureMismatchError) as err:
        raise ConfigError(f"deployment '{entry.name}': parameters: {str(err).splitlines()[0]}") from None
    for s in entry.schedules:
        try:
            CronSchedule(cron=s.cron)
        except ValueError:
            raise ConfigError(f"deployment '{entry.name}': invalid cron {s.cron!r}") from None
        try:
            CronSchedule(cron=s.cron, timezone=s.timezone)
        except ValueError:
            raise ConfigError(f"deployment '{entry.name}': invalid timezone {s.timezone!r}") from None
    return flow.to_deployment(
        name=entry.name, parameters=entry.parameters, description=entry.description or flow.description,
        schedules=[Cron(s.cron, timezone=s.timezone, active=s.active) for s in entry.schedules],
        concurrency_limit=entry.concurrency_limit, tags=list(entry.tags) or None, version=entry.version,
        entrypoint_type=EntrypointType.MODULE_PATH)


def describe(entries: list[Entry], limit: int | None) -> list[str]:
    """What would be served, one paragraph per deployment, then the limit; no server needed."""
    lines = []
    for entry in entries:
        try:
            full = f"{load_flow(entry).name}/{entry.name}"
        except ConfigError as err:
            full = f"?/{entry.name} (not servable: {err})"
        schedule = ", ".join(map(str, entry.schedules)) or "none (runs on demand)"
        lines.append(f"{full}\n  entrypoint: {entry.entrypoint}\n  schedule: {schedule}\n"
                     f"  parameters: {entry.parameters}")
    lines.append(f"limit: {limit or 'none'} flow runs at once")
    return lines


def serve(deployments: list[Any], limit: int | None) -> None:
    """Serve built deployments until stopped; returns once the host has stopped."""
    host = Runner(name="nas-serve", limit=limit, pause_on_shutdown=True)
    for deployment in deployments:
        host.add_deployment(deployment)
    try:
        asyncio.run(_run(host))
    except KeyboardInterrupt:
        pass


async def _run(host: Any) -> None:
    """prefect.serve's loop, but Ctrl-C and SIGTERM both take the host's own stop path:
    runs in flight are cancelled (not left Running), schedules paused; a second signal
    exits at once. (Prefect's SIGTERM handler calls the async stop without awaiting it.)"""
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task | None] = []

    def stop(*_: object) -> None:
        if stopping or not host.started:
            raise KeyboardInterrupt
        stopping.append(None)
        loop.call_soon_threadsafe(lambda: stopping.append(loop.create_task(host.astop())))

    host.handle_sigterm = stop  # Runner.start installs it for SIGTERM
    signal.signal(signal.SIGINT, stop)
    await host.start()

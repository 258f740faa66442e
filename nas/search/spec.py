"""A search's identity (what to build), the factories that build it, and the built search
(`Search`): made once per process and passed down from the check to the loop."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from nas.core.arch import stable_hash
from nas.core.constraint import Constraint
from nas.errors import ConfigError
from nas.evaluators import EVALUATORS, Evaluator
from nas.search.screen import ScreenSettings
from nas.spaces import SPACES, SearchSpace
from nas.strategies import STRATEGIES, Strategy

# Sanity bounds: a value above one is a typo (an extra zero or two), not a plan.
MAX_TRIALS = 1_000_000
MAX_BATCH_SIZE = 10_000
MAX_EPOCHS = 10_000


@dataclass(frozen=True)
class Component:
    name: str
    params: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, group: str, node: Any) -> "Component":
        if isinstance(node, str):
            return cls(node)
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise ConfigError(f"config group '{group}' needs a 'name' entry, got {node!r}")
        params = {k: v for k, v in node.items() if k != "name"}
        return cls(node["name"], params)


@dataclass(frozen=True)
class SearchSpec:
    space: Component
    strategy: Component
    evaluator: Component
    seed: int = 0
    trials: int = 100
    batch_size: int = 1
    constraint: Constraint = Constraint()
    in_flight: int = 1  # > 1: asynchronous steady state with this many evaluations running
    screen: ScreenSettings = ScreenSettings()

    def __post_init__(self) -> None:
        for name in ("seed", "trials", "batch_size", "in_flight"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{_where(name)} must be an integer, got {value!r}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.trials <= 0:
            raise ConfigError(f"budget.trials must be > 0, got {self.trials}")
        if self.batch_size <= 0:
            raise ConfigError(f"budget.batch_size must be > 0, got {self.batch_size}")
        if self.in_flight <= 0:
            raise ConfigError(f"budget.in_flight must be > 0, got {self.in_flight}")
        if self.in_flight > 1 and self.batch_size > 1:
            raise ConfigError(f"budget.in_flight={self.in_flight} runs evaluations asynchronously, one asked "
                              f"as each finishes: use budget.batch_size=1 with it (got {self.batch_size})")
        if self.in_flight > 1 and self.screen.active:
            raise ConfigError(f"screen.factor={self.screen.factor} screens whole batches: it does not work with "
                              f"budget.in_flight={self.in_flight} yet (use budget.batch_size instead)")
        for where, value, bound in (("budget.trials", self.trials, MAX_TRIALS),
                                    ("budget.batch_size", self.batch_size, MAX_BATCH_SIZE),
                                    ("budget.in_flight", self.in_flight, MAX_BATCH_SIZE),
                                    ("recipe.epochs", _epochs(self.evaluator), MAX_EPOCHS)):
            if isinstance(value, int) and value > bound:
                raise ConfigError(f"{where}={value} is above the sanity bound of {bound:,}")

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "SearchSpec":
        budget = cfg.get("budget") or {}
        return cls(
            space=Component.from_config("space", cfg.get("space")),
            strategy=Component.from_config("strategy", cfg.get("strategy")),
            evaluator=Component.from_config("evaluator", cfg.get("evaluator")),
            seed=cfg.get("seed", 0),
            trials=budget.get("trials", 100),
            batch_size=budget.get("batch_size", 1),
            in_flight=budget.get("in_flight", 1),
            constraint=Constraint.from_config(cfg.get("constraint")),
            screen=ScreenSettings.from_config(cfg.get("screen")),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SearchSpec":
        """Inverse of `to_dict`."""
        parts = {g: Component(**d[g]) for g in ("space", "strategy", "evaluator")}
        return cls(**parts, seed=d["seed"], trials=d["trials"], batch_size=d["batch_size"],
                   constraint=Constraint(**d.get("constraint", {})), in_flight=d.get("in_flight", 1),
                   screen=ScreenSettings(**d.get("screen", {})))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def batch_lines(self) -> int:
        """history.jsonl lines one batch appends: every candidate asked, screened-out ones too
        (at most this many lines past the saved state are a crash's, which resume cuts)."""
        return self.batch_size * self.screen.factor

    def identity(self) -> str:
        return stable_hash(self.identity_fields())

    def identity_fields(self) -> dict[str, Any]:
        """Everything that fixes the trajectory (`identity` is its hash); the trial budget is
        excluded so a finished run can be extended by resuming with more.
        `evaluator.trust_self_reported` counts (strategies learn from self-reported results only
        when it is true), except when false, so identities of runs that do not trust them predate it.
        `budget.in_flight` counts (history is in completion order), except its default 1,
        so identities of batch runs predate it. `evaluator.sandbox.tmp_mb` counts, except at
        its default (`Limits.tmp_mb`, the one place it is set), so identities of runs from before
        it hold. Screening is in it (when on): it changes which candidates are evaluated."""
        d = self.to_dict()
        d.pop("trials")
        if self.in_flight == 1:
            d.pop("in_flight")
        if d["evaluator"]["params"].get("trust_self_reported") is not True:
            d["evaluator"]["params"].pop("trust_self_reported", None)
        from nas.sandbox.limits import Limits  # torch-free

        sandbox = d["evaluator"]["params"].get("sandbox")
        if isinstance(sandbox, dict) and sandbox.get("tmp_mb") == Limits.tmp_mb:
            del sandbox["tmp_mb"]
        if not self.constraint.active:  # identities of unconstrained runs predate constraints
            d.pop("constraint")
        if not self.screen.active:  # nor do those of unscreened runs predate screening
            d.pop("screen")
        return d

    # --- checks before anything is built or written ------------------------
    def check_pairing(self, space_label: str | None = None) -> None:
        """A strategy or evaluator that cannot take the space stops here, with the
        fix in the message: the right space for it, or the right one for the space."""
        label = space_label or self.space.name
        natural = space_defaults(label)
        space_cls = SPACES.get(self.space.name)
        strategy_cls = STRATEGIES.get(self.strategy.name)
        if not _searches(strategy_cls, self.space.name, space_cls.open_ended):
            spaces = [n for n in SPACES.names() if _searches(strategy_cls, n, SPACES.get(n).open_ended)]
            fits = [n for n in STRATEGIES.names()
                    if _searches(STRATEGIES.get(n), self.space.name, space_cls.open_ended)]
            kind = "the open-ended" if space_cls.open_ended else "the categorical"
            raise ConfigError(
                f"strategy={self.strategy.name} searches space={'|'.join(spaces)}, not {kind} space={label}: "
                f"use space={'|'.join(spaces)}, or for space={label} use "
                f"strategy={'|'.join(_first(natural.get('strategy'), fits))}")
        evaluator_cls = EVALUATORS.get(self.evaluator.name)
        if not evaluator_cls.accepts(space_cls):
            fits = [n for n in EVALUATORS.names() if EVALUATORS.get(n).accepts(space_cls)]
            raise ConfigError(
                f"evaluator={self.evaluator.name} scores space={'|'.join(evaluator_cls.spaces())}, not "
                f"space={label}: use space={'|'.join(evaluator_cls.spaces())}, or for space={label} use "
                f"evaluator={'|'.join(_first(natural.get('evaluator'), fits))}")

    def check_budget(self, space: SearchSpace) -> None:
        """More trials than a finite space has members, with a strategy that never repeats one."""
        size = space.size()
        unique = self.strategy.params.get("unique", True) is not False
        if size is not None and unique and self.trials > size:
            raise ConfigError(
                f"budget.trials={self.trials} is more than space {space.name} has members ({size:,}) and "
                f"strategy {self.strategy.name} never repeats one: use budget.trials<={size}")

    # --- factories --------------------------------------------------------
    def build_space(self) -> SearchSpace:
        return build_space(self.space, self.evaluator)

    def build_strategy(self, space: SearchSpace) -> Strategy:
        if self.in_flight > 1 and not STRATEGIES.get(self.strategy.name).asynchronous:
            fits = [n for n in STRATEGIES.names() if STRATEGIES.get(n).asynchronous]
            raise ConfigError(f"budget.in_flight={self.in_flight}: strategy={self.strategy.name} works in batches "
                              f"(it needs each batch's results together); use budget.in_flight=1 with it, or "
                              f"strategy={'|'.join(fits)}")
        strategy = STRATEGIES.create(self.strategy.name, self.strategy.params, space=space, seed=self.seed)
        strategy.constrain(self.constraint)
        return strategy

    def build_evaluator(self, space: SearchSpace) -> Evaluator:
        return build_evaluator(self.evaluator, space)

    def build(self) -> Search:
        """The checks that need the parts, then the parts (each error one line)."""
        space = self.build_space()
        self.check_budget(space)
        return Search(self, space, self.build_strategy(space), self.build_evaluator(space))


@dataclass(frozen=True)
class Search:
    """One search's parts, built once per process: the command's checks build them, and the
    run dir, the runner, the flow and the loop use that same space, strategy and evaluator
    (passed down in the search's `Session`, nas/search/session.py)."""

    spec: SearchSpec
    space: SearchSpace
    strategy: Strategy
    evaluator: Evaluator


def build_space(space: Component, evaluator: Component) -> SearchSpace:
    """The configured space; a setting left null takes the value `evaluator`'s configuration fixes
    (`Evaluator.space_settings`: a released supernet's width), else the space's own meaning of null."""
    params = dict(space.params)
    unset = [k for k, v in params.items() if v is None]
    if unset:
        fixed = EVALUATORS.get(evaluator.name).space_settings(space.name, evaluator.params)
        params.update({k: fixed[k] for k in unset if k in fixed})
    return SPACES.create(space.name, params)


def build_evaluator(component: Component, space: SearchSpace) -> Evaluator:
    """The configured evaluator, after checking that it accepts `space`."""
    cls = EVALUATORS.get(component.name)
    if not cls.accepts(type(space)):
        raise ConfigError(
            f"evaluator '{cls.name}' does not support space '{space.name}' "
            f"(supports: {', '.join(cls.spaces())})"
        )
    return EVALUATORS.create(component.name, component.params, space=space)


def _where(name: str) -> str:
    return name if name == "seed" else f"budget.{name}"


def _epochs(evaluator: Component) -> Any:
    recipe = evaluator.params.get("recipe")
    return recipe.get("epochs") if isinstance(recipe, dict) else None


def _searches(strategy_cls: type[Strategy], space: str, open_ended: bool) -> bool:
    """Strategies naming their spaces search those; the others need a categorical space."""
    return space in strategy_cls.spaces if strategy_cls.spaces else not open_ended


def _first(natural: str | None, names: list[str]) -> list[str]:
    """The space's natural choice (a preset name, e.g. quick) first."""
    return [natural, *(n for n in names if n != natural)] if natural else names


def space_defaults(label: str) -> dict[str, str]:
    """The natural strategy and evaluator of a space preset (conf/space_defaults/<label>.yaml)."""

    import yaml  # lazy: loads yaml (start-up time)

    path = resources.files("conf") / "space_defaults" / f"{label}.yaml"
    if not path.is_file():
        return {}
    entries = yaml.safe_load(path.read_text()).get("defaults") or []
    return {k.lstrip("/"): v for entry in entries if isinstance(entry, dict) for k, v in entry.items()}

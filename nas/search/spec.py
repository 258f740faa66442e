"""A search's identity (what to build) and the factories that build it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from nas.arch.base import stable_hash
from nas.errors import ConfigError
from nas.search.constraint import Constraint
from nas.evaluators import EVALUATORS, Evaluator
from nas.spaces import SPACES, SearchSpace
from nas.strategies import STRATEGIES, Strategy


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

    def __post_init__(self) -> None:
        for name in ("seed", "trials", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{_where(name)} must be an integer, got {value!r}")
        if self.trials <= 0:
            raise ConfigError(f"budget.trials must be > 0, got {self.trials}")
        if self.batch_size <= 0:
            raise ConfigError(f"budget.batch_size must be > 0, got {self.batch_size}")

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
            constraint=Constraint.from_config(cfg.get("constraint")),
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SearchSpec":
        """Inverse of `to_dict`."""
        parts = {g: Component(**d[g]) for g in ("space", "strategy", "evaluator")}
        return cls(**parts, seed=d["seed"], trials=d["trials"], batch_size=d["batch_size"],
                   constraint=Constraint(**d.get("constraint", {})))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity(self) -> str:
        """Hash of everything that fixes the trajectory; the trial budget is
        excluded so a finished run can be extended by resuming with more, and
        `evaluator.trust_self_reported` since it only changes which trial is reported best."""
        d = self.to_dict()
        d.pop("trials")
        d["evaluator"]["params"].pop("trust_self_reported", None)
        if not self.constraint.active:  # identities of unconstrained runs predate constraints
            d.pop("constraint")
        return stable_hash(d)

    # --- factories --------------------------------------------------------
    def build_space(self) -> SearchSpace:
        return SPACES.create(self.space.name, self.space.params)

    def build_strategy(self, space: SearchSpace) -> Strategy:
        strategy = STRATEGIES.create(self.strategy.name, self.strategy.params, space=space, seed=self.seed)
        strategy.constrain(self.constraint)
        return strategy

    def build_evaluator(self, space: SearchSpace) -> Evaluator:
        return build_evaluator(self.evaluator, space)


def build_evaluator(component: Component, space: SearchSpace) -> Evaluator:
    """The configured evaluator, after checking that it accepts `space`."""
    cls = EVALUATORS.get(component.name)
    if space.name not in cls.spaces:
        raise ConfigError(
            f"evaluator '{cls.name}' does not support space '{space.name}' "
            f"(supports: {', '.join(cls.spaces)})"
        )
    return EVALUATORS.create(component.name, component.params, space=space)


def _where(name: str) -> str:
    return name if name == "seed" else f"budget.{name}"

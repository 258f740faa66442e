"""Size limits as one object: the FLOPs and params a network may have. A search's
`constraint` is checked before evaluation where the space prices its architectures
(OFA-style: strategies redraw or the Coordinator rejects); an evaluator's `budget`
sizes the block networks it builds (the widest that fits) and is what the design
strategies verify their drafts against."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from nas.core.registry import check_keys
from nas.errors import ConfigError

if TYPE_CHECKING:
    from nas.core.arch import Architecture
    from nas.core.space import SearchSpace

KEYS = ("flops", "params")


@dataclass(frozen=True)
class Constraint:
    flops: float | None = None   # maximum FLOPs (multiply-adds as fvcore counts them); None: no limit
    params: float | None = None  # maximum parameters; None: no limit

    def __post_init__(self) -> None:
        _check_values("constraint", self.flops, self.params)

    @classmethod
    def from_config(cls, node: Any, where: str = "constraint") -> "Constraint":
        """A `{flops, params}` mapping (either may be missing or null); errors name `where`."""
        if node is None:
            return cls()
        if not isinstance(node, dict):
            raise ConfigError(f"{where} must be a mapping with flops/params, got {node!r}")
        check_keys(where, node, KEYS)
        _check_values(where, node.get("flops"), node.get("params"))
        return cls(node.get("flops"), node.get("params"))

    @classmethod
    def nb201(cls, input_size: int) -> "Constraint":
        """NADER/NB201 limits: 1.5 M params and 0.2 GFLOPs at 32x32 (CIFAR), 0.05 at 16x16 (ImageNet16-120)."""
        return cls(flops=0.05e9 if input_size <= 16 else 0.2e9, params=1.5e6)

    def filled(self, default: "Constraint") -> "Constraint":
        """This constraint with the limits it leaves open taken from `default`."""
        return Constraint(flops=default.flops if self.flops is None else self.flops,
                          params=default.params if self.params is None else self.params)

    @property
    def active(self) -> bool:
        return self.flops is not None or self.params is not None

    def fits(self, params: float, flops: float) -> bool:
        return (self.params is None or params <= self.params) and (self.flops is None or flops <= self.flops)

    def to_dict(self) -> dict[str, float | None]:
        return asdict(self)

    def validate(self, space: SearchSpace, arch: Architecture) -> None:
        """Fail at set-up, not mid-search, when the space cannot price its architectures."""
        if self.active and space.cost(arch) is None:
            raise ConfigError(f"constraint: space '{space.name}' cannot measure FLOPs/params before evaluation; "
                              "drop the constraint or use a space with a cost model")

    def violation(self, space: SearchSpace, arch: Architecture) -> str | None:
        """Why `arch` breaks the constraint, in one line; None if it meets it (or none is set)."""
        if not self.active:
            return None
        cost = space.cost(arch)
        if cost is None:
            return None
        if self.flops is not None and cost.flops > self.flops:
            return f"{cost.flops / 1e6:.2f} MFLOPs exceeds the limit of {self.flops / 1e6:.2f} MFLOPs"
        if self.params is not None and cost.params > self.params:
            return f"{cost.params / 1e6:.3f} M params exceeds the limit of {self.params / 1e6:.3f} M"
        return None


def _check_values(where: str, flops: Any, params: Any) -> None:
    for name, value in (("flops", flops), ("params", params)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise ConfigError(f"{where}.{name} must be a positive number or null, got {value!r}")

"""Hardware constraints checked before evaluation (OFA-style: FLOPs and params
limits that candidates must meet; strategies redraw or the Coordinator rejects)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nas.core.arch import Architecture
from nas.errors import ConfigError
from nas.core.space import SearchSpace


@dataclass(frozen=True)
class Constraint:
    flops: float | None = None   # maximum FLOPs (multiply-adds as fvcore counts them)
    params: float | None = None  # maximum parameters

    def __post_init__(self) -> None:
        for name in ("flops", "params"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"constraint.{name} must be a positive number or null, got {value!r}")

    @classmethod
    def from_config(cls, node: Any) -> "Constraint":
        if node is None:
            return cls()
        if not isinstance(node, dict):
            raise ConfigError(f"constraint must be a mapping with flops/params, got {node!r}")
        unknown = set(node) - {"flops", "params"}
        if unknown:
            raise ConfigError(f"constraint: unknown key(s) {', '.join(sorted(unknown))} (valid: flops, params)")
        return cls(node.get("flops"), node.get("params"))

    @property
    def active(self) -> bool:
        return self.flops is not None or self.params is not None

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

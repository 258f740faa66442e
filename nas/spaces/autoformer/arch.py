"""An AutoFormer subnet: a ViT with one depth and embed dim for the whole net
and a head count and MLP ratio per active layer.

Only structure is checked here (types, lengths); which values are legal is
the space's business (`nas.spaces.autoformer.space`), since presets differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from nas.core.arch import Architecture
from nas.core.registry import check_keys
from nas.errors import EncodingError

FIELDS: tuple[str, ...] = ("depth", "embed_dim", "heads", "mlp_ratio")
# The network variants (`nas.spaces.autoformer.network` says what each does), here so the space checks them without torch.
POOLS: tuple[str, ...] = ("cls", "mean")
QKV_LAYOUTS: tuple[str, ...] = ("heads", "interleaved")


def mlp_hidden(ratio: float, embed_dim: int) -> int:
    """A layer's MLP width, as AutoFormer rounds it (the space's cost and the network both use it)."""
    return int(ratio * embed_dim)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True, eq=False)
class AutoFormerArch(Architecture):
    depth: int
    embed_dim: int
    heads: tuple[int, ...]  # one per active layer
    mlp_ratio: tuple[float, ...]  # one per active layer

    space: ClassVar[str] = "autoformer"

    def __post_init__(self) -> None:
        for name in ("depth", "embed_dim"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise EncodingError(f"autoformer: {name} must be a positive integer, got {value!r}")
        for name, ok, kind in (("heads", _is_int, "integer"), ("mlp_ratio", _is_number, "number")):
            values = getattr(self, name)
            if not isinstance(values, (list, tuple)):
                raise EncodingError(f"autoformer: {name} must be a list, got {type(values).__name__}")
            if len(values) != self.depth:
                raise EncodingError(f"autoformer: {name} has {len(values)} values but depth is {self.depth}")
            for i, v in enumerate(values):
                if not ok(v) or v <= 0:
                    raise EncodingError(f"autoformer: {name}[{i}] = {v!r} is not a positive {kind}")
        # Lists become tuples and ratios floats, so 4 and 4.0 give one canonical form.
        object.__setattr__(self, "heads", tuple(self.heads))
        object.__setattr__(self, "mlp_ratio", tuple(float(r) for r in self.mlp_ratio))

    def canonical(self) -> str:
        heads = ",".join(str(h) for h in self.heads)
        ratios = ",".join(repr(r) for r in self.mlp_ratio)  # shortest round-trip form: 3.0, 3.5
        return f"depth={self.depth} embed={self.embed_dim} heads={heads} mlp={ratios}"

    def encode(self) -> dict[str, Any]:
        return {"depth": self.depth, "embed_dim": self.embed_dim,
                "heads": list(self.heads), "mlp_ratio": list(self.mlp_ratio)}

    @classmethod
    def decode(cls, data: Any) -> "AutoFormerArch":
        if not isinstance(data, dict):
            raise EncodingError(f"autoformer: encoding must be an object with {', '.join(FIELDS)}, "
                                f"got {type(data).__name__}")
        missing = [f for f in FIELDS if f not in data]
        if missing:
            raise EncodingError(f"autoformer: encoding lacks '{missing[0]}'")
        check_keys("autoformer", data, FIELDS, what="field", error=EncodingError)
        return cls(**{f: data[f] for f in FIELDS})

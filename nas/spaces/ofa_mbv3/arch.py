"""An OFA MobileNetV3 subnet: resolution, per-stage depth, per-block kernel and expansion.

The encoding is CoLLM-NAS's: `{'r': [176], 'd': [5 ints], 'ks': [20 ints], 'e': [20 ints]}`.
The network has 5 stages of `len(ks) // 5` blocks; stage i runs only its first
`d[i]` blocks, so the ks/e of the other blocks do not change the network and
are left out of the canonical form. This class checks structure (lengths,
ints, depths within a stage); the space checks values against its choice sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any, ClassVar

from nas.core.arch import Architecture
from nas.core.registry import check_keys
from nas.errors import EncodingError

NUM_STAGES = 5
KEYS: tuple[str, ...] = ("r", "d", "ks", "e")


def as_int(name: str, value: Any) -> int:
    """`value` as an int; bools are rejected although Python calls them ints."""
    if isinstance(value, Integral) and not isinstance(value, bool):
        return int(value)
    raise EncodingError(f"ofa_mbv3: {name} = {value!r} is not an int")


def _ints(name: str, values: Any) -> tuple[int, ...]:
    if not isinstance(values, (list, tuple)):
        raise EncodingError(f"ofa_mbv3: {name} must be a list of ints, got {type(values).__name__}")
    return tuple(as_int(f"{name}[{i}]", v) for i, v in enumerate(values))


@dataclass(frozen=True, eq=False)
class OFAMbv3Arch(Architecture):
    r: int  # input resolution
    d: tuple[int, ...]  # active blocks per stage
    ks: tuple[int, ...]  # depthwise kernel size per block, stage-major
    e: tuple[int, ...]  # expansion ratio per block, stage-major

    space: ClassVar[str] = "ofa_mbv3"

    def __post_init__(self) -> None:
        object.__setattr__(self, "r", as_int("r", self.r))
        for name in KEYS[1:]:
            object.__setattr__(self, name, _ints(name, getattr(self, name)))
        if len(self.d) != NUM_STAGES:
            raise EncodingError(f"ofa_mbv3: d must have {NUM_STAGES} values, got {len(self.d)}")
        if not self.ks or len(self.ks) % NUM_STAGES:
            raise EncodingError(f"ofa_mbv3: ks must have a multiple of {NUM_STAGES} values, got {len(self.ks)}")
        if len(self.e) != len(self.ks):
            raise EncodingError(f"ofa_mbv3: e must have {len(self.ks)} values like ks, got {len(self.e)}")
        for i, depth in enumerate(self.d):
            if not 1 <= depth <= self.blocks_per_stage:
                raise EncodingError(f"ofa_mbv3: d[{i}] = {depth} is not in 1..{self.blocks_per_stage}")

    @property
    def blocks_per_stage(self) -> int:
        return len(self.ks) // NUM_STAGES

    def active_blocks(self) -> list[int]:
        """Indices into ks/e of the blocks the network runs (stage i: its first d[i])."""
        n = self.blocks_per_stage
        return [i * n + j for i, depth in enumerate(self.d) for j in range(depth)]

    def canonical(self) -> str:
        """`r176|k3e4,k5e6|...`: one group per stage listing its active blocks (the depth is the group's length)."""
        n = self.blocks_per_stage
        stages = (",".join(f"k{self.ks[i * n + j]}e{self.e[i * n + j]}" for j in range(depth))
                  for i, depth in enumerate(self.d))
        return f"r{self.r}|" + "|".join(stages)

    def encode(self) -> dict[str, list[int]]:
        return {"r": [self.r], "d": list(self.d), "ks": list(self.ks), "e": list(self.e)}

    @classmethod
    def decode(cls, data: Any, num_blocks: int | None = None) -> "OFAMbv3Arch":
        """The paper's dict; `r` may be an int or a 1-element list; `num_blocks` is the space's, when known."""
        if not isinstance(data, dict):
            raise EncodingError(f"ofa_mbv3: encoding must be a dict with keys r, d, ks, e, got {type(data).__name__}")
        for key in KEYS:
            if key not in data:
                raise EncodingError(f"ofa_mbv3: encoding is missing key '{key}' (needs r, d, ks, e)")
        check_keys("ofa_mbv3", data, KEYS, error=EncodingError)
        r = data["r"]
        if isinstance(r, (list, tuple)):
            if len(r) != 1:
                raise EncodingError(f"ofa_mbv3: r must be an int or a 1-element list, got {len(r)} values")
            r = r[0]
        for key in ("ks", "e"):
            if num_blocks is not None and isinstance(data[key], (list, tuple)) and len(data[key]) != num_blocks:
                raise EncodingError(f"ofa_mbv3: {key} must have {num_blocks} values, got {len(data[key])}")
        return cls(r, data["d"], data["ks"], data["e"])

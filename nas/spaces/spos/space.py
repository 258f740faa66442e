"""SPOS ShuffleNetV2 (Guo et al. 2020): 4 unit choices in each of 20 blocks, 4^20 networks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable

from nas.core.space import SPACES, CategoricalSpace, Cost, Decision
from nas.errors import ConfigError, EncodingError
from nas.lazy import LazyImport
from nas.spaces.spos.arch import CHOICE_NAMES, SPOSArch

# torch: the network module loads when a network is built, not with the space (the core stays torch-free)
spos_network = LazyImport("nas.spaces.spos.network")

if TYPE_CHECKING:
    from torch import nn

CHOICES: tuple[int, ...] = tuple(range(len(CHOICE_NAMES)))


@dataclass(frozen=True)
class BlockShape:
    """Where a choice block sits in the fixed skeleton; every candidate unit maps in→out channels."""

    in_channels: int
    out_channels: int
    stride: int


@SPACES.register("spos")
class SPOSSpace(CategoricalSpace[SPOSArch]):
    """Defaults are SPOS's ImageNet network. `stem_stride` is the stem conv's stride (SPOS has no
    max-pool); small inputs use 1 so four stride-2 stages still leave a feature map.
    `resolution` and `num_classes` only size the network whose costs `cost` reports."""

    def __init__(self, stage_repeats: tuple[int, ...] = (4, 4, 8, 4),
                 stage_channels: tuple[int, ...] = (64, 160, 320, 640), stem_channels: int = 16,
                 last_channels: int = 1024, resolution: int = 224, stem_stride: int = 2,
                 num_classes: int = 1000) -> None:
        self.stage_repeats = _ints("stage_repeats", stage_repeats)
        self.stage_channels = _ints("stage_channels", stage_channels)
        self.stem_channels = stem_channels
        self.last_channels = last_channels
        self.resolution = resolution
        self.stem_stride = stem_stride
        self.num_classes = num_classes
        self._check()

    def _check(self) -> None:
        if len(self.stage_repeats) != len(self.stage_channels):
            raise ConfigError(f"space 'spos': {len(self.stage_repeats)} stage_repeats but "
                              f"{len(self.stage_channels)} stage_channels")
        for name in ("stem_channels", "last_channels", "resolution", "num_classes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"space 'spos': {name} must be positive, got {getattr(self, name)}")
        if self.stem_stride not in (1, 2):
            raise ConfigError(f"space 'spos': stem_stride must be 1 or 2, got {self.stem_stride}")
        widths = (self.stem_channels, *self.stage_channels)
        for stage, (before, after) in enumerate(zip(widths, widths[1:])):
            # A stride-2 unit concatenates a projection of its input (`before` channels) with its
            # main branch, so the main branch gets `after - before`; stride-1 units halve `after`.
            if after <= before or after % 2:
                raise ConfigError(f"space 'spos': stage {stage} has {after} channels; it needs an even "
                                  f"number above the {before} it receives")

    # --- the skeleton -----------------------------------------------------
    def num_blocks(self) -> int:
        return sum(self.stage_repeats)

    def blocks(self) -> list[BlockShape]:
        """Each stage's first block halves the resolution; the rest keep it."""
        shapes, width = [], self.stem_channels
        for repeats, out in zip(self.stage_repeats, self.stage_channels):
            shapes.append(BlockShape(width, out, 2))
            shapes += [BlockShape(out, out, 1)] * (repeats - 1)
            width = out
        return shapes

    def config(self) -> tuple[Any, ...]:
        """Every setting, hashable: the cost table's cache key."""
        return (self.stage_repeats, self.stage_channels, self.stem_channels, self.last_channels,
                self.resolution, self.stem_stride, self.num_classes)

    # --- categorical space ----------------------------------------------------
    def decisions(self) -> list[Decision]:
        return [Decision(f"block[{i}]", CHOICES) for i in range(self.num_blocks())]

    def from_values(self, values: list[Any]) -> SPOSArch:
        return SPOSArch.decode(values, self.num_blocks())

    def to_values(self, arch: SPOSArch) -> list[Any]:
        if not isinstance(arch, SPOSArch) or len(arch.choices) != self.num_blocks():
            raise EncodingError(f"spos: expected an SPOS architecture with {self.num_blocks()} blocks, "
                                f"got {arch!r}")
        return list(arch.choices)

    def input_size(self, arch: SPOSArch) -> int:
        """The space's resolution: images are resized to it, so measured and modelled costs agree."""
        return self.resolution

    def build(self, arch: SPOSArch, num_classes: int, in_channels: int = 3, input_size: int = 32,
              options: Mapping[str, Any] | None = None) -> "nn.Module":
        return spos_network.subnet(self, arch, num_classes, in_channels)

    def decode(self, encoding: Any) -> SPOSArch:
        return SPOSArch.decode(encoding, self.num_blocks())

    # --- cost -------------------------------------------------------------------
    def cost(self, arch: SPOSArch) -> Cost:
        """Exact fvcore counts: a subnet is the fixed stem and head plus one unit per block."""
        base, per_block = cost_table(self.config())
        params, flops = base.params, base.flops
        for costs, choice in zip(per_block, self.to_values(arch), strict=True):
            params += costs[choice].params
            flops += costs[choice].flops
        return Cost(params, flops)

    def most_flops(self) -> SPOSArch:
        """Costs add up per block, so the costliest unit of each block gives the costliest network."""
        return self._by_flops(max)

    def fewest_flops(self) -> SPOSArch:
        return self._by_flops(min)

    def _by_flops(self, pick: Callable[..., int]) -> SPOSArch:
        _, per_block = cost_table(self.config())
        return self.from_values([pick(range(len(c)), key=lambda i, c=c: c[i].flops) for c in per_block])

    def describe(self) -> str:
        base, per_block = cost_table(self.config())
        low, high = (Cost(base.params + sum(pick(c.params for c in costs) for costs in per_block),
                          base.flops + sum(pick(c.flops for c in costs) for costs in per_block))
                     for pick in (min, max))
        n, first, stages = self.num_blocks(), 0, []
        for s, (repeats, channels) in enumerate(zip(self.stage_repeats, self.stage_channels)):
            stages.append(f"stage {s}: blocks {first}-{first + repeats - 1}, {channels} channels")
            first += repeats
        return (f"SPOS ShuffleNetV2 space ({len(CHOICES)}^{n} = {self.size():,} networks): a fixed "
                f"{self.resolution}px ShuffleNetV2 skeleton of {n} choice blocks ({'; '.join(stages)}). "
                "The first block of a stage halves the resolution; the others split the channels in half, "
                "transform one half and shuffle. Each block picks one unit: 0 = ShuffleNetV2 unit with a 3x3 "
                "depthwise conv, 1 = with 5x5, 2 = with 7x7 (larger receptive field, a little more compute), "
                "3 = Xception-style unit (three 3x3 depthwise-separable convs: deeper; the most FLOPs in "
                "wide non-downsampling blocks, fewer than 7x7 in downsampling ones). Networks have "
                f"{low.params / 1e6:.2f}M to {high.params / 1e6:.2f}M params and {low.flops / 1e6:.1f}M to "
                f"{high.flops / 1e6:.1f}M FLOPs (multiply-accumulates). Encoding: a JSON list of "
                f"{n} ints, block 0 (input side) first, e.g. {[i % len(CHOICES) for i in range(n)]}.")


def _ints(name: str, values: Any) -> tuple[int, ...]:
    """YAML gives lists; the space keeps tuples so its config is hashable."""
    if not isinstance(values, (list, tuple)) or not values or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise ConfigError(f"space 'spos': {name} must be a non-empty list of positive ints, got {values!r}")
    return tuple(values)


@lru_cache(maxsize=8)
def cost_table(config: tuple[Any, ...]) -> tuple[Cost, tuple[tuple[Cost, ...], ...]]:
    """(stem + head cost, cost of each choice in each block): measured once per skeleton on a
    random-init supernet, since no unit's cost depends on the other blocks' choices."""
    return spos_network.measure_costs(SPOSSpace(*config))

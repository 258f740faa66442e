"""Once-for-All MobileNetV3 space (CoLLM-NAS's "MobileNet space"): elastic
resolution, depth, kernel size and expansion ratio over 5 stages."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nas.core.space import SPACES, CategoricalSpace, Cost, Decision
from nas.errors import ConfigError, EncodingError
from nas.lazy import LazyImport
from nas.spaces.ofa_mbv3.arch import NUM_STAGES, OFAMbv3Arch

# torch: the network module loads when a network is built, not with the space (the core stays torch-free)
ofa_network = LazyImport("nas.spaces.ofa_mbv3.network")

if TYPE_CHECKING:
    from torch import nn

    from nas.spaces.ofa_mbv3.network import SubnetCost


def _choice_set(name: str, values: Any) -> tuple[int, ...]:
    """A config list of distinct positive ints → sorted tuple (decisions list choices small to large)."""
    ok = (isinstance(values, Sequence) and not isinstance(values, str) and values
          and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)
          and len(set(values)) == len(values))
    if not ok:
        raise ConfigError(f"space 'ofa_mbv3': {name} must be a non-empty list of distinct positive ints, "
                          f"got {values!r}")
    return tuple(sorted(values))


def _one_of(choices: tuple[int, ...]) -> str:
    return ", ".join(map(str, choices))


@SPACES.register("ofa_mbv3")
class OFAMbv3Space(CategoricalSpace[OFAMbv3Arch]):
    """Decisions r, d[0..4], ks[0..n-1], e[0..n-1] with n = 5 x the largest depth (20 in the paper)."""

    def __init__(self, resolutions: Sequence[int] = (160, 176, 192, 208, 224), depths: Sequence[int] = (2, 3, 4),
                 kernel_sizes: Sequence[int] = (3, 5, 7), expand_ratios: Sequence[int] = (3, 4, 6),
                 width_mult: float | None = None, num_classes: int = 1000) -> None:
        """`width_mult` None: 1.0, or under evaluator=supernet the checkpoint's (`nas.search.spec.build_space`)."""
        self.resolutions = _choice_set("resolutions", resolutions)
        self.depths = _choice_set("depths", depths)
        self.kernel_sizes = _choice_set("kernel_sizes", kernel_sizes)
        self.expand_ratios = _choice_set("expand_ratios", expand_ratios)
        if any(k % 2 == 0 for k in self.kernel_sizes):  # OFA crops smaller kernels from the centre of the largest
            raise ConfigError(f"space 'ofa_mbv3': kernel_sizes must be odd, got {list(self.kernel_sizes)}")
        if width_mult is None:
            width_mult = 1.0
        if isinstance(width_mult, bool) or not isinstance(width_mult, (int, float)):  # the registry checks no optional
            raise ConfigError(f"space 'ofa_mbv3': parameter 'width_mult' must be float, got {width_mult!r}")
        if width_mult <= 0 or num_classes < 1:
            raise ConfigError(f"space 'ofa_mbv3': width_mult and num_classes must be positive, "
                              f"got {width_mult} and {num_classes}")
        self.width_mult = float(width_mult)
        self.num_classes = num_classes
        self.blocks_per_stage = max(self.depths)
        self.num_blocks = NUM_STAGES * self.blocks_per_stage
        self._decisions = [
            Decision("r", self.resolutions),
            *(Decision(f"d[{i}]", self.depths) for i in range(NUM_STAGES)),
            *(Decision(f"ks[{j}]", self.kernel_sizes) for j in range(self.num_blocks)),
            *(Decision(f"e[{j}]", self.expand_ratios) for j in range(self.num_blocks)),
        ]
        self._cost: SubnetCost | None = None  # built on first cost(): it holds a randomly initialised supernet
        self._lock = threading.Lock()  # cost() reconfigures that supernet: calls must not interleave

    # --- CategoricalSpace -------------------------------------------------
    def decisions(self) -> list[Decision]:
        return list(self._decisions)

    def from_values(self, values: list[Any]) -> OFAMbv3Arch:
        if len(values) != len(self._decisions):
            raise EncodingError(f"ofa_mbv3: expected {len(self._decisions)} values (r, d[0..4], "
                                f"ks[0..{self.num_blocks - 1}], e[0..{self.num_blocks - 1}]), got {len(values)}")
        n = self.num_blocks
        return self.validate(OFAMbv3Arch(values[0], tuple(values[1:6]), tuple(values[6:6 + n]),
                                         tuple(values[6 + n:])))

    def to_values(self, arch: OFAMbv3Arch) -> list[Any]:
        return [arch.r, *arch.d, *arch.ks, *arch.e]

    def input_size(self, arch: OFAMbv3Arch) -> int:
        return arch.r

    def build(self, arch: OFAMbv3Arch, num_classes: int, in_channels: int = 3, input_size: int = 32,
              options: Mapping[str, Any] | None = None) -> "nn.Module":
        """OFA generates a subnet only from its elastic network: the subnet of a fresh supernet."""
        return ofa_network.subnet(ofa_network.elastic_network(self, num_classes, in_channels), self, arch)

    def decode(self, encoding: Any) -> OFAMbv3Arch:
        return self.validate(OFAMbv3Arch.decode(encoding, self.num_blocks))

    def validate(self, arch: OFAMbv3Arch) -> OFAMbv3Arch:
        """`arch` if every value is in this space's choice sets; else `EncodingError` naming the first bad one."""
        if len(arch.ks) != self.num_blocks:
            raise EncodingError(f"ofa_mbv3: ks and e must have {self.num_blocks} values, got {len(arch.ks)}")
        if arch.r not in self.resolutions:
            raise EncodingError(f"ofa_mbv3: r = {arch.r} is not one of {_one_of(self.resolutions)}")
        for name, values, choices in (("d", arch.d, self.depths), ("ks", arch.ks, self.kernel_sizes),
                                      ("e", arch.e, self.expand_ratios)):
            for i, v in enumerate(values):
                if v not in choices:
                    raise EncodingError(f"ofa_mbv3: {name}[{i}] = {v} is not one of {_one_of(choices)}")
        return arch

    def size(self) -> int:
        """Distinct networks: ks/e of blocks beyond a stage's depth do not count."""
        per_block = len(self.kernel_sizes) * len(self.expand_ratios)
        per_stage = sum(per_block ** d for d in self.depths)
        return len(self.resolutions) * per_stage ** NUM_STAGES

    # --- cost and prompts -------------------------------------------------
    def cost(self, arch: OFAMbv3Arch) -> Cost:
        """fvcore params/MACs of the static subnet at (1, 3, r, r) with `num_classes` outputs
        (see `nas.spaces.ofa_mbv3.network.SubnetCost`: per-block measurements, cached)."""
        with self._lock:
            if self._cost is None:
                self._cost = ofa_network.SubnetCost(self)
            return self._cost(arch)

    def describe(self) -> str:
        n, b = self.num_blocks, self.blocks_per_stage
        stages = "; ".join(f"stage {i}: blocks {i * b}-{i * b + b - 1}" for i in range(NUM_STAGES))
        return (
            f"Once-for-All MobileNetV3 space ({self.size():.3g} distinct networks, width multiplier "
            f"{self.width_mult:g}). The network is a stem, then 5 stages of up to {b} inverted-residual "
            f"(MBConv) blocks each ({n} blocks in all, numbered 0-{n - 1}: {stages}), then a classifier head. "
            f"Encoding (JSON): {{\"r\": [resolution], \"d\": [5 depths], \"ks\": [{n} kernel sizes], "
            f"\"e\": [{n} expansion ratios]}}. r is the input image size, one of {_one_of(self.resolutions)}. "
            f"d[i] is how many blocks stage i runs, one of {_one_of(self.depths)}: stage i runs only its first "
            f"d[i] blocks, so ks/e of the blocks after them are ignored (they do not change the network). "
            f"ks[j] is block j's depthwise kernel size, one of {_one_of(self.kernel_sizes)}; e[j] is its expansion "
            f"ratio (hidden width / input width), one of {_one_of(self.expand_ratios)}. Larger r, d, ks and e usually "
            "give more accurate but larger and slower networks."
        )

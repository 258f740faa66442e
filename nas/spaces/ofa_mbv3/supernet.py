"""Once-for-All MobileNetV3 supernet: a thin wrapper around `ofa`'s `OFAMobileNetV3`.

Training follows OFA: sandwich sampling and progressive shrinking, releasing
elastic kernel size, then depth, then expansion ratio (`phases`). The
resolution `r` belongs to no phase: OFA samples it in every phase from the
start, so the trainer should draw it freely and feed inputs of
`input_size(arch)` pixels (the network itself accepts any size).
"""

from __future__ import annotations

from typing import Any

import torch
from ofa.imagenet_classification.elastic_nn.networks import OFAMobileNetV3
from torch import nn

from nas.spaces.ofa_mbv3.arch import OFAMbv3Arch
from nas.errors import ConfigError
from nas.measure import count_params, flops_by_module
from nas.core.space import Cost
from nas.spaces.ofa_mbv3.space import OFAMbv3Space
from nas.supernets.base import SUPERNETS, Supernet


@SUPERNETS.register("ofa_mbv3")
class OFAMbv3Supernet(Supernet[OFAMbv3Arch, OFAMbv3Space]):
    default_sampling = "sandwich"
    phases = (("ks",), ("d",), ("e",))

    def __init__(self, space: OFAMbv3Space, num_classes: int, in_channels: int = 3,
                 dropout_rate: float = 0.1) -> None:
        if in_channels != 3:
            raise ConfigError(f"supernet 'ofa_mbv3': in_channels must be 3 (OFA's stem takes RGB; "
                              f"grey images are converted to RGB by the data pipeline), got {in_channels}")
        super().__init__(space, num_classes, in_channels)
        self.dropout_rate = dropout_rate
        # Fresh lists: OFA sorts the lists it is given in place.
        self.net = OFAMobileNetV3(n_classes=num_classes, dropout_rate=dropout_rate, width_mult=space.width_mult,
                                  ks_list=list(space.kernel_sizes), expand_ratio_list=list(space.expand_ratios),
                                  depth_list=list(space.depths))
        self.set_active(self.largest())

    def set_active(self, arch: OFAMbv3Arch) -> None:
        self.space.validate(arch)
        self.net.set_active_subnet(ks=list(arch.ks), e=list(arch.e), d=list(arch.d))
        self.active = arch

    def extract(self, arch: OFAMbv3Arch, copy_weights: bool = True) -> nn.Module:
        """A standalone MobileNetV3 (deep copy); `copy_weights=False` skips the copy when only its shape
        matters. The active subnet is left as it was."""
        previous = self.active
        self.set_active(arch)
        try:
            return self.net.get_active_subnet(preserve_weight=copy_weights)
        finally:
            self.set_active(previous)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "dropout_rate": self.dropout_rate}


class SubnetCost:
    """fvcore params and MACs of subnets, assembled from a table of per-block counts.

    fvcore's count is a sum over traced ops, so a subnet's count is its stem and
    head's plus each active block's, and a block's depends only on (r, block, ks, e)
    (its input width and size are fixed by its stage). A subnet with a block or
    resolution not yet in the table is traced whole, once, which records all its
    parts; later subnets made of known parts cost a few look-ups, so rejection
    sampling speeds up as it goes. Not thread-safe: the caller serialises calls.
    """

    def __init__(self, space: OFAMbv3Space) -> None:
        self.space = space
        self.supernet = OFAMbv3Supernet(space, space.num_classes)  # random weights: only shapes matter
        self._blocks: dict[tuple[int, int, int, int], tuple[int, int]] = {}  # (r, j, ks, e) -> (params, flops)
        self._base: dict[int, tuple[int, int]] = {}  # r -> stem and head (params, flops)

    def __call__(self, arch: OFAMbv3Arch) -> Cost:
        self.space.validate(arch)
        blocks = [(arch.r, j, arch.ks[j], arch.e[j]) for j in arch.active_blocks()]
        if arch.r not in self._base or any(b not in self._blocks for b in blocks):
            self._measure(arch, blocks)
        parts = [self._base[arch.r], *(self._blocks[b] for b in blocks)]
        return Cost(sum(p for p, _ in parts), sum(f for _, f in parts))

    def _measure(self, arch: OFAMbv3Arch, blocks: list[tuple[int, int, int, int]]) -> None:
        net = self.supernet.extract(arch, copy_weights=False)
        flops = flops_by_module(net, (1, 3, arch.r, arch.r))
        params, total = count_params(net), flops[""]
        for i, key in enumerate(blocks, start=1):  # the static net's blocks[0] is the fixed first block
            self._blocks[key] = (count_params(net.blocks[i]), flops[f"blocks.{i}"])
            params, total = params - self._blocks[key][0], total - self._blocks[key][1]
        self._base[arch.r] = (params, total)

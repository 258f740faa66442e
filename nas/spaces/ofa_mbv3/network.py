"""Once-for-All MobileNetV3's elastic network (`ofa`'s `OFAMobileNetV3`) and the subnets it
generates: a subnet's standalone network comes only from an elastic network, so the space
builds one here (random weights) and so does the supernet (`supernets/ofa_mbv3.py`), which
trains it. `SubnetCost` counts subnets from a table of per-block measurements."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ofa.imagenet_classification.elastic_nn.networks import OFAMobileNetV3
from torch import nn

from nas.core.space import Cost
from nas.errors import ConfigError
from nas.measure import count_params, flops_by_module
from nas.spaces.ofa_mbv3.arch import OFAMbv3Arch

if TYPE_CHECKING:  # annotations only: the space imports this module (lazily, for torch)
    from nas.spaces.ofa_mbv3.space import OFAMbv3Space


def elastic_network(space: OFAMbv3Space, num_classes: int, in_channels: int = 3,
                    dropout_rate: float = 0.1) -> OFAMobileNetV3:
    """A fresh elastic network of `space`, its largest subnet active."""
    if in_channels != 3:
        raise ConfigError(f"supernet 'ofa_mbv3': in_channels must be 3 (OFA's stem takes RGB; "
                          f"grey images are converted to RGB by the data pipeline), got {in_channels}")
    # Fresh lists: OFA sorts the lists it is given in place.
    return OFAMobileNetV3(n_classes=num_classes, dropout_rate=dropout_rate, width_mult=space.width_mult,
                          ks_list=list(space.kernel_sizes), expand_ratio_list=list(space.expand_ratios),
                          depth_list=list(space.depths))


def activate(net: OFAMobileNetV3, space: OFAMbv3Space, arch: OFAMbv3Arch) -> None:
    space.validate(arch)
    net.set_active_subnet(ks=list(arch.ks), e=list(arch.e), d=list(arch.d))


def subnet(net: OFAMobileNetV3, space: OFAMbv3Space, arch: OFAMbv3Arch, copy_weights: bool = True) -> nn.Module:
    """`arch`'s standalone MobileNetV3 (a deep copy; `copy_weights=False` skips the weights when only
    its shape matters). Leaves `arch` active: the caller restores what it had."""
    activate(net, space, arch)
    return net.get_active_subnet(preserve_weight=copy_weights)


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
        self.net = elastic_network(space, space.num_classes)  # random weights: only shapes matter
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
        net = subnet(self.net, self.space, arch, copy_weights=False)
        flops = flops_by_module(net, (1, 3, arch.r, arch.r))
        params, total = count_params(net), flops[""]
        for i, key in enumerate(blocks, start=1):  # the static net's blocks[0] is the fixed first block
            self._blocks[key] = (count_params(net.blocks[i]), flops[f"blocks.{i}"])
            params, total = params - self._blocks[key][0], total - self._blocks[key][1]
        self._base[arch.r] = (params, total)

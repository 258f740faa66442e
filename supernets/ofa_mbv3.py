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
from torch import nn

from nas.spaces.ofa_mbv3.arch import OFAMbv3Arch
from nas.spaces.ofa_mbv3.network import activate, elastic_network, subnet
from nas.spaces.ofa_mbv3.space import OFAMbv3Space
from supernets.base import SUPERNETS, Supernet


@SUPERNETS.register("ofa_mbv3")
class OFAMbv3Supernet(Supernet[OFAMbv3Arch, OFAMbv3Space]):
    default_sampling = "sandwich"
    phases = (("ks",), ("d",), ("e",))

    def __init__(self, space: OFAMbv3Space, num_classes: int, in_channels: int = 3,
                 dropout_rate: float = 0.1) -> None:
        net = elastic_network(space, num_classes, in_channels, dropout_rate)  # checks in_channels first
        super().__init__(space, num_classes, in_channels)
        self.dropout_rate = dropout_rate
        self.net = net
        self.set_active(self.largest())

    def set_active(self, arch: OFAMbv3Arch) -> None:
        activate(self.net, self.space, arch)
        self.active = arch

    def extract(self, arch: OFAMbv3Arch, copy_weights: bool = True) -> nn.Module:
        """A standalone MobileNetV3 (deep copy); `copy_weights=False` skips the copy when only its shape
        matters. The active subnet is left as it was."""
        previous = self.active
        try:
            return subnet(self.net, self.space, arch, copy_weights)
        finally:
            self.set_active(previous)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def config(self) -> dict[str, Any]:
        return {**super().config(), "dropout_rate": self.dropout_rate}

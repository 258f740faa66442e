"""AutoFormer's weight-entangled ViT supernet (Chen et al., 2021): the ViT of
`nas/spaces/autoformer/network.py` built with sliced layers at the supernet's sizes (the
space's largest choices, its embed width `super_embed_dim` when set); `extract` copies a
subnet's leading slices into a plain ViT. AutoFormer's released supernets load into it
through `supernets/released/autoformer.py`."""

from __future__ import annotations

from typing import Any

import torch

from nas.spaces.autoformer.arch import AutoFormerArch, mlp_hidden
from nas.spaces.autoformer.network import ViT
from nas.spaces.autoformer.space import AutoFormerSpace
from supernets.base import SUPERNETS, Supernet


@SUPERNETS.register("autoformer")
class AutoFormerSupernet(Supernet[AutoFormerArch, AutoFormerSpace]):
    default_sampling = "uniform"  # AutoFormer trains one uniformly sampled subnet per step

    def __init__(self, space: AutoFormerSpace, num_classes: int, in_channels: int = 3) -> None:
        super().__init__(space, num_classes, in_channels)
        largest = self.largest()  # at the stored width (an AutoFormerArch checks no choices: the space does)
        self.net = ViT(AutoFormerArch(largest.depth, space.super_embed_dim, largest.heads, largest.mlp_ratio),
                       sliced=True, **self._sizes())
        self.set_active(largest)

    def _sizes(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes, "in_channels": self.in_channels, **self.space.network_settings()}

    def set_active(self, arch: AutoFormerArch) -> None:
        self.space.validate(arch)
        net, e = self.net, arch.embed_dim
        net.depth, net.embed_dim = arch.depth, e
        net.patch_embed.out_active = e
        for block, heads, ratio in zip(net.blocks, arch.heads, arch.mlp_ratio):
            block.qkv.heads = heads
            block.fc1.out_active = mlp_hidden(ratio, e)
            block.proj.out_active = block.fc2.out_active = e

    def extract(self, arch: AutoFormerArch) -> ViT:
        """Built on the meta device and then filled: every subnet tensor (parameters and the position
        index buffers alike) is a leading slice of the supernet's, so a random initialisation would
        only be overwritten (for a Base-size subnet, seconds a score)."""
        self.space.validate(arch)
        with torch.device("meta"):
            sub = ViT(arch, **self._sizes())
        sub = sub.to_empty(device=self.net.cls_token.device)
        full = {**dict(self.net.named_parameters()), **dict(self.net.named_buffers())}
        with torch.no_grad():
            for name, t in [*sub.named_parameters(), *sub.named_buffers()]:
                t.copy_(full[name][tuple(slice(0, n) for n in t.shape)])
        return sub

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

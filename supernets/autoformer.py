"""AutoFormer's weight-entangled ViT supernet (Chen et al., 2021): the ViT of
`nas/spaces/autoformer/network.py` built with sliced layers at the space's largest sizes;
`extract` copies a subnet's leading slices into a plain ViT."""

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
        self.net = ViT(self.largest(), sliced=True, **self._sizes())
        self.set_active(self.largest())

    def _sizes(self) -> dict[str, Any]:
        s = self.space
        return {"head_dim": s.head_dim, "patch_size": s.patch_size, "image_size": s.image_size,
                "num_classes": self.num_classes, "in_channels": self.in_channels}

    def set_active(self, arch: AutoFormerArch) -> None:
        self.space.validate(arch)
        net, e = self.net, arch.embed_dim
        net.depth, net.embed_dim = arch.depth, e
        net.patch_embed.out_active = e
        for block, heads, ratio in zip(net.blocks, arch.heads, arch.mlp_ratio):
            block.heads = heads
            block.qkv.out_active = 3 * heads * block.head_dim
            block.fc1.out_active = mlp_hidden(ratio, e)
            block.proj.out_active = block.fc2.out_active = e

    def extract(self, arch: AutoFormerArch) -> ViT:
        self.space.validate(arch)
        sub = ViT(arch, **self._sizes()).to(self.net.cls_token.device)
        full = dict(self.net.named_parameters())
        with torch.no_grad():
            for name, p in sub.named_parameters():  # every subnet tensor is a leading slice of the supernet's
                p.copy_(full[name][tuple(slice(0, n) for n in p.shape)])
        return sub

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

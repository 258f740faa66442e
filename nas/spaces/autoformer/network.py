"""AutoFormer's ViT (Chen et al., 2021), our own code: a subnet's network and the sliced layers
of the weight-entangled supernet (`supernets/autoformer.py`).

One pre-norm ViT (`ViT`) serves both roles. Built plain, it is a subnet's
standalone network; built with sliced layers at the space's largest sizes, it
is the supernet, where every layer runs as the leading block of its weights
(Linear `weight[:out, :in]`, LayerNorm `weight[:d]`, patch conv `weight[:e]`)
and layers beyond the active depth are skipped. So a subnet's weights are
always the leading slices of the supernet's, and `extract` copies exactly those.

qkv rows are laid out head by head (q, k, v of head 0, then head 1, ...) so
that the first `heads` heads are the leading `3 * heads * head_dim` rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nas.errors import ConfigError
from nas.spaces.autoformer.arch import AutoFormerArch, mlp_hidden


class SlicedLinear(nn.Linear):
    """Uses `weight[:out_active, :in]`, `in` being the input's width."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        self.out_active = out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight[:self.out_active, :x.shape[-1]], self.bias[:self.out_active])


class SlicedLayerNorm(nn.LayerNorm):
    """Normalises over the input's (active) width only, as a LayerNorm of that width would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        return F.layer_norm(x, (d,), self.weight[:d], self.bias[:d], self.eps)


class SlicedPatchEmbed(nn.Conv2d):
    """Patch convolution producing only the first `out_active` embedding channels."""

    def __init__(self, in_channels: int, out_channels: int, patch_size: int) -> None:
        super().__init__(in_channels, out_channels, patch_size, stride=patch_size)
        self.out_active = out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight[:self.out_active], self.bias[:self.out_active], self.stride)


def attend(qkv: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Multi-head self-attention from head-major qkv rows. Explicit matmuls (not SDPA) so fvcore counts them."""
    b, t, _ = qkv.shape
    q, k, v = qkv.view(b, t, heads, 3, head_dim).permute(3, 0, 2, 1, 4)
    weights = ((q @ k.transpose(-2, -1)) * head_dim ** -0.5).softmax(dim=-1)
    return (weights @ v).transpose(1, 2).reshape(b, t, heads * head_dim)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, hidden: int, sliced: bool) -> None:
        super().__init__()
        linear, norm = (SlicedLinear, SlicedLayerNorm) if sliced else (nn.Linear, nn.LayerNorm)
        self.heads, self.head_dim = heads, head_dim
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.qkv = linear(dim, 3 * heads * head_dim)
        self.proj = linear(heads * head_dim, dim)
        self.fc1, self.fc2 = linear(dim, hidden), linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.proj(attend(self.qkv(self.norm1(x)), self.heads, self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """Pre-norm ViT classifying from the class token; `sliced` makes it the supernet."""

    def __init__(self, arch: AutoFormerArch, *, head_dim: int, patch_size: int, image_size: int,
                 num_classes: int, in_channels: int, sliced: bool = False) -> None:
        super().__init__()
        e = arch.embed_dim
        self.depth, self.embed_dim = arch.depth, e
        self.patch_embed = (SlicedPatchEmbed(in_channels, e, patch_size) if sliced
                            else nn.Conv2d(in_channels, e, patch_size, stride=patch_size))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e))
        self.image_size = image_size
        self.pos_embed = nn.Parameter(torch.zeros(1, (image_size // patch_size) ** 2 + 1, e))
        self.blocks = nn.ModuleList(Block(e, h, head_dim, mlp_hidden(r, e), sliced)
                                    for h, r in zip(arch.heads, arch.mlp_ratio))
        self.norm = SlicedLayerNorm(e) if sliced else nn.LayerNorm(e)
        self.head = SlicedLinear(e, num_classes) if sliced else nn.Linear(e, num_classes)
        self._init()

    def _init(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != (self.image_size,) * 2:  # the position embedding fixes the input size
            raise ConfigError(f"autoformer: the network takes {self.image_size}x{self.image_size} images, got "
                              f"{x.shape[-2]}x{x.shape[-1]} (set the space's image_size and patch_size to fit)")
        e = self.embed_dim
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token[..., :e].expand(len(x), -1, -1), x], dim=1) + self.pos_embed[..., :e]
        for block in self.blocks[:self.depth]:
            x = block(x)
        return self.head(self.norm(x[:, 0]))

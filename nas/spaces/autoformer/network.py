"""AutoFormer's ViT (Chen et al., 2021), our own code: a subnet's network and the sliced layers
of the weight-entangled supernet (`supernets/autoformer.py`).

One pre-norm ViT (`ViT`) serves both roles. Built plain, it is a subnet's
standalone network; built with sliced layers at the supernet's sizes, it
is the supernet, where every layer runs as the leading block of its weights
(Linear `weight[:out, :in]`, LayerNorm `weight[:d]`, patch conv `weight[:e]`)
and layers beyond the active depth are skipped. So a subnet's weights are
always the leading slices of the supernet's, and `extract` copies exactly those.

Three settings give the variant AutoFormer's released supernets were trained as
(`--gp --change_qkv --relative_position`); their defaults keep the plain ViT:
- `pool`: "cls" classifies from the class token, "mean" from the mean of the
  patch tokens after the final norm (the class token still attends).
- `qkv_layout`: "heads" lays qkv rows out head by head (q, k, v of head 0, then
  head 1, ...); "interleaved" is AutoFormer's `qkv_super`: row 3u+c is part c
  (q, k, v) of attention unit u, while the bias reads as q|k|v blocks of the
  active width n (`bias[:n]`, `bias[n:2n]`, `bias[2n:3n]`). Either way the first
  h heads use the leading 3*h*head_dim rows and bias entries.
- `relative_position`: the largest distance of AutoFormer's 2-D relative position
  tables for keys and values (one pair per layer), None for none.
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


class QKV(nn.Linear):
    """Queries, keys and values of the `heads` active heads, as (batch, tokens, 3, heads, head_dim),
    from the leading rows of its weight in either `qkv_layout`."""

    def __init__(self, dim: int, heads: int, head_dim: int, layout: str) -> None:
        super().__init__(dim, 3 * heads * head_dim)
        self.heads, self.head_dim, self.layout = heads, head_dim, layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, d = self.heads, self.head_dim
        n = h * d
        weight, bias = self.weight[:3 * n, :x.shape[-1]], self.bias[:3 * n]
        if self.layout == "heads":
            return F.linear(x, weight, bias).unflatten(-1, (h, 3, d)).transpose(-3, -2)
        parts = F.linear(x, weight).unflatten(-1, (n, 3)).transpose(-2, -1) + bias.view(3, n)
        return parts.unflatten(-1, (h, d))


class RelativePosition2D(nn.Module):
    """AutoFormer's 2-D relative position embedding of every (query, key) token pair: a row-table
    entry for their row distance plus a column-table entry for their column distance on the patch
    grid, distances clipped to +-`max_distance` and stored at 1 .. 2*max_distance+1; entry 0 of
    both tables is for the pairs with the class token (token 0)."""

    def __init__(self, side: int, max_distance: int, width: int) -> None:
        super().__init__()
        self.rows = nn.Parameter(torch.zeros(2 * max_distance + 2, width))
        self.cols = nn.Parameter(torch.zeros(2 * max_distance + 2, width))
        nn.init.trunc_normal_(self.rows, std=0.02)
        nn.init.trunc_normal_(self.cols, std=0.02)
        cell = torch.arange(side * side)
        for name, coord in (("row_index", cell // side), ("col_index", cell % side)):
            offset = (coord[None, :] - coord[:, None]).clamp(-max_distance, max_distance) + max_distance + 1
            self.register_buffer(name, F.pad(offset, (1, 0, 1, 0)), persistent=False)

    def forward(self) -> torch.Tensor:
        """(tokens, tokens, width)."""
        return self.rows[self.row_index] + self.cols[self.col_index]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_k: torch.Tensor | None = None,
           rel_v: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head self-attention of (batch, heads, tokens, head_dim) inputs, with the relative position
    embeddings (tokens, tokens, head_dim) of keys and values when given. Explicit matmuls (not SDPA)
    so fvcore counts them; the relative terms batch over query tokens, as AutoFormer computes them."""
    b, h, t, d = q.shape
    scores = q @ k.transpose(-2, -1)
    if rel_k is not None:  # scores[b, h, i, j] += q[b, h, i] . rel_k[i, j]
        by_query = q.permute(2, 0, 1, 3).reshape(t, b * h, d)
        scores = scores + (by_query @ rel_k.transpose(-2, -1)).view(t, b, h, t).permute(1, 2, 0, 3)
    weights = (scores * d ** -0.5).softmax(dim=-1)
    out = weights @ v
    if rel_v is not None:  # out[b, h, i] += sum_j weights[b, h, i, j] rel_v[i, j]
        by_query = weights.permute(2, 0, 1, 3).reshape(t, b * h, t)
        out = out + (by_query @ rel_v).view(t, b, h, d).permute(1, 2, 0, 3)
    return out.transpose(1, 2).reshape(b, t, h * d)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, hidden: int, sliced: bool, *, qkv_layout: str,
                 relative: tuple[int, int] | None) -> None:
        """`relative`: (patch grid side, max distance) of the relative position tables, None for none."""
        super().__init__()
        linear, norm = (SlicedLinear, SlicedLayerNorm) if sliced else (nn.Linear, nn.LayerNorm)
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.qkv = QKV(dim, heads, head_dim, qkv_layout)
        self.rel_k = RelativePosition2D(*relative, head_dim) if relative else None
        self.rel_v = RelativePosition2D(*relative, head_dim) if relative else None
        self.proj = linear(heads * head_dim, dim)
        self.fc1, self.fc2 = linear(dim, hidden), linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).permute(2, 0, 3, 1, 4)
        rel_k, rel_v = (None, None) if self.rel_k is None or self.rel_v is None else (self.rel_k(), self.rel_v())
        x = x + self.proj(attend(q, k, v, rel_k, rel_v))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    """Pre-norm ViT classifying from the class token or the mean patch token; `sliced` makes it the supernet."""

    def __init__(self, arch: AutoFormerArch, *, head_dim: int, patch_size: int, image_size: int,
                 num_classes: int, in_channels: int, sliced: bool = False, pool: str = "cls",
                 qkv_layout: str = "heads", relative_position: int | None = None) -> None:
        super().__init__()
        e, side = arch.embed_dim, image_size // patch_size
        self.depth, self.embed_dim, self.pool = arch.depth, e, pool
        self.patch_embed = (SlicedPatchEmbed(in_channels, e, patch_size) if sliced
                            else nn.Conv2d(in_channels, e, patch_size, stride=patch_size))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e))
        self.image_size = image_size
        self.pos_embed = nn.Parameter(torch.zeros(1, side * side + 1, e))
        relative = None if relative_position is None else (side, relative_position)
        self.blocks = nn.ModuleList(Block(e, h, head_dim, mlp_hidden(r, e), sliced, qkv_layout=qkv_layout,
                                          relative=relative)
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
        if self.pool == "mean":
            return self.head(self.norm(x)[:, 1:].mean(dim=1))
        return self.head(self.norm(x[:, 0]))

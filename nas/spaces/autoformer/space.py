"""AutoFormer's ViT space (Chen et al., 2021): depth and embed dim for the
whole net, heads and MLP ratio per layer. Defaults are AutoFormer-Tiny's choices on
a plain ViT; `pool`, `qkv_layout`, `relative_position` and `super_embed_dim` give the
network AutoFormer's released supernets were trained as (conf/space/autoformer_t.yaml)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Sequence

from nas.core.space import SPACES, CategoricalSpace, Cost, Decision
from nas.errors import ConfigError, EncodingError
from nas.lazy import LazyImport
from nas.spaces.autoformer.arch import POOLS, QKV_LAYOUTS, AutoFormerArch, mlp_hidden

# torch: the network module loads when a network is built, not with the space (the core stays torch-free)
autoformer_network = LazyImport("nas.spaces.autoformer.network")

if TYPE_CHECKING:
    from torch import nn


def _choices(name: str, values: Sequence[Any], kind: type) -> tuple[Any, ...]:
    """Sorted, distinct, positive: `Supernet.largest` takes the last choice as the largest."""
    if isinstance(values, (int, float)) or not values or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in values):
        raise ConfigError(f"space 'autoformer': {name} must be a non-empty list of positive numbers, got {values!r}")
    if kind is int and any(v != int(v) for v in values):
        raise ConfigError(f"space 'autoformer': {name} must be integers, got {list(values)!r}")
    return tuple(sorted({kind(v) for v in values}))


def _listing(values: Sequence[Any]) -> str:
    return ", ".join(str(v) for v in values)


@SPACES.register("autoformer")
class AutoFormerSpace(CategoricalSpace[AutoFormerArch]):
    def __init__(self, depths: Sequence[int] = (12, 13, 14), embed_dims: Sequence[int] = (192, 216, 240),
                 heads: Sequence[int] = (3, 4), mlp_ratios: Sequence[float] = (3.0, 3.5, 4.0),
                 head_dim: int = 64, patch_size: int = 16, image_size: int = 224, num_classes: int = 1000,
                 pool: str = "cls", qkv_layout: str = "heads", relative_position: bool = False,
                 max_relative_position: int = 14, super_embed_dim: int | None = None) -> None:
        """`super_embed_dim`: the width the supernet's tensors are stored at, when wider than the
        largest embed_dim (AutoFormer's released Tiny and Base: 256 and 640 for choices up to 240 and
        624); None reads as the largest embed_dim (and is kept as it, so equal spaces compare equal).
        Subnets never use the extra width."""
        self.depths = _choices("depths", depths, int)
        self.embed_dims = _choices("embed_dims", embed_dims, int)
        self.heads = _choices("heads", heads, int)
        self.mlp_ratios = _choices("mlp_ratios", mlp_ratios, float)
        for name, value in (("head_dim", head_dim), ("patch_size", patch_size), ("image_size", image_size),
                            ("num_classes", num_classes), ("max_relative_position", max_relative_position)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"space 'autoformer': {name} must be a positive integer, got {value!r}")
        if image_size % patch_size:
            raise ConfigError(f"space 'autoformer': image_size {image_size} is not a multiple of "
                              f"patch_size {patch_size}")
        for name, choice, valid in (("pool", pool, POOLS), ("qkv_layout", qkv_layout, QKV_LAYOUTS)):
            if choice not in valid:
                raise ConfigError(f"space 'autoformer': {name} must be one of {', '.join(valid)}, got {choice!r}")
        if not isinstance(relative_position, bool):
            raise ConfigError(f"space 'autoformer': relative_position must be true or false, got {relative_position!r}")
        if super_embed_dim is not None and (isinstance(super_embed_dim, bool) or not isinstance(super_embed_dim, int)
                                            or super_embed_dim < self.embed_dims[-1]):
            raise ConfigError(f"space 'autoformer': super_embed_dim must be null or an integer >= the largest "
                              f"embed_dim {self.embed_dims[-1]}, got {super_embed_dim!r}")
        self.head_dim, self.patch_size, self.image_size, self.num_classes = (
            head_dim, patch_size, image_size, num_classes)
        self.pool, self.qkv_layout, self.relative_position = pool, qkv_layout, relative_position
        self.max_relative_position = max_relative_position
        self.super_embed_dim: int = self.embed_dims[-1] if super_embed_dim is None else super_embed_dim
        layers = range(self.depths[-1])
        self._decisions = [Decision("depth", self.depths), Decision("embed_dim", self.embed_dims),
                           *(Decision(f"heads[{i}]", self.heads) for i in layers),
                           *(Decision(f"mlp_ratio[{i}]", self.mlp_ratios) for i in layers)]

    # --- decisions --------------------------------------------------------
    def decisions(self) -> list[Decision]:
        return list(self._decisions)

    def from_values(self, values: list[Any]) -> AutoFormerArch:
        """Values of layers at or beyond `depth` are checked, then dropped: they change nothing."""
        if len(values) != len(self._decisions):
            raise EncodingError(f"autoformer: expected {len(self._decisions)} decision values, got {len(values)}")
        for decision, value in zip(self._decisions, values):
            _check(decision.name, value, decision.choices)
        depth, n = values[0], self.depths[-1]
        return AutoFormerArch(depth, values[1], tuple(values[2:2 + depth]), tuple(values[2 + n:2 + n + depth]))

    def to_values(self, arch: AutoFormerArch) -> list[Any]:
        """Inactive layers read as the first choice, so equal networks give equal values."""
        pad = self.depths[-1] - arch.depth
        return [arch.depth, arch.embed_dim, *arch.heads, *[self.heads[0]] * pad,
                *arch.mlp_ratio, *[self.mlp_ratios[0]] * pad]

    def size(self) -> int:
        per_layer = len(self.heads) * len(self.mlp_ratios)
        return len(self.embed_dims) * sum(per_layer ** d for d in self.depths)

    # --- architectures ----------------------------------------------------
    def validate(self, arch: AutoFormerArch) -> AutoFormerArch:
        """`arch` if every value is one of this space's choices, else `EncodingError` naming the first that is not."""
        _check("depth", arch.depth, self.depths)
        _check("embed_dim", arch.embed_dim, self.embed_dims)
        for i, (h, r) in enumerate(zip(arch.heads, arch.mlp_ratio)):
            _check(f"heads[{i}]", h, self.heads)
            _check(f"mlp_ratio[{i}]", r, self.mlp_ratios)
        return arch

    def input_size(self, arch: AutoFormerArch) -> int:
        """The space's image size (the position embedding fixes it): other data is resized to it."""
        return self.image_size

    def build(self, arch: AutoFormerArch, num_classes: int, in_channels: int = 3, input_size: int = 32,
              options: Mapping[str, Any] | None = None) -> "nn.Module":
        return autoformer_network.ViT(self.validate(arch), num_classes=num_classes, in_channels=in_channels,
                                      **self.network_settings())

    def network_settings(self) -> dict[str, Any]:
        """What `ViT` takes from the space (besides the architecture, classes and channels)."""
        return {"head_dim": self.head_dim, "patch_size": self.patch_size, "image_size": self.image_size,
                "pool": self.pool, "qkv_layout": self.qkv_layout,
                "relative_position": self.max_relative_position if self.relative_position else None}

    def decode(self, encoding: Any) -> AutoFormerArch:
        return self.validate(AutoFormerArch.decode(encoding))

    def cost(self, arch: AutoFormerArch) -> Cost:
        """fvcore's counts for the standalone subnet at (1, 3, image_size, image_size), in closed form:
        ~0.2 ms a call where fvcore takes ~0.5 s (Tiny) to 2 s (Base), so no cache is needed."""
        settings = self.network_settings()
        del settings["qkv_layout"]  # a permutation of the same weights: it costs nothing
        return vit_cost(self.validate(arch), num_classes=self.num_classes, **settings)

    def describe(self) -> str:
        smallest, largest = (self.from_values([d.choices[i] for d in self._decisions]) for i in (0, -1))
        low, high = self.cost(smallest), self.cost(largest)
        relative = " with 2-D relative position embeddings of keys and values" if self.relative_position else ""
        pooled = "the mean of the patch tokens" if self.pool == "mean" else "the class token"
        return (
            f"AutoFormer vision-transformer space ({self.size():,} networks). A network splits a "
            f"{self.image_size}x{self.image_size} image into {self.patch_size}x{self.patch_size} patches, embeds "
            "them with a class token and learned position embeddings, runs `depth` pre-norm transformer layers "
            f"(multi-head self-attention{relative} then an MLP, each with a residual connection) and classifies "
            f"from {pooled}. Whole-network choices: depth in {{{_listing(self.depths)}}}, embed_dim (width of every "
            f"layer) in {{{_listing(self.embed_dims)}}}. Per-layer choices: heads in {{{_listing(self.heads)}}} "
            f"(each head is {self.head_dim} wide, so attention width is heads*{self.head_dim}) and mlp_ratio in "
            f"{{{_listing(self.mlp_ratios)}}} (MLP hidden width = mlp_ratio*embed_dim). Depth, width, heads and "
            f"MLP ratio all add cost: from {low.params / 1e6:.2f}M params and {low.flops / 1e6:.1f}M FLOPs "
            f"(multiply-accumulates) to {high.params / 1e6:.2f}M and {high.flops / 1e6:.1f}M. Encoding: a JSON "
            "object whose heads and mlp_ratio lists hold exactly depth values, one per layer, e.g. the smallest "
            f"network: {json.dumps(smallest.encode())}"
        )


def _check(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    kind = int if isinstance(choices[0], int) else (int, float)  # 12.0 is no depth, 4 is a ratio
    if isinstance(value, bool) or not isinstance(value, kind) or value not in choices:
        raise EncodingError(f"autoformer: {name} = {value!r} is not one of {_listing(choices)}")


def vit_cost(arch: AutoFormerArch, *, head_dim: int, patch_size: int, image_size: int, num_classes: int,
             in_channels: int = 3, pool: str = "cls", relative_position: int | None = None) -> Cost:
    """Params and fvcore FLOPs of `nas.spaces.autoformer.network.ViT`, in closed form (tests check it
    against fvcore): fvcore counts one MAC per Linear/conv/matmul weight use, 5 per LayerNorm
    element, nothing for softmax, GELU, adds, means, table look-ups or the attention scale.
    Mean pooling normalises every token before the mean; relative position adds four tables
    and two (tokens x tokens x width) products per layer."""
    e, patches = arch.embed_dim, (image_size // patch_size) ** 2
    t = patches + 1
    params = in_channels * patch_size ** 2 * e + e + e + t * e + 2 * e + e * num_classes + num_classes
    flops = patches * in_channels * patch_size ** 2 * e + 5 * e * (t if pool == "mean" else 1) + e * num_classes
    for heads, ratio in zip(arch.heads, arch.mlp_ratio):
        a, m = heads * head_dim, mlp_hidden(ratio, e)
        params += 4 * e + (e * 3 * a + 3 * a) + (a * e + e) + (e * m + m) + (m * e + e)
        flops += 2 * 5 * t * e + t * e * 3 * a + 2 * t * t * a + t * a * e + 2 * t * e * m
        if relative_position is not None:
            params += 4 * (2 * relative_position + 2) * head_dim
            flops += 2 * t * t * a
    return Cost(params, flops)

"""AutoFormer's released ViT supernets (microsoft/Cream, AutoFormer/: `supernet-tiny.pth`,
`supernet-small.pth`, `supernet-base.pth`): what its `supernet_train.py` saves, a dict whose
`model` entry is `Vision_TransformerSuper.state_dict()` (a training checkpoint also holds the
optimizer, scheduler and scaler states, the epoch and the `argparse.Namespace` of its settings).

They were trained with `--gp --change_qkv --relative_position`, so they load into the space
settings `pool: mean`, `qkv_layout: interleaved`, `relative_position: true` (the presets
conf/space/autoformer_t.yaml, _s, _b). Our ViT computes what theirs does in their own layouts,
so every tensor keeps its values and shape and only its name changes, by the table `RENAMES`
(docs/released-supernets.md prints it). The qkv layer could not be a fixed permutation of ours:
their bias splits into q|k|v at the active width, which moves with the head count.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from supernets.released import ReleasedFormat, register

if TYPE_CHECKING:
    from torch import Tensor

    from supernets.base import Supernet

PREFIX = "net."  # where our supernet keeps its ViT
# Their name -> ours (less PREFIX), `{i}` a layer; the tensors are the same, in the same layout.
RENAMES: tuple[tuple[str, str], ...] = (
    ("cls_token", "cls_token"),
    ("pos_embed", "pos_embed"),
    ("patch_embed_super.proj.{p}", "patch_embed.{p}"),
    ("blocks.{i}.attn_layer_norm.{p}", "blocks.{i}.norm1.{p}"),
    ("blocks.{i}.attn.qkv.{p}", "blocks.{i}.qkv.{p}"),
    ("blocks.{i}.attn.rel_pos_embed_k.embeddings_table_v", "blocks.{i}.rel_k.rows"),
    ("blocks.{i}.attn.rel_pos_embed_k.embeddings_table_h", "blocks.{i}.rel_k.cols"),
    ("blocks.{i}.attn.rel_pos_embed_v.embeddings_table_v", "blocks.{i}.rel_v.rows"),
    ("blocks.{i}.attn.rel_pos_embed_v.embeddings_table_h", "blocks.{i}.rel_v.cols"),
    ("blocks.{i}.attn.proj.{p}", "blocks.{i}.proj.{p}"),
    ("blocks.{i}.ffn_layer_norm.{p}", "blocks.{i}.norm2.{p}"),
    ("blocks.{i}.fc1.{p}", "blocks.{i}.fc1.{p}"),
    ("blocks.{i}.fc2.{p}", "blocks.{i}.fc2.{p}"),
    ("norm.{p}", "norm.{p}"),
    ("head.{p}", "head.{p}"),
)
# What the pattern fields match: a layer index, a parameter of a Linear, LayerNorm or conv.
FIELDS = {"i": r"(?P<i>\d+)", "p": r"(?P<p>weight|bias)"}


def _regex(pattern: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w)\}", pattern)  # literal, field, literal, ...
    return re.compile("".join(FIELDS[part] if k % 2 else re.escape(part) for k, part in enumerate(parts)))


THEIRS = tuple((_regex(theirs), ours) for theirs, ours in RENAMES)
OURS = tuple((_regex(ours), theirs) for theirs, ours in RENAMES)


def _rename(name: str, table: tuple[tuple[re.Pattern[str], str], ...]) -> str | None:
    for regex, target in table:
        if (m := regex.fullmatch(name)) is not None:
            return target.format(**m.groupdict())
    return None


@register
class AutoFormerFormat(ReleasedFormat):
    family = "autoformer"
    project = "AutoFormer (microsoft/Cream)"
    safe_globals = (argparse.Namespace,)  # `args` of a training checkpoint

    def matches(self, tensors: Mapping[str, Tensor]) -> bool:
        """Their module names no other format uses: the patch embedding's and the layers' norms."""
        return any(n.startswith("patch_embed_super.") or ".attn_layer_norm." in n or ".ffn_layer_norm." in n
                   for n in tensors)

    def space_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        # The flags every release was trained with; pooling and the qkv layout leave no trace in the names.
        found: dict[str, Any] = {"pool": "mean", "qkv_layout": "interleaved",
                                 "relative_position": any(".attn.rel_pos_embed_" in n for n in tensors)}
        patch = tensors.get("patch_embed_super.proj.weight")
        if patch is not None and patch.dim() == 4:
            found["super_embed_dim"], found["patch_size"] = int(patch.shape[0]), int(patch.shape[-1])
            pos = tensors.get("pos_embed")
            tokens = int(pos.shape[1]) if pos is not None and pos.dim() == 3 else 0
            side = math.isqrt(max(tokens - 1, 0))
            if side and side * side + 1 == tokens:  # the class token and a square grid of patches
                found["image_size"] = side * found["patch_size"]
        table = tensors.get("blocks.0.attn.rel_pos_embed_k.embeddings_table_v")
        if table is not None and table.dim() == 2:
            found["max_relative_position"], found["head_dim"] = (int(table.shape[0]) - 2) // 2, int(table.shape[1])
        classes = self._classes(tensors)
        if classes is not None:
            found["num_classes"] = classes
        return found

    def _classes(self, tensors: Mapping[str, Tensor]) -> int | None:
        head = tensors.get("head.weight")
        return int(head.shape[0]) if head is not None else None

    def supernet_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        classes, patch = self._classes(tensors), tensors.get("patch_embed_super.proj.weight")
        if classes is not None:
            found["num_classes"] = classes
        if patch is not None and patch.dim() == 4:
            found["in_channels"] = int(patch.shape[1])
        return found

    def to_ours(self, tensors: Mapping[str, Tensor], supernet: Supernet) -> dict[str, tuple[str, Tensor]]:
        produced: dict[str, tuple[str, Tensor]] = {}
        for name, tensor in tensors.items():
            ours = _rename(name, THEIRS)
            if ours is not None:
                produced[PREFIX + ours] = (name, tensor)
        return produced

    def their_name(self, ours: str) -> str:
        return _rename(ours.removeprefix(PREFIX), OURS) or ours

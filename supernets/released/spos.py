"""SPOS's ShuffleNetV2 supernet (Guo et al. 2020; megvii-model/SinglePathOneShot, `src/Supernet`).

The authors' README links a OneDrive folder whose `Supernet/checkpoint-150000.pth.tar` is their trained
supernet. Their training code saves `{"state_dict": model.state_dict()}` of `ShuffleNetV2_OneShot`
wrapped in `nn.DataParallel` (names prefixed `module.`): `first_conv` (conv, BN), `features[i][c]`
(block i's choice c: 0-2 a ShuffleNetV2 unit with a 3x3/5x5/7x7 depthwise conv, 3 the Xception-style
unit; each a `branch_main` and, in a stage's first block, a `branch_proj`), `conv_last` (conv, BN)
and `classifier.0` (linear, no bias). Every BatchNorm there is `affine=False` (the authors follow
DARTS), so a file holds only running statistics; ours are affine, so they get weight 1 and bias 0,
which computes the same. Their network takes BGR images with values 0-255, not normalised
(the ImageNet source's `spos` transform feeds it so).

Our names: first_conv -> stem, features.i.c.branch_main -> blocks.i.c.main, branch_proj -> proj,
conv_last -> head.0-1, classifier.0 -> head.6; the layers inside are in the same order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from supernets.released import ReleasedFormat, register

if TYPE_CHECKING:
    from torch import Tensor

    from supernets.base import Supernet

FEATURE = re.compile(r"features\.(\d+)\.\d+\.branch_main\.")
# (our prefix, theirs), most specific first.
RENAMES = ((re.compile(r"blocks\.(\d+)\.(\d+)\.main\."), r"features.\1.\2.branch_main."),
           (re.compile(r"blocks\.(\d+)\.(\d+)\.proj\."), r"features.\1.\2.branch_proj."),
           (re.compile(r"head\.6\."), "classifier.0."),
           (re.compile(r"head\.([01])\."), r"conv_last.\1."),
           (re.compile(r"stem\."), "first_conv."))


@register
class SPOSFormat(ReleasedFormat):
    family = "spos"
    project = "Single Path One-Shot (megvii-model/SinglePathOneShot)"

    def matches(self, tensors: Mapping[str, Tensor]) -> bool:
        return ({"first_conv.0.weight", "conv_last.0.weight"} <= tensors.keys()
                and any(FEATURE.match(n) for n in tensors))

    def space_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        found: dict[str, Any] = {}  # not stem_stride: no tensor shows it (theirs is 2, conf/space/spos.yaml's)
        for key, name in (("stem_channels", "first_conv.0.weight"), ("last_channels", "conv_last.0.weight"),
                          ("num_classes", "classifier.0.weight")):
            if name in tensors:
                found[key] = int(tensors[name].shape[0])
        repeats: list[int] = []
        channels: list[int] = []
        for i in sorted({int(m.group(1)) for n in tensors if (m := FEATURE.match(n))}):
            main, proj = tensors.get(f"features.{i}.0.branch_main.5.weight"), tensors.get(f"features.{i}.0.branch_proj.2.weight")
            if main is None or (proj is None and not repeats):
                return found  # the tensor check names what is missing
            if proj is not None:  # a stage's first block: projection and main branch concatenated
                repeats.append(1)
                channels.append(int(proj.shape[0] + main.shape[0]))
            else:
                repeats[-1] += 1
        found.update(stage_repeats=tuple(repeats), stage_channels=tuple(channels))
        return found

    def supernet_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        head = tensors.get("classifier.0.weight")
        return {} if head is None else {"num_classes": int(head.shape[0])}

    def their_name(self, ours: str) -> str:
        for pattern, theirs in RENAMES:
            if pattern.match(ours):
                return pattern.sub(theirs, ours, count=1)
        return ours

    def to_ours(self, tensors: Mapping[str, Tensor], supernet: Supernet) -> dict[str, tuple[str, Tensor]]:
        import torch  # lazy: loads torch (start-up time)

        bns = {name for name, m in supernet.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
        # Affine or not is the file's choice, made for all its BatchNorms: one weight is enough to tell.
        affine = any(f"{self.their_name(bn + '.')}weight" in tensors for bn in bns)
        produced: dict[str, tuple[str, Tensor]] = {}
        for name, mine in supernet.state_dict().items():
            theirs = self.their_name(name)
            module, _, leaf = name.rpartition(".")
            if theirs in tensors:
                produced[name] = (theirs, tensors[theirs])
            elif module in bns and leaf in ("weight", "bias") and not affine:
                fill = torch.ones_like if leaf == "weight" else torch.zeros_like
                produced[name] = (f"{theirs} (affine=False: {'1' if leaf == 'weight' else '0'})",
                                  fill(mine, device="cpu"))
        return produced

"""Once-for-All's MobileNetV3 supernets (the `ofa` package's model zoo: `ofa_mbv3_d234_e346_k357_w1.0`
and `..._w1.2`): `torch.save({"state_dict": OFAMobileNetV3(...).state_dict()})`.

Our supernet wraps the same `OFAMobileNetV3` as `net`, so a tensor's name is the file's with `net.`
in front. Files saved by older `ofa` releases spell some modules differently; they are read with
the spellings `OFAMobileNetV3.load_state_dict` itself accepts (`mobile_inverted_conv` for `conv`,
dynamic layers' doubled `.bn.bn.` / `.conv.conv.weight` / `.linear.linear.` or single forms).
The width multiplier is read from the channel counts (through ofa's own rounding), not the file name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from supernets.released import ReleasedFormat, register

if TYPE_CHECKING:
    from torch import Tensor

    from supernets.base import Supernet

PREFIX = "net."  # where our supernet keeps ofa's network
# OFAMobileNetV3's channels before the multiplier: first conv, first block, the 5 stages, final expand, feature mix.
BASE_WIDTHS = (16, 16, 24, 40, 80, 112, 160, 960, 1280)
WIDTHS = tuple(k / 100 for k in range(5, 401))  # multipliers tried, in steps of 0.01 (the zoo's: 1.0, 1.2)
# The alternative spellings OFAMobileNetV3.load_state_dict accepts, tried in its order.
RESPELLINGS = ((".bn.bn.", ".bn."), (".conv.conv.weight", ".conv.weight"), (".linear.linear.", ".linear."),
               (".linear.", ".linear.linear."), ("bn.", "bn.bn."), ("conv.weight", "conv.conv.weight"))
POINT_LINEAR = re.compile(r"blocks\.(\d+)\.conv\.point_linear\.conv(?:\.conv)?\.weight")


def _modern(name: str) -> str:
    return name.replace(".mobile_inverted_conv.", ".conv.")


def _spellings(name: str) -> Iterator[str]:
    name = _modern(name)
    yield name
    for old, new in RESPELLINGS:
        if old in name:
            yield name.replace(old, new)


@register
class OFAMbv3Format(ReleasedFormat):
    family = "ofa_mbv3"
    project = "Once-for-All (mit-han-lab/once-for-all)"

    def matches(self, tensors: Mapping[str, Tensor]) -> bool:
        names = {_modern(n) for n in tensors}
        return ({"first_conv.conv.weight", "final_expand_layer.conv.weight", "feature_mix_layer.conv.weight"} <= names
                and any(n.startswith("blocks.1.conv.") for n in names))

    def _widths(self, tensors: Mapping[str, Tensor]) -> list[int] | None:
        """The channel counts BASE_WIDTHS become in this file (None when a layer they are read from is missing)."""
        modern = {_modern(n): t for n, t in tensors.items()}
        blocks: dict[int, int] = {}
        for name, t in modern.items():
            if (m := POINT_LINEAR.fullmatch(name)) is not None:
                blocks[int(m.group(1))] = int(t.shape[0])
        stages = [w for i, w in sorted(blocks.items()) if i > 0]
        stage_widths = [w for j, w in enumerate(stages) if j == 0 or w != stages[j - 1]]
        try:
            return [int(modern["first_conv.conv.weight"].shape[0]), blocks[0], *stage_widths,
                    int(modern["final_expand_layer.conv.weight"].shape[0]),
                    int(modern["feature_mix_layer.conv.weight"].shape[0])]
        except KeyError:
            return None

    def space_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        from ofa.utils import MyNetwork, make_divisible  # lazy: only this family needs ofa

        found: dict[str, Any] = {}
        widths = self._widths(tensors)
        fits = [w for w in WIDTHS
                if widths == [make_divisible(b * w, MyNetwork.CHANNEL_DIVISIBLE) for b in BASE_WIDTHS]]
        if fits:
            found["width_mult"] = fits[0]  # 0.01 apart, two multipliers give different 1280-channel layers
        classes = self._classes(tensors)
        if classes is not None:
            found["num_classes"] = classes
        return found

    def _classes(self, tensors: Mapping[str, Tensor]) -> int | None:
        for name in ("classifier.linear.weight", "classifier.linear.linear.weight"):
            if name in tensors:
                return int(tensors[name].shape[0])
        return None

    def supernet_params(self, tensors: Mapping[str, Tensor]) -> dict[str, Any]:
        classes = self._classes(tensors)
        return {} if classes is None else {"num_classes": classes}

    def to_ours(self, tensors: Mapping[str, Tensor], supernet: Supernet) -> dict[str, tuple[str, Tensor]]:
        ours = supernet.state_dict()
        produced: dict[str, tuple[str, Tensor]] = {}
        for name, tensor in tensors.items():
            target = next((PREFIX + s for s in _spellings(name) if PREFIX + s in ours), None)
            if target is not None:
                produced[target] = (name, tensor)
        return produced

    def their_name(self, ours: str) -> str:
        return ours.removeprefix(PREFIX)

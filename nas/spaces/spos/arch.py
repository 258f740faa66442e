"""A SPOS (Single Path One-Shot) ShuffleNetV2 architecture: one unit choice per choice block.

The encoding is what CoLLM-NAS and SPOS use: a list with one int per block,
0-2 = ShuffleNetV2 unit with a 3x3/5x5/7x7 depthwise kernel, 3 = Xception-style
unit. The skeleton (channels, strides) belongs to the space, so the choices
alone are canonical.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral
from typing import Any, ClassVar

from nas.core.arch import Architecture
from nas.errors import EncodingError

CHOICE_NAMES: tuple[str, ...] = ("shuffle3x3", "shuffle5x5", "shuffle7x7", "xception")
NUM_BLOCKS = 20  # SPOS's ImageNet skeleton: stage repeats 4, 4, 8, 4
_VALID = f"0-{len(CHOICE_NAMES) - 1} ({', '.join(CHOICE_NAMES)})"


def _choice(block: int, value: Any) -> int:
    """An int or an op name → the choice index; bools are rejected although Python calls them ints."""
    if isinstance(value, Integral) and not isinstance(value, bool) and 0 <= int(value) < len(CHOICE_NAMES):
        return int(value)
    if isinstance(value, str) and value in CHOICE_NAMES:
        return CHOICE_NAMES.index(value)
    raise EncodingError(f"spos: block {block} = {value!r} is not a choice {_VALID}")


@dataclass(frozen=True, eq=False)
class SPOSArch(Architecture):
    choices: tuple[int, ...]  # one index into CHOICE_NAMES per choice block, input to output

    space: ClassVar[str] = "spos"

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(_choice(i, c) for i, c in enumerate(self.choices)))

    def canonical(self) -> str:
        return "".join(map(str, self.choices))

    def names(self) -> list[str]:
        return [CHOICE_NAMES[c] for c in self.choices]

    def encode(self) -> list[int]:
        return list(self.choices)

    @classmethod
    def decode(cls, data: Any, num_blocks: int = NUM_BLOCKS) -> "SPOSArch":
        """A list of ints or op names; `num_blocks` is the space's sum of stage repeats."""
        if not isinstance(data, (list, tuple)):
            raise EncodingError(f"spos: encoding must be a list of {num_blocks} block choices, "
                                f"got {type(data).__name__}")
        if len(data) != num_blocks:
            raise EncodingError(f"spos: expected {num_blocks} block choices, got {len(data)}")
        return cls(tuple(data))

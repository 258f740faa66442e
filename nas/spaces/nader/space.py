"""NADER's block files: an open-ended space whose networks are a skeleton of the
blocks at the widest width that fits a budget."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any

from nas.core.constraint import Constraint
from nas.core.registry import check_count, check_keys
from nas.core.space import SPACES, OpenEndedSpace
from nas.errors import ConfigError
from nas.lazy import LazyImport
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.macro import WIDTH_MULTIPLE, Plan, Skeleton, search_width

# torch: the network module loads when a network is built, not with the space (the core stays torch-free)
nader_network = LazyImport("nas.spaces.nader.network")

if TYPE_CHECKING:
    from torch import nn

BASE_BLOCKS = ("resnet_basic",)
SKELETONS = ("nb201", "imagenet")


@dataclass(frozen=True)
class Sizing:
    """How a block file becomes a network (evaluator=train's settings of the same names): base blocks
    per stage, the skeleton (nb201: 3 stages; imagenet: NADER's 2-3-5-2), the params/FLOPs budget
    (empty: NB201's limits at the input size) and the multiple the searched width rounds down to."""

    cells_per_stage: int = 5
    skeleton: str = "nb201"
    budget: Mapping[str, float] = field(default_factory=dict)
    width_multiple: int = WIDTH_MULTIPLE

    def __post_init__(self) -> None:
        check_count("evaluator.cells_per_stage", self.cells_per_stage)
        if self.skeleton not in SKELETONS:
            raise ConfigError(f"evaluator.skeleton must be one of {', '.join(SKELETONS)}, got {self.skeleton!r}")
        object.__setattr__(self, "budget", dict(self.budget or {}))  # null in a config: no budget of its own
        check_keys("evaluator.budget", dict(self.budget), ["params", "flops"])
        check_count("evaluator.width_multiple", self.width_multiple)


@SPACES.register("nader")
class BlockSpace(OpenEndedSpace[BlockArch]):
    """Block files; the root is `base` (default: a ResNet basic block, as NADER's NB201 setting)."""

    trainable = True
    sizing = Sizing
    file_suffix = ".txt"
    source_trusted = False  # the PyTorch code compiled from a block file is checked in the sandbox
    source_kind = "compiled from the NADER block file (untrusted: checked in the sandbox)"

    def __init__(self, base: str = "resnet_basic") -> None:
        text = self.read_base(
            base, BASE_BLOCKS,
            lambda n: (resources.files("nas.spaces.nader.dag") / "bases" / f"{n}.txt").read_text("utf-8"), "block")
        self.base = BlockArch.from_text(text, source=base)

    def decode(self, encoding: Any) -> BlockArch:
        return BlockArch.decode(encoding)

    def read(self, text: str, filename: str) -> BlockArch:
        return BlockArch.from_text(text, source=filename)

    def plan(self, arch: BlockArch, num_classes: int, in_channels: int, input_size: int,
             options: Mapping[str, Any] | None = None) -> Plan:
        """The network a block file trains as: its skeleton at the searched width (what `build` and
        `source` both give, so export rebuilds what was trained)."""
        sizing = Sizing(**self.build_options(options or {}))
        depths = (sizing.cells_per_stage,) * 3 if sizing.skeleton == "nb201" else (2, 3, 5, 2)
        skeleton = Skeleton(depths=depths, input_size=input_size, in_channels=in_channels, num_classes=num_classes)
        budget = Constraint.from_config(dict(sizing.budget), "evaluator.budget").filled(Constraint.nb201(input_size))
        width = search_width(arch.blocks, skeleton, budget, multiple=sizing.width_multiple).width
        return arch.plan(skeleton, width=width)

    def build(self, arch: BlockArch, num_classes: int, in_channels: int = 3, input_size: int = 32,
              options: Mapping[str, Any] | None = None) -> "nn.Module":
        return nader_network.build_network(self.plan(arch, num_classes, in_channels, input_size, options))

    def source(self, arch: BlockArch, num_classes: int, in_channels: int = 3, input_size: int = 32,
               options: Mapping[str, Any] | None = None) -> str:
        return nader_network.network_source(self.plan(arch, num_classes, in_channels, input_size, options))

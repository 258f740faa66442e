"""Turn a trusted representation into an `nn.Module` for a dataset.

NB201 cells go into NB201's network (width `channels`, `cells_per_stage`);
NADER block files into a skeleton whose width is the widest multiple of
`width_multiple` that fits the budget (default: NB201's limits at the data's
resolution). Model source is not built here: it is untrusted and trains in
the sandbox.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from nas.core.arch import Architecture
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.macro import WIDTH_MULTIPLE, Plan, Skeleton, search_width
from nas.spaces.nb201.arch import NB201Cell
from nas.errors import ConfigError, EvaluationError, NasError
from nas.core.registry import check_keys
from nas.core.constraint import Constraint

if TYPE_CHECKING:
    from torch import nn

SKELETONS = ("nb201", "imagenet")


@dataclass(frozen=True)
class BuildOptions:
    channels: int = 16  # NB201 cell networks: width C ...
    cells_per_stage: int = 5  # ... and cells per stage (block files: base blocks per stage in `nb201`)
    skeleton: str = "nb201"  # block files: 3 stages (nb201) or NADER's 4-stage 2-3-5-2 (imagenet)
    budget: dict[str, float] = field(default_factory=dict)  # params / flops; missing: NB201's (Constraint.nb201)
    width_multiple: int = WIDTH_MULTIPLE  # block files: the searched width is rounded down to a multiple

    def __post_init__(self) -> None:
        if self.skeleton not in SKELETONS:
            raise ConfigError(f"evaluator.skeleton must be one of {', '.join(SKELETONS)}, got {self.skeleton!r}")
        check_keys("evaluator.budget", self.budget, ["params", "flops"])
        for name in ("channels", "cells_per_stage", "width_multiple"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"evaluator.{name} must be an integer >= 1, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def skeleton_for(self, shape: tuple[int, int, int], num_classes: int) -> Skeleton:
        c, h, _ = shape
        depths = (self.cells_per_stage,) * 3 if self.skeleton == "nb201" else (2, 3, 5, 2)
        return Skeleton(depths=depths, input_size=h, in_channels=c, num_classes=num_classes)

    def budget_for(self, input_size: int) -> Constraint:
        return Constraint.from_config(self.budget, "evaluator.budget").filled(Constraint.nb201(input_size))

    def block_plan(self, arch: BlockArch, shape: tuple[int, int, int], num_classes: int) -> Plan:
        """The network a block file trains as: its skeleton at the searched width (what
        export must rebuild, so both come from here)."""
        skeleton = self.skeleton_for(shape, num_classes)
        budget = self.budget_for(skeleton.input_size)
        width = search_width(arch.blocks, skeleton, budget, multiple=self.width_multiple).width
        return arch.plan(skeleton, width=width)


def build_model(arch: Architecture, shape: tuple[int, int, int], num_classes: int, options: BuildOptions,
                seed: int) -> nn.Module:
    """Seeded, so the initial weights are part of what the seed fixes."""
    import torch  # here, not at import: `BuildOptions` is config, checked before anything trains

    torch.manual_seed(seed)
    try:
        if isinstance(arch, NB201Cell):
            return arch.to_module(channels=options.channels, cells_per_stage=options.cells_per_stage,
                                  num_classes=num_classes, in_channels=shape[0])
        if isinstance(arch, BlockArch):
            from nas.spaces.nader.network import build_network

            return build_network(options.block_plan(arch, shape, num_classes))
    except (NasError, ValueError, RuntimeError) as exc:
        raise EvaluationError(f"{arch.space} {arch.key()}: cannot build the network ({exc})") from None
    raise EvaluationError(f"{type(arch).__name__} cannot be built in-process (space '{arch.space}')")


TRUSTED: dict[str, type[Architecture]] = {cls.space: cls for cls in (NB201Cell, BlockArch)}

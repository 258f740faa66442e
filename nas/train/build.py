"""Turn a trusted representation into an `nn.Module` for a dataset: the space builds
it (`SearchSpace.build`), sized by evaluator=train's options.

NB201 cells take width `channels` and `cells_per_stage`; NADER block files a
skeleton whose width is the widest multiple of `width_multiple` that fits the
budget (default: NB201's limits at the data's resolution). Model source is not
built here: it is untrusted and trains in the sandbox.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from nas.core.arch import Architecture
from nas.core.registry import check_keys
from nas.core.space import SearchSpace
from nas.errors import ConfigError, EvaluationError, NasError
from nas.spaces.nader.dag.macro import WIDTH_MULTIPLE

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


def build_model(space: SearchSpace, arch: Architecture, shape: tuple[int, int, int], num_classes: int,
                options: BuildOptions, seed: int) -> nn.Module:
    """Seeded, so the initial weights are part of what the seed fixes."""
    import torch  # here, not at import: `BuildOptions` is config, checked before anything trains

    if not space.trusted or arch.space != space.name:
        raise EvaluationError(f"{type(arch).__name__} cannot be built in-process (space '{space.name}')")
    torch.manual_seed(seed)
    try:
        return space.build(arch, num_classes, shape[0], shape[1], options.to_dict())
    except (NasError, ValueError, RuntimeError) as exc:
        raise EvaluationError(f"{arch.space} {arch.key()}: cannot build the network ({exc})") from None

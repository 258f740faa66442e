"""What one training run reports, whichever path (plain, fast, sandboxed) produced it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class TrainResult:
    valid_accuracy: float | None  # percent; None when terminated early (nothing measured)
    test_accuracy: float | None
    loss_curve: list[float] = field(default_factory=list)  # mean train loss per epoch
    epochs: int = 0
    terminated: str | None = None  # early-termination reason, when it fired
    wall_seconds: float = 0.0
    device_seconds: float = 0.0  # time inside fit/validate/test (excludes data loading into memory)
    params: int = 0
    flops: int = 0
    device: str = "cpu"
    world_size: int = 1  # processes that trained it (DDP ranks)
    cuda_graphs: str = "off"  # fast engine: "on" (captured), "off", or "failed: why" (trained eagerly instead)
    compile_seconds: float = 0.0  # torch.compile and graph capture before the first epoch (part of device_seconds)
    eval_seconds: float = 0.0  # fast engine: the final valid/test passes, their capture included (part of device_seconds)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_untrusted(cls, report: dict[str, Any], max_epochs: int) -> "TrainResult":
        """Rebuild from a sandboxed child's (or the training worker's) training report, as the
        sandbox's protocol checked it (`nas.sandbox.protocol.TRAINED`: every field's type and range,
        its text escaped), since the child ran untrusted code while training: of at most
        `max_epochs` epochs (the recipe's), a non-finite loss as NaN. Raises ValueError."""
        sizes = {"loss_curve": len(report["loss_curve"]), "epochs": report["epochs"]}
        if over := [k for k, n in sizes.items() if n > max_epochs]:
            raise ValueError(f"training report field(s) {', '.join(over)} malformed")
        out = cls(**report)
        out.loss_curve = [x if math.isfinite(x) else float("nan") for x in out.loss_curve]
        return out

"""What one training run reports, whichever path (plain, fast, sandboxed) produced it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from nas.terminal import printable


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
    def from_untrusted(cls, data: object, max_epochs: int) -> "TrainResult":
        """Rebuild from a sandboxed child's JSON, checking every field, since
        the child ran untrusted code while training. Raises ValueError."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            raise ValueError("training report has the wrong fields")

        def num(v: object) -> bool:
            return type(v) in (int, float)

        def count(v: object) -> bool:
            return type(v) is int and v >= 0

        def percent(v: Any) -> bool:
            """Measured when training finished; None (not 0) when it was terminated."""
            return v is None if data["terminated"] is not None else num(v) and 0 <= v <= 100

        checks = {
            "valid_accuracy": percent, "test_accuracy": percent,
            "loss_curve": lambda v: type(v) is list and len(v) <= max_epochs and all(num(x) for x in v),
            "epochs": lambda v: count(v) and v <= max_epochs,
            "terminated": lambda v: v is None or (isinstance(v, str) and len(v) <= 500),
            "wall_seconds": lambda v: num(v) and v >= 0, "device_seconds": lambda v: num(v) and v >= 0,
            "params": count, "flops": count,
            "device": lambda v: isinstance(v, str) and len(v) <= 32,
            "world_size": lambda v: type(v) is int and 1 <= v <= 1024,
            "cuda_graphs": lambda v: isinstance(v, str) and len(v) <= 300,
            "compile_seconds": lambda v: num(v) and v >= 0, "eval_seconds": lambda v: num(v) and v >= 0,
        }
        bad = [k for k, check in checks.items() if not check(data[k])]
        if bad:
            raise ValueError(f"training report field(s) {', '.join(bad)} malformed")
        out = cls(**data)
        out.loss_curve = [float(x) if math.isfinite(x) else float("nan") for x in out.loss_curve]
        # shown on the console and in reports: no terminal escapes or second lines from the child
        out.terminated = None if out.terminated is None else printable(out.terminated)
        out.device, out.cuda_graphs = printable(out.device), printable(out.cuda_graphs)
        return out

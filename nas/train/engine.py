"""How a candidate is trained (not what): the plain Lightning path or the fast path.

Engine settings change speed, not results beyond run-to-run noise; they still
enter the train evaluator's fingerprint (bf16 and compiled kernels round
differently), so a cached result always says how it was computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from nas.errors import ConfigError
from nas.registry import check_keys

KINDS = ("plain", "fast")
ACCELERATORS = ("cpu", "gpu", "auto")


@dataclass(frozen=True)
class Engine:
    """`plain`: Lightning, DataLoader batches; `devices > 1` trains with DDP.
    `fast`: a hand-written loop with the whole split resident on the device,
    flip/crop on the device, optional channels_last, bf16 autocast and
    `torch.compile`, and `concurrent` candidates in lockstep on one device
    (each on its own CUDA stream)."""

    kind: str = "plain"
    accelerator: str = "cpu"
    devices: int = 1
    channels_last: bool = False
    bf16: bool = False
    compile: bool = False
    concurrent: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"engine.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.accelerator not in ACCELERATORS:
            raise ConfigError(f"engine.accelerator must be one of {', '.join(ACCELERATORS)}, got {self.accelerator!r}")
        for name in ("devices", "concurrent"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"engine.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.kind == "fast" and self.devices != 1:
            raise ConfigError("engine.devices > 1 (DDP) needs engine.kind=plain; the fast path uses one device")
        if self.kind == "plain" and (self.concurrent != 1 or self.compile or self.channels_last or self.bf16):
            raise ConfigError("engine.concurrent/compile/channels_last/bf16 need engine.kind=fast")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Engine":
        check_keys("engine", data, sorted(f.name for f in fields(cls)))
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

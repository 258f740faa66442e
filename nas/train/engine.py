"""How a candidate is trained (not what): the plain Lightning path or the fast path.

Engine settings change speed, not results beyond run-to-run noise; they still
enter the train evaluator's fingerprint (bf16 and compiled kernels round
differently), so a cached result always says how it was computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from nas.core.registry import check_keys
from nas.errors import ConfigError

KINDS = ("plain", "fast")
ACCELERATORS = ("cpu", "gpu", "auto")
CUDA_GRAPHS = ("auto", "on", "off")


@dataclass(frozen=True)
class Engine:
    """`plain`: Lightning, DataLoader batches; `devices > 1` trains with DDP.
    `fast`: a hand-written loop with the whole split resident on the device,
    flip/crop on the device, optional channels_last, bf16 autocast and
    `torch.compile` (static shapes: compiled once per model), and `concurrent`
    candidates in lockstep on one device (each on its own CUDA stream).
    `cuda_graphs` (fast only): each training step and eval batch captured
    whole in one CUDA graph and replayed; `auto` = on when training on CUDA."""

    kind: str = "plain"
    accelerator: str = "cpu"
    devices: int = 1
    channels_last: bool = False
    bf16: bool = False
    compile: bool = False
    concurrent: int = 1
    cuda_graphs: str = "auto"

    def __post_init__(self) -> None:
        if isinstance(self.cuda_graphs, bool):  # YAML reads a bare on/off as a boolean
            object.__setattr__(self, "cuda_graphs", "on" if self.cuda_graphs else "off")
        if self.cuda_graphs not in CUDA_GRAPHS:
            raise ConfigError(f"engine.cuda_graphs must be one of {', '.join(CUDA_GRAPHS)}, got {self.cuda_graphs!r}")
        if self.kind not in KINDS:
            raise ConfigError(f"engine.kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.accelerator not in ACCELERATORS:
            raise ConfigError(f"engine.accelerator must be one of {', '.join(ACCELERATORS)}, got {self.accelerator!r}")
        for name in ("devices", "concurrent"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"engine.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.kind == "fast" and self.devices != 1:
            raise ConfigError("engine.devices > 1 (DDP) needs engine.kind=plain; the fast path uses one device")
        if self.kind == "plain" and (self.concurrent != 1 or self.compile or self.channels_last or self.bf16
                                     or self.cuda_graphs == "on"):
            raise ConfigError("engine.concurrent/compile/channels_last/bf16/cuda_graphs=on need engine.kind=fast")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Engine":
        check_keys("engine", data, sorted(f.name for f in fields(cls)))
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

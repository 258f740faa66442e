"""Supernet training's settings (`conf/supernet/default.yaml`), apart from the trainer: they
import no torch, so `nas train-supernet` rejects a bad one in one line before torch and Lightning load."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from nas.core.registry import check_keys
from nas.errors import ConfigError
from nas.train.engine import ACCELERATORS
from nas.train.recipe import SgdCosine

SAMPLINGS = ("uniform", "fair", "sandwich", "droppath")


@dataclass(frozen=True)
class SupernetSettings(SgdCosine):
    """`conf/supernet/default.yaml` less `out` and `params`: SgdCosine over all steps."""

    section: ClassVar[str] = "supernet"
    lr: float = 0.05  # momentum, nesterov, weight_decay: SgdCosine's
    epochs: int = 10  # with cpu_seconds: an upper bound
    batch_size: int = 128
    flip: bool = True
    crop: bool = True
    train_subset: int | None = None  # train on the first N training images
    val_subset: int | None = 500  # validation images scoring the largest and smallest subnets at the end
    recal_batches: int = 10  # BN recalibration batches before those scores
    sampling: str | None = None  # None: the supernet's default_sampling
    n_random: int = 2  # sandwich: random subnets per step besides the largest and the smallest
    warmup: float = 0.5  # droppath: the fraction of training that averages several choices per decision
    cpu_seconds: float | None = None  # stop training once its CPU time (user + system) reaches this
    distill: bool = True  # sandwich: the others learn from the largest's soft labels
    accelerator: str = "auto"  # cpu | gpu | auto
    devices: int = 1  # > 1: DDP, Lightning relaunching this command once per extra rank
    strategy: str | None = None  # None: DDP that tolerates unused parameters when devices > 1

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, low in (("epochs", 1), ("batch_size", 1), ("n_random", 0), ("recal_batches", 0),
                          ("train_subset", 1), ("val_subset", 1), ("devices", 1)):
            value = getattr(self, name)
            if value is None and name in ("train_subset", "val_subset"):  # null: all images
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:  # epochs=null crashed training
                raise ConfigError(f"supernet.{name} must be an integer >= {low}, got {value!r}")
        if self.cpu_seconds is not None:
            if isinstance(self.cpu_seconds, bool) or not isinstance(self.cpu_seconds, (int, float)) \
                    or not self.cpu_seconds > 0:
                raise ConfigError(f"supernet.cpu_seconds must be a number > 0 or null, got {self.cpu_seconds!r}")
            if self.devices > 1:
                raise ConfigError("supernet.cpu_seconds bounds one process's CPU time; with devices > 1 "
                                  "bound training by epochs")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, (int, float)) or not 0 <= self.warmup <= 1:
            raise ConfigError(f"supernet.warmup must be a fraction from 0 to 1, got {self.warmup!r}")
        if self.accelerator not in ACCELERATORS:
            raise ConfigError(f"supernet.accelerator must be one of {', '.join(ACCELERATORS)}, got {self.accelerator!r}")
        if self.strategy is not None and not isinstance(self.strategy, str):
            raise ConfigError(f"supernet.strategy must be a Lightning strategy name or null, got {self.strategy!r}")
        if self.sampling is not None and self.sampling not in SAMPLINGS:
            raise ConfigError(f"supernet.sampling: unknown '{self.sampling}' (valid: null, {', '.join(SAMPLINGS)})")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SupernetSettings":
        check_keys("supernet", data, [f.name for f in fields(cls)])
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lightning_strategy(self) -> str:
        """Each step trains subnets, which leave parts of the supernet without
        gradients: plain DDP would fail on them, so the default finds unused parameters."""
        if self.strategy is not None:
            return self.strategy
        return "ddp_find_unused_parameters_true" if self.devices > 1 else "auto"

"""Training recipes: NB201's full recipe and CPU proxies of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from nas.core.registry import check_keys
from nas.errors import ConfigError

NB201_SEEDS = (777, 888, 999)


@dataclass(frozen=True)
class SgdCosine:
    """SGD with momentum, the learning rate falling from `lr` to 0 along a cosine, stepped per batch:
    the optimiser of both the training recipe and supernet training, built by `nas.train.optim`."""

    section: ClassVar[str] = "sgd"  # the config group named in errors
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True  # applies only with momentum > 0
    weight_decay: float = 5e-4

    def __post_init__(self) -> None:
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ConfigError(f"{self.section}.lr must be > 0, got {self.lr!r}")
        if not 0 <= self.momentum < 1 or self.weight_decay < 0:
            raise ConfigError(f"{self.section}: need 0 <= momentum < 1 and weight_decay >= 0, "
                              f"got {self.momentum!r} and {self.weight_decay!r}")


@dataclass(frozen=True)
class Recipe(SgdCosine):
    """NB201 defaults: SGD Nesterov 0.9, lr 0.1 cosine to 0, wd 5e-4, 200 epochs, batch 256, flip + crop."""

    section: ClassVar[str] = "recipe"
    epochs: int = 200
    batch_size: int = 256
    flip: bool = True
    crop: bool = True
    train_subset: int | None = None  # proxy recipes train on the first N images
    valid_subset: int | None = None
    test_subset: int | None = None
    # early termination of clearly failing candidates (NADER: 19.2 % fail to converge)
    stop_on_nan: bool = True
    patience_epochs: int = 3  # by this epoch the loss must have dropped ...
    min_loss_drop: float = 0.05  # ... by this fraction of the first epoch's loss

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("epochs", "batch_size", "patience_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"recipe.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("train_subset", "valid_subset", "test_subset"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(f"recipe.{name} must be an integer >= 1 or null (all images), got {value!r}")
        if not 0 <= self.min_loss_drop < 1:
            raise ConfigError(f"recipe.min_loss_drop must be in [0, 1), got {self.min_loss_drop}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Recipe":
        check_keys("recipe", data, sorted(f.name for f in fields(cls)))
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


NB201 = Recipe()
CPU_PROXY = Recipe(epochs=3, batch_size=128, train_subset=5000, valid_subset=2000, test_subset=2000)

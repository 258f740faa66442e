"""Score subnets with a trained supernet's shared weights (stage two of two-stage NAS).

Each candidate is extracted from the supernet (`supernets`, trained by
`nas train-supernet`), its BatchNorm statistics are re-estimated on a few
training batches (shared running statistics belong to no single subnet: OFA's
`set_running_statistics`, SPOS's BN recalibration) and it is scored on the
validation split; test accuracy is recorded, never used to choose. Scoring is
deterministic, so results are cached in process by (fingerprint, subnet key)
besides Prefect's task cache, whose key holds the same fingerprint.
"""

from __future__ import annotations

import copy
import hashlib
import io
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from nas.core.arch import Architecture, stable_hash
from nas.core.registry import check_keys
from nas.core.space import Cost, SearchSpace
from nas.data.normalise import Normaliser
from nas.data.sources import SOURCES, ImageData, Split, load_data
from nas.errors import ConfigError, MissingDependencyError
from nas.evaluators.base import EVALUATORS, EvalResult, Evaluator
from nas.measure import count_flops, count_params

# (evaluator fingerprint, subnet key) → result: a repeated subnet costs nothing in this process.
SCORES: dict[tuple[str, str], EvalResult] = {}
RECAL_SEED = 0  # the same recalibration batches for every subnet: scores differ only by the subnet


def resize(x: torch.Tensor, size: int | None) -> torch.Tensor:
    """Inputs at the subnet's resolution (OFA's elastic r); None keeps the data's own size."""
    if size is None or tuple(x.shape[-2:]) == (size, size):
        return x
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)


@dataclass
class Feeder:
    """Normalised batches of an RGB `ImageData` split on a device (no augmentation: scoring is deterministic)."""

    data: ImageData
    batch_size: int
    device: torch.device

    def batches(self, split: Split, size: int | None, limit: int | None = None,
                seed: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """At most `limit` batches, in a seeded random order when `seed` is given."""
        order = (torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))
                 if seed is not None else torch.arange(len(split)))
        n = len(split) if limit is None else min(len(split), limit * self.batch_size)
        normalise = Normaliser(self.data.mean, self.data.std, self.device)
        for i in range(0, n, self.batch_size):
            idx = order[i:i + self.batch_size]
            x = normalise.images(split.images[idx].to(self.device))
            yield resize(x, size), split.labels[idx].to(self.device)


@torch.no_grad()
def recalibrate_bn(net: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Reset BatchNorm running statistics and re-estimate them as plain averages
    over `batches` (momentum None); leaves `net` in eval mode."""
    bns = [m for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    momenta = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    net.train()
    for x, _ in batches:
        net(x)
    for m, momentum in zip(bns, momenta):
        m.momentum = momentum
    net.eval()


@torch.no_grad()
def accuracy(net: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Top-1 accuracy in percent."""
    net.eval()
    correct = total = 0
    for x, y in batches:
        correct += int((net(x).argmax(1) == y).sum())
        total += len(y)
    return 100.0 * correct / max(total, 1)


def score(net: nn.Module, feeder: Feeder, size: int | None, recal_batches: int,
          subset: int | None) -> tuple[float, float]:
    """(valid, test) accuracy of a standalone subnet after BN recalibration."""
    if recal_batches:
        recalibrate_bn(net, feeder.batches(feeder.data.train, size, recal_batches, seed=RECAL_SEED))
    return (accuracy(net, feeder.batches(feeder.data.valid.subset(subset), size)),
            accuracy(net, feeder.batches(feeder.data.test.subset(subset), size)))


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu" or (name.startswith("cuda") and torch.cuda.is_available()):
        return torch.device(name)
    raise ConfigError(f"device '{name}' is not available here (valid: auto, cpu{', cuda' * torch.cuda.is_available()})")


@EVALUATORS.register("supernet")
class SupernetEvaluator(Evaluator):
    @classmethod
    def accepts(cls, space: type[SearchSpace]) -> bool:
        from supernets.base import SUPERNETS

        return space.name in SUPERNETS.names()

    def __init__(self, space: SearchSpace, checkpoint: str | None = None, data: dict[str, Any] | None = None,
                 recal_batches: int = 20, batch_size: int = 128, val_subset: int | None = None,
                 device: str = "auto") -> None:
        super().__init__(space)
        where = "evaluator 'supernet'"
        if not checkpoint:
            raise ConfigError(f"{where}: evaluator.checkpoint is required (a supernet.pt from `nas train-supernet`)")
        for name, value, low in (("recal_batches", recal_batches, 0), ("batch_size", batch_size, 1),
                                 ("val_subset", val_subset, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"{where}: {name} must be an integer >= {low}, got {value!r}")
        self.path = Path(checkpoint).expanduser().resolve()
        self.sha256, self.checkpoint = _load_checkpoint(self.path)
        self._check_space()
        self.data_cfg = self._data_cfg(data)
        self.recal_batches, self.batch_size, self.val_subset = recal_batches, batch_size, val_subset
        self.device = pick_device(device)
        self._fingerprint = stable_hash("supernet", self.sha256, self.data_cfg, recal_batches, batch_size,
                                        val_subset)
        self._lock = threading.Lock()  # Prefect runs tasks in threads; extraction may switch the active subnet
        self._supernet: nn.Module | None = None
        self._feeder: Feeder | None = None
        self.computed = 0  # subnets actually scored (the rest came from SCORES)

    def _check_space(self) -> None:
        from nas.spaces import SPACES

        ckpt = self.checkpoint
        trained = SPACES.create(ckpt["space"], dict(ckpt["space_params"])) if ckpt["space"] in SPACES.names() else None
        if trained is None or ckpt["space"] != self.space.name or trained.params() != self.space.params():
            raise ConfigError(
                f"supernet checkpoint {self.path} is for space {ckpt['space']} {ckpt['space_params']}, "
                f"the run's space is {self.space.name} {self.space.params()}")

    def _data_cfg(self, data: dict[str, Any] | None) -> dict[str, Any]:
        trained = dict(self.checkpoint["data"])
        if data is None:
            return trained
        if not isinstance(data, dict) or data.get("name") not in SOURCES:
            got = data.get("name") if isinstance(data, dict) else data
            raise ConfigError(f"data: unknown dataset '{got}' (valid: {', '.join(SOURCES)})")
        check_keys("data", data, ["name", "root", "split_file"])
        if data["name"] != trained["name"]:
            raise ConfigError(f"supernet checkpoint {self.path} was trained on {trained['name']}, the run's data "
                              f"is {data['name']} (pass data={trained['name']})")
        return dict(data)

    def fingerprint(self) -> str:
        return self._fingerprint

    def _load(self) -> tuple[nn.Module, Feeder]:
        """The supernet and the data, once per evaluator."""
        with self._lock:
            if self._supernet is None:
                from supernets.base import SUPERNETS

                net = SUPERNETS.create(self.space.name, dict(self.checkpoint["supernet"]), space=self.space)
                net.load_state_dict(self.checkpoint["state_dict"])
                self._feeder = Feeder(load_data(**self.data_cfg).rgb(), self.batch_size, self.device)
                self._supernet = net.eval()
            return self._supernet, self._feeder  # type: ignore[return-value]

    def weights(self, arch: Architecture) -> nn.Module:
        """The subnet with its inherited weights, on `device`; under the lock, since extraction
        may switch the supernet's active subnet. BatchNorm is as trained: `rescore` recalibrates."""
        supernet, _ = self._load()
        with self._lock:
            return supernet.extract(arch).to(self.device)

    def provenance(self, arch: Architecture) -> dict[str, Any]:
        """The checkpoint (path, sha256) and BN recalibration the subnet's weights come from; refused
        when the checkpoint differs from the sha256 `nas train-supernet` wrote beside it."""
        sidecar = self.path.with_suffix(".json")
        if sidecar.is_file():
            from nas.io import read_json

            expected = read_json(sidecar).get("sha256")
            if expected and expected != self.sha256:
                raise MissingDependencyError(f"supernet checkpoint {self.path}: sha256 {self.sha256[:16]} differs "
                                             f"from {expected[:16]} in {sidecar.name} (changed since training)")
        return {"origin": "supernet", "checkpoint": str(self.path), "checkpoint_sha256": self.sha256,
                "recal_batches": self.recal_batches}

    def rescore(self, net: nn.Module, arch: Architecture) -> tuple[float, float]:
        """(valid, test) accuracy of `net` (from `weights`) after BN recalibration, as `evaluate` scores it."""
        supernet, feeder = self._load()
        return score(net, feeder, supernet.input_size(arch), self.recal_batches, self.val_subset)

    def input_shape(self, arch: Architecture) -> tuple[int, ...]:
        """(1, channels, H, W) the subnet takes: its own resolution (OFA's elastic r), else the data's."""
        supernet, feeder = self._load()
        size = supernet.input_size(arch)
        return (1, supernet.in_channels, *((size, size) if size else feeder.data.shape[1:]))

    def network_config(self) -> dict[str, Any]:
        """The supernet's constructor settings (`num_classes`, `in_channels`) its subnets' source needs."""
        return self._load()[0].config()

    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        key = (self._fingerprint, arch.key())
        if key in SCORES:
            return copy.deepcopy(SCORES[key])
        start = time.perf_counter()
        supernet, _ = self._load()
        sub = self.weights(arch)
        valid, test = self.rescore(sub, arch)
        # A space that fixes the input size prices its subnets itself (a cached table: no fvcore trace per subnet).
        cost = self.space.cost(arch) if supernet.input_size(arch) else None
        if cost is None:
            cost = Cost(count_params(sub), count_flops(sub.cpu(), self.input_shape(arch)))
        result = EvalResult(accuracy=round(valid, 4), metrics={"valid_accuracy": round(valid, 4),
                                                                "test_accuracy": round(test, 4)},
                            params=cost.params, flops=cost.flops,
                            cost_seconds=round(time.perf_counter() - start, 3))
        SCORES[key] = result
        self.computed += 1
        return copy.deepcopy(result)


def _load_checkpoint(path: Path) -> tuple[str, dict[str, Any]]:
    """(sha256 of the file, its contents); one read, tensors only (no pickled code)."""
    if not path.is_file():
        raise MissingDependencyError(f"supernet checkpoint not found at {path} (make one: nas train-supernet)")
    raw = path.read_bytes()
    try:
        ckpt = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        missing = [k for k in ("space", "space_params", "supernet", "state_dict", "data") if k not in ckpt]
    except Exception as err:  # torch raises many types for a damaged file
        raise MissingDependencyError(f"supernet checkpoint {path} is unreadable ({type(err).__name__})") from None
    if missing:
        raise MissingDependencyError(f"supernet checkpoint {path} lacks '{missing[0]}' (not from nas train-supernet)")
    return hashlib.sha256(raw).hexdigest(), ckpt

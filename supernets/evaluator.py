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
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nas.core.arch import Architecture, stable_hash
from nas.core.registry import check_keys, plugins
from nas.core.space import Cost, SearchSpace
from nas.core.trial import EvalResult
from nas.errors import ConfigError, MissingDependencyError
from nas.evaluators.base import EVALUATORS, Evaluator
from nas.io import read_json
from nas.lazy import LazyImport
from nas.spaces import SPACES
from supernets.released import convert

# torch: loaded when a supernet is scored (listing the evaluator's spaces needs none)
checkpoints = LazyImport("supernets.checkpoints")
scoring = LazyImport("supernets.scoring")
supernet_base = LazyImport("supernets.base")
imagenet_data = LazyImport("nas.data.imagenet")
paper_transforms = LazyImport("nas.data.paper_transforms")
data_sources = LazyImport("nas.data.sources")
measure = LazyImport("nas.measure")

if TYPE_CHECKING:
    from torch import nn

    from nas.data.imagenet import FolderSettings, ImageFolderData
    from supernets.scoring import Feeder, FolderFeeder

# (evaluator fingerprint, subnet key) → result: a repeated subnet costs nothing in this process.
SCORES: dict[tuple[str, str], EvalResult] = {}


@EVALUATORS.register("supernet")
class SupernetEvaluator(Evaluator):
    _folder: ImageFolderData | None = None  # ImageNet's listing (`_data_cfg`); None for data held in memory
    _folder_settings: FolderSettings | None = None

    @classmethod
    def accepts(cls, space: type[SearchSpace]) -> bool:
        """A space with a supernet: an entry point of `nasflow.supernets`, read without importing
        one (they load torch), or one registered in this process (then `supernets.base` is loaded)."""
        base = sys.modules.get("supernets.base")
        return space.name in plugins("nasflow.supernets") or (base is not None and space.name in base.SUPERNETS.names())

    def __init__(self, space: SearchSpace, checkpoint: str | None = None, data: dict[str, Any] | None = None,
                 recal_batches: int = 20, batch_size: int = 128, val_subset: int | None = None,
                 device: str = "auto") -> None:
        super().__init__(space)
        where = "evaluator 'supernet'"
        if not checkpoint:
            raise ConfigError(f"{where}: evaluator.checkpoint is required (a supernet.pt from `nas train-supernet`, "
                              "or a released supernet: docs/released-supernets.md)")
        for name, value, low in (("recal_batches", recal_batches, 0), ("batch_size", batch_size, 1),
                                 ("val_subset", val_subset, 1)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ConfigError(f"{where}: {name} must be an integer >= {low}, got {value!r}")
        self.path = Path(checkpoint).expanduser().resolve()
        self.sha256, self.checkpoint = checkpoints.load_checkpoint(self.path, space.name)
        self._check_space()
        self.data_cfg = self._data_cfg(data)
        self.recal_batches, self.batch_size, self.val_subset = recal_batches, batch_size, val_subset
        self.device = scoring.pick_device(device)
        self._fingerprint = stable_hash("supernet", self.sha256, self._scored_data(), recal_batches, batch_size,
                                        val_subset)
        self._lock = threading.Lock()  # Prefect runs tasks in threads; extraction may switch the active subnet
        self._supernet: nn.Module | None = None
        self._feeder: Feeder | FolderFeeder | None = None
        self.computed = 0  # subnets actually scored (the rest came from SCORES)

    @classmethod
    def space_settings(cls, space: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The settings of `space` the checkpoint fixes (a released OFA file's width_mult), read from
        the file: what a space setting left null takes. Empty for another space's checkpoint (the
        evaluator then says so)."""
        if not params.get("checkpoint"):
            return {}

        _, ckpt = checkpoints.load_checkpoint(Path(params["checkpoint"]).expanduser().resolve(), space)
        return dict(ckpt["space_params"]) if ckpt["space"] == space else {}

    def _check_space(self) -> None:
        """The checkpoint is a supernet of the run's space. A released one's tensors become our
        supernet's state_dict here, checked (one line naming the first that does not fit), so that
        nothing is scored with a file that is not the run's supernet and `_load` reads both kinds alike."""
        ckpt = self.checkpoint
        if "format" in ckpt:
            net = supernet_base.SUPERNETS.create(self.space.name, dict(ckpt["supernet"]), space=self.space)
            ckpt["state_dict"] = convert(ckpt["format"], ckpt["state_dict"], net, self.space.params(), str(self.path))
            return
        trained = SPACES.create(ckpt["space"], dict(ckpt["space_params"])) if ckpt["space"] in SPACES.names() else None
        if trained is None or ckpt["space"] != self.space.name or trained.params() != self.space.params():
            raise ConfigError(
                f"supernet checkpoint {self.path} is for space {ckpt['space']} {ckpt['space_params']}, "
                f"the run's space is {self.space.name} {self.space.params()}")

    def _data_cfg(self, data: dict[str, Any] | None) -> dict[str, Any]:
        """The data to score on: the checkpoint's (a released supernet's is ImageNet), which `data`
        may only name again, with its settings. ImageNet's folder is listed here (`_folder`), so a
        malformed one, or one whose classes are not the classifier's, stops before anything is scored."""
        trained = dict(self.checkpoint.get("data") or {"name": "imagenet"})
        known = [*data_sources.SOURCES, "imagenet"]
        if data is None and trained["name"] != "imagenet":
            return trained
        data = trained if data is None else data
        if not isinstance(data, dict) or data.get("name") not in known:
            got = data.get("name") if isinstance(data, dict) else data
            raise ConfigError(f"data: unknown dataset '{got}' (valid: {', '.join(known)})")
        imagenet = data["name"] == "imagenet"
        if not imagenet:  # conf/evaluator/supernet.yaml passes ImageNet's own keys, unset, with every dataset
            data = {k: v for k, v in data.items() if v is not None or k not in imagenet_data.FOLDER_KEYS}
        check_keys("data", data, ["name", "root", "split_file", *(imagenet_data.FOLDER_KEYS if imagenet else ())])
        if data["name"] != trained["name"]:
            raise ConfigError(f"supernet checkpoint {self.path} was trained on {trained['name']}, the run's data "
                              f"is {data['name']} (pass data={trained['name']})")
        if not imagenet:
            return dict(data)
        self._folder_settings = imagenet_data.FolderSettings.from_config(data, self.space.name)
        if "format" in self.checkpoint:  # a released network takes its paper's pixels (SPOS's: BGR 0-255)
            def pixels(transform: str) -> str:
                return "bgr_255" if paper_transforms.TRANSFORMS[transform].bgr_255 else "rgb_normalised"

            chosen = self._folder_settings.transform
            fed, takes = pixels(chosen), pixels(paper_transforms.SPACE_TRANSFORMS.get(self.space.name, chosen))
            if fed != takes:
                raise ConfigError(f"data.transform={chosen} feeds {fed} pixels, the network of {self.path} "
                                  f"takes {takes}")
        self._folder = imagenet_data.scan(self._folder_settings.root)
        classifier = self.checkpoint["supernet"].get("num_classes")
        if classifier is not None and self._folder.num_classes != classifier:
            raise ConfigError(f"imagenet: {self._folder.root} has {self._folder.num_classes} class folders, the "
                              f"supernet's classifier has {classifier} outputs")
        return self._folder_settings.config()

    def _scored_data(self) -> dict[str, Any]:
        """What the scores depend on of the data (for the fingerprint): its config; ImageNet's without
        where the folder is, its cache or threads, and with its listing (classes and file names)."""
        if self._folder is None or self._folder_settings is None:
            return self.data_cfg
        return {**self._folder_settings.scored(), "listing": self._folder.identity()}

    def _make_feeder(self) -> Feeder | FolderFeeder:
        if self._folder is not None and self._folder_settings is not None:
            return scoring.FolderFeeder(self._folder, self._folder_settings, self.batch_size, self.device)
        return scoring.Feeder(data_sources.load_data(**self.data_cfg).rgb(), self.batch_size, self.device)

    def fingerprint(self) -> str:
        return self._fingerprint

    def _load(self) -> tuple[nn.Module, Feeder | FolderFeeder]:
        """The supernet and the data, once per evaluator."""
        with self._lock:
            if self._supernet is None:
                net = supernet_base.SUPERNETS.create(self.space.name, dict(self.checkpoint["supernet"]),
                                                     space=self.space)
                net.load_state_dict(self.checkpoint["state_dict"])
                self._feeder = self._make_feeder()
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
            expected = read_json(sidecar).get("sha256")
            if expected and expected != self.sha256:
                raise MissingDependencyError(f"supernet checkpoint {self.path}: sha256 {self.sha256[:16]} differs "
                                             f"from {expected[:16]} in {sidecar.name} (changed since training)")
        return {"origin": "supernet", "checkpoint": str(self.path), "checkpoint_sha256": self.sha256,
                "recal_batches": self.recal_batches}

    def rescore(self, net: nn.Module, arch: Architecture) -> tuple[float, float]:
        """(valid, test) accuracy of `net` (from `weights`) after BN recalibration, as `evaluate` scores it."""
        supernet, feeder = self._load()
        return scoring.score(net, feeder, supernet.input_size(arch), self.recal_batches, self.val_subset)

    def input_shape(self, arch: Architecture) -> tuple[int, ...]:
        """(1, channels, H, W) the subnet takes: its own resolution (OFA's elastic r), else the data's."""
        supernet, feeder = self._load()
        size = supernet.input_size(arch)
        return (1, supernet.in_channels, *((size, size) if size else feeder.image_shape[1:]))

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
            cost = Cost(measure.count_params(sub), measure.count_flops(sub.cpu(), self.input_shape(arch)))
        result = EvalResult(accuracy=round(valid, 4), metrics={"valid_accuracy": round(valid, 4),
                                                                "test_accuracy": round(test, 4)},
                            params=cost.params, flops=cost.flops,
                            cost_seconds=round(time.perf_counter() - start, 3))
        SCORES[key] = result
        self.computed += 1
        return copy.deepcopy(result)

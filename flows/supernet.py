"""Supernet training (`nas train-supernet`) as a flow: the training is one task,
retried on a crash and cached by (config, data fingerprint), so asking again for
a supernet that exists costs a data load, not hours of training."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import INPUTS, NO_CACHE

from nas.config import check_config, data_source, split_override
from nas.errors import ConfigError
from nas.lazy import LazyImport
from supernets.settings import SupernetSettings
from tasks.records import (
    SERIALIZER,
    check_fields,
    is_count,
    is_number,
    read_record,
)

# torch: loaded by the tasks that train (a flow module loads without it)
sources = LazyImport("nas.data.sources")
supernet_training = LazyImport("supernets.train")

# The shape of `train_supernet_task`'s result: a cached record is used only if it has it.
TRAINED_FIELDS = {"path": lambda v: isinstance(v, str), "sha256": lambda v: isinstance(v, str),
                  "val_accuracy_largest": is_number, "val_accuracy_smallest": is_number,
                  "steps": is_count, "wall_seconds": is_number}


@task(cache_policy=NO_CACHE, retries=1, retry_delay_seconds=1)
def fingerprint_data(data: dict[str, Any]) -> str:
    """sha256 of the images and labels: a dataset changed in place retrains."""
    image = sources.load_data(**data)  # cached per process: the training task reuses it
    digest = hashlib.sha256(f"{image.name}:{image.num_classes}".encode())
    for split in (image.train, image.valid, image.test):
        for tensor in (split.images, split.labels):
            digest.update(tensor.contiguous().numpy())
    return digest.hexdigest()


@task(cache_policy=INPUTS, persist_result=True, result_serializer=SERIALIZER, retries=1,
      retry_delay_seconds=5, task_run_name="train-supernet-{space[name]}-{data[name]}")
def train_supernet_task(space: dict[str, Any], params: dict[str, Any], data: dict[str, Any],
                        settings: dict[str, Any], seed: int, out: str, data_fingerprint: str) -> dict[str, Any]:
    result = supernet_training.train_supernet(space, params, data, SupernetSettings.from_dict(settings), seed,
                                              Path(out), progress=False)
    return {"path": str(result.path), "sha256": result.sha256,
            "val_accuracy_largest": result.val_accuracy_largest,
            "val_accuracy_smallest": result.val_accuracy_smallest,
            "steps": result.steps, "wall_seconds": result.wall_seconds}


def _must_retrain(inputs: dict[str, Any]) -> bool:
    """Whether Prefect must not read the cached result: a record refused by the check
    (tasks/records.py: reported and removed), or one whose checkpoint is gone or changed
    (a cached result is only valid while its checkpoint is still there, unchanged)."""
    key = INPUTS.compute_key(None, inputs, {})  # type: ignore[arg-type]
    cached, rejected = read_record(key, lambda data: check_fields(data, TRAINED_FIELDS, exact=True),
                                   f"supernet {inputs['space']['name']}", "training again")
    if cached is None:
        return rejected
    path = Path(cached["path"])
    return not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != cached["sha256"]


@flow(name="nas-train-supernet", persist_result=False)
def train_supernet_flow(overrides: list[str] | None = None) -> dict[str, Any]:
    """`nas train-supernet [out=DIR] [overrides]`; returns the checkpoint's path, hash and scores."""

    outs, rest = split_override(list(overrides or []), "out")
    cfg = check_config(rest)
    group = dict(cfg["supernet"])
    out = Path(outs[-1] if outs else group["out"]).resolve()
    group.pop("out")
    params = group.pop("params", None) or {}
    settings = SupernetSettings.from_dict(group)  # bad settings fail before the data loads
    if settings.devices > 1:
        raise ConfigError("supernet.devices > 1 needs `nas train-supernet`: Lightning's DDP relaunches "
                          "the command per rank, which in a flow run would start the run again")
    data = data_source(cfg["data"])
    inputs = {"space": cfg["space"], "params": params, "data": data, "settings": settings.to_dict(),
              "seed": int(cfg["seed"]), "out": str(out), "data_fingerprint": fingerprint_data(data)}
    train = train_supernet_task.with_options(refresh_cache=True) if _must_retrain(inputs) else train_supernet_task
    state = train(**inputs, return_state=True)
    return {**state.result(), "cached": state.name == "Cached"}

"""Evaluation slots: which GPU each concurrent evaluation may use.

One slot is one evaluation running at a time. With GPUs, each slot's worker process
sees exactly one device through `CUDA_VISIBLE_DEVICES` (several slots may share a GPU
when small models are packed: `per_gpu`); without GPUs, slots are CPU processes that
see none. Torch-free on purpose: runner=local's worker pool (nas/pool.py) and the Dask task
runner (flows/task_runners.py) assign slots before any worker imports torch."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from nas.errors import ConfigError


@dataclass(frozen=True)
class Slot:
    index: int
    gpu: str | None  # the device id (as CUDA_VISIBLE_DEVICES names it) this slot's process sees; None: CPU only
    share: float = 1.0  # the fraction of that GPU a slot may count on (1 / per_gpu)

    def env(self) -> dict[str, str]:
        """Environment for the slot's worker process (an empty value hides every GPU)."""
        return {"CUDA_VISIBLE_DEVICES": self.gpu if self.gpu is not None else ""}


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use: `CUDA_VISIBLE_DEVICES` when set (an empty value: none),
    else the devices `nvidia-smi -L` lists; none when there is no driver."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def assign_slots(gpus: list[str], *, per_gpu: int = 1, workers: int | None = None) -> list[Slot]:
    """`per_gpu` slots on each GPU; without GPUs, `workers` CPU slots (default 1).
    `workers` caps the number of slots when GPUs are present."""
    if isinstance(per_gpu, bool) or not isinstance(per_gpu, int) or per_gpu < 1:
        raise ConfigError(f"runner.per_gpu: expected a positive integer, got {per_gpu!r}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"runner.workers: expected a positive integer, got {workers!r}")
    if not gpus:
        return [Slot(i, None) for i in range(workers or 1)]
    slots = [Slot(i * len(gpus) + g, gpu, 1.0 / per_gpu)  # round-robin: slot 0 on GPU 0, slot 1 on GPU 1, ...
             for i in range(per_gpu) for g, gpu in enumerate(gpus)]
    slots.sort(key=lambda s: s.index)
    return slots[:workers] if workers is not None else slots

"""Train one trusted candidate in its own process: how DDP runs inside a search.

Lightning's DDP relaunches the current command line once per extra rank, so
the process that calls `fit` must be one whose command line means "train
this candidate" and nothing else — not `nas search`, whose other ranks would
rerun the whole search. `train_in_subprocess` writes a request file and runs
`python -m nas.train.worker REQUEST`; every rank trains, rank 0 writes the
result next to the request (atomically).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from nas.core.arch import Architecture
from nas.core.space import SPACES, SearchSpace
from nas.errors import EvaluationError
from nas.io import atomic_write_json
from nas.train.build import build_model
from nas.train.engine import Engine
from nas.train.recipe import Recipe
from nas.train.result import TrainResult


def train_in_subprocess(space: SearchSpace, arch: Architecture, *, data: dict[str, Any], recipe: dict[str, Any],
                        engine: dict[str, Any], build: dict[str, Any], seed: int,
                        timeout_s: float | None = None) -> TrainResult:
    with tempfile.TemporaryDirectory(prefix="nas-train-") as tmp:
        request = Path(tmp, "request.json")
        atomic_write_json(request, {"space": space.name, "space_params": space.params(),
                                    "encoding": arch.encode(), "data": data,
                                    "recipe": recipe, "engine": engine, "build": build, "seed": seed})
        try:
            proc = subprocess.run([sys.executable, "-m", "nas.train.worker", str(request)], cwd=tmp,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise EvaluationError(f"training {arch.space} {arch.key()} exceeded {timeout_s:g} s") from None
        result = Path(tmp, "result.json")
        if proc.returncode != 0 or not result.exists():
            tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or ["no output"]
            raise EvaluationError(f"training worker for {arch.space} {arch.key()} exited with status "
                                  f"{proc.returncode}: {tail[0][:300]}")
        return TrainResult(**json.loads(result.read_text(encoding="utf-8")))


def main(request_path: str) -> None:
    from nas.data.sources import load_data  # lazy: loads torch (start-up time)
    from nas.train.run import train_one  # lazy: loads torch (start-up time)

    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    data = load_data(**request["data"])
    space = SPACES.create(request["space"], request["space_params"])
    arch = space.decode(request["encoding"])
    model = build_model(space, arch, data.shape, data.num_classes, request["build"], request["seed"])
    result = train_one(model, data, Recipe.from_dict(request["recipe"]), request["seed"],
                       Engine.from_dict(request["engine"]))
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and int(os.environ.get("NODE_RANK", "0")) == 0:
        atomic_write_json(Path(request_path).with_name("result.json"), result.to_dict())


if __name__ == "__main__":
    main(sys.argv[1])

"""`nas search evaluator=train` through the real CLI on a tiny proxy recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_nas
from nas.data.sources import FASHION_MNIST_ROOT

pytestmark = pytest.mark.slow

TINY = ["space=nb201", "evaluator=train", "strategy=random", "budget.trials=3", "recipe.epochs=1",
        "recipe.train_subset=256", "recipe.valid_subset=200", "recipe.test_subset=200",
        "evaluator.channels=4", "evaluator.cells_per_stage=1", "progress=false"]


def _history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]


def test_train_search_writes_run_files_and_replays_from_cache(nas_env, tmp_path):
    data = "data=fashion_mnist" if Path(FASHION_MNIST_ROOT).exists() else "data=digits"
    first, second = tmp_path / "a", tmp_path / "b"
    r = run_nas(["search", *TINY, data, f"hydra.run.dir={first}"], nas_env)
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("history.jsonl", "summary.json", "state.json", "report.md", "best_so_far.png"):
        assert (first / name).exists(), name
    rows = _history(first)
    assert len(rows) == 3 and all(row["error"] is None for row in rows)
    assert all(0 < row["accuracy"] <= 100 and row["metrics"]["epochs"] == 1.0 and len(row["curve"]) == 1
               for row in rows)
    r = run_nas(["search", *TINY, data, f"hydra.run.dir={second}"], nas_env)
    assert r.returncode == 0, r.stderr[-2000:]
    again = _history(second)
    assert all(row["cached"] for row in again)
    assert [row["accuracy"] for row in again] == [row["accuracy"] for row in rows]


def test_unknown_dataset_is_one_line(nas_env, tmp_path):
    r = run_nas(["search", *TINY, "data=svhn", f"hydra.run.dir={tmp_path}"], nas_env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("nas: error: unknown data 'svhn' (valid: cifar10, cifar100")


def test_missing_dataset_path_is_one_line(nas_env, tmp_path):
    r = run_nas(["search", *TINY, "data=cifar10", f"data.root={tmp_path / 'none'}", "runner=local",
                 f"hydra.run.dir={tmp_path / 'run'}"], nas_env)
    assert r.returncode == 2
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("nas: error: cifar10 not found at") and "cifar-10-batches-py" in last


MODEL = '''
import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))

    def forward(self, x):
        return self.body(x)
'''
TRAIN = ["data=digits", "recipe.epochs=2", "recipe.patience_epochs=3", "recipe.train_subset=256",
         "recipe.valid_subset=128", "recipe.test_subset=128", "evaluator.cells_per_stage=1", "evaluator.channels=4"]


@pytest.mark.parametrize("kind", ["source", "block", "cell"])
def test_nas_train_one_architecture_of_each_representation(kind, nas_env, tmp_path):
    root = Path(__file__).resolve().parent / "data"
    arch = {"source": tmp_path / "model.py", "block": root / "blocks" / "residual.txt",
            "cell": "|nor_conv_3x3~0|+|none~0|nor_conv_3x3~1|+|skip_connect~0|none~1|skip_connect~2|"}[kind]
    (tmp_path / "model.py").write_text(MODEL)
    extra = ["engine=fast", "evaluator.seeds=[777,888]"] if kind == "cell" else []
    r = run_nas(["train", str(arch), *TRAIN, *extra, "--out", str(tmp_path / "r.json")], nas_env)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads((tmp_path / "r.json").read_text())
    space = {"source": "source", "block": "nader", "cell": "nb201"}[kind]
    assert record["space"] == space and record["error"] is None and len(record["curve"]) == 2
    assert r.stdout.startswith(f"{space} {record['key']}: ok; valid ")
    if kind == "cell":
        assert {"valid_accuracy_seed777", "valid_accuracy_seed888"} <= set(record["metrics"])


def test_nas_train_errors_are_one_line(nas_env, tmp_path):
    r = run_nas(["train", str(tmp_path / "none.py"), "data=digits"], nas_env)
    assert r.returncode == 2 and r.stderr.strip() == (
        f"nas: error: {tmp_path / 'none.py'}: no such file (give a .txt file (space 'nader'), a .py file (space "
        "'source') or an architecture string (space 'nb201'))")
    broken = tmp_path / "broken.py"
    broken.write_text(MODEL.replace("def forward(self, x):\n        return self.body(x)",
                                    "def forward(self, x):\n        return self.missing(x)"))
    r = run_nas(["train", str(broken), *TRAIN], nas_env)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].startswith(
        "nas: error: forward: AttributeError: 'Network' object has no attribute 'missing' at broken.py:13")

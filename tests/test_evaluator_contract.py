"""The contract every registered evaluator keeps, checked at tiny settings: `accepts` is what
the search's `build_evaluator` lets through (a refusal is one line naming the supported
spaces), the fingerprint (part of every cache key) is stable and follows the results, and
`evaluate` scores a candidate of an accepted space. A new evaluator is tested by adding its
row to SETUPS."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import space_preset
from nas.core.space import SearchSpace
from nas.core.trial import EvalResult
from nas.errors import ConfigError
from nas.evaluators import EVALUATORS
from nas.search.spec import Component, build_evaluator
from nas.spaces import SPACES
from supernets import evaluator as supernet_evaluator
from supernets.train import SupernetSettings, train_supernet

DIGITS = {"name": "digits", "root": None, "split_file": None}


def preset(label: str) -> SearchSpace:
    """A space preset of conf/space, as the default job's data group resolves it."""
    params = space_preset(label)
    return SPACES.create(params.pop("name"), params)


LABELS = sorted(p.stem for p in Path(str(resources.files("conf") / "space")).glob("*.yaml"))


@dataclass(frozen=True)
class Setup:
    """An evaluator at tiny settings: the space it scores here, its params (given the tiny
    supernet checkpoint's path), and one param change that changes its results."""

    space: str
    params: Callable[[Path | None], dict[str, Any]]
    changed: dict[str, Any]


SETUPS = {
    "table": Setup("nb201", lambda _: {}, {"metric": "qat_accuracy"}),
    "simulated": Setup("nb201", lambda _: {"median_seconds": 0.01, "sigma": 0.1}, {"seed": 1}),
    "train": Setup("nader", lambda _: {"data": DIGITS, "recipe": {"epochs": 1, "batch_size": 64}, "seeds": [0],
                                       "cells_per_stage": 2},
                   {"recipe": {"epochs": 2, "batch_size": 64}}),
    "proxy": Setup("nb201", lambda _: {"data": DIGITS, "batch_size": 8, "reference": 3, "channels": 4,
                                       "cells_per_stage": 1}, {"seed": 1}),
    "supernet": Setup("autoformer_small", lambda ckpt: {"checkpoint": str(ckpt), "recal_batches": 1,
                                                        "batch_size": 64, "val_subset": 50},
                      {"recal_batches": 2}),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A supernet of the `_small` AutoFormer preset trained for one epoch on 64 digits (under a second)."""
    space = preset(SETUPS["supernet"].space)
    settings = SupernetSettings(epochs=1, batch_size=64, train_subset=64, val_subset=50, recal_batches=1)
    return train_supernet({"name": space.name, **space.params()}, {}, DIGITS, settings, seed=0,
                          out_dir=tmp_path_factory.mktemp("supernet"), progress=False).path


def make(name: str, ckpt: Path | None, **changed: Any):
    setup = SETUPS[name]
    return build_evaluator(Component(name, {**setup.params(ckpt), **changed}), preset(setup.space))


def test_every_evaluator_has_a_setup():
    assert set(SETUPS) == set(EVALUATORS.names())


@pytest.mark.parametrize("name", sorted(SETUPS))
@pytest.mark.parametrize("label", LABELS)
def test_accepts_is_what_build_evaluator_lets_through(name, label):
    space, cls = preset(label), EVALUATORS.get(name)
    # Without a checkpoint the supernet evaluator stops at its own parameters, after the space check.
    component = Component(name, {} if name == "supernet" else SETUPS[name].params(None))
    if not cls.accepts(type(space)):
        with pytest.raises(ConfigError) as info:
            build_evaluator(component, space)
        assert str(info.value) == (f"evaluator '{name}' does not support space '{space.name}' "
                                   f"(supports: {', '.join(cls.spaces())})")
        return
    assert space.name in cls.spaces()
    if name == "supernet":
        with pytest.raises(ConfigError, match="evaluator.checkpoint is required"):
            build_evaluator(component, space)
    else:
        assert isinstance(build_evaluator(component, space), cls)


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_fingerprint_is_stable_and_follows_the_results(name, request):
    ckpt = request.getfixturevalue("checkpoint") if name == "supernet" else None
    first = make(name, ckpt).fingerprint()
    assert isinstance(first, str) and first == make(name, ckpt).fingerprint()
    assert make(name, ckpt, **SETUPS[name].changed).fingerprint() != first


@pytest.mark.parametrize("name", sorted(SETUPS))
def test_evaluate_scores_a_candidate_of_an_accepted_space(name, request, monkeypatch):
    monkeypatch.setattr(supernet_evaluator, "SCORES", {})  # scored here, not served by the process cache
    ckpt = request.getfixturevalue("checkpoint") if name == "supernet" else None
    evaluator = make(name, ckpt)
    space = evaluator.space
    arch = space.base if space.open_ended else space.sample(np.random.default_rng(0))
    result = evaluator.evaluate(arch, seed=0)
    assert isinstance(result, EvalResult) and result.ok, result.error
    assert 0 <= result.accuracy <= 100 and result.params > 0 and result.flops > 0
    # Held weights come with where they are from (export's manifest records it); none, with nothing.
    origin = evaluator.provenance(arch)
    assert (evaluator.weights(arch) is None) == (origin == {})
    if ckpt is not None:
        assert (origin["checkpoint"], origin["checkpoint_sha256"]) == (
            str(ckpt.resolve()), hashlib.sha256(ckpt.read_bytes()).hexdigest())

"""The zero-cost vote as a screening scorer (`screen.scorer=proxy`): it needs no trained
candidates, so with `screen.min_history=0` it screens from the very first batch, where a
learned predictor has nothing to fit yet."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from nas.core.arch import Architecture
from nas.core.scorer import SCORERS, Scorer
from nas.core.space import SearchSpace
from nas.core.trial import TrialRecord
from nas.data.sources import SOURCES, load_data
from nas.errors import ConfigError
from nas.proxies.base import Batch
from nas.proxies.batch import data_batch, random_batch
from nas.proxies.vote import vote_scores


@SCORERS.register("proxy")
class ProxyScorer(Scorer):
    """Mean rank of synflow, jacob_cov and snip within each asked set, on one minibatch of
    `data` (a dataset name of the data group, or `random` for data-free images of `shape`);
    `sizing`: the networks' settings as evaluator=train takes them (NB201's channels, cells_per_stage)."""

    def __init__(self, space: SearchSpace, data: str = "random", batch_size: int = 32,
                 shape: tuple[int, int, int] | list[int] = (3, 32, 32), num_classes: int = 10,
                 **sizing: Any) -> None:
        super().__init__(space)
        if not (space.trainable and space.trusted and not space.open_ended):
            raise ConfigError(f"screen.scorer=proxy builds networks in this process: space '{space.name}' is "
                              f"{'untrusted' if not space.trusted else 'not a sampled, trainable space'}; "
                              f"use screen.scorer=predictor")
        if data != "random" and data not in SOURCES:
            raise ConfigError(f"screen.params.data: unknown dataset '{data}' (valid: random, {', '.join(SOURCES)})")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
            raise ConfigError(f"screen.params.batch_size must be an integer >= 2, got {batch_size!r}")
        if len(shape) != 3 or not all(isinstance(v, int) and v > 0 for v in shape):
            raise ConfigError(f"screen.params.shape must be [channels, height, width], got {shape!r}")
        checked = type(space).sizing_options(sizing, "screen.params", ProxyScorer)
        self.options = checked if sizing else None
        self.data, self.batch_size, self.num_classes = data, batch_size, num_classes
        self.shape = (int(shape[0]), int(shape[1]), int(shape[2]))

    @cached_property
    def batch(self) -> Batch:
        """One fixed minibatch for the whole run (seed 0): scores depend on the candidates only."""

        if self.data == "random":
            return random_batch(self.shape, self.num_classes, self.batch_size, 0)
        return data_batch(load_data(self.data), self.batch_size, 0, self.shape)

    def score(self, archs: list[Architecture], history: list[TrialRecord], seed: int) -> list[float]:
        return vote_scores(self.space, archs, self.batch, 0, self.options) if len(archs) > 1 else [0.0] * len(archs)

"""Scoring architectures with several proxies, and the rank vote that combines them."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from scipy.stats import rankdata
from torch import nn

from nas.core.arch import Architecture
from nas.core.space import SearchSpace
from nas.proxies.base import PROXIES, VOTE, Batch
from nas.proxies.gradients import GradientProxy, Gradients, loss_gradients
from nas.train.build import build_model


def score_network(net: nn.Module, batch: Batch, names: Sequence[str], seed: int) -> dict[str, float]:
    """Each proxy of `names` on the untrained `net`, torch seeded with `seed` before each; the
    caller's random state and `net` are left as they were (training may follow on the same network).
    A proxy that rewrites weights scores its own copy; the others share one copy (what they change,
    gradients, train-mode batch statistics, does not reach another's score), and the gradient
    proxies one backward pass: the scores are those of a fresh copy per proxy, at a third of the copies."""
    proxies = [PROXIES.get(n)() for n in names]  # unknown names fail before any work
    scores: dict[str, float] = {}
    shared: nn.Module | None = None
    gradients: Gradients | None = None
    with torch.random.fork_rng(devices=[]):
        for proxy in proxies:
            torch.manual_seed(seed)
            if proxy.mutates_weights:
                scores[proxy.name] = proxy.score(copy.deepcopy(net), batch)
                continue
            shared = shared if shared is not None else copy.deepcopy(net)
            if isinstance(proxy, GradientProxy):
                gradients = gradients if gradients is not None else loss_gradients(shared, batch)
                scores[proxy.name] = proxy.from_gradients(gradients)
            else:
                scores[proxy.name] = proxy.score(shared, batch)
    return scores


def score_arch(space: SearchSpace, arch: Architecture, batch: Batch, names: Sequence[str], seed: int,
               options: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Proxies of `arch`'s network, built by its (trusted) space for the batch's shape and classes with
    weights seeded by `seed`; `options`: sizing settings (`SearchSpace.build_options`), None: the space's own."""
    sizing = {} if options is None else type(space).build_options(options)
    net = build_model(space, arch, batch.shape, batch.num_classes, sizing, seed)
    return score_network(net, batch, names, seed)


def mean_rank(columns: Mapping[str, Sequence[float]]) -> list[float]:
    """Per row, the mean over columns of its rank among the rows (1 = lowest, ties averaged):
    the vote; higher is better, and only orderings matter, not the proxies' scales."""
    ranks = [rankdata(np.asarray(values, dtype=float)) for values in columns.values()]
    return [float(r) for r in np.mean(ranks, axis=0)]


def vote_scores(space: SearchSpace, archs: Sequence[Architecture], batch: Batch, seed: int,
                options: Mapping[str, Any] | None = None) -> list[float]:
    """The vote of synflow, jacob_cov and snip over `archs` (mean rank within this set: scores of
    different sets do not compare); `options` as in `score_arch`."""
    rows = [score_arch(space, arch, batch, VOTE, seed, options) for arch in archs]
    return mean_rank({name: [row[name] for row in rows] for name in VOTE})

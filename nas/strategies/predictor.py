"""A learned accuracy predictor fitted on a search's own evaluated candidates.

An ensemble of small MLPs (BANANAS, White et al. 2021: five networks from different
initialisations; their spread is the uncertainty) on a space's feature vectors
(`CategoricalSpace.features`: one-hot, or NB201's path encoding). NumPy only, so the
core stays torch-free. The members are trained as one stacked network (one matmul per
layer for all of them, one Adam update over one flat parameter vector): a search that
asks at every trial calls numpy a few dozen times per step, not once per member and layer.

`fit_on(space, history, seed)` is the one way to fit: from scratch on the first rows, then
a warm-started block of minibatch steps per further row (`steps` once past the first few), so
a predictor kept across asks pays for each new trial once (linear in the search's length) and
a fresh one replays the same fits bit for bit (a resumed search predicts as the uninterrupted one)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nas.core.space import CategoricalSpace
from nas.core.trial import TrialRecord
from nas.errors import ConfigError


@dataclass(frozen=True)
class PredictorSettings:
    members: int = 5
    hidden: int = 32  # units in each of the two hidden layers
    epochs: int = 300  # full-batch Adam steps of a fit from scratch
    lr: float = 0.01
    weight_decay: float = 1e-4
    steps: int = 10  # Adam steps per row added to a warm fit (at least: more for the first few)
    batch: int = 32  # rows in each of those steps: the new one and a sample of the earlier ones

    def __post_init__(self) -> None:
        for name in ("members", "hidden", "epochs", "steps", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"predictor.{name} must be an integer >= 1, got {value!r}")
        if not self.lr > 0 or self.weight_decay < 0:
            raise ConfigError(f"predictor: need lr > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}")


class _Stacked:
    """`members` MLPs (two ReLU hidden layers, one linear output) as one set of stacked
    weights in a flat vector, trained on squared error with Adam (weight decay on weights)."""

    BETA1, BETA2, EPS = 0.9, 0.999, 1e-8

    def __init__(self, members: int, dims: list[int], rng: np.random.Generator) -> None:
        shapes = [(members, a, b) for a, b in zip(dims[:-1], dims[1:])] + [(members, 1, b) for b in dims[1:]]
        sizes = [math.prod(s) for s in shapes]
        self.theta = np.zeros(sum(sizes))
        self.grad = np.zeros_like(self.theta)
        offsets = np.cumsum([0, *sizes])
        self.params = [self.theta[o:o + n].reshape(s) for o, n, s in zip(offsets, sizes, shapes)]
        self.grads = [self.grad[o:o + n].reshape(s) for o, n, s in zip(offsets, sizes, shapes)]
        self.n_layers = len(dims) - 1
        for w, a in zip(self.params[:self.n_layers], dims[:-1]):
            w[...] = rng.normal(0.0, math.sqrt(2.0 / a), size=w.shape)
        self.decay = np.zeros_like(self.theta)  # 1 on weights, 0 on biases
        self.decay[: offsets[self.n_layers]] = 1.0
        self.m, self.v, self.t = np.zeros_like(self.theta), np.zeros_like(self.theta), 0

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """`x`: (rows, features) shared by every member or (members, rows, features); out: (members, rows)."""
        acts = [x]
        weights, biases = self.params[:self.n_layers], self.params[self.n_layers:]
        for i, (w, b) in enumerate(zip(weights, biases)):
            x = x @ w + b
            if i < self.n_layers - 1:
                x = np.maximum(x, 0.0)
            acts.append(x)
        return x[..., 0], acts

    def step(self, x: np.ndarray, y: np.ndarray, s: PredictorSettings) -> None:
        """One Adam step on every member: `y` (rows,) or (members, rows) as `x` is shared or not."""
        out, acts = self.forward(x)
        grad = (2.0 / out.shape[-1]) * (out - y)[..., None]
        weights = self.params[:self.n_layers]
        for i in reversed(range(self.n_layers)):
            a = acts[i]
            self.grads[i][...] = (a.T if a.ndim == 2 else a.transpose(0, 2, 1)) @ grad
            self.grads[self.n_layers + i][...] = grad.sum(axis=-2, keepdims=True)
            if i:
                grad = (grad @ weights[i].transpose(0, 2, 1)) * (a > 0)
        g = self.grad + s.weight_decay * self.decay * self.theta
        self.t += 1
        self.m *= self.BETA1
        self.m += (1 - self.BETA1) * g
        self.v *= self.BETA2
        self.v += (1 - self.BETA2) * g * g
        self.theta -= (s.lr / (1 - self.BETA1 ** self.t)) * self.m / (np.sqrt(self.v / (1 - self.BETA2 ** self.t))
                                                                      + self.EPS)


class EnsemblePredictor:
    """`fit_on(space, history, seed)`, then `predict(features) -> (mean, std)` in accuracy units."""

    def __init__(self, settings: PredictorSettings | None = None) -> None:
        self.settings = settings or PredictorSettings()
        self.net: _Stacked | None = None
        self.rows: list[tuple[Any, float]] = []  # (encoding, accuracy) fitted on, in order
        self.start = 0  # how many of them the fit from scratch saw
        # set by `fit_on` (`predict` before it raises)
        self.x: np.ndarray
        self.y: np.ndarray
        self.y_mean: float
        self.y_std: float

    def fit_on(self, space: CategoricalSpace, history: list[TrialRecord], seed: int,
               start: int | None = None) -> "EnsemblePredictor":
        """Fitted on `history`'s trials with an accuracy, in order: from scratch on the first
        `start` (all by default), then each later row warm-starts from the fit before it.
        Kept from a call on a prefix of these rows (with the same `start`), it only adds the new
        ones; else it starts over, so the result depends on (rows, seed, start) alone."""
        rows = [(r.encoding, float(r.accuracy)) for r in history if r.ok and r.accuracy is not None]
        start = len(rows) if start is None else max(2, start)
        if len(rows) < start or len(rows) < 2:
            raise ValueError(f"predictor needs >= {max(2, start)} trials with an accuracy, got {len(rows)}")
        self.y = np.array([a for _, a in rows])
        done = len(self.rows)
        if self.net is None or start != self.start or rows[:done] != self.rows:
            self.rows, self.start, done = rows[:start], start, start
            self.x = np.array([space.features(space.decode(e)) for e, _ in self.rows], dtype=float)
            self._fit_scratch(seed)
        if len(rows) > done:
            new = np.array([space.features(space.decode(e)) for e, _ in rows[done:]], dtype=float)
            self.x = np.concatenate([self.x, new])
            for j in range(done, len(rows)):
                self.rows.append(rows[j])
                self._add_row(j, seed)
        return self

    def _targets(self, n: int) -> np.ndarray:
        y = self.y[:n]
        self.y_mean, self.y_std = float(y.mean()), float(y.std()) or 1.0
        return (y - self.y_mean) / self.y_std

    def _fit_scratch(self, seed: int) -> None:
        s = self.settings
        self.net = _Stacked(s.members, [self.x.shape[1], s.hidden, s.hidden, 1],
                            np.random.default_rng([seed, len(self.rows)]))
        target = self._targets(len(self.rows))
        for _ in range(s.epochs):
            self.net.step(self.x, target, s)

    def _add_row(self, j: int, seed: int) -> None:
        """Adam steps, each member on row `j` and, per step, its own sample of rows before it:
        `epochs / 2` for the first row after the fit from scratch, `epochs / k` for the k-th (a new
        row moves an early fit most), never fewer than `steps`."""
        assert self.net is not None
        s = self.settings
        target = self._targets(j + 1)
        rng = np.random.default_rng([seed, j])
        steps = max(s.steps, math.ceil(s.epochs / (j - self.start + 2)))
        idx = rng.integers(0, j, size=(steps, s.members, s.batch))
        idx[:, :, 0] = j
        for step in idx:
            self.net.step(self.x[step], target[step], s)

    def predict_archs(self, space: CategoricalSpace, archs: list) -> tuple[np.ndarray, np.ndarray]:
        return self.predict(np.array([space.features(a) for a in archs]))

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.net is None:
            raise RuntimeError("EnsemblePredictor.predict before fit_on")
        outs, _ = self.net.forward(np.asarray(features, dtype=float))
        return outs.mean(axis=0) * self.y_std + self.y_mean, outs.std(axis=0) * self.y_std


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI of maximising accuracy over `best` under independent Gaussians (std 0: the plain gain)."""
    std = np.maximum(std, 1e-9)
    z = (mean - best) / std
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (mean - best) * cdf + std * pdf

"""A learned accuracy predictor fitted on a search's own evaluated candidates.

An ensemble of small MLPs (BANANAS, White et al. 2021: five networks from different
initialisations; their spread is the uncertainty) on a space's feature vectors
(`CategoricalSpace.features`: one-hot, or NB201's path encoding). NumPy only, so the
core stays torch-free and a fit on a few hundred points takes milliseconds; every
fit is seeded, so a resumed search refits the same predictor."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from nas.core.space import CategoricalSpace
from nas.errors import ConfigError


@dataclass(frozen=True)
class PredictorSettings:
    members: int = 5
    hidden: int = 32  # units in each of the two hidden layers
    epochs: int = 300  # full-batch Adam steps per fit
    lr: float = 0.01
    weight_decay: float = 1e-4

    def __post_init__(self) -> None:
        for name in ("members", "hidden", "epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"predictor.{name} must be an integer >= 1, got {value!r}")
        if not self.lr > 0 or self.weight_decay < 0:
            raise ConfigError(f"predictor: need lr > 0 and weight_decay >= 0, got {self.lr}, {self.weight_decay}")


class _MLP:
    """Two ReLU hidden layers, one linear output, trained on squared error with Adam."""

    def __init__(self, dims: list[int], rng: np.random.Generator) -> None:
        self.weights = [rng.normal(0.0, math.sqrt(2.0 / a), size=(a, b)) for a, b in zip(dims[:-1], dims[1:])]
        self.biases = [np.zeros(b) for b in dims[1:]]

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        acts = [x]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = x @ w + b
            if i < len(self.weights) - 1:
                x = np.maximum(x, 0.0)
            acts.append(x)
        return x[:, 0], acts

    def fit(self, x: np.ndarray, y: np.ndarray, s: PredictorSettings) -> None:
        params = [*self.weights, *self.biases]
        m = [np.zeros_like(p) for p in params]
        v = [np.zeros_like(p) for p in params]
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        n_layers = len(self.weights)
        for step in range(1, s.epochs + 1):
            out, acts = self.forward(x)
            grad = (2.0 / len(y)) * (out - y)[:, None]
            gw, gb = [np.empty(0)] * n_layers, [np.empty(0)] * n_layers
            for i in reversed(range(n_layers)):
                gw[i] = acts[i].T @ grad + s.weight_decay * self.weights[i]
                gb[i] = grad.sum(axis=0)
                if i:
                    grad = (grad @ self.weights[i].T) * (acts[i] > 0)
            for j, g in enumerate([*gw, *gb]):
                m[j] = beta1 * m[j] + (1 - beta1) * g
                v[j] = beta2 * v[j] + (1 - beta2) * g * g
                params[j] -= s.lr * (m[j] / (1 - beta1 ** step)) / (np.sqrt(v[j] / (1 - beta2 ** step)) + eps)


class EnsemblePredictor:
    """`fit(features, accuracies)`, then `predict(features) -> (mean, std)` in accuracy units."""

    def __init__(self, settings: PredictorSettings | None = None) -> None:
        self.settings = settings or PredictorSettings()
        self.members: list[_MLP] = []
        self.y_mean, self.y_std = 0.0, 1.0

    def fit(self, features: np.ndarray, accuracies: np.ndarray, rng: np.random.Generator) -> None:
        x, y = np.asarray(features, dtype=float), np.asarray(accuracies, dtype=float)
        if x.ndim != 2 or len(x) != len(y) or len(y) < 2:
            raise ValueError(f"predictor needs >= 2 rows of features and as many accuracies, got {x.shape}, {y.shape}")
        self.y_mean, self.y_std = float(y.mean()), float(y.std()) or 1.0
        target = (y - self.y_mean) / self.y_std
        dims = [x.shape[1], self.settings.hidden, self.settings.hidden, 1]
        self.members = []
        for _ in range(self.settings.members):
            net = _MLP(dims, np.random.default_rng(int(rng.integers(2**63))))
            net.fit(x, target, self.settings)
            self.members.append(net)

    @classmethod
    def fitted(cls, space: CategoricalSpace, encodings: list, accuracies: list[float],
               settings: PredictorSettings, rng: np.random.Generator) -> "EnsemblePredictor":
        """Fitted on `space`'s features of the decoded `encodings` (a run's evaluated trials)."""
        predictor = cls(settings)
        predictor.fit(np.array([space.features(space.decode(e)) for e in encodings]), np.array(accuracies), rng)
        return predictor

    def predict_archs(self, space: CategoricalSpace, archs: list) -> tuple[np.ndarray, np.ndarray]:
        return self.predict(np.array([space.features(a) for a in archs]))

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if not self.members:
            raise RuntimeError("EnsemblePredictor.predict before fit")
        outs = np.stack([net.forward(np.asarray(features, dtype=float))[0] for net in self.members])
        return outs.mean(axis=0) * self.y_std + self.y_mean, outs.std(axis=0) * self.y_std


def expected_improvement(mean: np.ndarray, std: np.ndarray, best: float) -> np.ndarray:
    """EI of maximising accuracy over `best` under independent Gaussians (std 0: the plain gain)."""
    std = np.maximum(std, 1e-9)
    z = (mean - best) / std
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return (mean - best) * cdf + std * pdf

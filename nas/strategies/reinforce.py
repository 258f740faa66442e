"""REINFORCE (Williams, 1992) as NAS-Bench-201 runs it, for any categorical space.

The policy is one independent softmax per decision (NB201's `PolicyTopology`:
logits 1e-3·N(0,1), one row per edge); each trial samples one architecture,
and each told reward (validation accuracy) takes one Adam step on
-log p(a)·(reward - baseline), the baseline being a bias-corrected moving
average with momentum 0.9 updated before the step, as in NB201's code.
Failed trials are skipped; infeasible (constraint) and visited samples are
redrawn from the policy, then from the uniform sampler.

NumPy, not torch: the gradient of a softmax row is closed-form
(onehot(a) - p), and plain lists keep `state_dict` JSON.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from nas.core.space import CategoricalSpace, SearchSpace
from nas.core.trial import Candidate, SearchExhausted, Trial
from nas.errors import ConfigError, RunDirError
from nas.strategies.base import STRATEGIES, Deduplicating, Strategy


@dataclass
class Adam:
    """torch.optim.Adam's update (no weight decay, no amsgrad) over ragged rows."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    step_count: int = 0

    def step(self, params: list[np.ndarray], grads: list[np.ndarray], m: list[np.ndarray],
             v: list[np.ndarray]) -> None:
        self.step_count += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.step_count, 1 - b2 ** self.step_count
        for p, g, mi, vi in zip(params, grads, m, v):
            mi *= b1
            mi += (1 - b1) * g
            vi *= b2
            vi += (1 - b2) * g * g
            p -= self.lr * (mi / c1) / (np.sqrt(vi) / math.sqrt(c2) + self.eps)


@STRATEGIES.register("reinforce")
class Reinforce(Deduplicating, Strategy):
    asynchronous = True
    space: CategoricalSpace  # checked in __init__

    def __init__(self, space: SearchSpace, seed: int, learning_rate: float = 0.01, momentum: float = 0.9,
                 unique: bool = True, max_attempts: int = 100) -> None:
        super().__init__(space, seed)
        if not isinstance(space, CategoricalSpace):
            raise ConfigError(f"strategy 'reinforce' needs a categorical space (one choice per decision), "
                              f"not '{space.name}'")
        if learning_rate <= 0 or not 0 <= momentum < 1:
            raise ConfigError(f"strategy 'reinforce': learning_rate must be > 0 and momentum in [0, 1), "
                              f"got {learning_rate} and {momentum}")
        self.decisions = space.decisions()
        self.momentum = momentum
        self.unique = unique
        self.max_attempts = max_attempts
        self.logits = [1e-3 * self.rng.standard_normal(len(d.choices)) for d in self.decisions]
        self.m = [np.zeros_like(x) for x in self.logits]
        self.v = [np.zeros_like(x) for x in self.logits]
        self.adam = Adam(learning_rate)
        self.ema = [0.0, 0.0]  # numerator, denominator of the bias-corrected moving average
        self._init_seen()

    # -- policy -------------------------------------------------------------------------------------------

    def probs(self) -> list[np.ndarray]:
        out = []
        for row in self.logits:
            e = np.exp(row - row.max())
            out.append(e / e.sum())
        return out

    def _draw(self) -> tuple[Any, list[int]]:
        actions = [int(self.rng.choice(len(p), p=p)) for p in self.probs()]
        return self.space.from_indices(actions), actions

    def _uniform(self) -> tuple[Any, list[int]]:
        arch = self.space.sample(self.rng)
        return arch, self.space.to_indices(arch)

    def ask(self, n: int) -> list[Candidate]:
        out = []
        for _ in range(n):
            cand = self._sample()
            if self.unique:
                self.seen.add(cand.arch)
            out.append(cand)
        return out

    def _sample(self) -> Candidate:
        found = self._first(self._draw, self.max_attempts)
        if found is not None:
            return Candidate(found[0], {"origin": "policy", "actions": found[1]})
        # The policy has collapsed onto visited or infeasible cells: a uniform draw keeps the search going.
        found = self._first(self._uniform, self.max_attempts * 10)
        if found is None:
            raise SearchExhausted("reinforce: no unvisited feasible architecture found")
        return Candidate(found[0], {"origin": "random", "actions": found[1]})

    def _first(self, make, attempts: int) -> tuple[Any, list[int]] | None:
        """The first `make()` that is feasible (and unvisited when `unique`)."""
        for _ in range(attempts):
            arch, actions = make()
            if self.feasible(arch) and not (self.unique and arch in self.seen):
                return arch, actions
        return None

    # -- learning -----------------------------------------------------------------------------------------

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            self.seen.add(t.candidate.arch)
            if not t.record.ok or t.record.accuracy is None:
                continue
            reward = float(t.record.accuracy)
            self.ema[0] = self.momentum * self.ema[0] + (1 - self.momentum) * reward
            self.ema[1] = self.momentum * self.ema[1] + (1 - self.momentum)
            advantage = reward - self.ema[0] / self.ema[1]
            actions = t.candidate.info.get("actions") or self.space.to_indices(t.candidate.arch)
            grads = []
            for p, a in zip(self.probs(), actions):
                g = p.copy()        # d(-log p_a)/d(logits) = p - onehot(a), times the advantage
                g[a] -= 1.0
                grads.append(advantage * g)
            self.adam.step(self.logits, grads, self.m, self.v)

    # -- state --------------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "logits": [x.tolist() for x in self.logits],
                "adam": {"m": [x.tolist() for x in self.m], "v": [x.tolist() for x in self.v],
                         "step": self.adam.step_count},
                "baseline": list(self.ema)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            shapes = [len(d.choices) for d in self.decisions]
            rows = {k: [np.asarray(r, dtype=float) for r in rows]
                    for k, rows in (("logits", state["logits"]), ("m", state["adam"]["m"]),
                                    ("v", state["adam"]["v"]))}
            if any([len(r) for r in rr] != shapes for rr in rows.values()):
                raise ValueError(f"policy rows do not match the space's decisions {shapes}")
            step = int(state["adam"]["step"])
            ema = [float(x) for x in state["baseline"]]
            if len(ema) != 2:
                raise ValueError("baseline must be [numerator, denominator]")
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"strategy 'reinforce' state: malformed policy ({err})") from None
        self.logits, self.m, self.v = rows["logits"], rows["m"], rows["v"]
        self.adam.step_count, self.ema = step, ema

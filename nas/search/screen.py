"""Screening between strategy and evaluator: ask `screen.factor` times the batch,
score every candidate cheaply, evaluate only the best share. Evaluations are the
expensive part of a search; a scorer that ranks candidates better than chance turns
the same budget into better trials, whatever the strategy (LLM ones ask n x factor).

The screened-out candidates go to the history (`screened`, with their score) and are
told to the strategy like any trial without an accuracy, so its state stays that of a
run that asked them; they count in no budget and in no failure. The scorer is
refitted from the history at each batch with a seed drawn from (seed, history length):
no state of its own, so a resumed search screens exactly as the first one would have.

Scorers are registered in SCORERS: `predictor` here (NumPy, torch-free); a scorer
from elsewhere (e.g. zero-cost proxies) registers with `@SCORERS.register(name)` in
its own module, named in the registry's `modules` table so that it is imported
only when a config names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nas.core.arch import Architecture
from nas.core.registry import check_keys
from nas.core.scorer import SCORERS, Scorer  # here for their users (the base lives below nas.proxies)
from nas.core.space import CategoricalSpace, SearchSpace
from nas.core.trial import Candidate, EvalResult, SearchExhausted, Trial, TrialRecord, evaluated
from nas.errors import ConfigError
from nas.strategies.base import Strategy
from nas.strategies.predictor import EnsemblePredictor, PredictorSettings

MAX_FACTOR = 100


@dataclass(frozen=True)
class ScreenSettings:
    """`screen:` of the config. factor 1 is off (and leaves the run's identity as before)."""

    factor: int = 1  # candidates asked per evaluated one
    scorer: str = "predictor"
    min_history: int = 10  # successful trials before screening starts (a predictor needs data)
    params: dict[str, Any] = field(default_factory=dict)  # the scorer's own settings

    def __post_init__(self) -> None:
        for name, low, high in (("factor", 1, MAX_FACTOR), ("min_history", 0, None)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low \
                    or (high is not None and value > high):
                bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
                raise ConfigError(f"screen.{name} must be an integer {bound}, got {value!r}")
        if not isinstance(self.scorer, str):
            raise ConfigError(f"screen.scorer must be a scorer name, got {self.scorer!r}")
        if not isinstance(self.params, dict):
            raise ConfigError(f"screen.params must be a mapping of the scorer's settings, got {self.params!r}")

    @property
    def active(self) -> bool:
        return self.factor > 1

    @classmethod
    def from_config(cls, node: Any) -> ScreenSettings:
        if node is None:
            return cls()
        if not isinstance(node, dict):
            raise ConfigError(f"screen must be a mapping (factor, scorer, min_history, params), got {node!r}")
        check_keys("screen", node, ["factor", "min_history", "params", "scorer"])
        settings = cls(**{k: ({} if k == "params" and v is None else v) for k, v in node.items()})
        if settings.scorer not in SCORERS.names():  # stops here, before anything is built, screening on or off
            raise ConfigError(f"screen.scorer must be one of {', '.join(SCORERS.names())}, got {settings.scorer!r}")
        return settings

    def label(self) -> str:
        """How `nas compare` tells a screened run's strategy apart: '+screen(x4,predictor)'."""
        return f"+screen(x{self.factor},{self.scorer})" if self.active else ""


@SCORERS.register("predictor")
class PredictorScorer(Scorer):
    """Mean accuracy of an MLP ensemble (nas/strategies/predictor.py) fitted on the run's
    successful trials."""

    def __init__(self, space: SearchSpace, members: int = 5, hidden: int = 32, epochs: int = 300,
                 lr: float = 0.01) -> None:
        super().__init__(space)
        if not isinstance(space, CategoricalSpace):
            raise ConfigError(f"screen.scorer=predictor needs a categorical space (it reads decisions), "
                              f"not '{space.name}'")
        self.cat: CategoricalSpace = space
        self.settings = PredictorSettings(members=members, hidden=hidden, epochs=epochs, lr=lr)

    def score(self, archs: list[Architecture], history: list[TrialRecord], seed: int) -> list[float]:
        # the loop passes the history as told (`TrialRecord.as_told`): untrusted self-reported trials are unscored
        if sum(r.ok and r.accuracy is not None for r in history) < 2:  # nothing to learn from yet: keep the order
            return [0.0] * len(archs)
        predictor = EnsemblePredictor(self.settings).fit_on(self.cat, history, seed)
        mean, _ = predictor.predict_archs(self.cat, archs)
        return [float(m) for m in mean]


@dataclass
class Pick:
    """One asked candidate: its score (None when no scorer ran) and whether it is evaluated."""

    candidate: Candidate
    score: float | None
    kept: bool


class Screen:
    """`ask` in place of the strategy's; `trials` builds the told batch (kept and screened)."""

    def __init__(self, settings: ScreenSettings, space: SearchSpace, seed: int) -> None:
        self.settings = settings
        self.seed = seed
        self.scorer = SCORERS.create(settings.scorer, settings.params, space=space) if settings.active else None

    def ask(self, strategy: Strategy, n: int, history: list[TrialRecord]) -> list[Pick]:
        """`n` kept candidates, plus the screened-out ones once enough trials succeeded."""
        ok = sum(1 for r in evaluated(history) if r.ok)
        if self.scorer is None or ok < self.settings.min_history:
            return [Pick(c, None, True) for c in strategy.ask(n)]
        try:
            candidates = strategy.ask(n * self.settings.factor)
        except SearchExhausted:
            # too few new candidates left to over-generate: evaluate what can still be asked, unscreened;
            # the search ends only when not even `n` can
            return [Pick(c, None, True) for c in strategy.ask(n)]
        valid = [i for i, c in enumerate(candidates) if c.rejected is None]
        seed = int(np.random.SeedSequence([self.seed, len(history)]).generate_state(1)[0])
        values = self.scorer.score([candidates[i].arch for i in valid], history, seed)
        if len(values) != len(valid) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise ValueError(f"scorer '{self.settings.scorer}' returned {len(values)} scores for {len(valid)} "
                             "candidates, or a non-finite one")
        scores: list[float | None] = [None] * len(candidates)
        for i, v in zip(valid, values):
            scores[i] = round(float(v), 6)
        # best first, ties (and rejected drafts, last) in the order asked
        order = sorted(range(len(candidates)), key=lambda i: (scores[i] is None, -(scores[i] or 0.0), i))
        kept = set(order[:n])
        return [Pick(c, scores[i], i in kept) for i, c in enumerate(candidates)]

    @staticmethod
    def trials(picks: list[Pick], outcomes: list[tuple[EvalResult, bool, float]], start: int) -> list[Trial]:
        """The batch in the order asked, numbered from `start` (history lines): the kept
        with their outcomes, the screened-out as records without evaluation."""
        results = iter(outcomes)
        out = []
        for i, p in enumerate(picks):
            if p.kept:
                trial = Trial.of(start + i, p.candidate, *next(results))
            else:
                arch = p.candidate.arch
                trial = Trial(p.candidate, TrialRecord(
                    trial=start + i, key=arch.key(), encoding=arch.encode(), accuracy=None,
                    error=p.candidate.rejected, strategy=p.candidate.info, screened=True))
            trial.record.score = p.score
            out.append(trial)
        return out

"""Ask/tell strategy API (NNI-style): the search loop owns evaluation, so a
strategy never blocks on it and batches can be evaluated in parallel."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from nas.core.arch import Architecture, SeenIndex
from nas.core.constraint import Constraint
from nas.core.registry import Registry
from nas.core.space import OpenEndedSpace, SearchSpace
from nas.core.trial import Candidate, SearchExhausted, Trial, TrialRecord
from nas.errors import ConfigError, EncodingError, RunDirError

if TYPE_CHECKING:  # the LLM strategies import the client; the classic ones need not pay for it
    from nas.llm.client import Calls, LLMClient


class Strategy(ABC):
    name: str  # set by the registry
    random_moves: ClassVar[bool] = True  # uses space.sample/mutate (impossible in open-ended spaces)
    spaces: ClassVar[tuple[str, ...]] = ()  # the spaces it can search; empty: any
    asynchronous: ClassVar[bool] = False  # takes results one at a time, in completion order (budget.in_flight)
    client: LLMClient | None = None  # an LLM strategy's, made by `attach`

    def __init__(self, space: SearchSpace, seed: int) -> None:
        if self.spaces and space.name not in self.spaces:
            raise ConfigError(f"strategy '{self.name}' searches space={' or '.join(self.spaces)}, "
                              f"not '{space.name}': use space={self.spaces[0]}")
        if self.random_moves and space.open_ended:
            raise ConfigError(f"strategy '{self.name}' samples and mutates at random, but space '{space.name}' "
                              "is open-ended (its designs come from an LLM design strategy)")
        self.space = space
        self.rng = np.random.default_rng(seed)
        self.constraint = Constraint()

    def constrain(self, constraint: Constraint) -> None:
        """Hardware limits every proposal must meet (set by the spec before the search starts)."""
        if constraint.active:
            space = self.space
            constraint.validate(space, space.base if isinstance(space, OpenEndedSpace)
                                else space.sample(np.random.default_rng(0)))
        self.constraint = constraint

    def feasible(self, arch: Architecture) -> bool:
        return self.constraint.violation(self.space, arch) is None

    @classmethod
    def random_start(cls, params: dict[str, Any]) -> int:
        """How many first trials it draws at random whatever the results (an initial
        population); a budget no larger is random search under another name."""
        return 0

    @abstractmethod
    def ask(self, n: int) -> list[Candidate]:
        """Propose `n` candidates (fewer only by raising `SearchExhausted` when none)."""

    @abstractmethod
    def tell(self, trials: list[Trial]) -> None:
        """Receive evaluated candidates, in the order they were asked."""

    @property
    def llm_client(self) -> LLMClient:
        """The client `attach` made: an LLM strategy asks nothing before it."""
        if self.client is None:
            raise RuntimeError(f"{type(self).__name__}.attach(run_dir) must be called before ask()")
        return self.client

    def attach(self, run_dir: Path, llm_calls: Calls | None = None, progress: bool = True) -> None:
        """Called once before the loop: where LLM strategies keep their transcripts,
        and how their LLM calls run (`LLMClient(calls=...)`; Prefect tasks under runner=prefect);
        `progress`: the search's, so slow one-off work (seeding the idea store) says what it does."""

    def restore(self, history: list[TrialRecord]) -> None:
        """Called on resume after `load_state_dict`: rebuild what the history determines
        (e.g. the architectures already seen), so the state holds only what it cannot."""

    def reclaim(self, in_flight: list[Candidate]) -> None:
        """Called on an asynchronous resume after `restore`: candidates asked before the crash
        but never told, evaluated again now, so they must not be proposed again."""

    def report(self, history: list[TrialRecord]) -> dict[str, Any]:
        """Strategy-specific entries for summary.json (e.g. LLM usage, design metrics)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; restoring it makes the next `ask` identical."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.rng.bit_generator.state = state["rng"]
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"strategy '{self.name}' state: bad rng state ({err})") from None


class Deduplicating:
    """Unique candidates: every architecture proposed or told is in `seen`, which
    `restore` rebuilds from the history (plus `_pending()`: proposals made but not yet
    asked for) rather than the state storing it. Candidates that break the constraint
    are redrawn too (rejection sampling)."""

    space: SearchSpace
    seen: SeenIndex
    _broke: str | None = None  # the last `_fresh` that found nothing: a violation, if every draw broke the constraint

    def _init_seen(self) -> None:
        self.seen = SeenIndex()

    def _fresh(self, make, attempts: int) -> Architecture | None:
        """Call `make()` until it yields an unseen, feasible architecture; None if none
        (`_none_fresh` then says why)."""
        violations = []
        for _ in range(attempts):
            arch = make()
            why = None if arch in self.seen else self.constraint.violation(self.space, arch)  # type: ignore[attr-defined]
            if arch not in self.seen and why is None:
                return arch
            violations.append(why)
        self._broke = violations[-1] if violations and all(violations) else None
        return None

    def _none_fresh(self, who: str, attempts: int) -> SearchExhausted:
        """Why the last `_fresh` found nothing: every draw broke the constraint, or some were seen."""
        if self._broke is not None:
            return SearchExhausted(f"{who}: none of {attempts} sampled architectures meets the constraint "
                                   f"(e.g. {self._broke}); loosen constraint.flops/constraint.params")
        return SearchExhausted(f"{who}: no unvisited architecture in {attempts} samples")

    def _pending(self) -> list[Any]:
        """Encodings proposed (so seen) but not yet in the history, e.g. a queued generation."""
        return []

    def reclaim(self, in_flight: list[Candidate]) -> None:
        for cand in in_flight:
            self.seen.add(cand.arch)

    def restore(self, history: list[TrialRecord]) -> None:
        self._init_seen()
        told = [(f"trial {r.trial}", r.encoding) for r in history]
        for where, enc in told + [("a queued proposal", enc) for enc in self._pending()]:
            try:
                self.seen.add(self.space.decode(enc))
            except EncodingError as err:
                raise RunDirError(f"{where}: {err}") from None


STRATEGIES: Registry[Strategy] = Registry("strategy", "nasflow.strategies")


def random_only_note(name: str, params: dict[str, Any], trials: int) -> str | None:
    """Why `trials` never get past the strategy's random start (None if they do): said when
    the search starts and in `nas compare`, since such a run is random search in disguise."""
    if name not in STRATEGIES.names():  # a run of a strategy this version does not have
        return None
    start = STRATEGIES.get(name).random_start(params)
    if trials > start or start == 0:
        return None
    return (f"strategy '{name}': budget.trials={trials} <= population_size={start}, so every trial comes "
            f"from its random initial population: random search in disguise (raise budget.trials or lower "
            f"strategy.population_size)")

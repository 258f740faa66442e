"""What the LLM design strategies (NADER, FairNAD) share: an LLM client and
knowledge config attached to the run, the base design asked first (trial 0),
the verify-and-retry loop over a verifier chain, the index of designs already
proposed, and the report's LLM usage and design metrics. A subclass says how
it picks the next design and how it revises a draft the chain refused."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nas.core.arch import SeenIndex
from nas.core.constraint import Constraint
from nas.core.trial import Candidate, SearchExhausted, TrialRecord
from nas.design.metrics import design_metrics
from nas.design.verifiers import Chain, Outcome
from nas.knowledge.config import KnowledgeConfig
from nas.llm import LLMClient
from nas.llm.client import Calls
from nas.strategies.base import Strategy


@dataclass
class Try:
    """One draft for the verifier chain: what the writer replied (`text`, None when
    the LLM gave no usable reply, then `error` says why), labelled for the attempts log."""

    label: dict[str, Any]
    text: str | None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # logged after the chain's checks


# The next draft after a refused one: (last chain outcome or None, its error or the LLM's,
# the last text the chain checked or None) -> the next Try, or None when retries are spent.
Revise = Callable[[Outcome | None, str | None, str | None], Try | None]


def verify_and_retry(chain: Chain, first: Try, revise: Revise, attempts: list[dict[str, Any]], *,
                     retry_no_reply: bool) -> tuple[Outcome | None, str]:
    """Check drafts with `chain` until one passes, the failure cannot be retried
    (a duplicate), or `revise` has no more tries; every try is logged in `attempts`.
    Returns the last outcome (None if no draft was ever checked) and the last checked text."""
    outcome: Outcome | None = None
    last: str | None = None
    step: Try | None = first
    while step is not None:
        if step.text is None:
            attempts.append({**step.label, "error": step.error})
            if not retry_no_reply:
                break
            step = revise(outcome, step.error, last)
            continue
        last = step.text
        outcome = chain.run(last)
        attempts.append({**step.label, **outcome.to_dict(), **step.extra})
        failure = outcome.failure  # None: every check passed
        if failure is None or failure.retry is None:
            break
        step = revise(outcome, failure.error, last)
    return outcome, last or ""


class DesignStrategy(Strategy):
    """An LLM design strategy over an open-ended space: its moves are drafts the
    LLM writes and the verifier chain accepts, never random ones."""

    random_moves = False
    exhausted = "no design left to propose"  # SearchExhausted's message when `_next_design` has none

    def __init__(self, space, seed: int, llm: dict[str, Any] | None, knowledge: dict[str, Any] | None,
                 budget: dict[str, float] | None, input_size: int) -> None:
        super().__init__(space, seed)
        self.llm_settings, self.knowledge_settings = llm or {}, knowledge or {}
        # The evaluator's size limit (the config interpolates evaluator.budget), NB201's where it sets none.
        self.budget = Constraint.from_config(budget, "evaluator.budget").filled(Constraint.nb201(input_size))
        self.seen = SeenIndex()  # designs proposed so far, each with where it was seen (the Dedup message)
        self.client = None

    # -- wiring -------------------------------------------------------------------------------------------

    def attach(self, run_dir: Path, llm_calls: Calls | None = None, progress: bool = True) -> None:
        self.client = LLMClient(self.llm_settings, run_dir=run_dir, calls=llm_calls)
        self._open_knowledge(KnowledgeConfig.from_dict(self.knowledge_settings), progress)

    @abstractmethod
    def _open_knowledge(self, kcfg, progress: bool) -> None:
        """Open the stores the strategy reads (ideas, experiences, the attribute tree)."""

    # -- ask ----------------------------------------------------------------------------------------------

    def ask(self, n: int) -> list[Candidate]:
        if self.client is None:
            raise RuntimeError(f"{type(self).__name__}.attach(run_dir) must be called before ask()")
        out: list[Candidate] = []
        for _ in range(n):
            if self._root_pending():  # the base design is trial 0: what every design is measured against
                out.append(self._root())
                continue
            candidate = self._next_design()
            if candidate is None:
                if out:
                    break
                raise SearchExhausted(f"{self.name}: {self.exhausted}")
            out.append(candidate)
        return out

    @abstractmethod
    def _root_pending(self) -> bool:
        """The base design has not been asked yet."""

    @abstractmethod
    def _root(self) -> Candidate:
        """The base design as trial 0, recorded as seen."""

    @abstractmethod
    def _next_design(self) -> Candidate | None:
        """One designed (or rejected) candidate; None when nothing is left to modify."""

    def _tokens_since(self, before) -> int:
        used = self.llm_client.usage.total()
        return (used.prompt_tokens + used.completion_tokens) - (before.prompt_tokens + before.completion_tokens)

    # -- report -------------------------------------------------------------------------------------------

    def report(self, history: list[TrialRecord]) -> dict[str, Any]:
        out = {"design": design_metrics(history), **self._report(history)}
        if self.client is not None:
            out["llm"] = self.client.usage.to_dict()
        return out

    def _report(self, history: list[TrialRecord]) -> dict[str, Any]:
        """The strategy's own entries for summary.json (its tree, its models)."""
        return {}

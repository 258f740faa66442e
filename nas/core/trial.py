"""A trial's types, from `ask()` to report.md, in one torch-free module.

A trial takes three shapes: the `Candidate` a strategy proposes (an architecture and the
strategy's info); the `EvalResult` an evaluator turns it into; and the `TrialRecord`
history.jsonl holds (`Trial.of` joins the first two into it), which the loop appends,
strategies are told (`Trial`: the candidate and its record) and report/compare/export/
regression read back (`read_history`). `SearchExhausted` is how a strategy says it has no
candidate left. Nothing here imports above `nas.core` and the ground floor (`nas.errors`,
`nas.io`): reading a run's history must not load a framework, and strategies and the
search loop both import these types without importing each other.

`TrialRecord.to_json()` is exactly the line the loop has always written, so existing run
dirs resume and committed benchmark results reproduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from nas.core.arch import Architecture
from nas.errors import EncodingError, RunDirError
from nas.io import read_jsonl

# How a self-reported result is named wherever a person reads it (nas train, nas arch validate,
# report.md, nas export): the numbers are the model's own claim.
SELF_REPORTED = "self-reported by the model's own code, not verified"
# Why a strategy is told such a trial as unscored (`TrialRecord.as_told`).
UNSCORED = (f"{SELF_REPORTED} (it trained inside the sandbox): not scored, "
            "as evaluator.trust_self_reported is false")


class SearchExhausted(Exception):
    """The strategy cannot propose any new candidate (e.g. space enumerated)."""


@dataclass
class Candidate:
    arch: Architecture
    info: dict[str, Any] = field(default_factory=dict)  # strategy fields: origin, parent…
    rejected: str | None = None  # why a draft failed verification: recorded as a failed trial, never evaluated


class Draft(Architecture):
    """A design agent's text that did not verify: it has a key (so it is a
    trial in the history), but no representation to evaluate."""

    def __init__(self, text: str, space: str) -> None:
        self.text = text
        self.space = space  # type: ignore[misc]  # per draft (a class variable elsewhere): the space it was written for

    def canonical(self) -> str:
        return self.text

    def encode(self) -> str:
        return self.text

    @classmethod
    def decode(cls, data: Any) -> Draft:
        raise EncodingError("a rejected draft cannot be decoded into an architecture")


@dataclass
class EvalResult:
    """Outcome of one evaluation. `accuracy` (percent) is the objective;
    `error` is set, and `accuracy` is None, when the candidate failed."""

    accuracy: float | None
    metrics: dict[str, float] = field(default_factory=dict)
    params: int | None = None
    flops: int | None = None
    cost_seconds: float = 0.0
    error: str | None = None
    curve: list[float] = field(default_factory=list)  # training loss per epoch, for evaluators that train

    @property
    def ok(self) -> bool:
        return self.error is None and self.accuracy is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        return cls(**data)

    @classmethod
    def failure(cls, error: str, cost_seconds: float = 0.0) -> EvalResult:
        return cls(accuracy=None, error=error, cost_seconds=cost_seconds)


# What an executor returns per candidate: (result, served from the task cache, wall seconds).
Outcome = tuple[EvalResult, bool, float]


@dataclass
class TrialRecord:
    """One trial as history.jsonl holds it. `accuracy` (percent) is None, and `error` says why,
    when the trial failed; `strategy` is the candidate's info (origin, parent, …); `curve` the
    training loss per epoch, for evaluators that train (absent from the line when empty);
    `ask` only in asynchronous searches (absent otherwise, so batch lines stay as they were)."""

    trial: int
    key: str
    encoding: Any
    accuracy: float | None
    metrics: dict[str, Any] = field(default_factory=dict)
    params: float | None = None
    flops: float | None = None
    error: str | None = None
    cost_seconds: float = 0.0
    wall_seconds: float = 0.0
    cached: bool = False
    strategy: dict[str, Any] = field(default_factory=dict)
    curve: list[float] = field(default_factory=list)
    ask: int | None = None  # the ask index, asynchronous searches only (history is in completion order)
    screened: bool = False  # asked but screened out before evaluation: no trial of the budget, not a failure
    score: float | None = None  # the screening scorer's value (screen.factor > 1)

    @property
    def ok(self) -> bool:
        return self.error is None and self.accuracy is not None

    @property
    def self_reported(self) -> bool:
        """Numbers the candidate's own code reported (trained inside the sandbox), not measured by us."""
        return bool(self.metrics.get("self_reported"))

    def counts_for_best(self, trust: bool) -> bool:
        """The one rule for every "best" (summary, curves, progress, report, export, compare):
        a successful trial, and not self-reported unless the evaluator's config trusts that."""
        return self.accuracy is not None and (trust or not self.self_reported)

    def as_told(self, trust: bool) -> TrialRecord:
        """This record as strategies and predictors learn from it (`tell`, `restore`, screening):
        a success that does not count for best is told as a failed trial, without its numbers,
        so a forged score never ranks, never becomes a parent and never trains a predictor."""
        if self.accuracy is None or self.counts_for_best(trust):
            return self
        return replace(self, accuracy=None, params=None, flops=None, error=UNSCORED)

    def to_json(self) -> dict[str, Any]:
        return {
            "trial": self.trial, "key": self.key, "encoding": self.encoding, "accuracy": self.accuracy,
            "metrics": self.metrics, "params": self.params, "flops": self.flops, "error": self.error,
            "cost_seconds": self.cost_seconds, "wall_seconds": self.wall_seconds,
            "cached": self.cached, "strategy": self.strategy,
            **({"curve": self.curve} if self.curve else {}),
            **({"ask": self.ask} if self.ask is not None else {}),
            **({"screened": True} if self.screened else {}),
            **({"score": self.score} if self.score is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> TrialRecord:
        """Check every field (lines written by older versions may lack the optional ones);
        `where` (file:line) starts the one-line error."""
        if not isinstance(data, dict):
            raise RunDirError(f"{where}: not a JSON object")
        for name, (required, what, check) in _FIELDS.items():
            if name not in data:
                if required:
                    raise RunDirError(f"{where}: field '{name}' missing")
            elif not check(data[name]):
                raise RunDirError(f"{where}: field '{name}' must be {what}, got {_brief(data[name])}")
        if data["error"] is not None and data["accuracy"] is not None:
            # A failed trial has no accuracy: read as a success, it would rank in every "best".
            raise RunDirError(f"{where}: fields 'error' and 'accuracy' are both set; a failed trial has no accuracy")
        return cls(**{name: data[name] for name in _FIELDS if name in data})


@dataclass
class Trial:
    """A told candidate with the record its evaluation left in the history, so `tell`
    and `report` read the same fields."""

    candidate: Candidate
    record: TrialRecord

    @property
    def index(self) -> int:
        return self.record.trial

    @classmethod
    def of(cls, index: int, candidate: Candidate, result: EvalResult, cached: bool = False,
           wall_seconds: float = 0.0) -> Trial:
        """Trial `index`: `candidate` evaluated to `result` (`cached`: served by the task cache)."""
        arch, r = candidate.arch, result
        return cls(candidate, TrialRecord(
            trial=index, key=arch.key(), encoding=arch.encode(), accuracy=r.accuracy, metrics=r.metrics,
            params=r.params, flops=r.flops, error=r.error, cost_seconds=round(r.cost_seconds, 6),
            wall_seconds=round(wall_seconds, 6), cached=cached, strategy=candidate.info, curve=r.curve or []))


def read_history(path: Path, *, repair: bool = False) -> list[TrialRecord]:
    """A run's history.jsonl, each line checked and numbered by its position
    (`repair`: cut a torn last line from the file, as a crash leaves it)."""
    return [record_at(path, i, line) for i, line in enumerate(read_jsonl(path, repair=repair, numbered=True))]


def record_at(path: Path, index: int, line: Any) -> TrialRecord:
    """Line `index` (0-based) of `path`: a well-formed record of trial `index`."""
    where = f"{path}:{index + 1}"
    record = TrialRecord.from_json(line, where)
    if record.trial != index:
        raise RunDirError(f"{where}: field 'trial' is {record.trial} but line {index + 1} holds trial {index}")
    return record


def evaluated(history: list[TrialRecord]) -> list[TrialRecord]:
    """The trials of the budget: every record but the screened-out candidates."""
    return [r for r in history if not r.screened]


def best_record(history: list[TrialRecord], trust: bool) -> TrialRecord | None:
    """The first trial with the highest accuracy among those that count for best."""
    scored = [(r.accuracy, r) for r in history if r.accuracy is not None and r.counts_for_best(trust)]
    best = max(scored, key=lambda pair: pair[0], default=None)
    return None if best is None else best[1]


def best_so_far(history: list[TrialRecord], trust: bool = False) -> list[float | None]:
    """Best accuracy after each evaluated trial (None until the first that counts);
    screened-out candidates take no place on the curve."""
    out: list[float | None] = []
    best = None
    for rec in evaluated(history):
        acc = rec.accuracy
        if acc is not None and rec.counts_for_best(trust) and (best is None or acc > best):
            best = acc
        out.append(best)
    return out


def _number(v: Any) -> bool:
    return type(v) in (int, float)


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


# field → (required, what it must be, check), in the dataclass's order.
_FIELDS: dict[str, tuple[bool, str, Callable[[Any], bool]]] = {
    "trial": (True, "an integer", lambda v: type(v) is int),
    "key": (True, "a string", lambda v: isinstance(v, str)),
    "encoding": (True, "not null", lambda v: v is not None),
    "accuracy": (True, "null or a finite number", _optional(lambda v: _number(v) and math.isfinite(v))),
    "metrics": (True, "an object", lambda v: isinstance(v, dict)),
    "params": (True, "null or a number", _optional(_number)),
    "flops": (True, "null or a number", _optional(_number)),
    "error": (True, "null or a string", _optional(lambda v: isinstance(v, str))),
    "cost_seconds": (False, "a number", _number),
    "wall_seconds": (False, "a number", _number),
    "cached": (False, "true or false", lambda v: type(v) is bool),
    "strategy": (False, "an object", lambda v: isinstance(v, dict)),
    "curve": (False, "a list of numbers", lambda v: isinstance(v, list) and all(map(_number, v))),
    "ask": (False, "an integer", lambda v: type(v) is int),
    "screened": (False, "true or false", lambda v: type(v) is bool),
    "score": (False, "null or a finite number", _optional(lambda v: _number(v) and math.isfinite(v))),
}


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"

"""Verifiers between a design agent's draft and the evaluator, as a chain
(NNI's middleware): parse → execute → budget → structure → dedup. Each check
returns one LLM-readable line and says which retry loop can fix it — `fix`
(the Modifier's validator feedback, FairNAD's debugger), `downscale` (over
budget) — or none (a duplicate is skipped, not retried). The first failure
stops the chain; nothing is trained before every check passed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from nas.core.arch import Architecture
from nas.spaces.nader.dag.macro import BlockSet, Budget, Skeleton, search_width, section_errors
from nas.errors import EncodingError

FIX, DOWNSCALE = "fix", "downscale"


@dataclass
class Check:
    name: str
    ok: bool
    error: str | None = None
    retry: str | None = None           # FIX, DOWNSCALE or None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    arch: Architecture | None
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [asdict(c) for c in self.checks]}


@dataclass
class Draft:
    """What an agent wrote, and what the checks learn about it on the way."""

    text: str
    arch: Architecture | None = None
    facts: dict[str, Any] = field(default_factory=dict)


class Verifier(ABC):
    name: ClassVar[str]

    @abstractmethod
    def check(self, draft: Draft) -> Check: ...

    def passed(self, **detail: Any) -> Check:
        return Check(self.name, True, detail=detail)

    def failed(self, error: str, retry: str | None, **detail: Any) -> Check:
        return Check(self.name, False, error=" ".join(error.split()), retry=retry, detail=detail)


class Chain:
    def __init__(self, verifiers: list[Verifier]) -> None:
        self.verifiers = verifiers

    def run(self, text: str) -> Outcome:
        draft, checks = Draft(text), []
        for verifier in self.verifiers:
            check = verifier.check(draft)
            checks.append(check)
            if not check.ok:
                break
        return Outcome(draft.arch, checks)


class Dedup(Verifier):
    """A design already proposed (same canonical key) is skipped, never trained again."""

    name = "dedup"

    def __init__(self, seen: dict[str, str] | None = None) -> None:
        self.seen = seen if seen is not None else {}   # key -> where it was seen (e.g. "node 4")

    def check(self, draft: Draft) -> Check:
        key = draft.arch.key()
        if key in self.seen:
            return self.failed(f"duplicate of {self.seen[key]} (same canonical architecture)", None, key=key)
        return self.passed(key=key)


# -- NADER block files ------------------------------------------------------------------------------------

class ParseBlock(Verifier):
    """Structure, then shapes at every position of the skeleton (node-level
    errors for the Modifier); sections the draft lacks come from the parent."""

    name = "parse"

    def __init__(self, parent: BlockSet | None, skeleton: Skeleton) -> None:
        self.parent, self.skeleton = parent, skeleton

    def check(self, draft: Draft) -> Check:
        from nas.spaces.nader.arch import BlockArch

        try:
            blocks = BlockSet.from_text(draft.text, "block", self.parent)
        except EncodingError as err:
            return self.failed(str(err), FIX)
        errors = section_errors(blocks, self.skeleton)
        if errors:
            return self.failed(errors[0], FIX)
        draft.arch = BlockArch(blocks)
        return self.passed()


class BlockBudget(Verifier):
    """NADER's width search: the widest network of this block within the budget."""

    name = "budget"

    def __init__(self, skeleton: Skeleton, budget: Budget) -> None:
        self.skeleton, self.budget = skeleton, budget

    def check(self, draft: Draft) -> Check:
        try:
            choice = search_width(draft.arch.blocks, self.skeleton, self.budget)
        except EncodingError as err:
            return self.failed(str(err), FIX)
        if choice.width < 1:
            return self.failed(f"no width fits the budget ({self.budget.params / 1e6:g}M params, "
                               f"{self.budget.flops / 1e9:g} GFLOPs) even at width 1", FIX)
        draft.facts.update(width=choice.width, params=choice.params, flops=choice.flops)
        return self.passed(width=choice.width, params=choice.params, flops=choice.flops)


def block_chain(parent: BlockSet | None, skeleton: Skeleton, budget: Budget, seen: dict[str, str]) -> Chain:
    return Chain([ParseBlock(parent, skeleton), BlockBudget(skeleton, budget), Dedup(seen)])


# -- FairNAD model source ---------------------------------------------------------------------------------

class ParseSource(Verifier):
    name = "parse"

    def check(self, draft: Draft) -> Check:
        from nas.spaces.source.arch import SourceArch

        arch = SourceArch(draft.text)
        try:
            arch.key()
        except EncodingError as err:
            return self.failed(str(err), FIX)
        draft.arch = arch
        return self.passed()


class Execute(Verifier):
    """Build, run forward and backward in the sandbox; measure params, FLOPs and
    what changed against the parent (the code runs only in the child)."""

    name = "execute"

    def __init__(self, parent_source: str | None, num_classes: int, input_size: int, limits=None) -> None:
        from nas.sandbox.limits import Limits

        self.parent_source = parent_source
        self.num_classes = num_classes
        self.input_shape = (2, 3, input_size, input_size)
        self.limits = limits or Limits()

    def check(self, draft: Draft) -> Check:
        from nas.sandbox import verify_model_source

        verdict = verify_model_source(draft.text, num_classes=self.num_classes, input_shape=self.input_shape,
                                      parent_source=self.parent_source, limits=self.limits)
        draft.facts["verdict"] = verdict
        if not verdict.ok:
            return self.failed(f"{verdict.stage}: {verdict.error}", FIX, stage=verdict.stage,
                               traceback=verdict.traceback)
        return self.passed(params=verdict.params, flops=verdict.flops, layers=verdict.layers,
                           changed_layers=verdict.changed_layers)


class SourceBudget(Verifier):
    name = "budget"

    def __init__(self, budget: Budget) -> None:
        self.budget = budget

    def check(self, draft: Draft) -> Check:
        v = draft.facts["verdict"]
        over = [f"{what} {have / scale:.3g}{unit} > {limit / scale:g}{unit}"
                for what, have, limit, scale, unit in (("params", v.params, self.budget.params, 1e6, "M"),
                                                       ("FLOPs", v.flops, self.budget.flops, 1e9, "G"))
                if have > limit]
        if over:
            return self.failed("over budget: " + ", ".join(over) + "; make the model smaller", DOWNSCALE,
                               params=v.params, flops=v.flops)
        return self.passed(params=v.params, flops=v.flops)


class Structure(Verifier):
    """FairNAD's structural check: a child must differ from its parent, and a
    single-layer network is not a design."""

    name = "structure"

    def check(self, draft: Draft) -> Check:
        v = draft.facts["verdict"]
        if v.changed is False:
            return self.failed("no layer differs from the parent model; apply the idea to the architecture", FIX)
        if (v.layers or 0) <= 1:
            return self.failed(f"the network has {v.layers or 0} layer(s) with parameters; "
                               "a single-layer network is not a design", None, layers=v.layers)
        return self.passed(changed_layers=v.changed_layers, layers=v.layers)


def source_chain(parent_source: str | None, budget: Budget, seen: dict[str, str], *, num_classes: int = 10,
                 input_size: int = 32, limits=None, structure: bool = True) -> Chain:
    """`structure=False`: FairNAD's ablation without the structural verifier."""
    checks = [ParseSource(), Execute(parent_source, num_classes, input_size, limits), SourceBudget(budget)]
    return Chain(checks + ([Structure()] if structure else []) + [Dedup(seen)])

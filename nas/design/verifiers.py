"""Verifiers between a design agent's draft and the evaluator, as a chain
(NNI's middleware): parse → execute → budget → structure → dedup (NADER adds
keeps-parent after parse and unchanged before dedup). Each check
returns one LLM-readable line and says which retry loop can fix it — `fix`
(the Modifier's validator feedback, FairNAD's debugger), `downscale` (over
budget) — or none (a duplicate is skipped, not retried). The first failure
stops the chain; nothing is trained before every check passed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from nas.core.arch import Architecture, SeenIndex
from nas.core.constraint import Constraint
from nas.design.verdicts import verdict_key
from nas.errors import EncodingError
from nas.sandbox import verify_model_source
from nas.sandbox.limits import Limits
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.macro import BlockSet, Skeleton, search_width, section_errors
from nas.spaces.nader.dag.parse import Block
from nas.spaces.nader.dag.validate import without_dead_nodes, without_repeated_edges
from nas.spaces.source.arch import SourceArch

if TYPE_CHECKING:
    from nas.design.verdicts import VerdictCache

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

    @property
    def decoded(self) -> Architecture:
        """`arch`, for the checks after the parse check (it sets `arch`; the chain stops if it fails)."""
        if self.arch is None:
            raise RuntimeError("a verifier read the draft's architecture before the parse check set it")
        return self.arch

    @property
    def blocks(self) -> BlockSet:
        """A NADER draft's block files (its parse check decodes it to a BlockArch)."""
        arch = self.decoded
        if not isinstance(arch, BlockArch):
            raise RuntimeError(f"a block verifier got a {type(arch).__name__} draft")
        return arch.blocks


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

    def __init__(self, seen: SeenIndex) -> None:
        self.seen = seen  # the strategy's index, read when a draft is checked

    def check(self, draft: Draft) -> Check:
        key = draft.decoded.key()
        if key in self.seen:
            return self.failed(f"duplicate of {self.seen.where(key)} (same canonical architecture)", None, key=key)
        return self.passed(key=key)


# -- NADER block files ------------------------------------------------------------------------------------

class ParseBlock(Verifier):
    """Structure, then shapes at every position of the skeleton (node-level
    errors for the Modifier); sections the draft lacks come from the parent.
    First an edge listed twice counts once and operations whose results reach
    no output are dropped (neither changes what an accepted block computes);
    the check's detail lists both by section (`repeated`, `dropped`)."""

    name = "parse"

    def __init__(self, parent: BlockSet | None, skeleton: Skeleton) -> None:
        self.parent, self.skeleton = parent, skeleton

    def check(self, draft: Draft) -> Check:
        try:
            blocks = BlockSet.from_text(draft.text, "block", self.parent)
        except EncodingError as err:
            return self.failed(str(err), FIX)
        cleaned: dict[str, Block] = {}
        detail: dict[str, dict[str, list[str]]] = {}  # "repeated" / "dropped" -> role -> edges / nodes
        for role, block in blocks.sections().items():
            block, repeated = without_repeated_edges(block)
            cleaned[role], dead = without_dead_nodes(block)
            for name, found in (("repeated", repeated), ("dropped", dead)):
                if found:
                    detail.setdefault(name, {})[role] = found
        blocks = replace(blocks, **cleaned)
        errors = section_errors(blocks, self.skeleton)
        if errors:
            return self.failed(errors[0], FIX, **detail)
        draft.arch = BlockArch(blocks)
        return self.passed(**detail)


class BlockBudget(Verifier):
    """NADER's width search: the widest network of this block within the budget."""

    name = "budget"

    def __init__(self, skeleton: Skeleton, budget: Constraint) -> None:
        self.skeleton, self.budget = skeleton, budget

    def check(self, draft: Draft) -> Check:
        try:
            choice = search_width(draft.blocks, self.skeleton, self.budget)
        except EncodingError as err:
            return self.failed(str(err), FIX)
        if choice.width < 1:
            params, flops = budget_limits(self.budget)
            return self.failed(f"no width fits the budget ({params / 1e6:g}M params, "
                               f"{flops / 1e9:g} GFLOPs) even at width 1", FIX)
        draft.facts.update(width=choice.width, params=choice.params, flops=choice.flops)
        return self.passed(width=choice.width, params=choice.params, flops=choice.flops)


def block_chain(parent: BlockSet | None, skeleton: Skeleton, budget: Constraint, seen: SeenIndex) -> Chain:
    return Chain([ParseBlock(parent, skeleton), BlockBudget(skeleton, budget), Dedup(seen)])


class KeepsParent(Verifier):
    """A design must be a modification of its parent, not a rewrite: every section it changes keeps
    at least half of the parent section's operations (`MIN_KEPT`) and at least one of their kinds.
    NADER's ideas are edits (swap a kernel, add a gate or a branch); a weak Modifier instead collapses
    the block to a convolution or two, which passes every shape check yet ignores parent and idea.
    The error goes back to the Modifier (FIX) like a verifier failure."""

    name = "keeps_parent"
    MIN_KEPT = 0.5

    def __init__(self, parent: BlockSet) -> None:
        self.parent = parent

    def check(self, draft: Draft) -> Check:
        for role, block in draft.blocks.sections().items():
            before = getattr(self.parent, role)
            if block == before:
                continue
            old, new = _ops(before), _ops(block)
            lost_kinds = not set(old) & set(new)
            if len(new) < max(1, int(len(old) * self.MIN_KEPT)) or (old and lost_kinds):
                return self.failed(
                    f"dropped the parent's structure: {role} block '{block.name}' has {len(new)} operation(s) "
                    f"({_kinds(new)}), the parent's {len(old)} ({_kinds(old)}); keep the parent's operations "
                    f"and apply the idea as a change to them", FIX, role=role, ops=len(new), parent_ops=len(old))
        return self.passed()


class Changed(Verifier):
    """The parent block given back unchanged: retried (FIX) with that as the error, unlike a
    duplicate of another node, which is skipped."""

    name = "unchanged"

    def __init__(self, parent_key: str, parent_id: int) -> None:
        self.parent_key, self.parent_id = parent_key, parent_id

    def check(self, draft: Draft) -> Check:
        if draft.decoded.key() == self.parent_key:
            return self.failed(f"duplicate of the parent (node {self.parent_id}): the block is unchanged; "
                               f"apply the idea", FIX)
        return self.passed()


def budget_limits(budget: Constraint) -> tuple[float, float]:
    """(params, flops): a design strategy's budget has both (`Constraint.filled` with NB201's)."""
    if budget.params is None or budget.flops is None:
        raise RuntimeError(f"a design budget leaves a limit open: {budget}")
    return budget.params, budget.flops


def _ops(block) -> list[str]:
    return [n.op for n in block.nodes.values() if not n.is_io]


def _kinds(ops: list[str]) -> str:
    return ", ".join(dict.fromkeys(ops)) or "none"


# -- FairNAD model source ---------------------------------------------------------------------------------

class ParseSource(Verifier):
    name = "parse"

    def check(self, draft: Draft) -> Check:
        arch = SourceArch(draft.text)
        try:
            arch.key()
        except EncodingError as err:
            return self.failed(str(err), FIX)
        draft.arch = arch
        return self.passed()


class Execute(Verifier):
    """Build, run forward and backward in the sandbox; measure params, FLOPs and
    what changed against the parent (the code runs only in the child). With a
    `cache` (`nas.design.verdicts`), a file checked before is not run again."""

    name = "execute"

    def __init__(self, parent_source: str | None, num_classes: int, input_size: int, limits=None,
                 cache: VerdictCache | None = None) -> None:
        self.parent_source = parent_source
        self.num_classes = num_classes
        self.input_shape = (2, 3, input_size, input_size)
        self.limits = limits or Limits()
        self.cache = cache

    def check(self, draft: Draft) -> Check:
        def check():
            return verify_model_source(draft.text, num_classes=self.num_classes, input_shape=self.input_shape,
                                       parent_source=self.parent_source, limits=self.limits)

        if self.cache is None:
            verdict, cached = check(), False
        else:
            key = verdict_key(draft.text, self.parent_source, self.num_classes, self.input_shape, self.limits)
            verdict, cached = self.cache.verdict(key, check)
        draft.facts["verdict"] = verdict
        if isinstance(draft.arch, SourceArch):  # what it trains must be the graph this verdict measured
            draft.arch.checked = verdict.graph
        if not verdict.ok:
            return self.failed(verdict.error or verdict.stage, FIX, stage=verdict.stage,  # the error names its stage
                               traceback=verdict.traceback, cached=cached)
        return self.passed(params=verdict.params, flops=verdict.flops, layers=verdict.layers,
                           changed_layers=verdict.changed_layers, cached=cached)


class SourceBudget(Verifier):
    name = "budget"

    def __init__(self, budget: Constraint) -> None:
        self.budget = budget

    def check(self, draft: Draft) -> Check:
        v = draft.facts["verdict"]
        params, flops = budget_limits(self.budget)
        over = [f"{what} {have / scale:.3g}{unit} > {limit / scale:g}{unit}"
                for what, have, limit, scale, unit in (("params", v.params, params, 1e6, "M"),
                                                       ("FLOPs", v.flops, flops, 1e9, "G"))
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


def source_chain(parent_source: str | None, budget: Constraint, seen: SeenIndex, *, num_classes: int = 10,
                 input_size: int = 32, limits=None, structure: bool = True,
                 cache: VerdictCache | None = None) -> Chain:
    """`structure=False`: FairNAD's ablation without the structural verifier; `cache`: the
    `VerdictCache` the execute check reads and fills."""
    checks = [ParseSource(), Execute(parent_source, num_classes, input_size, limits, cache), SourceBudget(budget)]
    return Chain(checks + ([Structure()] if structure else []) + [Dedup(seen)])

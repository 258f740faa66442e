"""FairNAD (its Algorithms 1-2) as an ask/tell strategy over model source files.

The base model is trained first; `init` children mutate it with fairly
sampled ideas; then generations repeat three stages, each one switchable:
I. fair mutation — top-k parents, ideas sampled uniformly over the attribute
tree's main categories (or sub-categories, or ideas: the paper's ablation),
the idea's granularity picking the mutation target; II. Pareto-aware mutation —
NSGA-II parents over (accuracy, params, FLOPs), an upscaling idea while a
budget is under 0.9 τ, a hyper-parameter idea otherwise; III. LLM iterative
mutation — top-k parents refined for d steps, the improved or degraded prompt
by whether the last mutation helped. Every child goes through the feedback
loop: the verifier chain, with debug retries after parse/execution errors and
downscale retries over budget; a child that never passes is a failed trial
with its reason and is not trained.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nas.agents.fairnad.agents import (
    DOWNSCALE_ONCE,
    DOWNSCALE_SHRINK,
    HYPER_IDEAS,
    TARGETS,
    UPSCALE_IDEAS,
    debug,
    downscale,
    iterate,
    mutate,
    off_multiple,
)
from nas.core.arch import SeenIndex
from nas.core.registry import check_keys
from nas.core.space import SearchSpace
from nas.core.trial import Candidate, Draft, SearchExhausted, Trial, TrialRecord
from nas.design.base import DesignStrategy, Try, verify_and_retry
from nas.design.metrics import design_metrics
from nas.design.verdicts import VerdictCache
from nas.design.verifiers import Outcome, budget_limits, source_chain
from nas.errors import ConfigError, RunDirError
from nas.home import home
from nas.sandbox.limits import Limits
from nas.search.pareto import FAIRNAD_OBJECTIVES, nsga2_select, underused
from nas.spaces.nader.dag.macro import WIDTH_MULTIPLE
from nas.spaces.source.arch import SourceArch
from nas.strategies.base import STRATEGIES

STAGES = ("fair", "pareto", "iterative")
SAMPLING = ("main", "sub", "idea")
OVERSIZE = 1.5  # over 1.5 τ the new module is used once, otherwise depth/width shrink (FairNAD F.2.5)


@dataclass
class Model:
    """A verified child (or the base): what later stages pick parents from."""

    id: int
    parent: int | None
    source: str
    stage: str
    idea: str
    status: str = "pending"          # pending | evaluated | failed
    accuracy: float | None = None
    params: float | None = None
    flops: float | None = None

    @property
    def score(self) -> float:
        """An evaluated model's accuracy (`tell` sets both; only evaluated models are ranked)."""
        if self.accuracy is None:
            raise ValueError(f"fairnad: model {self.id} is {self.status}, it has no accuracy")
        return self.accuracy

    @property
    def size(self) -> tuple[float, float]:
        """(params, FLOPs) of a measured model (Pareto parents are)."""
        if self.params is None or self.flops is None:
            raise ValueError(f"fairnad: model {self.id} has no measured params/FLOPs")
        return self.params, self.flops


@dataclass
class Job:
    """One child to design: the stage, the parent, and (stage III) the chain step."""

    stage: str
    parent: int
    idea: str = ""
    tag: dict[str, str] | None = None
    step: int = 0
    chain: int | None = None


@dataclass
class PoolIdea:
    text: str
    granularity: str = "block"
    main: str = ""
    sub: str = ""


@STRATEGIES.register("fairnad")
class FairNADStrategy(DesignStrategy):
    spaces = ("source",)
    exhausted = "no evaluated model to mutate (the base model failed)"

    def __init__(self, space: SearchSpace, seed: int, llm: dict[str, Any] | None = None,
                 knowledge: dict[str, Any] | None = None, init: int = 8, stages: dict[str, bool] | None = None,
                 fair_parents: int = 8, pareto_parents: int = 8, iterative_parents: int = 4,
                 iterative_steps: int = 2, sampling: str = "main", use_knowledge: bool = True,
                 max_debug: int = 2, max_downscale: int = 4, structure: bool = True, underused: float = 0.9,
                 input_size: int = 32, num_classes: int = 10, budget: dict[str, float] | None = None,
                 sandbox: dict[str, Any] | None = None, width_multiple: int = WIDTH_MULTIPLE,
                 check_cache: bool = True) -> None:
        super().__init__(space, seed, llm, knowledge, budget, input_size)
        stages = {s: True for s in STAGES} | dict(stages or {})
        check_keys("strategy.stages", stages, STAGES, what="stage")
        if sampling not in SAMPLING:
            raise ConfigError(f"strategy.sampling must be one of {', '.join(SAMPLING)}, got {sampling!r}")
        counts = {"init": init, "fair_parents": fair_parents, "pareto_parents": pareto_parents,
                  "iterative_parents": iterative_parents, "iterative_steps": iterative_steps}
        bad = [f"{k}={v}" for k, v in counts.items() if not (isinstance(v, int) and v >= 0)]
        bad += [f"{k}={v}" for k, v in (("max_debug", max_debug), ("max_downscale", max_downscale))
                if not (isinstance(v, int) and v >= 0)]
        if bad:
            raise ConfigError(f"strategy 'fairnad': counts must be integers >= 0 ({', '.join(bad)})")
        self.stage_order = [s for s in STAGES if stages[s]]
        if not self.stage_order:
            raise ConfigError("strategy 'fairnad': every stage is switched off (strategy.stages)")
        if type(width_multiple) is not int or width_multiple < 1:
            raise ConfigError(f"strategy.width_multiple must be an integer >= 1, got {width_multiple!r}")
        self.width_multiple = width_multiple
        if not 0 < underused <= 1:
            raise ConfigError(f"strategy.underused must be in (0, 1], got {underused}")
        self.counts, self.sampling, self.use_knowledge = counts, sampling, use_knowledge
        self.max_debug, self.max_downscale, self.structure = max_debug, max_downscale, structure
        self.underused_ratio = underused
        self.input_size, self.num_classes = input_size, num_classes
        self.sandbox = dict(sandbox or {})
        self.check_cache = check_cache
        self.models: list[Model] = []
        self.queue: list[Job] = []
        self.next_stage = "init"      # the stage planned when the queue runs dry
        self.generation = 0
        self.pool: list[PoolIdea] = []
        self.attributes = ""

    # -- wiring -------------------------------------------------------------------------------------------

    def _open_knowledge(self, kcfg, progress: bool) -> None:
        tree = kcfg.load_tree()
        self.attributes = "\n".join(tree.render(t) for t in tree.targets)
        self.pool = self._idea_pool(kcfg, tree, progress)

    def _idea_pool(self, kcfg, tree, progress: bool) -> list[PoolIdea]:
        """Ideas from the knowledge store; with knowledge off, the attribute tree's leaves themselves."""
        if not self.use_knowledge:
            return [PoolIdea(tree.describe(t), t.granularity, t.main, t.sub) for t in tree.tags()]
        ideas = [PoolIdea(i.text, i.tag.granularity, i.tag.main, i.tag.sub) if i.tag else PoolIdea(i.text)
                 for i in kcfg.open_ideas(progress=progress).ideas()]
        return sorted(ideas, key=lambda i: i.text)  # the store's scroll order is not ours to rely on

    # -- ask ----------------------------------------------------------------------------------------------

    def _root_pending(self) -> bool:
        return not self.models

    def _root(self) -> Candidate:
        base = self.space.base  # type: ignore[attr-defined]
        self.models.append(Model(0, None, base.source, "root", "base model"))
        self.seen.add_key(base.key(), _label(self.models[0]))
        return Candidate(base, {"stage": "root", "node": 0})

    def _next_design(self) -> Candidate | None:
        job = self._next_job()
        return None if job is None else self._design(job)

    def _next_job(self) -> Job | None:
        if not self.queue:
            self._plan()
        return self.queue.pop(0) if self.queue else None

    def _plan(self) -> None:
        """Queue the next stage's jobs: `init` once, then I → II → III per generation."""
        ranked = self._ranked()
        if not ranked:
            return
        if self.next_stage == "init":
            self.queue = [self._fair_job("init", 0) for _ in range(self.counts["init"])]
            self.next_stage = self.stage_order[0]
            if self.queue:
                return
        for _ in range(len(self.stage_order)):   # a stage with 0 parents is skipped
            stage = self.next_stage
            i = self.stage_order.index(stage)
            self.next_stage = self.stage_order[(i + 1) % len(self.stage_order)]
            if i == 0:
                self.generation += 1
            if stage == "fair":
                self.queue = [self._fair_job("fair", p) for p in _cycle(ranked, self.counts["fair_parents"])]
            elif stage == "pareto":
                self.queue = [self._pareto_job(p) for p in self._pareto_parents(self.counts["pareto_parents"])]
            else:
                parents = _cycle(ranked, self.counts["iterative_parents"]) if self.counts["iterative_steps"] else []
                self.queue = [Job("iterative", p, step=1, chain=p) for p in parents]
            if self.queue:
                return

    def _ranked(self) -> list[int]:
        """Evaluated models, best accuracy first (top-k parent selection)."""
        done = [m for m in self.models if m.status == "evaluated"]
        return [m.id for m in sorted(done, key=lambda m: (-m.score, m.id))]

    def _pareto_parents(self, k: int) -> list[int]:
        done = [m for m in self.models if m.status == "evaluated" and m.params is not None and m.flops is not None]
        if not done or k == 0:
            return []
        points = [[m.score, *m.size] for m in done]
        picked = nsga2_select(points, [o.maximize for o in FAIRNAD_OBJECTIVES], min(k, len(done)))
        return _cycle([done[i].id for i in picked], k)

    def _fair_job(self, stage: str, parent: int) -> Job:
        idea = self._sample_idea()
        return Job(stage, parent, idea.text, {"granularity": idea.granularity, "main": idea.main, "sub": idea.sub})

    def _sample_idea(self) -> PoolIdea:
        """Fair sampling: a main category (or leaf) uniformly, then an idea in it."""
        if not self.pool:
            raise SearchExhausted("fairnad: the idea pool is empty")
        if self.sampling == "idea" or not any(i.main for i in self.pool):
            return self.pool[int(self.rng.integers(len(self.pool)))]
        group = (lambda i: i.main) if self.sampling == "main" else (lambda i: (i.main, i.sub))
        groups: dict[Any, list[PoolIdea]] = {}
        for idea in self.pool:
            if idea.main:
                groups.setdefault(group(idea), []).append(idea)
        keys = sorted(groups, key=str)
        members = groups[keys[int(self.rng.integers(len(keys)))]]
        return members[int(self.rng.integers(len(members)))]

    def _pareto_job(self, parent: int) -> Job:
        m = self.models[parent]
        small = underused(*m.size, *budget_limits(self.budget), self.underused_ratio)
        ideas = UPSCALE_IDEAS if small else HYPER_IDEAS
        return Job("pareto", parent, ideas[int(self.rng.integers(len(ideas)))],
                   {"refinement": "upscale" if small else "hyper-parameter"})

    # -- one child: mutation, then the feedback loop ------------------------------------------------------

    def _request(self, job: Job) -> tuple[str, str]:
        """The mutation request and its target (FairNAD's templates by granularity)."""

        if job.stage == "pareto":
            return job.idea, "refinement"
        if (job.tag or {}).get("granularity") == "network":
            target = "network"
        else:
            target = ("new", "modify")[int(self.rng.integers(2))]
        return TARGETS[target].format(idea=" ".join(job.idea.split())), target

    def _design(self, job: Job) -> Candidate:
        parent = self.models[job.parent]
        before = self.llm_client.usage.total()
        info: dict[str, Any] = {"stage": job.stage, "generation": self.generation, "parent": parent.id}
        if job.stage == "iterative":
            info.update(step=job.step, chain=job.chain, chain_from=job.parent)
        grand = self.models[parent.parent] if parent.parent is not None else None
        if job.stage == "iterative" and grand is not None:
            iterated = iterate(self.llm_client, grand.source, parent.source, parent.idea, grand.accuracy,
                               parent.accuracy, self.attributes)
            improved = grand.accuracy is not None and parent.accuracy is not None and parent.accuracy > grand.accuracy
            info["variant"] = "improved" if improved else "degraded"
            design, errors = iterated.value, iterated.errors
            request = design.idea if design is not None and design.idea else (
                f"refine the model after the mutation '{parent.idea}'")
            code = design.source if design is not None else None
            # The degraded variant rewrites the grand-parent: it is the child's parent then.
            base = parent if improved else grand
            idea, target = request, "iterative"
        else:
            if job.stage == "iterative" and not job.idea:  # the base has no mutation to learn from
                fresh = self._fair_job("iterative", job.parent)
                job = Job("iterative", job.parent, fresh.idea, fresh.tag, job.step, job.chain)
            request, target = self._request(job)
            mutated = mutate(self.llm_client, parent.source, request)
            code, errors = mutated.value, mutated.errors
            base, idea = parent, job.idea
        info.update(parent=base.id, idea=idea, target=target, request=request, tag=job.tag)
        attempts: list[dict[str, Any]] = []
        first = Try({"action": "mutate"}, code, None if code is not None else
                    errors[-1] if errors else "no reply")
        outcome, code = self._feedback(first, base, request, attempts)
        info.update(attempts=attempts, valid=outcome is not None and outcome.ok,
                    debug_retries=sum(a["action"] == "debug" for a in attempts),
                    downscale_retries=sum(a["action"] == "downscale" for a in attempts),
                    tokens=self._tokens_since(before))
        arch = outcome.arch if outcome is not None and outcome.ok else None  # a passing chain decoded it
        if outcome is not None and arch is not None:
            measured = _measured(outcome)
            model = Model(len(self.models), base.id, code, job.stage, idea, params=measured[0], flops=measured[1])
            self.models.append(model)
            self.seen.add_key(arch.key(), _label(model))
            return Candidate(arch, {**info, "node": model.id})
        failure = outcome.failure if outcome is not None else None
        reason = (f"{failure.name}: {failure.error}" if failure is not None
                  else f"mutate: {attempts[-1]['error']}")
        if failure is not None and failure.name == "dedup":
            info["duplicate"] = True
        return Candidate(Draft(code or f"(no model) {request}", "source"), info, rejected=reason)

    def _feedback(self, first: Try, parent: Model, request: str,
                  attempts: list[dict[str, Any]]) -> tuple[Outcome | None, str]:
        """Algorithm 1's loop: check; debug after parse/execution errors (≤ max_debug),
        downscale over budget (≤ max_downscale); anything else ends the loop."""

        chain = source_chain(parent.source, self.budget, self.seen, num_classes=self.num_classes,
                             input_size=self.input_size, limits=Limits(**self.sandbox),
                             structure=self.structure,
                             cache=VerdictCache(home() / "checks") if self.check_cache else None)
        debugs = downs = 0

        def revise(outcome: Outcome | None, error: str | None, code: str | None) -> Try | None:
            nonlocal debugs, downs
            failure = outcome.failure if outcome is not None else None
            if failure is None or failure.error is None or code is None:  # no draft checked (no reply): no retry
                return None
            if failure.name in ("parse", "execute") and debugs < self.max_debug:
                answer = debug(self.llm_client, code, parent.source, request, failure.error,
                               failure.detail.get("traceback"), attempt=debugs)
                action, debugs = "debug", debugs + 1
            elif failure.retry == "downscale" and downs < self.max_downscale:
                d = failure.detail
                max_params, max_flops = budget_limits(self.budget)
                oversize = d["params"] > OVERSIZE * max_params or d["flops"] > OVERSIZE * max_flops
                how = DOWNSCALE_ONCE if oversize else DOWNSCALE_SHRINK[int(self.rng.integers(len(DOWNSCALE_SHRINK)))]
                answer = downscale(self.llm_client, code, parent.source, request, failure.error.split(": ", 1)[-1],
                                   how, attempt=downs, multiple=self.width_multiple)
                action, downs = "downscale", downs + 1
            else:
                return None
            if answer.value is None:
                return Try({"action": action}, None, answer.errors[-1] if answer.errors else "no reply")
            off = off_multiple(answer.value, self.width_multiple) if action == "downscale" else []
            # the prompt's width rule, not kept
            return Try({"action": action}, answer.value, extra={"off_multiple": off[:8]} if off else {})

        return verify_and_retry(chain, first, revise, attempts, retry_no_reply=False)

    # -- tell ---------------------------------------------------------------------------------------------

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            info = t.candidate.info
            node = info.get("node")
            if node is not None and self.models[node].status == "pending":
                m = self.models[node]
                if t.record.ok and t.record.accuracy is not None:
                    m.status, m.accuracy = "evaluated", float(t.record.accuracy)
                    m.params = t.record.params if t.record.params is not None else m.params
                    m.flops = t.record.flops if t.record.flops is not None else m.flops
                else:
                    m.status = "failed"
            if info.get("stage") == "iterative" and info["step"] < self.counts["iterative_steps"]:
                # The chain goes on from the new model, or retries from the same parent.
                parent = info["chain_from"] if node is None or self.models[node].status != "evaluated" else node
                self.queue.append(Job("iterative", parent, step=info["step"] + 1, chain=info["chain"]))

    # -- state and report ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "models": [asdict(m) for m in self.models],
                "queue": [asdict(j) for j in self.queue], "next_stage": self.next_stage,
                "generation": self.generation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            self.models = [Model(**m) for m in state["models"]]
            self.queue = [Job(**j) for j in state["queue"]]
            self.next_stage = str(state["next_stage"])
            self.generation = int(state["generation"])
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"strategy 'fairnad' state: {err}") from None
        self.seen = SeenIndex()  # every verified model is a design seen
        for m in self.models:
            self.seen.add_key(SourceArch(m.source).key(), _label(m))

    def _report(self, history: list[TrialRecord]) -> dict[str, Any]:
        by_stage: dict[str, list[TrialRecord]] = {}
        for r in history:
            by_stage.setdefault(r.strategy.get("stage", "?"), []).append(r)
        stages = {s: design_metrics(rs, history) for s, rs in by_stage.items() if s != "root"}
        return {"stages": stages,
                "models": [{k: v for k, v in asdict(m).items() if k != "source"} for m in self.models]}


def _label(model: Model) -> str:
    """Where a duplicate was seen, in the Dedup verifier's message."""
    return "model 0 (the base)" if model.id == 0 else f"model {model.id}"


def _measured(outcome) -> tuple[float | None, float | None]:
    """Params and FLOPs the sandbox measured for a verified child."""
    budget = next((c for c in outcome.checks if c.name == "budget"), None)
    return (budget.detail.get("params"), budget.detail.get("flops")) if budget else (None, None)


def _cycle(items: list[int], k: int) -> list[int]:
    """k items, repeating the list when it is shorter (few evaluated models early on)."""
    return [items[i % len(items)] for i in range(k)] if items else []

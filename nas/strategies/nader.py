"""NADER as an ask/tell strategy over block files.

ask: select a node of the modification tree (the root first), retrieve ideas
for it from the knowledge store, let the Proposer rank them, let the Modifier
write the new block — retried with the verifier's node-level error (LIF, up
to `lif_tries`) and given the top experiences (LDE) — and return the design;
a draft that never verifies, or a duplicate, comes back as a rejected
candidate (a failed trial, never trained). A design that drops the parent's
structure (`KeepsParent`) or gives the parent back unchanged (`Changed`) is
sent back to the Modifier with that error, within the same `lif_tries`. After failed attempts the
Reflector writes a tip; tell: record scores in the tree, and after a
degradation the Reflector writes a suggestion. Tips and suggestions go to the
experience store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nas.spaces.nader.dag.macro import BlockSet, Budget, Skeleton
from nas.errors import ConfigError, RunDirError
from nas.search.record import TrialRecord
from nas.core.space import SearchSpace
from nas.strategies.base import STRATEGIES, Candidate, Draft, SearchExhausted, Strategy, Trial
from nas.strategies.design import design_metrics
from nas.strategies.modtree import ModificationTree
from nas.verify import FIX, Check, Verifier, block_chain
from nas.verify import Draft as VerifyDraft

GENERIC_IDEA = "Improve the block's accuracy with one architectural change of your choice."


@STRATEGIES.register("nader")
class NaderStrategy(Strategy):
    random_moves = False
    spaces = ("nader",)

    def __init__(self, space: SearchSpace, seed: int, llm: dict[str, Any] | None = None,
                 knowledge: dict[str, Any] | None = None, policy: str = "dfs", max_children: int = 3,
                 max_depth: int = 8, ideas: int = 5, lif: bool = True, lif_tries: int = 5, lde: bool = True,
                 experiences: int = 5, use_knowledge: bool = True, cells_per_stage: int = 5,
                 input_size: int = 32, num_classes: int = 10, max_params: float = 1.5e6,
                 max_flops: float = 0.2e9) -> None:
        super().__init__(space, seed)
        if lif_tries < 1 or ideas < 1 or experiences < 0:
            raise ConfigError("strategy 'nader': lif_tries and ideas must be >= 1, experiences >= 0")
        self.llm_settings, self.knowledge_settings = llm or {}, knowledge or {}
        self.ideas_k, self.lif_tries, self.lif, self.lde = ideas, lif_tries, lif, lde
        self.experiences_k, self.use_knowledge = experiences, use_knowledge
        self.skeleton = Skeleton.nb201(n=cells_per_stage, input_size=input_size, num_classes=num_classes)
        self.budget = Budget(params=max_params, flops=max_flops)
        root = space.base  # type: ignore[attr-defined]
        self.tree = ModificationTree(root.key(), root.encode(), policy=policy, max_children=max_children,
                                     max_depth=max_depth)
        self.root_asked = False
        self.client = self.store = self.experience_store = None

    # -- wiring -------------------------------------------------------------------------------------------

    def attach(self, run_dir: Path, llm_calls=None) -> None:
        from nas.knowledge.config import KnowledgeConfig
        from nas.llm import LLMClient

        self.client = LLMClient(self.llm_settings, run_dir=run_dir, calls=llm_calls)
        kcfg = KnowledgeConfig.from_dict(self.knowledge_settings)
        if self.use_knowledge:
            self.store = kcfg.open_ideas()
        if self.lde:
            self.experience_store = kcfg.open_experiences()

    # -- ask ----------------------------------------------------------------------------------------------

    def ask(self, n: int) -> list[Candidate]:
        if self.client is None:
            raise RuntimeError("NaderStrategy.attach(run_dir) must be called before ask()")
        out: list[Candidate] = []
        for _ in range(n):
            if not self.root_asked:
                self.root_asked = True
                out.append(Candidate(self.space.base, {"stage": "root", "node": 0}))  # type: ignore[attr-defined]
                continue
            node = self.tree.select()
            if node is None:
                if out:
                    break
                raise SearchExhausted("nader: the modification tree has no node left to modify")
            out.append(self._design(node))
        return out

    def _design(self, node) -> Candidate:
        from nas.agents.nader import modify

        before = self.client.usage.total()
        tried = [(self.tree.node(c).idea, self.tree.node(c).status) for c in node.children]
        idea, ideas, proposal_error = self._propose(node, tried)
        tips = self._experiences(idea)
        parent_blocks = BlockSet.from_text(node.text, f"node {node.id}")
        seen = {self.tree.node(i).key: f"node {i}" for i in range(len(self.tree))}
        chain = block_chain(parent_blocks, self.skeleton, self.budget, seen)
        chain.verifiers.insert(1, KeepsParent(parent_blocks))     # after parse: needs the parsed blocks
        chain.verifiers.insert(-1, Changed(node.key, node.id))    # before dedup: the parent is retried
        attempts: list[dict[str, Any]] = []
        previous = error = None
        outcome, text = None, ""
        for attempt in range(self.lif_tries if self.lif else 1):
            answer = modify(self.client, node.text, idea, tips, previous=previous, error=error, attempt=attempt)
            if not answer.ok:
                attempts.append({"attempt": attempt, "error": answer.errors[-1] if answer.errors else "no reply"})
                error = attempts[-1]["error"]
                continue
            text = answer.value
            outcome = chain.run(text)
            attempts.append({"attempt": attempt, **outcome.to_dict()})
            if outcome.ok or outcome.failure.retry is None:
                break
            previous, error = text, outcome.failure.error
        used = self.client.usage.total()
        info = {"stage": "modify", "parent": node.id, "idea": idea, "ideas": ideas, "attempts": attempts,
                "valid": outcome is not None and outcome.ok,
                "retries": len(attempts) - 1, "proposal_error": proposal_error,
                "tokens": (used.prompt_tokens + used.completion_tokens)
                - (before.prompt_tokens + before.completion_tokens)}
        failed = [a for a in attempts if not a.get("ok")]
        if failed and (outcome is None or not outcome.ok):
            self._reflect_tip(idea, [a.get("error") or _first_error(a) for a in failed])
        if outcome is not None and outcome.ok:
            child = self.tree.add_child(node.id, outcome.arch.key(), outcome.arch.encode(), idea,
                                        info={"width": outcome.checks[1].detail.get("width")})
            return Candidate(outcome.arch, {**info, "node": child.id})
        reason = (outcome.failure.error if outcome is not None else attempts[-1].get("error")) or "no valid design"
        draft = Draft(text or f"(no reply) {idea}", "nader")
        if outcome is not None and outcome.failure.name in ("dedup", "unchanged"):
            return Candidate(draft, {**info, "duplicate": True}, rejected=reason)
        if self.tree.has_key(draft.key()) is not None:  # the same broken draft again
            return Candidate(draft, info, rejected=reason)
        child = self.tree.add_child(node.id, draft.key(), draft.text, idea, info={"rejected": reason})
        return Candidate(draft, {**info, "node": child.id}, rejected=reason)

    def _propose(self, node, tried: list[tuple[str, str]]) -> tuple[str, list[str], str | None]:
        """The idea to apply: the Proposer's first choice among retrieved ideas not yet tried here."""
        from nas.agents.nader import propose

        if self.store is None:
            return GENERIC_IDEA, [], None
        done = {t for t, _ in tried}
        query = f"{node.idea or 'improve a residual convolution block for image classification'}"
        hits = [h.idea.text for h in self.store.search(query, k=self.ideas_k + len(done))]
        ideas = [t for t in hits if t not in done][: self.ideas_k]
        if not ideas:
            return GENERIC_IDEA, [], "knowledge store has no untried idea"
        parent_score = self.tree.node(node.parent).score if node.parent is not None else None
        answer = propose(self.client, node.text, node.score, parent_score, tried, ideas)
        if answer.ok and answer.value:
            return ideas[answer.value[0]], ideas, None
        # A garbage ranking costs the ranking, not the design: take the retrieval order.
        return ideas[0], ideas, answer.errors[-1] if answer.errors else "no reply"

    def _experiences(self, idea: str) -> list[str]:
        if self.experience_store is None or self.experiences_k == 0:
            return []
        return [e.text for e, _ in self.experience_store.retrieve(idea, k=self.experiences_k)]

    def _reflect_tip(self, idea: str, errors: list[str]) -> None:
        from nas.agents.nader import reflect_tip
        from nas.knowledge.store import Experience

        if self.experience_store is None:
            return
        answer = reflect_tip(self.client, idea, errors)
        if answer.ok:
            self.experience_store.add(Experience(text=answer.value, kind="tip", error=errors[-1], idea=idea,
                                                 source="nader-run"))

    # -- tell ---------------------------------------------------------------------------------------------

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            node_id = t.candidate.info.get("node")
            if node_id is None:
                continue  # a duplicate: not in the tree
            node = self.tree.node(node_id)
            if node.status != "pending":
                continue
            if t.record.ok and t.record.accuracy is not None:
                self.tree.record(node_id, float(t.record.accuracy))
                self._reflect_degradation(node_id)
            else:
                self.tree.record(node_id, None, failed=True)

    def _reflect_degradation(self, node_id: int) -> None:
        from nas.agents.nader import reflect_suggestion
        from nas.knowledge.store import Experience

        node = self.tree.node(node_id)
        if self.experience_store is None or node.parent is None:
            return
        parent = self.tree.node(node.parent)
        if parent.score is None or node.score >= parent.score:
            return
        answer = reflect_suggestion(self.client, node.idea, parent.text, node.text, parent.score, node.score)
        if answer.ok:
            self.experience_store.add(Experience(text=answer.value, kind="suggestion", idea=node.idea,
                                                 source="nader-run"))

    # -- state and report ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "tree": self.tree.state_dict(), "root_asked": self.root_asked}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            self.tree.load_state_dict(state["tree"])
            self.root_asked = bool(state["root_asked"])
        except (KeyError, ValueError) as err:
            raise RunDirError(f"strategy 'nader' state: {err}") from None

    def report(self, history: list[TrialRecord]) -> dict[str, Any]:
        out = {"tree": self.tree.to_dict(), "design": design_metrics(history)}
        if self.client is not None:
            out["llm"] = self.client.usage.to_dict()
        return out


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

    def check(self, draft: VerifyDraft) -> Check:
        for role, block in draft.arch.blocks.sections().items():  # type: ignore[union-attr]
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

    def check(self, draft: VerifyDraft) -> Check:
        if draft.arch.key() == self.parent_key:  # type: ignore[union-attr]
            return self.failed(f"duplicate of the parent (node {self.parent_id}): the block is unchanged; "
                               f"apply the idea", FIX)
        return self.passed()


def _ops(block) -> list[str]:
    return [n.op for n in block.nodes.values() if not n.is_io]


def _kinds(ops: list[str]) -> str:
    return ", ".join(dict.fromkeys(ops)) or "none"


def _first_error(attempt: dict[str, Any]) -> str:
    return next((c["error"] for c in attempt.get("checks", []) if not c["ok"]), "failed")

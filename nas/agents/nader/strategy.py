"""NADER as an ask/tell strategy over block files.

ask: select a node of the modification tree (the root first), retrieve ideas
for it from the knowledge store, let the Proposer rank them, let the Modifier
write the new block — retried with the verifier's node-level error (LIF, up
to `lif_tries`) and given the top experiences (LDE) — and return the design;
a draft that never verifies, or a duplicate, comes back as a rejected
candidate (a failed trial, never trained). A design that drops the parent's
structure (`KeepsParent`) or gives the parent back unchanged (`Changed`) is
sent back to the Modifier with that error, within the same `lif_tries`; a draft that repeats an
earlier try's says so (the same prompt would mostly get the same draft). After failed attempts the
Reflector writes a tip; tell: record scores in the tree, and after a
degradation the Reflector writes a suggestion. Tips and suggestions go to the
experience store.
"""

from __future__ import annotations

from typing import Any

from nas.agents.nader.agents import modify, propose, reflect_suggestion, reflect_tip
from nas.agents.nader.modtree import ModificationTree
from nas.core.arch import SeenIndex
from nas.core.space import SearchSpace
from nas.core.trial import Candidate, Draft, Trial, TrialRecord
from nas.design.base import DesignStrategy, Try, verify_and_retry
from nas.design.verifiers import Changed, KeepsParent, block_chain
from nas.errors import ConfigError, RunDirError
from nas.spaces.nader.dag.macro import BlockSet, Skeleton
from nas.strategies.base import STRATEGIES

GENERIC_IDEA = "Improve the block's accuracy with one architectural change of your choice."


@STRATEGIES.register("nader")
class NaderStrategy(DesignStrategy):
    spaces = ("nader",)
    exhausted = "the modification tree has no node left to modify"

    def __init__(self, space: SearchSpace, seed: int, llm: dict[str, Any] | None = None,
                 knowledge: dict[str, Any] | None = None, policy: str = "dfs", max_children: int = 3,
                 max_depth: int = 8, ideas: int = 5, lif: bool = True, lif_tries: int = 5, lde: bool = True,
                 experiences: int = 5, use_knowledge: bool = True, cells_per_stage: int = 5,
                 input_size: int = 32, num_classes: int = 10, budget: dict[str, float] | None = None) -> None:
        super().__init__(space, seed, llm, knowledge, budget, input_size)
        if lif_tries < 1 or ideas < 1 or experiences < 0:
            raise ConfigError("strategy 'nader': lif_tries and ideas must be >= 1, experiences >= 0")
        self.ideas_k, self.lif_tries, self.lif, self.lde = ideas, lif_tries, lif, lde
        self.experiences_k, self.use_knowledge = experiences, use_knowledge
        self.skeleton = Skeleton.nb201(n=cells_per_stage, input_size=input_size, num_classes=num_classes)
        root = space.base  # type: ignore[attr-defined]
        self.tree = ModificationTree(root.key(), root.encode(), policy=policy, max_children=max_children,
                                     max_depth=max_depth)
        self._index()
        self.root_asked = False
        self.store = self.experience_store = None

    def _index(self) -> None:
        """Every node of the tree (valid designs and rejected drafts) is a design seen."""
        for i in range(len(self.tree)):
            self.seen.add_key(self.tree.node(i).key, f"node {i}")

    # -- wiring -------------------------------------------------------------------------------------------

    def _open_knowledge(self, kcfg, progress: bool) -> None:
        if self.use_knowledge:
            self.store = kcfg.open_ideas(progress=progress)
        if self.lde:
            self.experience_store = kcfg.open_experiences()

    # -- ask ----------------------------------------------------------------------------------------------

    def _root_pending(self) -> bool:
        return not self.root_asked

    def _root(self) -> Candidate:
        self.root_asked = True
        return Candidate(self.space.base, {"stage": "root", "node": 0})  # type: ignore[attr-defined]

    def _next_design(self) -> Candidate | None:
        node = self.tree.select()
        return None if node is None else self._design(node)

    def _add_child(self, parent: int, key: str, text: str, idea: str, info: dict[str, Any]):
        child = self.tree.add_child(parent, key, text, idea, info=info)
        self.seen.add_key(key, f"node {child.id}")
        return child

    def _design(self, node) -> Candidate:
        before = self.llm_client.usage.total()
        tried = [(self.tree.node(c).idea, self.tree.node(c).status) for c in node.children]
        idea, ideas, proposal_error = self._propose(node, tried)
        tips = self._experiences(idea)
        parent_blocks = BlockSet.from_text(node.text, f"node {node.id}")
        chain = block_chain(parent_blocks, self.skeleton, self.budget, self.seen)
        chain.verifiers.insert(1, KeepsParent(parent_blocks))     # after parse: needs the parsed blocks
        chain.verifiers.insert(-1, Changed(node.key, node.id))    # before dedup: the parent is retried

        def write(attempt: int, previous: str | None, error: str | None) -> Try:
            answer = modify(self.llm_client, node.text, idea, tips, previous=previous, error=error, attempt=attempt)
            if not answer.ok:
                return Try({"attempt": attempt}, None, answer.errors[-1] if answer.errors else "no reply")
            return Try({"attempt": attempt}, answer.value)

        tries = self.lif_tries if self.lif else 1
        written: dict[str, list[int]] = {}  # draft -> the tries that wrote it

        def revise(outcome, error: str | None, last: str | None) -> Try | None:
            attempt = len(attempts)
            if attempt >= tries:
                return None
            error = _with_parse_changes(outcome, error)
            if last is not None and error is not None and "checks" in attempts[-1]:  # the last try wrote `last`
                before = written.setdefault(last, [])
                error = _repeated(error, before) if before else error
                before.append(attempt - 1)
            return write(attempt, last, error)

        attempts: list[dict[str, Any]] = []
        outcome, text = verify_and_retry(chain, write(0, None, None), revise, attempts, retry_no_reply=True)
        info = {"stage": "modify", "parent": node.id, "idea": idea, "ideas": ideas, "attempts": attempts,
                "valid": outcome is not None and outcome.ok,
                "retries": len(attempts) - 1, "proposal_error": proposal_error,
                "tokens": self._tokens_since(before)}
        failed = [a for a in attempts if not a.get("ok")]
        if failed and (outcome is None or not outcome.ok):
            self._reflect_tip(idea, [a.get("error") or _first_error(a) for a in failed])
        arch = outcome.arch if outcome is not None and outcome.ok else None  # a passing chain decoded it
        if outcome is not None and arch is not None:
            child = self._add_child(node.id, arch.key(), arch.encode(), idea,
                                    info={"width": outcome.checks[1].detail.get("width")})
            return Candidate(arch, {**info, "node": child.id})
        failure = outcome.failure if outcome is not None else None
        reason = (failure.error if failure is not None else attempts[-1].get("error")) or "no valid design"
        draft = Draft(text or f"(no reply) {idea}", "nader")
        if failure is not None and failure.name in ("dedup", "unchanged"):
            return Candidate(draft, {**info, "duplicate": True}, rejected=reason)
        if draft.key() in self.seen:  # the same broken draft again
            return Candidate(draft, info, rejected=reason)
        child = self._add_child(node.id, draft.key(), draft.text, idea, info={"rejected": reason})
        return Candidate(draft, {**info, "node": child.id}, rejected=reason)

    def _propose(self, node, tried: list[tuple[str, str]]) -> tuple[str, list[str], str | None]:
        """The idea to apply: the Proposer's first choice among retrieved ideas not yet tried here."""

        if self.store is None:
            return GENERIC_IDEA, [], None
        done = {t for t, _ in tried}
        query = f"{node.idea or 'improve a residual convolution block for image classification'}"
        hits = [h.idea.text for h in self.store.search(query, k=self.ideas_k + len(done))]
        ideas = [t for t in hits if t not in done][: self.ideas_k]
        if not ideas:
            return GENERIC_IDEA, [], "knowledge store has no untried idea"
        parent_score = self.tree.node(node.parent).score if node.parent is not None else None
        answer = propose(self.llm_client, node.text, node.score, parent_score, tried, ideas)
        if answer.ok and answer.value:
            return ideas[answer.value[0]], ideas, None
        # A garbage ranking costs the ranking, not the design: take the retrieval order.
        return ideas[0], ideas, answer.errors[-1] if answer.errors else "no reply"

    def _experiences(self, idea: str) -> list[str]:
        if self.experience_store is None or self.experiences_k == 0:
            return []
        return [e.text for e, _ in self.experience_store.retrieve(idea, k=self.experiences_k)]

    def _reflect_tip(self, idea: str, errors: list[str]) -> None:
        from nas.knowledge.store import Experience  # lazy: loads qdrant_client, threadpoolctl (start-up time)

        if self.experience_store is None:
            return
        answer = reflect_tip(self.llm_client, idea, errors)
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
        from nas.knowledge.store import Experience  # lazy: loads qdrant_client, threadpoolctl (start-up time)

        node = self.tree.node(node_id)
        if self.experience_store is None or node.parent is None:
            return
        parent = self.tree.node(node.parent)
        if parent.score is None or node.score >= parent.score:
            return
        answer = reflect_suggestion(self.llm_client, node.idea, parent.text, node.text, parent.score, node.score)
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
        self.seen = SeenIndex()
        self._index()

    def _report(self, history: list[TrialRecord]) -> dict[str, Any]:
        return {"tree": self.tree.to_dict()}


def _with_parse_changes(outcome, error: str | None) -> str | None:
    """The error for the Modifier, saying which repeated edges the parse counted once and which
    of its nodes it dropped as dead (the error is about the block without them)."""
    detail = outcome.checks[0].detail if outcome is not None and outcome.checks else {}
    changes = []
    if repeated := detail.get("repeated"):
        changes.append("with each edge once, " + "; ".join(
            f"{role} block: {', '.join(edges)} listed twice" for role, edges in repeated.items()))
    if dropped := detail.get("dropped"):
        changes.append("without the nodes whose result reaches no output, " + "; ".join(
            f"{role} block: nodes {', '.join(dead)}" for role, dead in dropped.items()))
    if not changes or error is None:
        return error
    return f"{error} (checked {' and '.join(changes)})"


def _repeated(error: str, before: list[int]) -> str:
    """The error for a draft that earlier tries (`before`, from 0) wrote too: given the same retry
    prompt, SmolLM2 mostly writes the same draft again, so each such prompt must differ (one
    `make run` sent a prompt four times and got one draft four times)."""
    tries = " and ".join(str(t + 1) for t in before)
    return f"{error} (you wrote this same draft in try {tries} too: change what the checker names)"


def _first_error(attempt: dict[str, Any]) -> str:
    return next((c["error"] for c in attempt.get("checks", []) if not c["ok"]), "failed")

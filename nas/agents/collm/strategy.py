"""CoLLM-NAS as an ask/tell strategy over any categorical space.

Each iteration: the stateful Navigator turns the newest results (and, with
`navigator_memory`, its own earlier conversation) into a strategy; the
stateless Generator turns the strategy into K candidates; the Coordinator
(this class) drops illegal, visited and infeasible ones with their reasons,
asks the Generator again for the shortfall (up to `max_retries`), fills what is
still missing with random feasible samples (`origin: random_fill`) and queues
the rest for evaluation. `ask` serves the queue; the search stops at
`target_accuracy` or after `max_iterations`. `single_llm` is the paper's
SiLLM ablation: one call writes both the strategy and the candidates.

Rejected proposals are not trials (the paper's Coordinator never evaluates
them); they are counted in `report()` and shown to the Navigator.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from nas.agents.collm.agents import MAX_DIRECTIONS, decision_table, generate, navigate, single, values_text
from nas.core.arch import Architecture
from nas.core.space import CategoricalSpace, SearchSpace
from nas.core.trial import Candidate, SearchExhausted, Trial, TrialRecord
from nas.errors import ConfigError, RunDirError
from nas.llm import LLMClient
from nas.llm.client import Answer
from nas.llm.prompts import load_prompt
from nas.strategies.base import STRATEGIES, Deduplicating, Strategy

log = logging.getLogger("nas.agents.collm.strategy")
OPENING = "No strategy yet: explore architectures that differ from each other in every decision."


@dataclass
class Record:
    """An evaluated architecture as the LLMs are shown it."""

    values: str
    key: str
    accuracy: float | None
    flops: float | None
    params: float | None
    error: str | None
    iteration: int | None


@dataclass
class Rejection:
    iteration: int
    kind: str      # illegal | duplicate | infeasible
    text: str
    reason: str


@dataclass
class Turn:
    """One call's conversation, its new user message (what memory keeps) and its cache-key template."""

    messages: list[dict[str, str]]
    user: dict[str, str]
    template: str


@dataclass
class Counts:
    proposals: int = 0
    accepted: int = 0
    illegal: int = 0
    duplicate: int = 0
    infeasible: int = 0
    random_fill: int = 0
    navigator_failures: int = 0
    generator_failures: int = 0
    trimmed_turns: int = 0        # remembered exchanges left out so that a prompt fits the context


LATER_COUNTS = ("trimmed_turns",)   # counts newer than some saved states: 0 when a resumed state lacks them


@STRATEGIES.register("collm")
class CoLLMStrategy(Deduplicating, Strategy):
    random_moves = False   # its moves come from the LLMs; random fills only make up their shortfall
    space: CategoricalSpace  # checked in __init__

    def __init__(self, space: SearchSpace, seed: int, llm: dict[str, Any] | None = None,
                 candidates_per_iteration: int = 5, max_iterations: int | None = None,
                 target_accuracy: float | None = None, temperature: float | None = 0.6,
                 navigator_memory: bool = True, generator_memory: bool = False, single_llm: bool = False,
                 memory_turns: int | None = 2, max_retries: int = 2, shown_visited: int = 20,
                 shown_best: int = 5, max_attempts: int = 1000) -> None:
        super().__init__(space, seed)
        if not isinstance(space, CategoricalSpace):
            raise ConfigError(f"strategy 'collm' needs a categorical space (one choice per decision), "
                              f"not '{space.name}'")
        if candidates_per_iteration < 1 or max_retries < 0 or (max_iterations is not None and max_iterations < 1) \
                or (memory_turns is not None and memory_turns < 0):
            raise ConfigError("strategy 'collm': candidates_per_iteration and max_iterations must be >= 1, "
                              "max_retries and memory_turns >= 0")
        self.seed = seed
        self.llm_settings = dict(llm or {})
        self.k, self.max_iterations, self.target = candidates_per_iteration, max_iterations, target_accuracy
        self.temperature = temperature
        self.navigator_memory, self.generator_memory, self.single_llm = navigator_memory, generator_memory, single_llm
        self.memory_turns, self.max_retries, self.max_attempts = memory_turns, max_retries, max_attempts
        self.shown_visited, self.shown_best = shown_visited, shown_best
        self.client = None
        self.iteration = 0
        self.queue: list[tuple[Any, dict[str, Any]]] = []
        self.records: list[Record] = []
        self.rejections: list[Rejection] = []
        self.reported = [0, 0]           # records and rejections the Navigator has seen
        self.strategy_text: str | None = None
        self.nav_log: list[dict[str, str]] = []   # the Navigator's (or SiLLM's) conversation, system prompt aside
        self.gen_log: list[dict[str, str]] = []   # the Generator's, kept only with generator_memory
        self.errors: list[dict[str, Any]] = []
        self.counts = Counts()
        self._init_seen()

    def attach(self, run_dir: Path, llm_calls=None, progress: bool = True) -> None:
        settings = dict(self.llm_settings)
        roles = {r: dict(v or {}) for r, v in dict(settings.get("roles") or {}).items()}
        if self.temperature is not None:
            for role in ("navigator", "generator"):
                roles[role] = {**roles.get(role, {}), "temperature": self.temperature}
        settings["roles"] = roles
        self.client = LLMClient(settings, run_dir=run_dir, calls=llm_calls)

    # -- ask ----------------------------------------------------------------------------------------------

    def ask(self, n: int) -> list[Candidate]:
        if self.client is None:
            raise RuntimeError("CoLLMStrategy.attach(run_dir) must be called before ask()")
        out: list[Candidate] = []
        while len(out) < n:
            stop = self._target_reached()
            if stop is None and not self.queue:
                if self.max_iterations is not None and self.iteration >= self.max_iterations:
                    stop = f"collm: reached max_iterations ({self.max_iterations})"
                else:
                    self._iterate()
                    stop = None if self.queue else "collm: no unvisited feasible architecture left"
            if stop is not None:
                if out:
                    break
                raise SearchExhausted(stop)
            enc, info = self.queue.pop(0)
            out.append(Candidate(self.space.decode(enc), info))
        return out

    def _target_reached(self) -> str | None:
        best = max((r.accuracy for r in self.records if r.accuracy is not None), default=None)
        if self.target is not None and best is not None and best >= self.target:
            return f"reached target accuracy {self.target:g} (best {best:.4g})"
        return None

    def _iterate(self) -> None:
        self.iteration += 1
        accepted: list[Architecture] = []
        turn = self._single_turn() if self.single_llm else None
        if turn is None:
            self._navigate()
        answer: Answer[Any]  # SiLLM's (strategy, proposals) or the Generator's proposals
        for attempt in range(1 + self.max_retries):
            need = self.k - len(accepted)
            if need <= 0:
                break
            if turn is not None:     # SiLLM: a retry re-asks the same turn (a new attempt, a new sample)
                answer = single(self.llm_client, self.space, turn.messages, turn.template, need, attempt=attempt)
                if answer.value is not None:
                    self.strategy_text, proposals = answer.value
                    self._remember(self.nav_log, turn, answer, self.navigator_memory and attempt == 0)
                    self.reported = [len(self.records), len(self.rejections)]
            else:
                gen = self._generator_turn(need, attempt > 0)
                answer = generate(self.llm_client, self.space, gen.messages, gen.template, need, attempt=attempt)
                if answer.value is not None:
                    proposals = answer.value
                    self._remember(self.gen_log, gen, answer, self.generator_memory)
            if not answer.ok:
                self.counts.generator_failures += 1
                self._error("single" if turn is not None else "generator", answer)
                continue
            accepted += self._screen(proposals, need)
        self.queue += [(a.encode(), {"origin": "llm", "iteration": self.iteration}) for a in accepted]
        while len(accepted) < self.k:
            arch = self._fresh(lambda: self.space.sample(self.rng), self.max_attempts)
            if arch is None:
                break
            accepted.append(arch)
            self.seen.add(arch)
            self.counts.random_fill += 1
            self.queue.append((arch.encode(), {"origin": "random_fill", "iteration": self.iteration}))

    def _screen(self, proposals, need: int) -> list[Architecture]:
        """The Coordinator: the first `need` legal, unvisited and feasible proposals; the rejected are logged."""
        out: list[Architecture] = []
        for p in proposals:
            if len(out) == need:
                break       # an API model that wrote more than asked: the surplus is neither used nor counted
            self.counts.proposals += 1
            if p.arch is None:
                kind, reason = "illegal", p.error or "not an architecture of the space"
            elif p.arch in self.seen:
                kind, reason = "duplicate", "already evaluated or proposed"
            elif (why := self.constraint.violation(self.space, p.arch)) is not None:
                kind, reason = "infeasible", why
            else:
                self.seen.add(p.arch)
                self.counts.accepted += 1
                out.append(p.arch)
                continue
            setattr(self.counts, kind, getattr(self.counts, kind) + 1)
            self.rejections.append(Rejection(self.iteration, kind, p.text, reason))
        return out

    # -- conversations ------------------------------------------------------------------------------------

    def _navigate(self) -> None:
        turn = self._stateful("collm_navigator", "collm_navigator_refine", self._refine_values())
        answer = navigate(self.llm_client, self.space, turn.messages, turn.template)
        if not answer.ok:
            self.counts.navigator_failures += 1
            self._error("navigator", answer)
            return
        self.strategy_text = answer.value
        self.reported = [len(self.records), len(self.rejections)]
        self._remember(self.nav_log, turn, answer, True)

    def _single_turn(self) -> Turn:
        values = {**self._refine_values(), "k": self.k, "visited": self._visited_text()}
        return self._stateful("collm_single", "collm_single_refine", values, k=self.k)

    def _stateful(self, opening: str, refine: str, values: dict[str, Any], **extra: Any) -> Turn:
        """System + (remembered turns) + this turn: the opening request first, then refinements."""
        first = _render(opening, **self._space_values(), directions=self._directions(), **extra)
        if self.strategy_text is None and not self.nav_log:
            return Turn(first, first[1], self._template(opening))
        user = _render(refine, **values)[0]
        history = self._window(self.nav_log) if self.navigator_memory else []
        tokens = self._single_tokens() if opening == "collm_single" else None
        return Turn(self._fit("navigator", first[0], history, user, tokens), user, self._template(refine))

    def _generator_turn(self, k: int, retry: bool) -> Turn:
        lines = [f"- {r.text}: {r.kind}, {r.reason}" for r in self.rejections if r.iteration == self.iteration]
        feedback = "\nYour last candidates were rejected, so write different ones:\n" + "\n".join(lines[-10:]) \
            + "\n" if retry and lines else ""
        system, user = _render("collm_generator", **self._space_values(), strategy=self.strategy_text or OPENING,
                               visited=self._visited_text(), feedback=feedback, k=k)
        history = self._window(self.gen_log) if self.generator_memory else []
        return Turn(self._fit("generator", system, history, user), user, self._template("collm_generator"))

    def _window(self, log: list[dict[str, str]]) -> list[dict[str, str]]:
        if self.memory_turns is None:
            return list(log)
        return log[-2 * self.memory_turns:] if self.memory_turns else []  # fewer so far: all of them

    def _fit(self, role: str, system: dict[str, str], history: list[dict[str, str]], user: dict[str, str],
             max_tokens: int | None = None) -> list[dict[str, str]]:
        """System + history + user, without the oldest remembered exchanges that would push prompt and
        reply past the context (`llm.context`): a remembered turn is worth less than an answered call."""
        budget = self.llm_client.prompt_budget(role, max_tokens)
        while budget is not None and history and self.llm_client.prompt_tokens([system, *history, user]) > budget:
            history = history[2:]        # one exchange: the user turn and the reply to it
            self.counts.trimmed_turns += 1
        return [system, *history, user]

    def _single_tokens(self) -> int:
        """SiLLM's reply budget: both roles' replies in one (as `nas.agents.collm.agents.single` asks)."""
        return self.llm_client.config.role("navigator").max_tokens + self.llm_client.config.role("generator").max_tokens

    @staticmethod
    def _remember(log: list[dict[str, str]], turn: Turn, answer, keep: bool) -> None:
        if keep:
            log += [turn.user, {"role": "assistant", "content": answer.replies[-1].text}]

    def _template(self, prompt: str) -> str:
        """The prompt's id and the seed: seeds sample independently (own cache keys), a re-run replays."""

        return f"{load_prompt(prompt).template_id}#seed={self.seed}"

    def _error(self, role: str, answer) -> None:
        """A failed call costs its turn (counted, one log line); the search goes on."""
        error = answer.errors[-1] if answer.errors else "no reply"
        self.errors.append({"iteration": self.iteration, "role": role, "error": error})
        log.warning("collm: %s failed at iteration %d: %s", role, self.iteration, error)

    # -- what the LLMs are shown --------------------------------------------------------------------------

    def _space_values(self) -> dict[str, Any]:
        target = f"an accuracy of at least {self.target:g}%" if self.target is not None \
            else "the highest accuracy you can find"
        return {"space": self.space.describe(), "decisions": decision_table(self.space),
                "n": len(self.space.decisions()), "target": target, "constraint": self._constraint_text()}

    def _constraint_text(self) -> str:
        c = self.constraint
        parts = ([f"at most {c.flops / 1e6:g} MFLOPs"] if c.flops is not None else []) \
            + ([f"at most {c.params / 1e6:g} M parameters"] if c.params is not None else [])
        return " and ".join(parts) if parts else "none"

    def _directions(self) -> str:
        decisions = self.space.decisions()
        if len(decisions) <= MAX_DIRECTIONS:
            return "\n".join(f"{d.name}: which values to favour or avoid" for d in decisions)
        return "- one line of guidance per group of decisions (at most eight lines)"

    def _refine_values(self) -> dict[str, Any]:
        space = {k: v for k, v in self._space_values().items() if k in ("target", "constraint")}
        fresh = self.rejections[self.reported[1]:]
        rejected = [f"- {r.text}: {r.kind}, {r.reason}" for r in fresh[-10:]]
        return {**space, "results": self._lines(self.records[self.reported[0]:]),
                "rejected": "\n".join(rejected) if rejected else "none",
                "best": self._lines(self._best(self.shown_best)), "evaluated": len(self.records)}

    def _best(self, n: int) -> list[Record]:
        scored = [(r.accuracy, r) for r in self.records if r.accuracy is not None]
        return [r for _, r in sorted(scored, key=lambda pair: -pair[0])][:n]

    def _visited_text(self) -> str:
        if not self.records:
            return "none yet"
        shown = self.records if len(self.records) <= self.shown_visited else self._best(self.shown_visited)
        more = len(self.records) - len(shown)
        return "\n".join(r.values for r in shown) + (f"\n(and {more} lower-scoring ones)" if more > 0 else "")

    @staticmethod
    def _lines(records: list[Record]) -> str:
        if not records:
            return "none"
        out = []
        for r in records:
            if r.accuracy is None:
                out.append(f"- {r.values} -> failed: {r.error or 'no accuracy'}")
                continue
            cost = "".join([f", {r.flops / 1e6:.1f} MFLOPs" if r.flops is not None else "",
                            f", {r.params / 1e6:.3f} M params" if r.params is not None else ""])
            out.append(f"- {r.values} -> accuracy {r.accuracy:.2f}{cost}")
        return "\n".join(out)

    # -- tell, state, report ------------------------------------------------------------------------------

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            arch, res = t.candidate.arch, t.record
            self.seen.add(arch)
            cost = self.space.cost(arch)
            self.records.append(Record(
                values_text(self.space, arch), arch.key(),
                float(res.accuracy) if res.ok and res.accuracy is not None else None,
                float(cost.flops) if cost is not None else (float(res.flops) if res.flops else None),
                float(cost.params) if cost is not None else (float(res.params) if res.params else None),
                None if res.ok else (res.error or "failed").splitlines()[0],
                t.candidate.info.get("iteration")))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "seed": self.seed, "iteration": self.iteration,
                "queue": [[enc, info] for enc, info in self.queue],
                "records": [asdict(r) for r in self.records], "rejections": [asdict(r) for r in self.rejections],
                "reported": list(self.reported), "strategy_text": self.strategy_text,
                "nav_log": list(self.nav_log), "gen_log": list(self.gen_log), "errors": list(self.errors),
                "counts": asdict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            seed, iteration = int(state["seed"]), int(state["iteration"])
            queue = [(enc, dict(info)) for enc, info in state["queue"]]
            records = [Record(**r) for r in state["records"]]
            rejections = [Rejection(**r) for r in state["rejections"]]
            reported = [int(x) for x in state["reported"]]
            strategy_text = state["strategy_text"]
            logs = [[{"role": str(m["role"]), "content": str(m["content"])} for m in state[k]]
                    for k in ("nav_log", "gen_log")]
            errors = [dict(e) for e in state["errors"]]
            counts = Counts(**{f.name: int(state["counts"][f.name] if f.name not in LATER_COUNTS
                                            else state["counts"].get(f.name, 0)) for f in fields(Counts)})
            if len(reported) != 2 or not (strategy_text is None or isinstance(strategy_text, str)):
                raise ValueError("reported must be two counts and strategy_text a string or null")
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"strategy 'collm' state: {err}") from None
        self.seed, self.iteration, self.queue = seed, iteration, queue
        self.records, self.rejections = records, rejections
        self.reported, self.strategy_text, (self.nav_log, self.gen_log) = reported, strategy_text, logs
        self.errors, self.counts = errors, counts

    def _pending(self) -> list[Any]:
        return [enc for enc, _ in self.queue]

    def report(self, history: list[TrialRecord]) -> dict[str, Any]:
        out: dict[str, Any] = {"collm": {"iterations": self.iteration, "single_llm": self.single_llm,
                                         **asdict(self.counts),
                                         "rejections": {k: [asdict(r) for r in self.rejections if r.kind == k][-5:]
                                                        for k in ("illegal", "duplicate", "infeasible")},
                                         "errors": self.errors[-5:], "strategy": self.strategy_text}}
        if self.client is not None:
            out["llm"] = self.client.usage.to_dict()
        return out


def _render(prompt: str, **values: Any) -> list[dict[str, str]]:
    """A prompt filled from the shared values (each prompt takes the fields it names)."""

    p = load_prompt(prompt)
    return p.render(**{k: v for k, v in values.items() if k in p.fields()})

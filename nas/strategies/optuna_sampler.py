"""Optuna's samplers (TPE, GP, NSGA-II, random, CMA-ES, QMC) on any categorical space, through
Optuna's ask-and-tell interface: each decision is a categorical parameter, each candidate an
Optuna trial.

- Storage: the study lives in an Optuna journal in the run dir (`optuna.journal`, Optuna's file
  format: `JournalFileBackend` and optuna-dashboard read it). On resume it is replayed from the
  history and the state (which trial numbers answered a repeat, or were over the constraint), so
  it holds exactly the trials of the last saved state, whatever a crash left after it: the
  resumed study asks what the uninterrupted one asks next.
- Repeats: Optuna may propose an architecture the run already evaluated; that trial is told the
  known accuracy at once and Optuna is asked again, so every candidate is new and `budget.trials`
  counts distinct candidates. A proposal equal to a candidate being evaluated is told with it.
  After `max_repeats` repeats in a row, a random unvisited architecture is enqueued instead: a
  sampler that converged (independent TPE proposes ~10 repeats per new cell by 200 trials on NB201)
  would otherwise grow its study, and each ask's cost with it, by hundreds of repeats.
- Determinism: the sampler's random states are reseeded before each ask from the search's seed
  and the trial's number (GP also warm-starts its kernel fit from the last one: a resumed GP
  search may differ from an uninterrupted one from there).
- Constraint: every trial carries its constraint values (`Trial.set_constraint`: FLOPs and params
  over the limit, <= 0 within); proposals over it are never evaluated, but told as infeasible trials
  (accuracy 0), so the samplers that model constraints (TPE, GP, NSGA-II) learn where the limit is.

One objective (accuracy, maximised), NSGA-II included. Optuna is an optional extra
(`pip install 'nasflow[optuna]'`), imported only when this strategy is built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from nas.core.arch import Architecture, SeenIndex
from nas.core.space import CategoricalSpace, SearchSpace
from nas.core.trial import Candidate, SearchExhausted, Trial, TrialRecord
from nas.errors import ConfigError, EncodingError, RunDirError
from nas.llm.client import Calls
from nas.strategies.base import STRATEGIES, Strategy

SAMPLERS = {"tpe": "TPESampler", "gp": "GPSampler", "nsga2": "NSGAIISampler", "random": "RandomSampler",
            "cmaes": "CmaEsSampler", "qmc": "QMCSampler"}
JOURNAL = "optuna.journal"
STUDY = "nasflow"
INFEASIBLE_VALUE = 0.0  # what an over-the-limit proposal is told (its constraint values mark it infeasible)


def _optuna() -> Any:
    try:
        import optuna  # lazy: an optional extra, refused in one line when missing
    except ImportError:
        raise ConfigError("strategy 'optuna' needs Optuna: pip install 'nasflow[optuna]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not a line per trial
    return optuna


@STRATEGIES.register("optuna")
class OptunaSampler(Strategy):
    asynchronous = True
    space: CategoricalSpace  # checked in __init__

    def __init__(self, space: SearchSpace, seed: int, sampler: str = "tpe",
                 sampler_params: dict[str, Any] | None = None, max_repeats: int = 10) -> None:
        super().__init__(space, seed)
        if not isinstance(space, CategoricalSpace):
            raise ConfigError(f"strategy 'optuna' needs a categorical space (one choice per decision), "
                              f"not '{space.name}'")
        if sampler not in SAMPLERS:
            raise ConfigError(f"strategy 'optuna': unknown sampler {sampler!r} (valid: {', '.join(SAMPLERS)})")
        if sampler_params is not None and not isinstance(sampler_params, dict):
            raise ConfigError(f"strategy 'optuna': sampler_params must be a mapping, got {sampler_params!r}")
        params = dict(sampler_params or {})
        if "seed" in params:
            raise ConfigError("strategy 'optuna': sampler_params.seed is not taken; the search's seed seeds the sampler")
        if isinstance(max_repeats, bool) or not isinstance(max_repeats, int) or max_repeats < 1:
            raise ConfigError(f"strategy 'optuna': max_repeats must be an integer >= 1, got {max_repeats!r}")
        self.optuna = _optuna()
        self.sampler_name, self.sampler_params, self.max_repeats = sampler, params, max_repeats
        self.seed = int(seed)
        decisions = space.decisions()
        names = [d.name for d in decisions]
        self.names = names if len(set(names)) == len(names) else [f"{i}:{n}" for i, n in enumerate(names)]
        # Choices that are plain values are the parameter's values (readable in the journal); others, indices.
        self.by_value = [all(type(c) in (str, int, float) for c in d.choices)
                         and len({repr(c) for c in d.choices}) == len(d.choices) for d in decisions]
        dist = self.optuna.distributions.CategoricalDistribution
        self.distributions = {n: dist(list(d.choices) if v else list(range(len(d.choices))))
                              for n, d, v in zip(self.names, decisions, self.by_value)}
        self.sampler = self._make_sampler()  # checks sampler_params now, not at the first ask
        self.study: Any = None
        self.path: Path | None = None        # the journal; None: in memory (never attached)
        self.seen = SeenIndex()              # every candidate asked or told
        self.known: dict[str, tuple[int, float | None]] = {}  # key -> (history index, accuracy; None: failed)
        self.pending: dict[str, tuple[int, Architecture]] = {}  # key -> (trial number, arch): asked, not told
        self.echoes: dict[str, list[int]] = {}  # key -> trials that proposed a pending candidate again
        # Trials that are no candidate, by number: a history index (a repeat, told that record's result),
        # ["infeasible", encoding], ["echo", key] (told with a pending candidate), or None (failed).
        self.extra: dict[int, Any] = {}
        self.saved_trials = 0                 # the study's trials at the state loaded (resume)
        self.history: list[TrialRecord] = []
        self.reclaimed: dict[int, Architecture] = {}

    # -- the sampler and the study ------------------------------------------------------------------------

    def _make_sampler(self) -> Any:
        cls = getattr(self.optuna.samplers, SAMPLERS[self.sampler_name])
        try:
            return cls(**self.sampler_params, seed=self.seed)
        except TypeError as err:
            raise ConfigError(f"strategy 'optuna': sampler '{self.sampler_name}' ({cls.__name__}): {err}") from None
        except ImportError as err:
            raise ConfigError(f"strategy 'optuna': sampler '{self.sampler_name}' needs a package Optuna does not "
                              f"install: {err}") from None
        except ValueError as err:
            raise ConfigError(f"strategy 'optuna': sampler '{self.sampler_name}': {err}") from None

    def _constraint_values(self, arch: Architecture) -> dict[str, float]:
        """Per limit of the constraint, how far over it `arch` is (<= 0: within); {} without one."""
        cost, c = self.space.cost(arch), self.constraint
        if cost is None or not c.active:
            return {}
        return {**({"flops": float(cost.flops - c.flops)} if c.flops is not None else {}),
                **({"params": float(cost.params - c.params)} if c.params is not None else {})}

    def attach(self, run_dir: Path, llm_calls: Calls | None = None, progress: bool = True) -> None:
        self.path = Path(run_dir) / JOURNAL

    def _ensure_study(self) -> Any:
        """The study, opened at the first ask or tell (after `restore` and `reclaim` on resume):
        a new journal, replayed from the history and the state."""
        if self.study is not None:
            return self.study
        optuna = self.optuna
        storage: Any = optuna.storages.InMemoryStorage()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)  # derived: what a crash left after the last state is not kept
            storage = optuna.storages.JournalStorage(_journal(optuna, self.path))
        self.study = optuna.create_study(storage=storage, study_name=STUDY, direction="maximize", sampler=self.sampler)
        self._replay()
        return self.study

    def _replay(self) -> None:
        """Trials 0 .. saved_trials-1 as the saved state had them: the history's candidates with
        their results, repeats and infeasible proposals as told then, candidates and echoes still
        being evaluated (`reclaim`) as running trials."""
        State = self.optuna.trial.TrialState
        by_number: dict[int, TrialRecord] = {}
        by_index = {r.trial: r for r in self.history}
        for r in self.history:
            number = r.strategy.get("optuna_trial")
            if isinstance(number, int) and not isinstance(number, bool):
                by_number[number] = r
        for number in range(self.saved_trials):
            if number in by_number:
                r = by_number[number]
                self._add(self._decode(r), _told_value(r))
            elif number in self.reclaimed:
                arch = self.reclaimed[number]
                self.pending[arch.key()] = (self._enqueued(arch), arch)
            elif isinstance(self.extra.get(number), int):
                r = by_index[self.extra[number]]
                self._add(self._decode(r), _told_value(r))
            elif isinstance(self.extra.get(number), list) and self.extra[number][0] == "infeasible":
                arch = self._decode_encoding(self.extra[number][1], f"state: optuna trial {number}")
                self._add(arch, INFEASIBLE_VALUE)
            elif isinstance(self.extra.get(number), list) and self.extra[number][1] in self.pending:
                key = self.extra[number][1]
                self._enqueued(self.pending[key][1])
                self.echoes.setdefault(key, []).append(number)
            else:  # asked but lost (an echo of a candidate no longer in flight): failed
                self.extra[number] = None
                self.study.add_trial(self.optuna.trial.create_trial(state=State.FAIL))

    def _add(self, arch: Architecture, value: float | None) -> None:
        optuna = self.optuna
        self.study.add_trial(optuna.trial.create_trial(
            params=self._params(arch), distributions=self.distributions, constraints=self._constraint_values(arch),
            **({"value": value} if value is not None else {"state": optuna.trial.TrialState.FAIL})))

    def _enqueued(self, arch: Architecture) -> int:
        """A running trial of `arch`: its number."""
        self.study.enqueue_trial(self._params(arch), skip_if_exists=False)
        number, asked = self._ask_study()
        if asked != arch:
            raise RuntimeError(f"optuna: the enqueued architecture came back as {asked.key()}")
        return number

    # -- ask and tell -------------------------------------------------------------------------------------

    def ask(self, n: int) -> list[Candidate]:
        self._ensure_study()
        return [self._next() for _ in range(n)]

    def _next(self) -> Candidate:
        for _ in range(self.max_repeats):
            number, arch = self._ask_study()
            key = arch.key()
            if key in self.known:  # answered from the history: not a candidate
                index, value = self.known[key]
                self._tell(number, value)
                self.extra[number] = index
            elif key in self.pending:  # being evaluated: told with it
                self.echoes.setdefault(key, []).append(number)
                self.extra[number] = ["echo", key]
            elif self.constraint.violation(self.space, arch) is not None:
                self._tell(number, INFEASIBLE_VALUE)
                self.extra[number] = ["infeasible", arch.encode()]
            else:
                return self._candidate(number, arch, "optuna")
        return self._random_fill()

    def _candidate(self, number: int, arch: Architecture, origin: str) -> Candidate:
        self.pending[arch.key()] = (number, arch)
        self.seen.add(arch)
        return Candidate(arch, {"origin": origin, "optuna_trial": number})

    def _random_fill(self) -> Candidate:
        """Optuna proposed only repeats `max_repeats` times: a random unvisited architecture,
        enqueued so that the study holds it like any trial."""
        rng = np.random.default_rng([self.seed, len(self.study.get_trials(deepcopy=False)), 1])
        for _ in range(1000):
            arch = self.space.sample(rng)
            if arch not in self.seen and self.feasible(arch):
                return self._candidate(self._enqueued(arch), arch, "random")
        raise SearchExhausted(f"optuna: sampler '{self.sampler_name}' proposed {self.max_repeats} visited or "
                              "infeasible architectures in a row, and 1000 random draws found no unvisited one")

    def _ask_study(self) -> tuple[int, Architecture]:
        study = self.study
        self._reseed(len(study.get_trials(deepcopy=False)))
        trial = study.ask(self.distributions)
        arch = self._arch(trial.params)
        for name, value in self._constraint_values(arch).items():
            trial.set_constraint(name, value)
        return trial.number, arch

    def _reseed(self, number: int) -> None:
        """Each ask's randomness from (seed, trial number) alone, as a resumed study replays it."""
        lazy = self.optuna.samplers._lazy_random_state.LazyRandomState
        for i, rng in enumerate(_random_states(self.sampler, lazy)):
            rng.rng.seed(int(np.random.SeedSequence([self.seed, number, i]).generate_state(1)[0]))

    def tell(self, trials: list[Trial]) -> None:
        self._ensure_study()
        for t in trials:
            key = t.candidate.arch.key()
            value = _told_value(t.record)
            self.known[key] = (t.record.trial, value)
            self.seen.add(t.candidate.arch)
            asked = self.pending.pop(key, None)
            if asked is not None:
                self._tell(asked[0], value)
            for echo in self.echoes.pop(key, []):
                self._tell(echo, value)
                self.extra[echo] = t.record.trial

    def _tell(self, number: int, value: float | None) -> None:
        if value is None:
            self.study.tell(number, state=self.optuna.trial.TrialState.FAIL, skip_if_finished=True)
        else:
            self.study.tell(number, value, skip_if_finished=True)

    def restore(self, history: list[TrialRecord]) -> None:
        self.history = list(history)
        self.seen, self.known = SeenIndex(), {}
        for r in history:
            self.seen.add(self._decode(r))
            self.known[r.key] = (r.trial, _told_value(r))

    def reclaim(self, in_flight: list[Candidate]) -> None:
        """Candidates being evaluated at the crash, evaluated again now: running trials of the study."""
        for cand in in_flight:
            number = cand.info.get("optuna_trial")
            self.seen.add(cand.arch)
            if isinstance(number, int) and not isinstance(number, bool):
                self.reclaimed[number] = cand.arch

    # -- encoding -----------------------------------------------------------------------------------------

    def _params(self, arch: Architecture) -> dict[str, Any]:
        decisions = self.space.decisions()
        return {n: (v if by else decisions[i].choices.index(v))
                for i, (n, v, by) in enumerate(zip(self.names, self.space.to_values(arch), self.by_value))}

    def _arch(self, params: dict[str, Any]) -> Architecture:
        decisions = self.space.decisions()
        return self.space.from_values([params[n] if by else decisions[i].choices[params[n]]
                                       for i, (n, by) in enumerate(zip(self.names, self.by_value))])

    def _decode(self, record: TrialRecord) -> Architecture:
        return self._decode_encoding(record.encoding, f"trial {record.trial}")

    def _decode_encoding(self, encoding: Any, where: str) -> Architecture:
        try:
            return self.space.decode(encoding)
        except EncodingError as err:
            raise RunDirError(f"{where}: {err}") from None

    # -- state and report ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        trials = self.saved_trials if self.study is None else len(self.study.get_trials(deepcopy=False))
        return {**super().state_dict(), "seed": self.seed, "trials": trials,
                "extra": [[number, ref] for number, ref in sorted(self.extra.items())]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            seed, trials = state["seed"], state["trials"]
            extra = {int(number): ref for number, ref in state["extra"]}
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (seed, trials)):
                raise ValueError(f"seed {seed!r}, trials {trials!r}")
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"strategy 'optuna' state: malformed ({type(err).__name__}: {err})") from None
        self.seed, self.saved_trials, self.extra = seed, trials, extra
        self.sampler = self._make_sampler()

    def report(self, history: list[TrialRecord]) -> dict[str, Any]:
        trials = self.saved_trials if self.study is None else len(self.study.get_trials(deepcopy=False))
        kinds = [ref if ref is None or isinstance(ref, int) else ref[0] for ref in self.extra.values()]
        return {"optuna": {"sampler": self.sampler_name, "version": self.optuna.__version__, "study_trials": trials,
                           "repeats_answered": sum(isinstance(k, int) or k == "echo" for k in kinds),
                           "infeasible": kinds.count("infeasible")}}


def _told_value(record: TrialRecord) -> float | None:
    return float(record.accuracy) if record.ok and record.accuracy is not None else None


def _random_states(sampler: Any, lazy: type, depth: int = 0) -> list[Any]:
    """The sampler's `LazyRandomState`s (its own and its fallback samplers'), in a fixed order."""
    out: list[Any] = []
    for _, value in sorted(vars(sampler).items()):
        found = [value] if isinstance(value, lazy) else \
            _random_states(value, lazy, depth + 1) if depth < 2 and hasattr(value, "reseed_rng") else []
        out.extend(r for r in found if all(r is not o for o in out))
    return out


def _journal(optuna: Any, path: Path) -> Any:
    """The run dir's journal backend: Optuna's file format (one JSON log per line), without its
    lock (the run dir's lock is held for the whole search, so a killed search leaves no stale lock
    for its resume to wait out) and without an fsync per log (8 per trial: most of a table
    search's time; the journal is replayed from the history on resume, so a lost tail costs nothing)."""

    class RunDirJournal(optuna.storages.journal.BaseJournalBackend):
        def __init__(self) -> None:
            self.logs: list[dict[str, Any]] = []

        def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
            return self.logs[log_number_from:]

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            with path.open("ab") as f:
                f.write("".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode())
            self.logs.extend(logs)

    return RunDirJournal()

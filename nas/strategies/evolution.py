"""OFA's constrained evolution (Cai et al., ICLR 2020,
`ofa/nas/search_algorithm/evolution.py` `EvolutionFinder`), for any categorical space.

A generation is `population_size` children: the first is random; after it, the
best `parent_ratio` of the population are the parents, `mutation_ratio` of the
children mutate a random parent (each decision redrawn with `mutate_prob`) and
the rest cross two random parents (each decision from one of them); the
population becomes the parents plus the evaluated children. Every child must
meet the constraint: infeasible (and, with `unique`, visited) children are
redrawn, as OFA redraws until the efficiency predictor accepts.

OFA's loop asks `population_size` × `max_time_budget` predictor queries; here
each child is one evaluation, so the budget (`budget.trials`) sets the number
of generations: trials / population_size.
"""

from __future__ import annotations

from typing import Any

from nas.core.arch import Architecture
from nas.core.space import CategoricalSpace, SearchSpace
from nas.core.trial import Candidate, SearchExhausted, Trial
from nas.errors import ConfigError, RunDirError
from nas.strategies.base import STRATEGIES, Deduplicating, Strategy

POPULATION_SIZE = 20


@STRATEGIES.register("evolution")
class Evolution(Deduplicating, Strategy):
    asynchronous = True
    space: CategoricalSpace  # checked in __init__

    def __init__(self, space: SearchSpace, seed: int, population_size: int = POPULATION_SIZE,
                 parent_ratio: float = 0.25, mutation_ratio: float = 0.5, mutate_prob: float = 0.1,
                 unique: bool = True, max_attempts: int = 100) -> None:
        super().__init__(space, seed)
        if not isinstance(space, CategoricalSpace):
            raise ConfigError(f"strategy 'evolution' needs a categorical space (one choice per decision), "
                              f"not '{space.name}'")
        if population_size < 2 or not 0 < parent_ratio <= 1 or not 0 <= mutation_ratio <= 1 \
                or not 0 < mutate_prob <= 1:
            raise ConfigError("strategy 'evolution': population_size must be >= 2, parent_ratio and mutate_prob "
                              f"in (0, 1], mutation_ratio in [0, 1]; got {population_size}, {parent_ratio}, "
                              f"{mutate_prob}, {mutation_ratio}")
        self.population_size = population_size
        self.parents_size = max(1, int(round(parent_ratio * population_size)))   # OFA's rounding
        self.mutations = int(round(mutation_ratio * population_size))
        self.mutate_prob = mutate_prob
        self.unique = unique
        self.max_attempts = max_attempts
        self.population: list[tuple[Any, str, float]] = []   # (encoding, key, accuracy) of evaluated members
        self.queue: list[tuple[Any, dict[str, Any]]] = []     # (encoding, info) of this generation's children
        self.generation = -1
        self._init_seen()

    @classmethod
    def random_start(cls, params: dict[str, Any]) -> int:
        return int(params.get("population_size", POPULATION_SIZE))  # the first generation has no parents

    # -- ask ----------------------------------------------------------------------------------------------

    def ask(self, n: int) -> list[Candidate]:
        out = []
        for _ in range(n):
            if not self.queue:
                self._breed()
            enc, info = self.queue.pop(0)
            out.append(Candidate(self.space.decode(enc), info))
        return out

    def _breed(self) -> None:
        """The next generation's children (the first: random), queued in order."""
        self.generation += 1
        parents = sorted(self.population, key=lambda m: -m[2])[: self.parents_size]
        self.population = list(parents)
        info: dict[str, Any]
        for j in range(self.population_size):
            if not parents:
                arch, info = self._child(lambda: self.space.sample(self.rng)), {"origin": "random"}
            elif j < self.mutations:
                parent = parents[int(self.rng.integers(len(parents)))]
                arch = self._child(lambda: self._mutate(parent[0]))
                info = {"origin": "mutation", "parent": parent[1]}
            else:
                a, b = (parents[int(i)] for i in self.rng.integers(len(parents), size=2))
                arch = self._child(lambda: self._crossover(a[0], b[0]))
                info = {"origin": "crossover", "parents": [a[1], b[1]]}
            if arch is None:   # the parents' neighbourhood is used up: a random child instead
                arch, info = self._child(lambda: self.space.sample(self.rng), self.max_attempts * 10), \
                    {"origin": "random"}
            if arch is None:
                if self.queue:
                    return
                raise SearchExhausted("evolution: no unvisited feasible architecture found")
            if self.unique:
                self.seen.add(arch)
            self.queue.append((arch.encode(), {**info, "generation": self.generation}))

    def _child(self, make, attempts: int | None = None) -> Architecture | None:
        for _ in range(attempts or self.max_attempts):
            arch = make()
            if self.feasible(arch) and not (self.unique and arch in self.seen):
                return arch
        return None

    def _mutate(self, encoding: Any) -> Architecture:
        values = self.space.to_values(self.space.decode(encoding))
        for i, d in enumerate(self.space.decisions()):
            if self.rng.random() < self.mutate_prob:
                values[i] = d.choices[int(self.rng.integers(len(d.choices)))]
        return self.space.from_values(values)

    def _crossover(self, enc_a: Any, enc_b: Any) -> Architecture:
        a = self.space.to_values(self.space.decode(enc_a))
        b = self.space.to_values(self.space.decode(enc_b))
        return self.space.from_values([x if self.rng.random() < 0.5 else y for x, y in zip(a, b)])

    # -- tell and state -----------------------------------------------------------------------------------

    def tell(self, trials: list[Trial]) -> None:
        for t in trials:
            self.seen.add(t.candidate.arch)
            if t.record.ok and t.record.accuracy is not None:
                self.population.append((t.candidate.arch.encode(), t.candidate.arch.key(),
                                        float(t.record.accuracy)))

    def _pending(self) -> list[Any]:
        return [enc for enc, _ in self.queue]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "population": [list(m) for m in self.population],
                "queue": [[enc, info] for enc, info in self.queue], "generation": self.generation}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        try:
            population = [(enc, str(key), float(acc)) for enc, key, acc in state["population"]]
            queue = [(enc, dict(info)) for enc, info in state["queue"]]
            generation = int(state["generation"])
        except (KeyError, TypeError, ValueError) as err:
            raise RunDirError(f"strategy 'evolution' state: malformed population ({err})") from None
        self.population, self.queue, self.generation = population, queue, generation

"""Pure proxy search: score each candidate by zero-cost proxies on one minibatch of the run's data,
with no training (seconds per candidate on a CPU).

The loop ranks by `accuracy`, and a proxy's raw value means nothing on its own and does not compare
across proxies, so `accuracy` here is NOT an accuracy: it is the vote's percentile (0-100) against a
fixed reference sample of the space (`reference` architectures drawn with `seed`). Per proxy, the
share of the reference the candidate beats (ties count half), averaged over `proxies`. It is fixed per
candidate (cacheable, comparable across a run and across runs with the same settings); the raw scores
are in `metrics` as `proxy_<name>` and the same value as `vote_percentile`. Weights, minibatch and
reference are all drawn with the evaluator's own `seed`, so the run's seed changes nothing.

Only trusted, sampleable spaces (NB201): untrusted model source is never built in-process (its
proxies are the `proxy_*` metrics evaluator=train computes on the sandbox's exported graph), and an
open-ended space has no random sample to be a reference."""

from __future__ import annotations

import time
from functools import cached_property
from typing import Any

import numpy as np

from nas.core.arch import Architecture, stable_hash
from nas.core.registry import check_count, check_keys
from nas.core.space import SearchSpace
from nas.core.trial import EvalResult
from nas.errors import ConfigError, RunDirError
from nas.evaluators.base import EVALUATORS, Evaluator
from nas.home import home
from nas.io import atomic_write_json, read_json
from nas.lazy import LazyImport
from nas.status import status
from nas.train.build import build_model

# torch (and scipy, the data loaders) load with the evaluator, not with its module
data_sources = LazyImport("nas.data.sources")
nas_proxies = LazyImport("nas.proxies")
proxy_batch = LazyImport("nas.proxies.batch")
measure = LazyImport("nas.measure")


@EVALUATORS.register("proxy")
class ProxyEvaluator(Evaluator):
    @classmethod
    def accepts(cls, space: type[SearchSpace]) -> bool:
        return space.trainable and space.trusted and not space.open_ended

    def __init__(self, space: SearchSpace, data: dict[str, Any], proxies: list[str] | None = None,
                 batch_size: int = 64, reference: int = 32, seed: int = 0, **sizing: Any) -> None:
        """`sizing`: the networks' settings, as evaluator=train's (NB201's `channels`, `cells_per_stage`)."""
        super().__init__(space)
        if not isinstance(data, dict) or data.get("name") not in data_sources.SOURCES:
            got = data.get("name") if isinstance(data, dict) else data
            raise ConfigError(f"data: unknown dataset '{got}' (valid: {', '.join(data_sources.SOURCES)})")
        self.data_cfg = dict(data)
        check_keys("data", self.data_cfg, ["name", "root", "split_file"])
        self.proxies = list(nas_proxies.VOTE if proxies is None else proxies)
        if not self.proxies or not all(isinstance(p, str) for p in self.proxies):
            raise ConfigError(f"evaluator.proxies must be a non-empty list of proxy names, got {proxies!r}")
        for name in self.proxies:
            nas_proxies.PROXIES.get(name)  # an unknown name: one line listing the valid ones
        check_count("evaluator.batch_size", batch_size)
        check_count("evaluator.reference", reference)
        self.batch_size, self.reference, self.seed = batch_size, reference, seed
        self.build = type(space).sizing_options(sizing, "evaluator 'proxy'", ProxyEvaluator)
        self.data = data_sources.load_data(**self.data_cfg)  # a missing dataset fails here, before any trial
        if batch_size > len(self.data.train):
            raise ConfigError(f"evaluator.batch_size={batch_size} is more than the {len(self.data.train)} "
                              f"training images of {self.data.name}")
        self._reference: dict[str, np.ndarray] | None = None

    def fingerprint(self) -> str:
        return stable_hash("proxy", self.data_cfg, self.proxies, self.batch_size, self.reference, self.seed,
                           self.build)

    @cached_property
    def batch(self) -> Any:
        """The one minibatch every candidate and the reference are scored on."""
        return proxy_batch.data_batch(self.data, self.batch_size, self.seed)

    def _scores(self, arch: Architecture) -> tuple[dict[str, float], Any]:
        """The proxies' scores and the network they scored."""
        net = build_model(self.space, arch, self.batch.shape, self.batch.num_classes, self.build, self.seed)
        return nas_proxies.score_network(net, self.batch, self.proxies, self.seed), net

    def prepare(self, show: bool) -> None:
        self.reference_scores(show)

    def reference_scores(self, show: bool = False) -> dict[str, np.ndarray]:
        """Each proxy's sorted scores over the reference sample: scored once per settings (tens of
        seconds for 32 cells on a CPU) and kept under $NASFLOW_HOME, so the workers, the Prefect
        tasks and later runs with the same settings read it."""
        if self._reference is not None:
            return self._reference

        rng = np.random.default_rng(self.seed)
        sample = [self.space.sample(rng) for _ in range(self.reference)]
        # the scoring settings and the cells themselves: another space never reads this sample's scores
        name = stable_hash(self.fingerprint(), type(self.space).__name__, [a.key() for a in sample])
        path = home() / "proxy_reference" / f"{name}.json"
        try:
            stored = read_json(path)
            self._reference = {n: np.asarray(stored[n], dtype=float) for n in self.proxies}
            return self._reference
        except (OSError, RunDirError, KeyError, TypeError, ValueError):  # none yet, or unreadable: score it
            pass
        rows = []
        with status(f"scoring evaluator=proxy's reference sample of {self.reference} cells (once per settings)",
                    total=self.reference, show=show) as advance:
            for arch in sample:
                rows.append(self._scores(arch)[0])
                advance()
        self._reference = {n: np.sort([r[n] for r in rows]) for n in self.proxies}
        atomic_write_json(path, {n: v.tolist() for n, v in self._reference.items()})
        return self._reference

    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        start = time.perf_counter()
        reference = self.reference_scores()  # the first candidate pays for it
        scores, net = self._scores(arch)
        shares = [(np.searchsorted(ref, scores[n], "left") + np.searchsorted(ref, scores[n], "right")) / 2 / len(ref)
                  for n, ref in reference.items()]
        percentile = round(100.0 * float(np.mean(shares)), 4)
        metrics = {f"proxy_{n}": s for n, s in scores.items()} | {"vote_percentile": percentile}
        return EvalResult(accuracy=percentile, metrics=metrics, params=measure.count_params(net),
                          flops=measure.count_flops(net, (1, *self.batch.shape)),
                          cost_seconds=time.perf_counter() - start)

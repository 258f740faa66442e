"""Evaluate by training: the candidate is built, trained with a recipe and scored.

The objective is validation accuracy (test accuracy is recorded, never used
to choose). Spaces that are `trainable` train: trusted ones (NB201 cells, NADER
block files) are built in-process by the space; untrusted ones (FairNAD's model
source) are not: the sandbox exports them as graph data, which trains in a limited
trusted worker (see `nas.sandbox.graph`, `nas.sandbox.trusted`); one that cannot be exported trains inside the sandbox
and its metrics say `self_reported: 1.0`. Before training, zero-cost
`proxies` (nas.proxies) score each candidate's untrained network on one
minibatch, recorded as `proxy_<name>` metrics: here for a trusted space's,
in the trusted training worker for an exported graph (a network trained in the
sandbox has none: its graph never leaves it). With `seeds` (NB201 uses
777, 888, 999) every candidate trains once per seed and the mean is the
objective; otherwise the run's seed is used. Data, recipe, engine and seeds
enter the cache key; early-terminated candidates are failures with the reason,
so strategies skip them and the cache keeps them.
"""

from __future__ import annotations

import logging
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from nas.core.arch import Architecture, stable_hash
from nas.core.registry import check_keys
from nas.core.space import SearchSpace
from nas.core.trial import EvalResult
from nas.errors import ConfigError, EvaluationError, NasError
from nas.evaluators.base import EVALUATORS, Evaluator
from nas.lazy import LazyImport
from nas.sandbox.isolation import isolation
from nas.sandbox.limits import Limits
from nas.sandbox.verify import ProxyRequest, train_model_source
from nas.train.build import build_model
from nas.train.engine import Engine
from nas.train.progress import OnEpoch, combine, prefect_progress
from nas.train.recipe import Recipe
from nas.train.result import TrainResult
from nas.train.worker import train_in_subprocess

# torch (and scipy, the data loaders) load with the evaluator, not with its module
data_sources = LazyImport("nas.data.sources")
nas_proxies = LazyImport("nas.proxies")
proxy_batch = LazyImport("nas.proxies.batch")
training_run = LazyImport("nas.train.run")

if TYPE_CHECKING:  # torch and the data loaders load with the evaluator, not with its module:
    import torch  # a config error found before the evaluator is built need not pay for them

    from nas.spaces.source.arch import SourceArch  # the one untrusted space's architectures
else:
    torch = LazyImport("torch")

# A training run needs far more than a verification: the defaults allow an
# hour of wall time on all cores and 8 GB on top of the data.
log = logging.getLogger(__name__)

SANDBOX_DEFAULTS: dict[str, Any] = {"wall_s": 3600.0, "cpu_s": 4 * 3600, "memory_mb": 8192, "file_mb": 64,
                                   "tmp_mb": Limits.tmp_mb}
# Images the zero-cost proxies see per candidate: one small minibatch keeps them ~1 s on a CPU.
PROXY_BATCH = 32
# How model source's networks start training (in an untrusted space's fingerprint, so its cached
# results from before, trained from the sandbox's own initial values, are not reused).
SOURCE_INIT = "drawn here by role (nas.sandbox.graph.GraphNet.reinitialise)"


@EVALUATORS.register("train")
class TrainEvaluator(Evaluator):
    trains = True

    @classmethod
    def accepts(cls, space: type[SearchSpace]) -> bool:
        return space.trainable

    def __init__(self, space: SearchSpace, data: dict[str, Any], recipe: dict[str, Any],
                 engine: dict[str, Any] | None = None, seeds: list[int] | None = None,
                 sandbox: dict[str, float] | None = None, trust_self_reported: bool = False,
                 proxies: list[str] | None = None, **sizing: Any) -> None:
        """`sizing`: the networks' settings, each space's own (`SearchSpace.sizing`: NB201's
        `channels`, a block file's `skeleton` and `budget`...). `proxies`: the zero-cost proxies
        recorded per candidate (None: the vote's synflow, jacob_cov, snip; []: none)."""
        super().__init__(space)
        # May numbers a model reported from inside the sandbox be a run's best (nas.core.trial.TrialRecord.counts_for_best)?
        # Not in the fingerprint: it changes no result.
        self.trust_self_reported = trust_self_reported
        # Who hears of each trained epoch (`nas train`'s display); inside a Prefect run each
        # training also gets a progress artifact. Not in the fingerprint: it changes no result.
        self.on_epoch: OnEpoch | None = None
        if not isinstance(data, dict) or data.get("name") not in data_sources.SOURCES:
            got = data.get("name") if isinstance(data, dict) else data
            raise ConfigError(f"data: unknown dataset '{got}' (valid: {', '.join(data_sources.SOURCES)})")
        if not isinstance(recipe, dict):
            raise ConfigError(f"recipe must be a mapping of recipe settings, got {recipe!r}")
        self.data_cfg = dict(data)
        check_keys("data", self.data_cfg, ["name", "root", "split_file"])
        self.recipe = Recipe.from_dict(recipe)
        self.engine = Engine.from_dict(dict(engine or {}))
        self.build = type(space).sizing_options(sizing, "evaluator 'train'", TrainEvaluator, every_space=True)
        if seeds is not None and (not seeds or not all(type(s) is int and s >= 0 for s in seeds)):
            raise ConfigError(f"evaluator.seeds must be a non-empty list of integers >= 0 or null, got {seeds!r}")
        self.seeds = list(seeds) if seeds is not None else None
        self.uses_seed = self.seeds is None  # with fixed seeds, the run's seed changes nothing
        check_keys("evaluator.sandbox", sandbox or {}, list(SANDBOX_DEFAULTS))
        self.limits = Limits(**{**SANDBOX_DEFAULTS, **(sandbox or {})})
        self.proxies = list(nas_proxies.VOTE if proxies is None else proxies)
        if not all(isinstance(p, str) for p in self.proxies):
            raise ConfigError(f"evaluator.proxies must be a list of proxy names, got {proxies!r}")
        for name in self.proxies:
            nas_proxies.PROXIES.get(name)  # an unknown name: one line listing the valid ones
        # Not in the fingerprint: the proxies are extra metrics, they change no result.
        self.data = data_sources.load_data(**self.data_cfg)  # a missing dataset fails here, before any trial
        if not space.trusted:

            isolation()  # no OS isolation and no opt-out: one line now, before any trial

    @property
    def batched(self) -> bool:
        return self.engine.concurrent > 1

    def fingerprint(self) -> str:
        # Data is identified by its config (name, root, split file); loading it here would cost seconds.
        return stable_hash("train", self.data_cfg, self.recipe.to_dict(), self.engine.to_dict(),
                           self.build, self.seeds, *([] if self.space.trusted else [SOURCE_INIT]))

    def evaluate(self, arch: Architecture, seed: int | None = None) -> EvalResult:
        result = self.evaluate_batch([arch], seed)[0]
        if result.error and not result.error.startswith("terminated early"):
            raise EvaluationError(result.error)
        return result

    def evaluate_batch(self, archs: list[Architecture], seed: int | None = None) -> list[EvalResult]:
        """Per candidate, one `TrainResult` per seed, combined; candidates that fail to
        build or verify get their error, the rest train together (`engine.concurrent`)."""
        seeds = self.seeds or [0 if seed is None else seed]
        runs: list[list[TrainResult] | str] = [[] for _ in archs]
        proxies: list[dict[str, float]] = [{} for _ in archs]
        sources = list(range(len(archs))) if not self.space.trusted else []
        with ThreadPoolExecutor(max_workers=self.engine.concurrent) as pool:  # sandbox children run in parallel
            # an untrusted space's architectures are model files (SourceArch)
            futures = {i: pool.submit(self._train_source, archs[i], seeds, proxies[i])  # type: ignore[arg-type]
                       for i in sources}
            trusted = [i for i in range(len(archs)) if i not in futures]
            for i in trusted:
                proxies[i] = self._proxies_of_trusted(archs[i], seeds[0])
            for s in seeds:
                self._train_trusted(archs, trusted, s, runs)
            reported = set()
            for i, future in futures.items():
                runs[i], self_reported = future.result()
                if self_reported:
                    reported.add(i)
        results = [_combine(r, seeds, i in reported) for i, r in enumerate(runs)]
        for result, scores in zip(results, proxies):
            result.metrics.update({f"proxy_{n}": v for n, v in scores.items()})
        return results

    def _proxies_of_trusted(self, arch: Architecture, seed: int) -> dict[str, float]:
        """The proxies of `arch`'s untrained network (built here: a trusted space's) on `PROXY_BATCH`
        training images drawn with `seed`; {} when none are asked for or the network does not build
        (training then records why)."""
        if not self.proxies:
            return {}
        try:
            net = build_model(self.space, arch, self.data.shape, self.data.num_classes, self.build, seed)
        except NasError:
            return {}
        batch = proxy_batch.data_batch(self.data, min(PROXY_BATCH, len(self.data.train)), seed)
        return nas_proxies.score_network(net, batch, self.proxies, seed)

    def _train_trusted(self, archs: list[Architecture], todo: list[int], seed: int,
                       runs: list[list[TrainResult] | str]) -> None:
        todo = [i for i in todo if not isinstance(runs[i], str)]
        if self.engine.devices > 1:

            for i in todo:
                try:
                    runs[i].append(train_in_subprocess(  # type: ignore[union-attr]
                        self.space, archs[i], data=self.data_cfg, recipe=self.recipe.to_dict(),
                        engine=self.engine.to_dict(), build=self.build, seed=seed,
                        timeout_s=self.limits.wall_s))
                except NasError as err:
                    runs[i] = str(err)
            return
        built: dict[int, torch.nn.Module] = {}
        for i in todo:
            try:
                built[i] = build_model(self.space, archs[i], self.data.shape, self.data.num_classes, self.build, seed)
            except NasError as err:
                runs[i] = str(err)
        labels = [f"{archs[i].space} {archs[i].key()}" + (f" seed {seed}" if self.seeds else "") for i in built]
        results = training_run.train_many(list(built.values()), self.data, self.recipe, seed, self.engine,
                                          combine(self.on_epoch, prefect_progress()), labels)
        for i, result in zip(built, results):
            runs[i].append(result)  # type: ignore[union-attr]

    def _train_source(self, arch: SourceArch, seeds: list[int],
                      proxies: dict[str, float]) -> tuple[list[TrainResult] | str, bool]:
        """(results or the error, whether the sandbox trained it and reported the numbers itself);
        `proxies` gets the exported graph's proxy scores, which the training worker computes."""
        def heard(scores: dict[str, float] | str) -> None:
            if isinstance(scores, str):  # an exported op a proxy cannot run (float64, say): no proxies
                log.warning("%s %s: no proxy scores (%s)", arch.space, arch.key(), scores)
            else:
                proxies.update(scores)

        gpu = self.engine.accelerator == "gpu" or (self.engine.accelerator == "auto" and torch.cuda.is_available())
        verdict, results = train_model_source(
            arch.source, data=self.data_cfg, recipe=self.recipe.to_dict(), engine=self.engine.to_dict(),
            seeds=seeds, num_classes=self.data.num_classes, input_shape=(2, *self.data.shape), gpu=gpu,
            threads=torch.get_num_threads(), limits=self.limits, filename=arch.filename,
            on_epoch=combine(self.on_epoch, prefect_progress()), label=f"{arch.space} {arch.key()}",
            proxies=ProxyRequest(tuple(self.proxies), PROXY_BATCH, heard) if self.proxies else None,
            checked=arch.checked)
        return (results if verdict.ok else verdict.error or verdict.stage), verdict.self_reported


def _combine(runs: list[TrainResult] | str, seeds: list[int], self_reported: bool = False) -> EvalResult:
    """Mean over seeds; any seed terminated early makes the candidate a failure. Accuracy is the
    mean over the seeds that measured one (a terminated seed has none), absent when none did."""
    if isinstance(runs, str):
        return EvalResult.failure(runs)
    measured = [(s, r.valid_accuracy, r.test_accuracy) for s, r in zip(seeds, runs)
                if r.valid_accuracy is not None and r.test_accuracy is not None]
    valid = [v for _, v, _ in measured]
    metrics: dict[str, float] = {}
    if measured:
        metrics["valid_accuracy"] = round(statistics.fmean(valid), 4)
        metrics["test_accuracy"] = round(statistics.fmean(t for *_, t in measured), 4)
    metrics.update({"epochs": float(statistics.fmean(r.epochs for r in runs)),
                    "device_seconds": round(sum(r.device_seconds * r.world_size for r in runs), 3),
                    # how the numbers were computed: compile/capture time, and the share of seeds whose
                    # training step ran as a captured CUDA graph (1.0 all, 0.0 eager: off, or failed)
                    "compile_seconds": round(sum(r.compile_seconds for r in runs), 3),
                    "cuda_graphs": round(statistics.fmean(r.cuda_graphs == "on" for r in runs), 4)})
    if len(measured) > 1:
        metrics["valid_accuracy_std"] = round(statistics.pstdev(valid), 4)
    if len(runs) > 1:
        metrics.update({f"valid_accuracy_seed{s}": v for s, v, _ in measured})
    curves = [r.loss_curve for r in runs]
    curve = [statistics.fmean(c[e] for c in curves) for e in range(min(map(len, curves)))]
    if curve:
        metrics["final_train_loss"] = curve[-1]
    if self_reported:
        metrics["self_reported"] = 1.0
    result = EvalResult(accuracy=metrics.get("valid_accuracy"), metrics=metrics, params=runs[0].params,
                        flops=runs[0].flops, cost_seconds=round(sum(r.wall_seconds for r in runs), 3), curve=curve)
    stopped = [(s, r.terminated) for s, r in zip(seeds, runs) if r.terminated]
    if stopped:
        where = f" (seed {stopped[0][0]})" if len(runs) > 1 else ""
        result.accuracy, result.error = None, f"terminated early: {stopped[0][1]}{where}"
    return result

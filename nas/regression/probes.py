"""The regression probes: each runs real work (table searches, NB201 forward passes, the
embedded LLM, a small open-ended design run) and returns named metrics; `run_suite`
runs a suite's probes in turn and judges them (nas/regression/judge.py). Application
code: it composes configs and runs searches through the library (nas/config.py,
nas/execute.py); `nas regress` and the nightly-regression flow call it.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from nas.config import check_config
from nas.core.trial import best_so_far, read_history
from nas.errors import ConfigError, EvaluationError, MissingDependencyError
from nas.evaluators.table import TableEvaluator
from nas.execute import execute
from nas.lazy import LazyImport
from nas.llm.local import PROMPT_CACHE_MB, LocalServer, check_server_deps, model_path, stop_shared
from nas.regression.judge import (
    HIGHER,
    LOWER,
    Metric,
    Probe,
    Suite,
    failed_probe,
    finish,
    metric_dict,
    plan,
)
from nas.search.loop import LocalExecutor, SearchLoop
from nas.search.spec import Component, SearchSpec
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import NB201Space

# torch, qdrant: loaded by the probes that use them
torch = LazyImport("torch")
knowledge_store = LazyImport("nas.knowledge.store")


class ProbeSkipped(Exception):
    """The probe cannot run on this machine (e.g. no LLM); the reason is recorded instead."""


TABLE_STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {  # as benchmarks/collm_nb201.py
    "random": ("random", {"unique": True}),
    "rea": ("rea", {"population_size": 20, "sample_size": 5, "unique": True}),
    "reinforce": ("reinforce", {"learning_rate": 0.01, "momentum": 0.9}),
    "evolution": ("evolution", {"population_size": 20, "parent_ratio": 0.25, "mutation_ratio": 0.5,
                                "mutate_prob": 0.1}),
}
FORWARD_CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|skip_connect~0|nor_conv_3x3~1|nor_conv_3x3~2|"


def table_probe(workdir: Path, overrides: Sequence[str], strategies: Sequence[str], seeds: int,
                trials: int, at: Sequence[int]) -> dict[str, Metric]:
    """Best table accuracy at N trials, mean over fixed seeds: deterministic, so the tolerance is tight."""
    metrics: dict[str, Metric] = {}
    seconds, done = 0.0, 0
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for label in strategies:
            name, params = TABLE_STRATEGIES[label]
            curves = []
            for seed in range(seeds):
                spec = SearchSpec(space=Component("nb201"), strategy=Component(name, params),
                                  evaluator=Component("table"), seed=seed, trials=trials)
                run_dir = Path(tmp) / f"{label}_s{seed}"
                start = time.perf_counter()
                summary = SearchLoop(spec, run_dir, LocalExecutor(spec.build_evaluator(spec.build_space()), None),
                                     progress=False).run_search()
                seconds += time.perf_counter() - start
                done += summary["trials"]
                curve = best_so_far(read_history(run_dir / "history.jsonl"))
                curves.append(curve + [curve[-1]] * (trials - len(curve)))  # stopped early: keeps its best
            for n in at:
                metrics[f"{label}.best_at_{n}"] = Metric(round(statistics.fmean(_at(c, n, label) for c in curves), 4),
                                                          HIGHER, {"abs": 0.05}, unit="%")
    metrics["trials_per_s"] = Metric(round(done / seconds, 2), HIGHER, {"rel": 0.5}, timing=True,
                                     unit="trials/s")
    return metrics


def _at(curve: list[float | None], n: int, label: str) -> float:
    """Best accuracy after `n` trials; a run with no successful trial by then has no number to average."""
    value = curve[n - 1]
    if value is None:
        raise EvaluationError(f"regression: a {label} run has no successful trial among its first {n}")
    return value


def throughput_probe(workdir: Path, overrides: Sequence[str], lookups: int,
                     forward_repeats: int) -> dict[str, Metric]:
    """Table evaluations/s and, if asked, the forward time of a fixed NB201 network (batch 16, 32×32)."""
    space = NB201Space()
    evaluator = TableEvaluator(space)
    rng = np.random.default_rng(0)
    cells = [space.sample(rng) for _ in range(min(lookups, 2000))]
    evaluator.evaluate(cells[0])
    start = time.perf_counter()
    for i in range(lookups):
        evaluator.evaluate(cells[i % len(cells)])
    metrics = {"table_evals_per_s": Metric(round(lookups / (time.perf_counter() - start), 1), HIGHER,
                                           {"rel": 0.5}, timing=True, unit="evals/s")}
    if forward_repeats:
        net = space.build(NB201Cell.from_string(FORWARD_CELL), num_classes=10).eval()
        x = torch.randn(16, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        times = []
        with torch.no_grad():
            for i in range(forward_repeats + 2):  # two warm-up passes
                start = time.perf_counter()
                net(x)
                if i >= 2:
                    times.append(time.perf_counter() - start)
        metrics["forward_ms"] = Metric(round(1000 * statistics.median(times), 2), LOWER, {"rel": 1.0},
                                       timing=True, unit="ms")
    return metrics


def llm_probe(workdir: Path, overrides: Sequence[str], calls: int, max_tokens: int) -> dict[str, Metric]:
    """Completion tokens/s of the embedded model (the `llm=local` path), temperature 0."""

    llm = check_config(list(overrides)).get("llm") or {}
    if llm.get("backend") != "local":
        raise ProbeSkipped(f"llm.backend is '{llm.get('backend')}'; this probe measures the embedded model")
    local = llm.get("local") or {}
    server = LocalServer(n_ctx=int(local.get("n_ctx", 4096)), n_threads=local.get("n_threads"),
                         startup_timeout_s=float(local.get("startup_timeout_s", 120)),
                         prompt_cache_mb=int(local.get("prompt_cache_mb", PROMPT_CACHE_MB)),
                         log_path=workdir / "llm-server.log")
    try:
        start = time.perf_counter()
        server.start()
    except MissingDependencyError as err:
        raise ProbeSkipped(str(err)) from None
    startup = time.perf_counter() - start
    try:
        from openai import OpenAI  # lazy: loads openai (start-up time)

        sdk = OpenAI(base_url=server.base_url, api_key="local", max_retries=0)
        tokens, seconds = 0, 0.0
        for i in range(calls):
            start = time.perf_counter()
            reply = sdk.chat.completions.create(
                model=server.alias, temperature=0.0, max_tokens=max_tokens,
                messages=[{"role": "user", "content": f"Describe design idea {i + 1} for a small image "
                                                      "classifier block in a few sentences."}])
            seconds += time.perf_counter() - start
            tokens += reply.usage.completion_tokens
    finally:
        server.stop()
    return {"tokens_per_s": Metric(round(tokens / seconds, 2), HIGHER, {"rel": 0.5}, timing=True, unit="tokens/s"),
            "startup_s": Metric(round(startup, 2), LOWER, None, timing=True, unit="s")}


def design_probe(workdir: Path, overrides: Sequence[str], trials: int, lif_tries: int) -> dict[str, Metric]:
    """A tiny open-ended design run (the default job: NADER, the configured LLM, digits, evaluator=quick):
    the root block trains and the LLM path proposes, with few Modifier retries to bound the LLM time;
    an LLM's output varies, so tolerances are loose."""
    run_dir = workdir / "design-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a retried probe measures afresh, never resumes
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        cfg = check_config(["space=nader", "strategy=nader", "evaluator=quick", "data=digits", "recipe=quick",
                              f"budget.trials={trials}", "seed=0", "llm.cache=false",  # measure afresh
                              f"strategy.lif_tries={lif_tries}", f"knowledge.path={Path(tmp) / 'qdrant'}",
                              *overrides])
        llm = cfg.get("llm") or {}
        if llm.get("backend") == "local":

            try:
                model_path()
                check_server_deps()
            except MissingDependencyError as err:
                raise ProbeSkipped(str(err)) from None
        start = time.perf_counter()
        try:
            summary = execute(SearchSpec.from_config(cfg), run_dir, {"name": "local"}, progress=False)
        except MissingDependencyError as err:  # e.g. the embedding model of the knowledge store
            raise ProbeSkipped(str(err)) from None
        finally:
            stop_shared()
            knowledge_store.close_client(path=Path(tmp) / "qdrant")
        wall = time.perf_counter() - start
    history = read_history(run_dir / "history.jsonl")
    design = summary.get("design") or {}
    metrics = {
        "trials": Metric(summary["trials"], HIGHER, {"abs": 0}),
        "proposals": Metric(design.get("proposals", 0), HIGHER, {"abs": 0}),
        "valid": Metric(design.get("valid", 0), HIGHER, None),
        "llm_tokens": Metric((summary.get("llm") or {}).get("total", {}).get("tokens", 0), LOWER, None),
        "wall_s": Metric(round(wall, 1), LOWER, {"rel": 2.0}, timing=True, unit="s"),
    }
    if history and history[0].accuracy is not None:  # absent: the root did not train → "missing"
        metrics["root_accuracy"] = Metric(round(history[0].accuracy, 2), HIGHER, {"abs": 3.0}, unit="%")
    return metrics


SUITES: dict[str, Suite] = {
    "smoke": Suite("smoke", (
        Probe("table", table_probe, {"strategies": ("random", "rea"), "seeds": 2, "trials": 25, "at": (10, 25)}),
        Probe("throughput", throughput_probe, {"lookups": 5000, "forward_repeats": 0}),
    ), compare_timings=False),
    "nightly": Suite("nightly", (
        Probe("table", table_probe, {"strategies": tuple(TABLE_STRATEGIES), "seeds": 5, "trials": 100,
                                     "at": (25, 50, 100)}),
        Probe("throughput", throughput_probe, {"lookups": 50000, "forward_repeats": 10}),
        Probe("llm", llm_probe, {"calls": 3, "max_tokens": 64}),
        Probe("design", design_probe, {"trials": 2, "lif_tries": 2}),
    ), compare_timings=True),
}


def get_suite(name: str) -> Suite:
    if name not in SUITES:
        raise ConfigError(f"unknown suite '{name}' (valid: {', '.join(SUITES)})")
    return SUITES[name]


def run_probe(suite: str, name: str, out: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """One probe → {name, metrics, skipped, error, seconds}; a crash propagates (Prefect retries it)."""
    probe = get_suite(suite).probe(name)
    workdir = Path(out) / "probes" / name
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    result: dict[str, Any] = {"name": name, "metrics": {}, "skipped": None, "error": None}
    try:
        metrics = probe.fn(workdir=workdir, overrides=list(overrides), **probe.params)
        result["metrics"] = {f"{name}.{k}": metric_dict(m, get_suite(suite)) for k, m in metrics.items()}
    except ProbeSkipped as why:
        result["skipped"] = str(why)
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def run_suite(suite: str, baseline: str | Path | None = None, out: str | Path | None = None, *,
              overrides: Sequence[str] = (), update: bool = False, progress: bool = True) -> dict[str, Any]:
    """Every probe of the suite in turn (never concurrently: timings must not compete), then the report."""
    p = plan(get_suite(suite), baseline, out, update)
    start = time.perf_counter()
    results = []
    with _progress(progress, len(p.suite.probes)) as bar:
        for probe in p.suite.probes:
            bar.step(probe.name)
            try:
                results.append(run_probe(suite, probe.name, p.out, overrides))
            except Exception as err:  # a crashed probe is reported (its metrics "missing"), not fatal
                results.append(failed_probe(probe.name, err))
        bar.step("compare")
    return finish(p, results, overrides, round(time.perf_counter() - start, 1))


class _progress:
    """A rich progress bar over the probes on stderr (or nothing)."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total, self.started = enabled, total, False
        self.bar: Any = None  # a rich Progress once started
        self.task: Any = None

    def __enter__(self) -> "_progress":
        if self.enabled:
            self.bar = Progress(TextColumn("[bold]regression[/] {task.description}"), BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), console=Console(file=sys.stderr))
            self.bar.__enter__()
            self.task = self.bar.add_task("", total=self.total)
        return self

    def step(self, name: str) -> None:
        """The previous step is done; `name` starts."""
        if self.bar is not None:
            self.bar.update(self.task, description=name, advance=1 if self.started else 0)
        self.started = True

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

"""The evaluators case by case (issue 52, the library mutation run): the base API's defaults,
the table and simulated evaluators' settings at and either side of each limit and their timings
on a scripted clock, the simulated clock's schedule, the proxy evaluator's percentile, and the
train evaluator's combination of seeds and its checks, on stand-in training results."""

from __future__ import annotations

import math
import statistics
import types
import zlib

import numpy as np
import pytest
from torch import nn

from nas.core.trial import EvalResult
from nas.errors import ConfigError, EvaluationError, NasError
from nas.evaluators import base, proxy, simulated, table, train
from nas.evaluators.base import EVALUATORS, Evaluator, evaluate_safely
from nas.spaces.nb201.space import NB201Space
from nas.train.result import TrainResult

SPACE = NB201Space()
DIGITS = {"name": "digits"}
RECIPE = {"epochs": 1, "batch_size": 64, "train_subset": 128, "valid_subset": 64, "test_subset": 64}
SIZING = {"channels": 4, "cells_per_stage": 1}


class Clock:
    """A module's `time`: scripted perf_counter readings, and the sleeps asked for."""

    def __init__(self, *readings: float):
        self.readings, self.slept = list(readings), []

    def perf_counter(self) -> float:
        return self.readings.pop(0)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def arch(key: str):
    return types.SimpleNamespace(key=lambda: key, space="x")


@pytest.fixture(scope="module")
def table_evaluator():
    return table.TableEvaluator(SPACE)


# ---------------------------------------------------------------- the base API

class Plain(Evaluator):
    @classmethod
    def accepts(cls, space):
        return space.tabular

    def fingerprint(self):
        return "plain"

    def evaluate(self, arch, seed=None):
        if arch.key() == "bad":
            raise EvaluationError("cannot score bad")
        if arch.key() == "crash":
            raise RuntimeError("a bug")
        return EvalResult(accuracy=float(seed or 0))


def test_an_evaluator_s_defaults_hold_no_weights_and_batch_one_by_one(monkeypatch):
    ev = Plain(SPACE)
    assert (ev.uses_seed, ev.trains, ev.batched, ev.weights(arch("a")), ev.provenance(arch("a"))) == (
        False, False, False, None, {})
    assert Plain.space_settings("nb201", {"x": 1}) == {} and ev.prepare(True) is None
    assert Plain.spaces() == ["nb201"] and train.TrainEvaluator.trains is True
    monkeypatch.setattr(base, "time", Clock(10.0, 20.0, 20.75))  # a success reads the clock once
    got = ev.evaluate_batch([arch("a"), arch("bad")], seed=3)
    assert got == [EvalResult(accuracy=3.0), EvalResult.failure("cannot score bad", 0.75)]
    monkeypatch.setattr(base, "time", Clock(0.0))
    with pytest.raises(RuntimeError, match="a bug"):  # only deterministic failures become results
        evaluate_safely(ev, arch("crash"), None)


# ---------------------------------------------------------------- table

@pytest.mark.parametrize("cost, ok", [(0.0, True), (0, True), (0.5, True), (-0.001, False), (True, False),
                                      (math.nan, False)])
def test_the_table_s_simulated_cost_must_be_a_number_at_least_0(cost, ok):
    if ok:
        assert table.TableEvaluator(SPACE, simulated_cost_seconds=cost).simulated_cost_seconds == cost
    else:
        with pytest.raises(ConfigError, match=r"^evaluator.simulated_cost_seconds must be >= 0, got "):
            table.TableEvaluator(SPACE, simulated_cost_seconds=cost)


@pytest.mark.parametrize("cost, slept", [(0.0, []), (0.25, [0.25])])
def test_a_table_lookup_sleeps_only_a_positive_simulated_cost_and_times_itself(monkeypatch, table_evaluator,
                                                                               cost, slept):
    clock = Clock(5.0, 5.5)
    monkeypatch.setattr(table, "time", clock)
    monkeypatch.setattr(table_evaluator, "simulated_cost_seconds", cost)
    cell = SPACE.sample(np.random.default_rng(0))
    got = table_evaluator.evaluate(cell)
    accuracy, cost_model = table_evaluator.table.score(cell), table_evaluator.table.cost(cell)
    assert got == EvalResult(accuracy=accuracy, metrics={"baseline_accuracy": accuracy}, params=cost_model.params,
                             flops=cost_model.flops, cost_seconds=0.5)
    assert clock.slept == slept


def test_the_table_s_fingerprint_is_the_table_s_then_its_classes_and_resolution(table_evaluator):
    assert table_evaluator.fingerprint() == f"{table_evaluator.table.fingerprint()}:10:32"
    assert (table_evaluator.metric, table_evaluator.num_classes, table_evaluator.resolution) == (
        "baseline_accuracy", 10, 32)


# ---------------------------------------------------------------- simulated

@pytest.mark.parametrize("setting", ["median_seconds", "sigma", "pareto_alpha", "time_scale"])
@pytest.mark.parametrize("value, ok", [(1e-9, True), (0.0, False), (-1.0, False), (math.nan, False)])
def test_each_simulated_setting_must_be_above_0(setting, value, ok):
    if ok:
        assert getattr(simulated.SimulatedEvaluator(SPACE, **{setting: value}), setting) == value
    else:
        with pytest.raises(ConfigError, match=rf"^evaluator.{setting}: expected a number > 0, got "):
            simulated.SimulatedEvaluator(SPACE, **{setting: value})


def test_the_simulated_distribution_is_lognormal_or_pareto():
    with pytest.raises(ConfigError, match=r"^evaluator.distribution: expected one of lognormal, pareto, got 'normal'$"):
        simulated.SimulatedEvaluator(SPACE, distribution="normal")
    ev = simulated.SimulatedEvaluator(SPACE, distribution="pareto", median_seconds=2.0, sigma=0.5, pareto_alpha=3.0,
                                      time_scale=9.0, seed=4)
    assert ev.fingerprint() == f"simulated:{table.TableEvaluator.fingerprint(ev)}:pareto:2.0:0.5:3.0:4"
    assert (ev.distribution, ev.median_seconds, ev.sigma, ev.pareto_alpha, ev.time_scale, ev.seed) == (
        "pareto", 2.0, 0.5, 3.0, 9.0, 4)
    default = simulated.SimulatedEvaluator(SPACE)
    assert (default.distribution, default.median_seconds, default.sigma, default.pareto_alpha, default.time_scale,
            default.seed) == ("lognormal", 1.0, 1.0, 1.5, 1.0, 0)


def test_a_lognormal_duration_is_the_median_times_e_to_sigma_times_a_normal_draw_of_key_and_seed():
    ev = simulated.SimulatedEvaluator(SPACE, median_seconds=2.0, sigma=0.5, seed=3)
    z = np.random.default_rng([3, zlib.crc32(b"k1")]).standard_normal()
    assert ev.duration(arch("k1")) == pytest.approx(2.0 * math.exp(0.5 * z), rel=1e-12)
    logs = [math.log(ev.duration(arch(f"a{i}")) / 2.0) / 0.5 for i in range(3000)]
    assert abs(statistics.fmean(logs)) < 0.1 and abs(statistics.pstdev(logs) - 1) < 0.1
    assert simulated.SimulatedEvaluator(SPACE, seed=4).duration(arch("k1")) != simulated.SimulatedEvaluator(
        SPACE, seed=3).duration(arch("k1"))


def test_a_pareto_duration_has_the_asked_median_and_never_less_than_its_scale():
    ev = simulated.SimulatedEvaluator(SPACE, distribution="pareto", median_seconds=2.0, pareto_alpha=1.5)
    durations = [ev.duration(arch(f"a{i}")) for i in range(4000)]
    x_m = 2.0 / 2 ** (1 / 1.5)
    assert min(durations) >= x_m and min(durations) < x_m * 1.01
    assert statistics.median(durations) == pytest.approx(2.0, rel=0.06)


def test_a_simulated_evaluation_waits_its_scaled_duration_and_reports_the_unscaled_one(monkeypatch):
    clock = Clock(0.0, 0.0)
    monkeypatch.setattr(simulated, "time", clock)
    monkeypatch.setattr(table, "time", Clock(1.0, 1.25))
    ev = simulated.SimulatedEvaluator(SPACE, time_scale=0.5)
    cell = SPACE.sample(np.random.default_rng(1))
    got = ev.evaluate(cell)
    d = ev.duration(cell)
    assert clock.slept == [pytest.approx(d * 0.5, rel=1e-12)]
    assert got.cost_seconds == d and got.metrics["simulated_seconds"] == round(d, 6) != round(d, 7)
    assert got.accuracy == ev.table.score(cell)


def test_the_simulated_clock_runs_workers_at_once_finishing_in_duration_order():
    durations = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.5}
    ev = types.SimpleNamespace(duration=lambda a: durations[a.key()],
                               score=lambda a: EvalResult(accuracy=durations[a.key()]))
    clock = simulated.SimulatedClock(ev, workers=2)  # type: ignore[arg-type]
    cands = [types.SimpleNamespace(arch=arch(k)) for k in "abcd"]
    for i, c in enumerate(cands):
        clock.submit(i, c)  # a, b start at 0; c when b ends at 1; d when a or c ends at 3
    order = []
    for _ in cands:
        ticket, (result, cached, duration) = clock.next_done()
        order.append((ticket, clock.now, cached, duration, result.accuracy))
    assert order == [(1, 1.0, False, 1.0, 1.0), (0, 3.0, False, 3.0, 3.0), (2, 3.0, False, 2.0, 2.0),
                     (3, 3.5, False, 0.5, 0.5)]
    assert clock.busy == 6.5
    again = simulated.SimulatedClock(ev, workers=3)  # type: ignore[arg-type]
    assert [r.accuracy for r, _, _ in again.evaluate(cands)] == [3.0, 1.0, 2.0, 0.5]  # in the asked order
    assert again.now == 3.0 and again.busy == 6.5
    again.submit(9, cands[0])
    again.close()
    assert not again._queue and not again._events


# ---------------------------------------------------------------- proxy

@pytest.mark.parametrize("trainable, trusted, open_ended, accepted", [
    (True, True, False, True), (False, True, False, False), (True, False, False, False), (True, True, True, False)])
def test_the_proxy_evaluator_scores_trusted_trainable_sampled_spaces_only(trainable, trusted, open_ended, accepted):
    space = types.SimpleNamespace(trainable=trainable, trusted=trusted, open_ended=open_ended)
    assert proxy.ProxyEvaluator.accepts(space) is accepted  # type: ignore[arg-type]


@pytest.mark.parametrize("params, problem", [
    ({"data": "digits"}, "data: unknown dataset 'digits'"), ({"data": {"name": "mnist9"}}, "unknown dataset 'mnist9'"),
    ({"proxies": []}, "evaluator.proxies must be a non-empty list of proxy names, got []"),
    ({"proxies": ["snip", 3]}, "got ['snip', 3]"), ({"proxies": ["snipp"]}, "unknown proxy 'snipp'"),
    ({"batch_size": 0}, "evaluator.batch_size"), ({"reference": 0}, "evaluator.reference"),
])
def test_the_proxy_evaluator_s_bad_settings_are_one_line(params, problem):
    with pytest.raises(ConfigError) as err:
        proxy.ProxyEvaluator(SPACE, **{"data": DIGITS, **params})
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_the_proxy_evaluator_takes_a_batch_of_up_to_all_training_images():
    from nas.data.sources import load_data

    n = len(load_data("digits").train)
    assert proxy.ProxyEvaluator(SPACE, DIGITS, batch_size=n).batch_size == n
    with pytest.raises(ConfigError, match=rf"^evaluator.batch_size={n + 1} is more than the {n} training images"):
        proxy.ProxyEvaluator(SPACE, DIGITS, batch_size=n + 1)
    ev = proxy.ProxyEvaluator(SPACE, DIGITS)
    assert (ev.proxies, ev.batch_size, ev.reference, ev.seed) == (["synflow", "jacob_cov", "snip"], 64, 32, 0)


def test_the_proxy_percentile_is_the_mean_share_of_the_reference_beaten_ties_counting_half(monkeypatch):
    ev = proxy.ProxyEvaluator(SPACE, DIGITS, proxies=["synflow", "snip"], **SIZING)
    ev._reference = {"synflow": np.array([1.0, 2.0, 3.0, 4.0]), "snip": np.array([10.0, 20.0])}
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 2))  # on digits, 8 x 8
    monkeypatch.setattr(ev, "_scores", lambda a: ({"synflow": 2.0, "snip": 25.0}, net))
    monkeypatch.setattr(proxy, "time", Clock(7.0, 7.5))
    got = ev.evaluate(arch("a"))
    # synflow: beats 1, ties 2: (1 + 0.5) / 4 = 0.375; snip beats both: 1.0; mean 0.6875
    assert got.accuracy == 68.75 and got.cost_seconds == 0.5
    assert got.metrics == {"proxy_synflow": 2.0, "proxy_snip": 25.0, "vote_percentile": 68.75}
    assert got.params == 130 and got.flops == 128
    monkeypatch.setattr(ev, "_scores", lambda a: ({"synflow": 0.5, "snip": 15.0}, net))
    monkeypatch.setattr(proxy, "time", Clock(0.0, 0.0))
    assert ev.evaluate(arch("a")).accuracy == 25.0  # 0 and 0.5
    ev._reference = {"synflow": np.array([1.0, 2.0, 3.0]), "snip": np.array([1.0])}
    monkeypatch.setattr(ev, "_scores", lambda a: ({"synflow": 2.5, "snip": 0.0}, net))
    monkeypatch.setattr(proxy, "time", Clock(0.0, 0.0))
    assert ev.evaluate(arch("a")).accuracy == 33.3333  # 2/3 and 0, to 4 decimals


# ---------------------------------------------------------------- train: combining seeds

def run(valid, test=None, *, curve=(1.0,), epochs=1, terminated=None, wall=0.0, device=0.0, world=1,
        graphs="off", compile_s=0.0, params=0, flops=0):
    return TrainResult(valid, test if test is not None or valid is None else valid - 10, list(curve), epochs,
                       terminated, wall, device, params, flops, world_size=world, cuda_graphs=graphs,
                       compile_seconds=compile_s)


def test_seeds_combine_into_means_spreads_and_per_seed_accuracies():
    runs = [run(90.123456, 80.0, curve=(2.0, 1.0, 0.5), epochs=3, wall=1.5, device=1.0004, world=2, graphs="on",
                compile_s=0.1234, params=10, flops=20),
            run(92.0, 84.0, curve=(3.0, 2.0), epochs=2, wall=2.25, device=1.0, compile_s=0.25, params=11),
            run(93.0, 83.0, curve=(1.0, 0.0), epochs=4, wall=0.0, device=0.0)]
    got = train._combine(runs, [7, 8, 9])
    assert got.metrics == {
        "valid_accuracy": 91.7078, "test_accuracy": 82.3333, "epochs": 3.0, "device_seconds": 3.001,
        "compile_seconds": 0.373, "cuda_graphs": 0.3333, "valid_accuracy_std": round(statistics.pstdev(
            [90.123456, 92.0, 93.0]), 4), "valid_accuracy_seed7": 90.123456, "valid_accuracy_seed8": 92.0,
        "valid_accuracy_seed9": 93.0, "final_train_loss": 1.0}
    assert got.curve == [2.0, 1.0] and (got.accuracy, got.params, got.flops, got.cost_seconds, got.error) == (
        91.7078, 10, 20, 3.75, None)


def test_one_seed_has_no_spread_nor_per_seed_accuracy_and_self_reported_numbers_say_so():
    got = train._combine([run(90.0, curve=())], [7], self_reported=True)
    assert got.metrics == {"valid_accuracy": 90.0, "test_accuracy": 80.0, "epochs": 1.0, "device_seconds": 0.0,
                           "compile_seconds": 0.0, "cuda_graphs": 0.0, "self_reported": 1.0}
    assert got.curve == [] and got.ok
    assert train._combine("it did not build", [7]) == EvalResult.failure("it did not build")


def test_a_terminated_seed_fails_the_candidate_naming_the_first_one_stopped():
    runs = [run(90.0), run(None, terminated="loss not improving"), run(None, terminated="diverged")]
    got = train._combine(runs, [7, 8, 9])
    assert got.accuracy is None and got.error == "terminated early: loss not improving (seed 8)"
    assert got.metrics["valid_accuracy"] == 90.0 and "valid_accuracy_std" not in got.metrics
    assert got.metrics["valid_accuracy_seed7"] == 90.0 and "valid_accuracy_seed8" not in got.metrics
    alone = train._combine([run(None, terminated="diverged")], [7])
    assert alone.error == "terminated early: diverged" and "valid_accuracy" not in alone.metrics


# ---------------------------------------------------------------- train: settings and dispatch

@pytest.fixture(scope="module")
def trainer():
    return train.TrainEvaluator(SPACE, DIGITS, RECIPE, **SIZING)


@pytest.mark.parametrize("seeds, ok", [(None, True), ([0], True), ([777, 888], True), ([], False), ([-1], False),
                                       ([True], False), ([1.0], False)])
def test_the_train_evaluator_s_seeds_are_integers_from_0_or_none(seeds, ok):
    if ok:
        ev = train.TrainEvaluator(SPACE, DIGITS, RECIPE, seeds=seeds, **SIZING)
        assert ev.seeds == seeds and ev.uses_seed is (seeds is None)
    else:
        with pytest.raises(ConfigError, match=r"^evaluator.seeds must be a non-empty list of integers >= 0 or null"):
            train.TrainEvaluator(SPACE, DIGITS, RECIPE, seeds=seeds, **SIZING)


@pytest.mark.parametrize("params, problem", [
    ({"data": "digits"}, "data: unknown dataset 'digits'"), ({"recipe": [1]}, "recipe must be a mapping"),
    ({"proxies": ["snip", 1]}, "evaluator.proxies must be a list of proxy names, got ['snip', 1]"),
    ({"proxies": ["snipp"]}, "unknown proxy 'snipp'"), ({"sandbox": {"wall": 1}}, "evaluator.sandbox"),
])
def test_the_train_evaluator_s_bad_settings_are_one_line(params, problem):
    with pytest.raises(ConfigError) as err:
        train.TrainEvaluator(SPACE, **{"data": DIGITS, "recipe": RECIPE, **params})
    assert problem in str(err.value)


def test_the_train_evaluator_s_defaults(trainer):
    assert trainer.proxies == ["synflow", "jacob_cov", "snip"] and trainer.trust_self_reported is False
    assert trainer.limits.wall_s == train.SANDBOX_DEFAULTS["wall_s"] and trainer.on_epoch is None
    assert train.TrainEvaluator(SPACE, DIGITS, RECIPE, proxies=[], sandbox={"wall_s": 5.0}, **SIZING).limits.wall_s == 5.0


def test_a_training_run_s_sandbox_allows_an_hour_on_4_cores_8_gb_and_64_mb_files(trainer):
    """Far more than a verification's limits: the documented defaults, each one."""
    from nas.sandbox.limits import Limits

    assert train.SANDBOX_DEFAULTS == {"wall_s": 3600.0, "cpu_s": 14400, "memory_mb": 8192, "file_mb": 64,
                                      "tmp_mb": Limits.tmp_mb}
    assert {k: getattr(trainer.limits, k) for k in train.SANDBOX_DEFAULTS} == train.SANDBOX_DEFAULTS


@pytest.mark.parametrize("seeds, seed, trained", [(None, None, [0]), (None, 5, [5]), ([7, 8], 5, [7, 8])])
def test_a_batch_trains_with_the_fixed_seeds_or_the_run_s_or_0(monkeypatch, seeds, seed, trained):
    ev = train.TrainEvaluator(SPACE, DIGITS, RECIPE, seeds=seeds, proxies=[], **SIZING)
    seen = []

    def train_trusted(archs, todo, s, runs):
        seen.append(s)
        for i in todo:
            runs[i].append(run(90.0 + s))

    monkeypatch.setattr(ev, "_train_trusted", train_trusted)
    got = ev.evaluate_batch([SPACE.sample(np.random.default_rng(0))], seed)
    assert seen == trained and got[0].accuracy == 90.0 + statistics.fmean(trained)


def test_evaluate_raises_a_failure_but_returns_a_terminated_candidate(monkeypatch, trainer):
    results = {"a": EvalResult.failure("build failed"), "b": EvalResult.failure("terminated early: diverged")}
    monkeypatch.setattr(trainer, "evaluate_batch", lambda archs, seed: [results[archs[0].key()]])
    with pytest.raises(EvaluationError, match="^build failed$"):
        trainer.evaluate(arch("a"))
    assert trainer.evaluate(arch("b")).error == "terminated early: diverged"


def test_the_proxies_of_a_trusted_network_are_on_a_seeded_batch_of_32(monkeypatch, trainer):
    seen = {}
    monkeypatch.setattr(train.nas_proxies, "score_network",
                        lambda net, batch, names, seed: seen.update(n=len(batch.images), names=names, seed=seed) or {"x": 1.0})
    cell = SPACE.sample(np.random.default_rng(0))
    assert trainer._proxies_of_trusted(cell, 3) == {"x": 1.0}
    assert seen == {"n": train.PROXY_BATCH, "names": ["synflow", "jacob_cov", "snip"], "seed": 3} and train.PROXY_BATCH == 32
    monkeypatch.setattr(trainer, "proxies", [])
    assert trainer._proxies_of_trusted(cell, 3) == {}
    monkeypatch.setattr(trainer, "proxies", ["snip"])

    def unbuildable(*a, **k):
        raise NasError("no network")

    monkeypatch.setattr(train, "build_model", unbuildable)
    assert trainer._proxies_of_trusted(cell, 3) == {}


@pytest.mark.parametrize("accelerator, cuda, gpu", [("cpu", True, False), ("gpu", False, True), ("auto", True, True),
                                                     ("auto", False, False)])
def test_model_source_trains_on_the_gpu_when_asked_or_when_auto_finds_one(monkeypatch, accelerator, cuda, gpu):
    from nas.spaces.source.space import SourceSpace

    monkeypatch.setattr(train, "isolation", lambda: None)
    monkeypatch.setattr(train.torch.cuda, "is_available", lambda: cuda)
    ev = train.TrainEvaluator(SourceSpace(), DIGITS, RECIPE, engine={"accelerator": accelerator})
    asked = {}

    def train_model_source(source, **kwargs):
        asked.update(kwargs)
        return types.SimpleNamespace(ok=True, error=None, stage="", self_reported=False), ["r"]

    monkeypatch.setattr(train, "train_model_source", train_model_source)
    source = types.SimpleNamespace(source="src", filename="m.py", space="source", key=lambda: "k", checked=None)
    assert ev._train_source(source, [1, 2], {}) == (["r"], False)  # type: ignore[arg-type]
    assert asked["gpu"] is gpu and asked["seeds"] == [1, 2] and asked["input_shape"] == (2, *ev.data.shape)
    assert asked["proxies"].batch == train.PROXY_BATCH


def test_every_registered_evaluator_is_listed():
    assert {"table", "simulated", "proxy", "train"} <= set(EVALUATORS.names())


def test_the_fingerprint_follows_what_changes_results_only():
    fp = train.TrainEvaluator(SPACE, DIGITS, RECIPE, **SIZING).fingerprint()
    same = [train.TrainEvaluator(SPACE, DIGITS, RECIPE, trust_self_reported=True, proxies=[], **SIZING),
            train.TrainEvaluator(SPACE, DIGITS, RECIPE, sandbox={"wall_s": 5.0}, **SIZING)]
    assert all(ev.fingerprint() == fp for ev in same)
    other = [train.TrainEvaluator(SPACE, DIGITS, {**RECIPE, "epochs": 2}, **SIZING),
             train.TrainEvaluator(SPACE, DIGITS, RECIPE, seeds=[1], **SIZING),
             train.TrainEvaluator(SPACE, DIGITS, RECIPE, channels=8, cells_per_stage=1),
             train.TrainEvaluator(SPACE, DIGITS, RECIPE, engine={"kind": "fast"}, **SIZING)]
    assert len({fp, *(ev.fingerprint() for ev in other)}) == 5


def test_model_source_s_fingerprint_names_how_its_networks_start(monkeypatch):
    from nas.spaces.source.space import SourceSpace

    monkeypatch.setattr(train, "isolation", lambda: None)
    ev = train.TrainEvaluator(SourceSpace(), DIGITS, RECIPE)
    assert ev.fingerprint() == train.stable_hash("train", ev.data_cfg, ev.recipe.to_dict(), ev.engine.to_dict(),
                                                 ev.build, None, train.SOURCE_INIT)


def test_trusted_candidates_train_together_and_one_that_does_not_build_gets_its_error(monkeypatch):
    ev = train.TrainEvaluator(SPACE, DIGITS, RECIPE, seeds=[7, 8], proxies=[], **SIZING)
    good, bad = SPACE.sample(np.random.default_rng(1)), SPACE.sample(np.random.default_rng(2))
    real_build = train.build_model

    def build(space, arch, *args):
        if arch is bad:
            raise NasError("no network")
        return real_build(space, arch, *args)

    trained = []

    def train_many(nets, data, recipe, seed, engine, on_epoch, labels):
        trained.append((len(nets), seed, labels))
        return [run(90.0 + seed) for _ in nets]

    monkeypatch.setattr(train, "build_model", build)
    monkeypatch.setattr(train.training_run, "train_many", train_many)
    got = ev.evaluate_batch([good, bad], seed=3)
    assert trained == [(1, 7, [f"nb201 {good.key()} seed 7"]), (1, 8, [f"nb201 {good.key()} seed 8"])]
    assert got[0].accuracy == 97.5 and got[1] == EvalResult.failure("no network")
    plain = train.TrainEvaluator(SPACE, DIGITS, RECIPE, proxies=[], **SIZING)
    trained.clear()
    plain.evaluate_batch([good], seed=3)
    assert trained == [(1, 3, [f"nb201 {good.key()}"])]  # the run's seed: no seed in the label


def test_with_several_devices_each_candidate_trains_in_its_own_process(monkeypatch):
    ev = train.TrainEvaluator(SPACE, DIGITS, RECIPE, proxies=[], engine={"devices": 2}, **SIZING)
    a, b = SPACE.sample(np.random.default_rng(1)), SPACE.sample(np.random.default_rng(2))
    asked = []

    def train_in_subprocess(space, arch, data, recipe, engine, build, seed, timeout_s):
        asked.append((arch.key(), seed, timeout_s))
        if arch is b:
            raise NasError("worker died")
        return run(80.0)

    monkeypatch.setattr(train, "train_in_subprocess", train_in_subprocess)
    got = ev.evaluate_batch([a, b], seed=4)
    assert asked == [(a.key(), 4, ev.limits.wall_s), (b.key(), 4, ev.limits.wall_s)]
    assert got[0].accuracy == 80.0 and got[1].error == "worker died"


def test_the_proxy_reference_is_each_proxy_s_sorted_scores_kept_and_a_damaged_file_scored_again(monkeypatch, tmp_path):
    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path))
    ev = proxy.ProxyEvaluator(SPACE, DIGITS, proxies=["snip", "synflow"], reference=3, seed=2, **SIZING)
    scored = []
    values = iter([3.0, 1.0, 2.0])

    def scores(cell):
        scored.append(cell.key())
        v = next(values)
        return {"snip": v, "synflow": -v}, None

    monkeypatch.setattr(ev, "_scores", scores)
    got = ev.reference_scores()
    rng = np.random.default_rng(2)
    assert scored == [SPACE.sample(rng).key() for _ in range(3)]  # the reference: 3 cells drawn with the seed
    assert {n: v.tolist() for n, v in got.items()} == {"snip": [1.0, 2.0, 3.0], "synflow": [-3.0, -2.0, -1.0]}
    assert ev.reference_scores() is got and len(scored) == 3  # once per evaluator
    [path] = (tmp_path / "proxy_reference").glob("*.json")
    path.write_text('{"snip": [1.0]}')  # a proxy missing: scored again
    again = proxy.ProxyEvaluator(SPACE, DIGITS, proxies=["snip", "synflow"], reference=3, seed=2, **SIZING)
    values = iter([5.0, 4.0, 6.0])
    monkeypatch.setattr(again, "_scores", scores)
    assert again.reference_scores()["snip"].tolist() == [4.0, 5.0, 6.0] and len(scored) == 6
    kept = proxy.ProxyEvaluator(SPACE, DIGITS, proxies=["snip", "synflow"], reference=3, seed=2, **SIZING)
    monkeypatch.setattr(kept, "_scores", lambda cell: pytest.fail("scored again"))
    assert kept.reference_scores()["synflow"].tolist() == [-6.0, -5.0, -4.0]

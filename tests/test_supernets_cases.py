"""Supernet training and scoring case by case (issue 52, the library mutation run): the settings'
defaults and checks at and either side of each limit, the sampler's phases, pins and drop-path
warm-up, the training module's progress, building and checkpoint errors, the feeders and scoring,
the supernet evaluator's checks, rounding and cache on one tiny trained NB201 supernet, and each
family's own routing checks. Messages matched whole; the supernets are the tiny test sizes."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from nas.core.trial import EvalResult
from nas.errors import ConfigError, EncodingError, MissingDependencyError
from nas.evaluators import EVALUATORS
from nas.spaces import SPACES
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import NB201Space
from supernets import evaluator as supernet_evaluator
from supernets import scoring
from supernets.base import SUPERNETS, Supernet
from supernets.checkpoints import load_checkpoint
from supernets.settings import SupernetSettings
from supernets.train import Mixed, SubnetSampler, SupernetModule, build_supernet, cpu_seconds, train_supernet
from test_supernet_train import PHASES, FakeOFASpace, Values

ROOT = Path(__file__).resolve().parents[1]
SPACE = {"name": "nb201", "channels": 4, "cells_per_stage": 1}
DIGITS = {"name": "digits", "root": None, "split_file": None}
TINY = SupernetSettings(epochs=1, batch_size=64, train_subset=64, val_subset=7, recal_batches=1)
AUTOFORMER = {"depths": [1, 2], "embed_dims": [8, 16], "heads": [1, 2], "mlp_ratios": [1.0, 2.0], "head_dim": 8,
              "patch_size": 4, "image_size": 8, "num_classes": 3}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One step on 64 digits: the weights matter to no test here, only that scoring runs on them."""
    return train_supernet(SPACE, {}, DIGITS, TINY, seed=0, out_dir=tmp_path_factory.mktemp("sn"), progress=False)


# -- settings ------------------------------------------------------------------------------------------

def test_the_settings_defaults_are_the_shipped_config_s():
    shipped = yaml.safe_load((ROOT / "conf" / "supernet" / "default.yaml").read_text())
    shipped = {k: v for k, v in shipped.items() if k not in ("out", "params")}
    assert SupernetSettings().to_dict() == shipped == SupernetSettings.from_dict(shipped).to_dict()


@pytest.mark.parametrize("name, low", [("epochs", 1), ("batch_size", 1), ("n_random", 0), ("recal_batches", 0),
                                       ("train_subset", 1), ("val_subset", 1), ("devices", 1)])
def test_each_count_is_an_integer_from_its_least(name, low):
    assert getattr(SupernetSettings(**{name: low}), name) == low
    assert getattr(SupernetSettings(**{name: low + 1}), name) == low + 1
    for bad in (low - 1, True, float(low), "1"):
        with pytest.raises(ConfigError) as err:
            SupernetSettings(**{name: bad})
        assert str(err.value) == f"supernet.{name} must be an integer >= {low}, got {bad!r}"


def test_subsets_may_be_none_and_the_rest_not():
    assert SupernetSettings(train_subset=None, val_subset=None).val_subset is None
    for name in ("epochs", "batch_size", "n_random", "recal_batches", "devices"):  # null once crashed training
        with pytest.raises(ConfigError) as err:
            SupernetSettings(**{name: None})
        assert str(err.value) == f"supernet.{name} must be an integer >= {0 if 'n_' in name or 'recal' in name else 1}, got None"


@pytest.mark.parametrize("change, message", [
    ({"cpu_seconds": 0}, "supernet.cpu_seconds must be a number > 0 or null, got 0"),
    ({"cpu_seconds": -1.0}, "supernet.cpu_seconds must be a number > 0 or null, got -1.0"),
    ({"cpu_seconds": True}, "supernet.cpu_seconds must be a number > 0 or null, got True"),
    ({"cpu_seconds": "5"}, "supernet.cpu_seconds must be a number > 0 or null, got '5'"),
    ({"cpu_seconds": 5, "devices": 2}, "supernet.cpu_seconds bounds one process's CPU time; with devices > 1 "
                                       "bound training by epochs"),
    ({"warmup": -0.01}, "supernet.warmup must be a fraction from 0 to 1, got -0.01"),
    ({"warmup": 1.01}, "supernet.warmup must be a fraction from 0 to 1, got 1.01"),
    ({"warmup": True}, "supernet.warmup must be a fraction from 0 to 1, got True"),
    ({"warmup": "0.5"}, "supernet.warmup must be a fraction from 0 to 1, got '0.5'"),
    ({"accelerator": "tpu"}, "supernet.accelerator must be one of cpu, gpu, auto, got 'tpu'"),
    ({"strategy": 1}, "supernet.strategy must be a Lightning strategy name or null, got 1"),
    ({"sampling": "greedy"}, "supernet.sampling: unknown 'greedy' (valid: null, uniform, fair, sandwich, droppath)"),
    ({"lr": 0}, "supernet.lr must be > 0, got 0"),
])
def test_bad_settings_are_one_line_errors(change, message):
    with pytest.raises(ConfigError) as err:
        SupernetSettings(**change)
    assert str(err.value) == message


@pytest.mark.parametrize("change", [
    {"cpu_seconds": 0.01}, {"cpu_seconds": 1}, {"cpu_seconds": 5, "devices": 1}, {"devices": 2},
    {"warmup": 0}, {"warmup": 1}, {"warmup": 0.5}, {"accelerator": "cpu"}, {"accelerator": "gpu"},
    {"strategy": "ddp"}, *({"sampling": s} for s in ("uniform", "fair", "sandwich", "droppath")),
])
def test_settings_at_their_limits_are_accepted(change):
    assert {k: getattr(SupernetSettings(**change), k) for k in change} == change


def test_the_lightning_strategy_tolerates_unused_parameters_only_under_ddp():
    assert SupernetSettings().lightning_strategy() == "auto"
    assert SupernetSettings(devices=2).lightning_strategy() == "ddp_find_unused_parameters_true"
    assert SupernetSettings(devices=2, strategy="ddp").lightning_strategy() == "ddp"
    assert SupernetSettings(strategy="fsdp").lightning_strategy() == "fsdp"
    with pytest.raises(ConfigError, match=r"^supernet: unknown key 'epoch' "):
        SupernetSettings.from_dict({"epoch": 1})


# -- the sampler ---------------------------------------------------------------------------------------

def sampler(sampling: str, total_steps: int = 8, n_random: int = 6, warmup: float = 0.5) -> SubnetSampler:
    return SubnetSampler(FakeOFASpace(), Values((16, 7, 7, 4, 6)), Values((8, 3, 3, 2, 3)), sampling, PHASES,
                         n_random, total_steps, seed=0, warmup=warmup)


@pytest.mark.parametrize("progress, phase", [(0.0, 0), (0.24, 0), (0.25, 1), (0.49, 1), (0.5, 2), (0.74, 2),
                                             (0.75, 3), (0.99, 3), (1.0, 3), (1.5, 3)])
def test_a_budget_s_progress_places_the_sandwich_phase(progress, phase):
    s = sampler("sandwich")
    assert s.n_phases == 4 and s.phase(0, progress) == phase and s.phase(7, progress) == phase


@pytest.mark.parametrize("total, phases", [(4, [0, 1, 2, 3, 3, 3]), (3, [0, 1, 2, 3, 3, 3]), (6, [0, 0, 1, 2, 2, 3]),
                                           (1, [0, 3, 3, 3, 3, 3]), (0, [0, 3, 3, 3, 3, 3])])
def test_steps_place_the_phase_over_the_total(total, phases):
    s = sampler("sandwich", total_steps=total)
    assert s.total_steps == max(total, 1) and [s.phase(t) for t in range(6)] == phases


def test_phases_pin_their_groups_until_released_and_only_under_sandwich():
    s = sampler("sandwich")
    assert [s.pinned(p) for p in range(4)] == [[False, True, True, True, True], [False, False, False, True, True],
                                               [False, False, False, False, True], [False] * 5]
    for name in ("uniform", "fair", "droppath"):
        other = sampler(name)
        assert other.phases == () and other.n_phases == 1 and other.phase(5) == 0 and other.pinned(0) == [False] * 5
    assert s.groups == ["r", "ks", "ks", "d", "e"]
    assert (s.largest, s.smallest) == ([16, 7, 7, 4, 6], [8, 3, 3, 2, 3])


def test_sandwich_with_no_random_subnets_trains_the_largest_then_the_smallest():
    s = sampler("sandwich", n_random=0)
    assert [a.values for a in s.draw(7)] == [(16, 7, 7, 4, 6), (8, 3, 3, 2, 3)]
    assert [a.values for a in s.draw(0)] == [(16, 7, 7, 4, 6), (8, 7, 7, 4, 6)]  # phase 0: only r is free
    assert [a.values for a in s.draw(0, progress=0.8)] == [(16, 7, 7, 4, 6), (8, 3, 3, 2, 3)]
    assert len(sampler("sandwich", n_random=1).draw(7)) in (2, 3)


@pytest.mark.parametrize("warmup, step, progress, mixed", [
    (0.5, 3, None, True), (0.5, 4, None, False), (0.5, 5, None, False), (0.25, 1, None, True), (0.25, 2, None, False),
    (0.0, 0, None, False), (1.0, 7, None, True), (0.5, 0, 0.49, True), (0.5, 0, 0.5, False), (0.5, 7, 0.1, True)])
def test_droppath_mixes_until_the_warmup_is_done(warmup, step, progress, mixed):
    drawn = sampler("droppath", warmup=warmup).draw(step, progress)
    assert len(drawn) == 1 and isinstance(drawn[0], Mixed) == mixed and isinstance(drawn[0], Values) != mixed


def test_droppath_keeps_every_choice_at_first_and_fewer_as_the_warmup_goes():
    s = sampler("droppath", total_steps=100)
    assert s.draw(0)[0].values == tuple(d.choices for d in FakeOFASpace().decisions())
    full = sampler("droppath").mixed(1.0)
    assert full.values == tuple(d.choices for d in FakeOFASpace().decisions())
    alone = sampler("droppath").mixed(0.0)
    assert all(len(v) == 1 and v[0] in d.choices for v, d in zip(alone.values, FakeOFASpace().decisions()))
    late = [sum(map(len, s.draw(45)[0].values)) for _ in range(20)]   # keep 0.1: about one and a half a decision
    early = [sum(map(len, s.draw(5)[0].values)) for _ in range(20)]   # keep 0.9: nearly all 15
    assert sum(late) < sum(early) and max(late) < 15 and min(early) > 5


def test_uniform_and_fair_draw_free_subnets_every_step():
    s = sampler("uniform")
    assert all(len(s.draw(t)) == 1 and isinstance(s.draw(t)[0], Values) for t in range(8))
    assert len(sampler("fair").draw(0)) == 3


def test_droppath_and_the_rest_come_from_the_supernet():
    space = SPACES.create("nb201", {"channels": 4, "cells_per_stage": 1})
    net = SUPERNETS.create("nb201", {"num_classes": 10}, space=space)
    s = SubnetSampler.for_supernet(net, "droppath", 0, 10, seed=0, warmup=0.3)
    assert (s.sampling, s.warmup, s.total_steps, s.n_random) == ("droppath", 0.3, 10, 0)
    assert s.largest == list(net.largest().ops) and s.smallest == list(net.smallest().ops)


# -- the training module -------------------------------------------------------------------------------

def module(settings: SupernetSettings, total: int = 10) -> SupernetModule:
    space = SPACES.create("nb201", {"channels": 4, "cells_per_stage": 1})
    net = SUPERNETS.create("nb201", {"num_classes": 10}, space=space)
    return SupernetModule(net, SubnetSampler.for_supernet(net, settings.sampling or "fair", 0, total, 0), settings)


@pytest.mark.parametrize("cpu_budget, used, steps, progress", [
    (None, 0.0, 0, 0.0), (None, 99.0, 5, 0.5), (None, 0.0, 10, 1.0), (None, 0.0, 12, 1.0),
    (4.0, 1.0, 9, 0.25), (4.0, 4.0, 0, 1.0), (4.0, 6.0, 0, 1.0), (4.0, 0.0, 10, 0.0)])
def test_progress_is_the_cpu_budget_spent_else_the_steps_done(cpu_budget, used, steps, progress):
    m = module(SupernetSettings(cpu_seconds=cpu_budget))
    m.cpu_used, m.steps = used, steps
    assert m.progress() == progress


def test_distillation_is_only_for_the_sandwich_and_the_clock_is_this_process_s():
    assert module(SupernetSettings(sampling="sandwich")).distill is True
    assert module(SupernetSettings(sampling="sandwich", distill=False)).distill is False
    assert module(SupernetSettings(sampling="fair")).distill is False
    m = module(SupernetSettings())
    assert (m.steps, m.cpu_start, m.cpu_used, m.automatic_optimization) == (0, None, 0.0, False)
    x = torch.zeros(2, 3, 8, 8)
    m.supernet.set_active(m.supernet.largest())
    assert torch.equal(m(x), m.supernet(x))
    before = cpu_seconds()
    sum(i * i for i in range(200_000))
    assert cpu_seconds() > before > 0


# -- building and training inputs ----------------------------------------------------------------------

def test_build_supernet_refuses_a_space_without_one_and_settings_taken_from_the_data():
    net = build_supernet(SPACE, {}, 7)
    assert net.config() == {"num_classes": 7, "in_channels": 3} and net.space.params() == NB201Space(4, 1).params()
    with pytest.raises(ConfigError) as err:
        build_supernet({"name": "nader"}, {}, 10)
    assert str(err.value) == f"space 'nader' has no supernet (spaces with one: {', '.join(SUPERNETS.names())})"
    for clash in ({"in_channels": 1}, {"num_classes": 2, "in_channels": 1}):
        with pytest.raises(ConfigError) as err:
            build_supernet(SPACE, clash, 10)
        assert str(err.value) == f"supernet.params.{sorted(clash)[0]} is set from the data; remove it"


@pytest.mark.parametrize("data, message", [
    ({"name": "cifar99"}, "data: unknown dataset 'cifar99' (valid: "),
    ("digits", "data: unknown dataset 'digits' (valid: "),
    ({"name": "digits", "colour": 1}, "data: unknown key 'colour' (valid: name, root, split_file)"),
])
def test_bad_data_stops_training_before_anything_runs(data, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        train_supernet(SPACE, {}, data, TINY, seed=0, out_dir=tmp_path, progress=False)
    assert str(err.value).startswith(message) and not list(tmp_path.iterdir())


# -- checkpoints ---------------------------------------------------------------------------------------

def saved(tmp_path: Path, obj, name: str = "x.pt") -> Path:
    path = tmp_path / name
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    path.write_bytes(buffer.getvalue())
    return path


class Pickled:
    """A type no checkpoint may unpickle."""


def test_checkpoints_that_are_not_ours_nor_released_are_refused_in_one_line(tmp_path):
    with pytest.raises(MissingDependencyError) as err:
        load_checkpoint(tmp_path / "none.pt", "nb201")
    assert str(err.value) == (f"supernet checkpoint not found at {tmp_path / 'none.pt'} (make one: nas "
                              "train-supernet, or pass a released supernet: docs/released-supernets.md)")
    for partial, first in (({"space": "nb201"}, "space_params"), ({"space_params": {}}, "space"),
                           ({"space": "nb201", "space_params": {}, "supernet": {}, "state_dict": {}}, "data")):
        path = saved(tmp_path, partial)
        with pytest.raises(MissingDependencyError) as err:
            load_checkpoint(path, "nb201")
        assert str(err.value) == f"supernet checkpoint {path} lacks '{first}' (not from nas train-supernet)"
    for obj in ([torch.zeros(1)], {}, {"w": 1}):
        path = saved(tmp_path, obj)
        with pytest.raises(MissingDependencyError) as err:
            load_checkpoint(path, "nb201")
        assert str(err.value) == (f"supernet checkpoint {path} is neither from nas train-supernet nor a released "
                                  "supernet: it holds no mapping of parameter names to tensors")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(MissingDependencyError, match=r"^supernet checkpoint .*junk.pt is unreadable \(\w+\)$"):
        load_checkpoint(junk, "nb201")
    path = saved(tmp_path, {"w": Pickled()})
    with pytest.raises(MissingDependencyError) as err:
        load_checkpoint(path, "nb201")
    assert str(err.value) == (f"supernet checkpoint {path} is unreadable (UnpicklingError: it pickles "
                              "test_supernets_cases.Pickled, which is not loaded)")


def test_our_checkpoint_reads_whole_with_its_hash(trained):
    with pytest.raises(dataclasses.FrozenInstanceError):
        trained.steps = 2  # type: ignore[misc]
    sha, record = load_checkpoint(trained.path, "nb201")
    assert sha == trained.sha256 and set(record) >= {"space", "space_params", "supernet", "state_dict", "data"}
    assert record["space"] == "nb201" and record["data"] == DIGITS


# -- feeding and scoring -------------------------------------------------------------------------------

def test_resize_keeps_none_and_the_same_size_and_interpolates_the_rest():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    assert scoring.resize(x, None) is x and scoring.resize(x, 4) is x
    assert scoring.resize(x, 2).shape == (1, 1, 2, 2) and scoring.resize(x, 8).shape == (1, 1, 8, 8)
    assert scoring.resize(torch.zeros(1, 1, 4, 6), 4).shape == (1, 1, 4, 4)
    up = scoring.resize(torch.tensor([[[[0.0, 1.0], [2.0, 3.0]]]]), 4)   # pixel centres, not corners, aligned
    assert up[0, 0, 0].tolist() == [0.0, 0.25, 0.75, 1.0] and up[0, 0, :, 0].tolist() == [0.0, 0.5, 1.5, 2.0]


@pytest.fixture(scope="module")
def digits():
    from nas.data.sources import load_data

    return load_data("digits").rgb()


def test_a_feeder_gives_at_most_limit_batches_seeded_or_in_order(digits):
    feeder = scoring.Feeder(digits, 10, torch.device("cpu"))
    n = len(digits.train)
    assert feeder.image_shape == digits.shape and scoring.RECAL_SEED == 0
    sizes = [len(y) for _, y in feeder.batches(digits.train, None, limit=3)]
    assert sizes == [10, 10, 10]
    assert sum(len(y) for _, y in feeder.batches(digits.train, None)) == n
    assert sum(len(y) for _, y in feeder.batches(digits.train, None, limit=n)) == n  # more than there are: all
    ordered = torch.cat([y for _, y in feeder.batches(digits.train, None, limit=2)])
    assert torch.equal(ordered, digits.train.labels[:20])
    seeded = [torch.cat([y for _, y in feeder.batches(digits.train, None, limit=2, seed=s)]) for s in (0, 0, 1)]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:20]
    assert torch.equal(seeded[0], digits.train.labels[perm]) and torch.equal(seeded[0], seeded[1])
    assert not torch.equal(seeded[0], seeded[2])
    recal = torch.cat([y for _, y in feeder.recal(None, 2)])
    assert torch.equal(recal, seeded[0])
    x, _ = next(feeder.valid(5, 3))
    assert x.shape == (3, 3, 5, 5)
    assert sum(len(y) for _, y in feeder.test(None, 7)) == 7 and sum(len(y) for _, y in feeder.valid(None, 12)) == 12


class Counted(nn.Module):
    """Predicts class 0 always; counts the images it saw in training mode (BN recalibration)."""

    def __init__(self, norm: bool) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(3) if norm else nn.Identity()
        self.seen_training = 0

    def forward(self, x):
        if self.training:
            self.seen_training += len(x)
        out = self.bn(x).mean((2, 3))
        return torch.cat([torch.full((len(x), 1), 1e3), out, torch.zeros(len(x), 6)], 1)


def test_scoring_recalibrates_only_batchnorm_and_only_when_asked(digits):
    feeder = scoring.Feeder(digits, 8, torch.device("cpu"))
    zeros = 100.0 * float((digits.valid.labels[:9] == 0).float().mean())
    zeros_test = 100.0 * float((digits.test.labels[:9] == 0).float().mean())
    for norm, batches, seen in ((True, 2, 16), (True, 0, 0), (False, 2, 0)):
        net = Counted(norm)
        assert scoring.score(net, feeder, None, batches, 9) == (pytest.approx(zeros), pytest.approx(zeros_test))
        assert net.seen_training == seen and not net.training
    assert scoring.has_batchnorm(Counted(True)) and not scoring.has_batchnorm(Counted(False))
    bn = nn.BatchNorm2d(3, momentum=0.3)
    scoring.recalibrate_bn(bn, iter([(torch.ones(2, 3, 2, 2) * 5, None)]))
    assert bn.momentum == 0.3 and torch.allclose(bn.running_mean, torch.full((3,), 5.0)) and not bn.training


def test_a_feeder_without_a_test_split_scores_validation_for_both():
    class NoTest:
        def recal(self, size, limit):
            return iter(())

        def valid(self, size, subset):
            return iter([(torch.zeros(2, 3, 2, 2), torch.tensor([0, 1]))])

        def test(self, size, subset):
            return None

    assert scoring.score(Counted(False), NoTest(), None, 1, None) == (50.0, 50.0)


def test_devices_are_auto_cpu_or_an_available_cuda():
    assert scoring.pick_device("cpu") == torch.device("cpu")
    assert scoring.pick_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        for name in ("cuda", "cuda:0", "tpu"):
            with pytest.raises(ConfigError) as err:
                scoring.pick_device(name)
            assert str(err.value) == f"device '{name}' is not available here (valid: auto, cpu)"


# -- the supernet evaluator ----------------------------------------------------------------------------

def evaluator(path, **params):
    return EVALUATORS.create("supernet", {"checkpoint": str(path), "recal_batches": 1, "batch_size": 64,
                                          "val_subset": 7, "device": "cpu", **params},
                             space=NB201Space(channels=4, cells_per_stage=1))


@pytest.mark.parametrize("params, message", [
    ({"checkpoint": None}, "evaluator 'supernet': evaluator.checkpoint is required (a supernet.pt from "
                           "`nas train-supernet`, or a released supernet: docs/released-supernets.md)"),
    ({"checkpoint": ""}, "evaluator 'supernet': evaluator.checkpoint is required"),
    ({"recal_batches": -1}, "evaluator 'supernet': recal_batches must be an integer >= 0, got -1"),
    ({"batch_size": 0}, "evaluator 'supernet': batch_size must be an integer >= 1, got 0"),
    ({"val_subset": 0}, "evaluator 'supernet': val_subset must be an integer >= 1, got 0"),
])
def test_the_evaluator_s_bad_settings_are_one_line_before_any_file_is_read(params, message, tmp_path):
    with pytest.raises(ConfigError) as err:
        evaluator(tmp_path / "none.pt", **params)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("name, value, low", [("recal_batches", True, 0), ("batch_size", 2.0, 1),
                                              ("val_subset", False, 1), ("val_subset", "5", 1)])
def test_the_evaluator_itself_refuses_what_is_no_integer(name, value, low, tmp_path):
    """The registry checks types for a config; the class checks them for a caller in Python too."""
    with pytest.raises(ConfigError) as err:
        supernet_evaluator.SupernetEvaluator(NB201Space(4, 1), str(tmp_path / "none.pt"), **{name: value})
    assert str(err.value) == f"evaluator 'supernet': {name} must be an integer >= {low}, got {value!r}"


@pytest.mark.parametrize("params", [{"recal_batches": 0}, {"batch_size": 1}, {"val_subset": 1}, {"val_subset": None}])
def test_settings_at_their_limits_go_on_to_read_the_checkpoint(params, tmp_path):
    with pytest.raises(MissingDependencyError, match="supernet checkpoint not found at"):
        evaluator(tmp_path / "none.pt", **params)


def test_the_evaluator_reads_space_settings_only_from_a_named_checkpoint_of_its_space(trained):
    cls = EVALUATORS.get("supernet")
    assert cls.space_settings("nb201", {}) == {} and cls.space_settings("nb201", {"checkpoint": None}) == {}
    assert cls.space_settings("nb201", {"checkpoint": str(trained.path)}) == {"channels": 4, "cells_per_stage": 1}
    assert cls.space_settings("spos", {"checkpoint": str(trained.path)}) == {}


def test_a_checkpoint_of_another_space_or_data_is_refused(trained):
    with pytest.raises(ConfigError) as err:
        EVALUATORS.create("supernet", {"checkpoint": str(trained.path)}, space=NB201Space(channels=8,
                                                                                         cells_per_stage=1))
    assert str(err.value) == (f"supernet checkpoint {trained.path} is for space nb201 {{'channels': 4, "
                              "'cells_per_stage': 1}, the run's space is nb201 {'channels': 8, 'cells_per_stage': 1}")
    with pytest.raises(ConfigError) as err:
        evaluator(trained.path, data={"name": "fashion_mnist", "root": None, "split_file": None})
    assert str(err.value) == (f"supernet checkpoint {trained.path} was trained on digits, the run's data is "
                              "fashion_mnist (pass data=digits)")
    with pytest.raises(ConfigError, match=r"^data: unknown dataset 'mnist9' \(valid: .*imagenet\)$"):
        evaluator(trained.path, data={"name": "mnist9"})
    with pytest.raises(ConfigError, match=r"^data: unknown dataset 'digits' \(valid: "):
        evaluator(trained.path, data="digits")
    # ImageNet's own keys, unset, come with every dataset (conf/evaluator/supernet.yaml) and are dropped
    named = evaluator(trained.path, data={**DIGITS, "transform": None, "recal_images": None})
    assert named.data_cfg == DIGITS == evaluator(trained.path).data_cfg
    with pytest.raises(ConfigError, match=r"^data: unknown key 'transform' "):
        evaluator(trained.path, data={**DIGITS, "transform": "ofa"})


def test_scores_are_rounded_to_4_places_cached_and_costed(trained, monkeypatch):
    monkeypatch.setattr(supernet_evaluator, "SCORES", {})
    ev = evaluator(trained.path)
    arch = NB201Cell(("nor_conv_3x3", "skip_connect") * 3)
    monkeypatch.setattr(ev, "rescore", lambda net, a: (100 / 7, 200 / 7))  # a stand-in score of a 7-image split
    first = ev.evaluate(arch)
    assert (first.accuracy, first.metrics) == (14.2857, {"valid_accuracy": 14.2857, "test_accuracy": 28.5714})
    assert first.params > 0 and first.flops > 0 and ev.computed == 1
    again = ev.evaluate(arch)
    assert again == first and again is not first and ev.computed == 1
    again.metrics["valid_accuracy"] = -1.0                     # a copy: the cached result is not changed
    assert ev.evaluate(arch).metrics["valid_accuracy"] == 14.2857
    other = evaluator(trained.path, val_subset=5)
    assert other.fingerprint() != ev.fingerprint()
    monkeypatch.setattr(other, "rescore", lambda net, a: (1.0, 2.0))
    assert other.evaluate(arch).accuracy == 1.0 and other.computed == 1


def test_a_real_score_is_the_recalibrated_subnet_s_and_its_shapes_are_the_data_s(trained, monkeypatch):
    monkeypatch.setattr(supernet_evaluator, "SCORES", {})
    ev = evaluator(trained.path)
    arch = NB201Cell(("nor_conv_1x1",) * 6)
    valid, test = ev.rescore(ev.weights(arch), arch)
    result = ev.evaluate(arch)
    assert result.metrics == {"valid_accuracy": round(valid, 4), "test_accuracy": round(test, 4)}
    assert result.cost_seconds > 0 and isinstance(result, EvalResult)
    assert ev.input_shape(arch) == (1, 3, 8, 8) and ev.network_config() == {"num_classes": 10, "in_channels": 3}
    assert ev.provenance(arch) == {"origin": "supernet", "checkpoint": str(trained.path),
                                   "checkpoint_sha256": trained.sha256, "recal_batches": 1}


def test_provenance_refuses_a_checkpoint_changed_since_training(trained, tmp_path):
    copy_path = tmp_path / "supernet.pt"
    copy_path.write_bytes(trained.path.read_bytes())
    ev = evaluator(copy_path)
    assert ev.provenance(NB201Cell(("none",) * 6))["checkpoint"] == str(copy_path)  # no sidecar: nothing to check
    sidecar = json.loads(trained.path.with_suffix(".json").read_text())
    copy_path.with_suffix(".json").write_text(json.dumps({**sidecar, "sha256": ""}))
    assert ev.provenance(NB201Cell(("none",) * 6))["checkpoint_sha256"] == trained.sha256  # no sha256 said
    copy_path.with_suffix(".json").write_text(json.dumps({**sidecar, "sha256": "ab" * 32}))
    with pytest.raises(MissingDependencyError) as err:
        ev.provenance(NB201Cell(("none",) * 6))
    assert str(err.value) == (f"supernet checkpoint {copy_path}: sha256 {trained.sha256[:16]} differs from "
                              f"{'ab' * 8} in supernet.json (changed since training)")


# -- each family's routing ----------------------------------------------------------------------------

class Plain(Supernet):
    """The protocol's defaults over a two-decision space."""

    def set_active(self, arch):
        self.arch = arch

    def extract(self, arch):
        return nn.Identity()


def test_the_protocol_s_defaults_are_the_first_and_last_choices_and_no_mixing():
    space = FakeOFASpace()
    net = Plain(space, 5, in_channels=1)
    net.name = "plain"
    assert net.largest().values == (16, 7, 7, 4, 6) and net.smallest().values == (8, 3, 3, 2, 3)
    assert net.config() == {"num_classes": 5, "in_channels": 1} and Plain(space, 5).in_channels == 3
    assert (Plain.default_sampling, Plain.mixes, Plain.phases) == ("uniform", False, ())
    with pytest.raises(NotImplementedError, match=r"^supernet 'plain' does not average choices$"):
        net.set_mixed([(8,)])


def nb201():
    torch.manual_seed(0)
    return SUPERNETS.create("nb201", {"num_classes": 10}, space=NB201Space(channels=4, cells_per_stage=1)).eval()


def test_nb201_routes_one_op_or_the_mean_and_refuses_anything_else():
    from supernets.nb201 import MixedEdge

    net = nb201()
    edges = [m for m in net.modules() if isinstance(m, MixedEdge)]
    assert [e.active for e in edges] == [("nor_conv_3x3",)] * 18                  # built at its largest
    assert [len(m.edges) for m in net.net.cells if hasattr(m, "edges")] == [6, 6, 6]
    channels = [m.edges[0].ops["nor_conv_1x1"][1].in_channels for m in net.net.cells if hasattr(m, "edges")]
    assert channels == [4, 8, 16]
    ops = ("none", "skip_connect", "nor_conv_1x1", "nor_conv_3x3", "avg_pool_3x3", "skip_connect")
    net.set_active(NB201Cell(ops))
    assert [e.active for e in edges[:6]] == [(op,) for op in ops]
    x = torch.randn(2, 4, 4, 4)
    edge = edges[2]
    with torch.no_grad():
        assert torch.equal(edge(x), edge.ops["nor_conv_1x1"](x))
    for bad in ([("none",)] * 5, [("none",)] * 7, [("none",)] * 5 + [()], [("none",)] * 5 + [("conv",)]):
        with pytest.raises(ValueError) as err:
            net.set_mixed(bad)
        assert str(err.value) == "nb201 supernet: set_mixed takes a non-empty list of ops for each of 6 edges"
    for wrong in (Values(ops), ops):
        with pytest.raises(EncodingError) as err:
            net.set_active(wrong)
        assert str(err.value) == f"NB201 supernet takes NB201 cells, got {type(wrong).__name__}"
        with pytest.raises(EncodingError):
            net.extract(wrong)
    assert net.largest() == NB201Cell(("nor_conv_3x3",) * 6) and net.smallest() == NB201Cell(("skip_connect",) * 6)


def test_an_extracted_nb201_subnet_holds_copies_of_the_chosen_ops_weights():
    net = nb201()
    arch = NB201Cell(("nor_conv_1x1", "nor_conv_3x3", "skip_connect", "none", "avg_pool_3x3", "nor_conv_1x1"))
    sub = net.extract(arch).eval()
    shared = net.net.state_dict()
    weights = sub.state_dict()
    assert torch.equal(weights["cells.0.edges.1.1.weight"], shared["cells.0.edges.1.ops.nor_conv_3x3.1.weight"])
    assert torch.equal(weights["cells.4.edges.0.1.weight"], shared["cells.4.edges.0.ops.nor_conv_1x1.1.weight"])
    assert not any(".edges.3." in k for k in weights if "cells.0." in k)          # 'none' holds no weights
    assert torch.equal(weights["stem.0.weight"], shared["stem.0.weight"])
    net.set_active(arch)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(sub(x), net(x), atol=1e-6)


def spos():
    space = SPACES.create("spos", {"stage_repeats": [1, 1, 1, 1], "stage_channels": [8, 16, 32, 64],
                                   "stem_channels": 4, "last_channels": 32, "resolution": 16, "stem_stride": 1,
                                   "num_classes": 10})
    torch.manual_seed(0)
    return SUPERNETS.create("spos", {"num_classes": 10}, space=space).eval()


def test_spos_runs_one_unit_per_block_or_the_mean_and_needs_a_path_first():
    net = spos()
    x = torch.randn(1, 3, 16, 16)
    with pytest.raises(RuntimeError, match=r"^spos supernet: call set_active\(arch\) before forward$"):
        net(x)
    assert [len(units) for units in net.blocks] == [4, 4, 4, 4]
    for bad in ([(0,)] * 3, [(0,)] * 5, [(0,), (0,), (0,), ()]):
        with pytest.raises(ValueError) as err:
            net.set_mixed(bad)
        assert str(err.value) == "spos supernet: set_mixed takes a non-empty choice list for each of 4 blocks"
    arch = net.space.from_values([3, 2, 1, 0])
    net.set_active(arch)
    assert net.active == ((3,), (2,), (1,), (0,))
    sub = net.extract(arch).eval()
    assert [name for name, _ in sub.named_children()] == ["stem", "block0", "block1", "block2", "block3", "head"]
    with torch.no_grad():
        assert torch.allclose(sub(x), net(x), atol=1e-6)
        first = next(sub.block0.parameters())
        first.add_(1.0)
        assert not torch.equal(first, next(net.blocks[0][3].parameters()))       # copies, not the supernet's
    with torch.no_grad():
        h = net.stem(x)
        for units, c in zip(net.blocks[:-1], (3, 2, 1)):
            h = units[c](h)
        net.set_mixed([(3,), (2,), (1,), (0, 2)])
        assert torch.allclose(net(x), net.head((net.blocks[-1][0](h) + net.blocks[-1][2](h)) / 2), atol=1e-6)
        net.set_mixed([(3,), (2,), (1,), (0,)])
        assert torch.allclose(net(x), net.extract(arch).eval()(x), atol=1e-6)
    assert net.largest() == net.space.most_flops() and net.smallest() == net.space.fewest_flops()
    assert net.space.cost(net.largest()).flops > net.space.cost(net.smallest()).flops


def test_autoformer_slices_to_the_active_subnet_and_extracts_its_leading_slices():
    space = SPACES.create("autoformer", AUTOFORMER)
    torch.manual_seed(0)
    net = SUPERNETS.create("autoformer", {"num_classes": 3}, space=space).eval()
    small = net.smallest()
    net.set_active(small)
    assert (net.net.depth, net.net.embed_dim, net.net.patch_embed.out_active) == (small.depth, small.embed_dim,
                                                                                  small.embed_dim)
    block = net.net.blocks[0]
    assert block.qkv.heads == small.heads[0] and block.proj.out_active == block.fc2.out_active == small.embed_dim
    sub = net.extract(small).eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.allclose(sub(x), net(x), atol=1e-5)
    big = net.largest()
    net.set_active(big)
    assert net.net.depth == max(AUTOFORMER["depths"]) and net.net.embed_dim == max(AUTOFORMER["embed_dims"])


def test_ofa_keeps_its_active_subnet_through_an_extraction_and_records_its_dropout():
    space = SPACES.create("ofa_mbv3", {})
    net = SUPERNETS.create("ofa_mbv3", {"num_classes": 10, "dropout_rate": 0.2}, space=space)
    assert net.config() == {"num_classes": 10, "in_channels": 3, "dropout_rate": 0.2}
    assert net.active == net.largest() and net.phases == (("ks",), ("d",), ("e",))
    small = net.smallest()
    net.set_active(small)
    sub = net.extract(net.largest(), copy_weights=False)
    assert net.active == small and isinstance(sub, nn.Module)
    net.eval()
    copied = net.extract(small).eval()   # by default with the supernet's weights: the same outputs
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        out = net(x)
        assert out.shape == (1, 10) and torch.allclose(copied(x), out, atol=1e-5)
    assert net.active == small


def fit(m: SupernetModule, max_steps: int) -> "pl.Trainer":  # noqa: F821
    import pytorch_lightning as pl
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 3, 8, 8), torch.randint(0, 10, (32,)))
    trainer = pl.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(m, DataLoader(data, batch_size=8))
    return trainer


def test_each_training_step_sets_the_cosine_learning_rate_and_counts_itself():
    import math

    m = module(SupernetSettings(lr=0.1, batch_size=8, weight_decay=0.0), total=4)
    trainer = fit(m, 2)
    assert m.steps == 2 and m.cpu_start is not None and m.cpu_used > 0
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 0.25)))
    assert float(trainer.callback_metrics["phase"]) == 0.0 and float(trainer.callback_metrics["loss"]) > 0


def test_a_spent_cpu_budget_stops_training_after_the_step_that_spent_it():
    m = module(SupernetSettings(lr=0.1, batch_size=8, cpu_seconds=1e-6), total=4)
    trainer = fit(m, 3)
    assert m.steps == 1 and m.cpu_used >= 1e-6 and trainer.should_stop
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.1   # the first step: nothing spent yet


def test_the_evaluator_accepts_only_spaces_with_a_supernet():
    cls = EVALUATORS.get("supernet")
    assert [cls.accepts(SPACES.get(name)) for name in ("nb201", "spos", "autoformer", "ofa_mbv3", "nader", "source")] \
        == [True, True, True, True, False, False]


def test_the_sidecar_says_what_the_file_is_and_how_it_was_trained(trained):
    meta = json.loads(trained.path.with_suffix(".json").read_text())
    raw = trained.path.read_bytes()
    assert (meta["file"], meta["bytes"], meta["sha256"]) == ("supernet.pt", len(raw), trained.sha256)
    assert (meta["steps"], meta["seed"], meta["wall_seconds"]) == (1, 0, trained.wall_seconds) and trained.steps == 1
    assert meta["train_cpu_seconds"] == trained.train_cpu_seconds == round(trained.train_cpu_seconds, 1)
    assert meta["train"] == {**TINY.to_dict(), "sampling": "fair"} and meta["supernet"] == {"num_classes": 10,
                                                                                           "in_channels": 3}
    assert meta["largest"] == NB201Cell(("nor_conv_3x3",) * 6).encode()
    assert meta["smallest"] == NB201Cell(("skip_connect",) * 6).encode()
    for which in ("largest", "smallest"):
        value = meta[f"val_accuracy_{which}"]
        assert value == getattr(trained, f"val_accuracy_{which}") and abs(value * 7 / 100 - round(value * 7 / 100)) < 1e-3
    ckpt = torch.load(trained.path, weights_only=True)
    assert {k: ckpt[k] for k in meta if k not in ("file", "bytes", "sha256", "wall_seconds")} == \
        {k: v for k, v in meta.items() if k not in ("file", "bytes", "sha256", "wall_seconds")}


def test_droppath_names_the_supernets_that_can_average():
    space = SPACES.create("autoformer", AUTOFORMER)
    net = SUPERNETS.create("autoformer", {"num_classes": 3}, space=space)
    mixing = [n for n in SUPERNETS.names() if SUPERNETS.get(n).mixes]
    assert mixing == ["nb201", "spos"]
    with pytest.raises(ConfigError) as err:
        SubnetSampler.for_supernet(net, "droppath", 0, 10, seed=0)
    assert str(err.value) == ("supernet.sampling=droppath: the autoformer supernet cannot average its choices "
                              "(one that can: nb201, spos)")
    assert SubnetSampler.for_supernet(net, "uniform", 0, 10, seed=0).sampling == "uniform"


def test_a_supernet_s_input_size_is_its_space_s():
    assert nb201().input_size(NB201Cell(("none",) * 6)) is None
    net = spos()
    assert net.input_size(net.largest()) == 16


def _ofa_file_of_width(w: float) -> dict[str, torch.Tensor]:
    """The layers an OFA-MobileNetV3 zoo file's width is read from, at multiplier `w` (shapes only)."""
    from ofa.utils import MyNetwork, make_divisible

    first, block0, *stages, expand, mix = [make_divisible(b * w, MyNetwork.CHANNEL_DIVISIBLE)
                                           for b in (16, 16, 24, 40, 80, 112, 160, 960, 1280)]
    tensors = {"first_conv.conv.weight": torch.empty(first, 1), "final_expand_layer.conv.weight": torch.empty(expand, 1),
               "feature_mix_layer.conv.weight": torch.empty(mix, 1), "classifier.linear.weight": torch.empty(7, 1),
               "blocks.0.mobile_inverted_conv.point_linear.conv.weight": torch.empty(block0, 1)}
    for i, c in enumerate((c for c in stages for _ in range(4)), start=1):  # 4 blocks a stage
        tensors[f"blocks.{i}.conv.point_linear.conv.conv.weight"] = torch.empty(c, 1)
    return tensors


@pytest.mark.parametrize("w", [0.5, 1.0, 1.2, 2.0, 4.0])
def test_an_ofa_zoo_files_width_multiplier_is_read_from_its_layers(w):
    from supernets.released.ofa_mbv3 import OFAMbv3Format

    fmt = OFAMbv3Format()
    tensors = _ofa_file_of_width(w)
    assert fmt.matches(tensors)
    assert fmt.space_params(tensors) == {"width_mult": w, "num_classes": 7}
    del tensors["feature_mix_layer.conv.weight"]
    assert fmt.space_params(tensors) == {"num_classes": 7}  # a layer it is read from missing: no width

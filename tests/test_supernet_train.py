"""Supernet training (sampling, phases, checkpoint files) and subnet scoring with the supernet evaluator."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from conftest import run_nas
from nas.core.arch import Architecture
from nas.core.space import CategoricalSpace, Decision
from nas.errors import ConfigError, MissingDependencyError
from nas.evaluators import EVALUATORS
from nas.spaces.nb201.arch import NB201Cell
from nas.spaces.nb201.space import NB201Space
from supernets import evaluator as supernet_evaluator
from supernets.settings import SAMPLINGS
from supernets.train import SubnetSampler, SupernetSettings, train_supernet

SPACE = {"name": "nb201", "channels": 4, "cells_per_stage": 1}
DIGITS = {"name": "digits", "root": None, "split_file": None}
TINY = SupernetSettings(epochs=1, batch_size=64, train_subset=256, val_subset=100, recal_batches=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_supernet(SPACE, {}, DIGITS, TINY, seed=0, out_dir=tmp_path_factory.mktemp("sn"), progress=False)


def make_evaluator(path, **params):
    space = NB201Space(channels=4, cells_per_stage=1)
    return EVALUATORS.create("supernet", {"checkpoint": str(path), "recal_batches": 2, "batch_size": 64,
                                          "val_subset": 100, **params}, space=space)


def test_checkpoint_and_its_hash_are_written(trained):
    assert trained.path.name == "supernet.pt" and trained.steps == 4  # 256 images / 64
    meta = json.loads(trained.path.with_suffix(".json").read_text())
    assert meta["sha256"] == trained.sha256 == hashlib.sha256(trained.path.read_bytes()).hexdigest()
    assert meta["space"] == "nb201" and meta["space_params"] == {"channels": 4, "cells_per_stage": 1}
    assert meta["data"] == DIGITS and meta["train"]["sampling"] == "fair" and meta["train"]["epochs"] == 1
    assert 0 <= meta["val_accuracy_largest"] <= 100 and 0 <= meta["val_accuracy_smallest"] <= 100
    ckpt = torch.load(trained.path, weights_only=True)
    assert ckpt["supernet"] == {"num_classes": 10, "in_channels": 3} and "net.stem.0.weight" in ckpt["state_dict"]
    assert not list(trained.path.parent.glob(".*.tmp"))  # atomic writes leave no temp files


def test_evaluator_scores_subnets_and_caches_repeats(trained, monkeypatch):
    monkeypatch.setattr(supernet_evaluator, "SCORES", {})
    ev = make_evaluator(trained.path)
    a, b = NB201Cell(("nor_conv_3x3",) * 6), NB201Cell(("skip_connect", "nor_conv_1x1") * 3)
    first = [ev.evaluate(a), ev.evaluate(b)]
    for r in first:
        assert r.ok and 0 <= r.accuracy <= 100 and 0 <= r.metrics["test_accuracy"] <= 100
        assert r.params > 0 and r.flops > 0 and r.cost_seconds > 0
    assert first[0].params > first[1].params
    assert ev.computed == 2
    again = ev.evaluate(a)
    assert ev.computed == 2 and again == first[0]
    # Another evaluator with the same settings shares the in-process cache.
    twin = make_evaluator(trained.path)
    assert twin.fingerprint() == ev.fingerprint() and twin.evaluate(b) == first[1] and twin.computed == 0


def test_weights_are_the_subnet_that_evaluate_scores(trained, monkeypatch):
    """Export takes a supernet run's weights from `Evaluator.weights`: the very subnet, rescored
    and shaped as `evaluate` did it."""
    monkeypatch.setattr(supernet_evaluator, "SCORES", {})
    ev = make_evaluator(trained.path)
    a = NB201Cell(("nor_conv_3x3",) * 6)
    net = ev.weights(a)
    valid, test = ev.rescore(net, a)
    result = ev.evaluate(a)
    assert (round(valid, 4), round(test, 4)) == (result.accuracy, result.metrics["test_accuracy"])
    assert ev.network_config() == {"num_classes": 10, "in_channels": 3}
    shape = ev.input_shape(a)
    assert shape == (1, 3, 8, 8) and tuple(net.eval()(torch.zeros(shape)).shape) == (1, 10)
    assert sum(p.numel() for p in net.parameters()) == result.params


def test_a_space_with_a_fixed_input_size_scores_resized_data_at_its_own_cost(tmp_path, monkeypatch):
    """SPOS at 32 px on 8x8 digits: images are resized to the space's resolution, so the reported
    params/FLOPs are the space's cost model (what constraints were checked against)."""
    import numpy as np

    from nas.spaces.spos.space import SPOSSpace

    monkeypatch.setattr(supernet_evaluator, "SCORES", {})
    small = {"stage_channels": [16, 32, 64, 128], "stem_channels": 8, "last_channels": 256, "stem_stride": 1,
             "resolution": 32, "num_classes": 10}
    settings = SupernetSettings(epochs=1, batch_size=64, train_subset=64, val_subset=50, recal_batches=1)
    path = train_supernet({"name": "spos", **small}, {}, DIGITS, settings, seed=0, out_dir=tmp_path,
                          progress=False).path
    space = SPOSSpace(**small)
    ev = EVALUATORS.create("supernet", {"checkpoint": str(path), "recal_batches": 1, "batch_size": 64,
                                        "val_subset": 50}, space=space)
    arch = space.sample(np.random.default_rng(0))
    result = ev.evaluate(arch)
    cost = space.cost(arch)
    assert result.ok and (result.params, result.flops) == (cost.params, cost.flops)


def test_fingerprint_follows_checkpoint_and_scoring_settings(trained):
    base = make_evaluator(trained.path).fingerprint()
    assert make_evaluator(trained.path, recal_batches=3).fingerprint() != base
    assert make_evaluator(trained.path, val_subset=50).fingerprint() != base
    assert make_evaluator(trained.path, data=DIGITS).fingerprint() == base  # the checkpoint's own data


def test_bad_checkpoints_and_mismatches_are_one_line_errors(trained, tmp_path):
    with pytest.raises(MissingDependencyError, match="supernet checkpoint not found") as info:
        make_evaluator(tmp_path / "missing.pt")
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="checkpoint is required"):
        make_evaluator("")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(MissingDependencyError, match="unreadable"):
        make_evaluator(tmp_path / "junk.pt")
    with pytest.raises(ConfigError, match="is for space nb201") as info:
        EVALUATORS.create("supernet", {"checkpoint": str(trained.path)}, space=NB201Space())
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="trained on digits"):
        make_evaluator(trained.path, data={"name": "fashion_mnist", "root": None, "split_file": None})
    with pytest.raises(ConfigError, match="recal_batches"):
        make_evaluator(trained.path, recal_batches=-1)


# --- sampling --------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Values(Architecture):
    values: tuple[Any, ...]
    space = "fake"

    def canonical(self) -> str:
        return repr(self.values)

    def encode(self) -> list[Any]:
        return list(self.values)

    @classmethod
    def decode(cls, data: Any) -> "Values":
        return cls(tuple(data))


class FakeOFASpace(CategoricalSpace):
    """OFA-like decision names: a resolution in no phase, then kernel sizes, depths and expansions."""

    def decisions(self) -> list[Decision]:
        return [Decision("r", (8, 12, 16)), Decision("ks[0]", (3, 5, 7)), Decision("ks[1]", (3, 5, 7)),
                Decision("d[0]", (2, 3, 4)), Decision("e[0]", (3, 4, 6))]

    def from_values(self, values: list[Any]) -> Values:
        return Values(tuple(values))

    def to_values(self, arch: Values) -> list[Any]:
        return list(arch.values)

    def decode(self, encoding: Any) -> Values:
        return Values.decode(encoding)


PHASES = (("ks",), ("d",), ("e",))


def sampler(sampling: str, total_steps: int = 8, n_random: int = 6) -> SubnetSampler:
    space = FakeOFASpace()
    largest, smallest = Values((16, 7, 7, 4, 6)), Values((8, 3, 3, 2, 3))
    return SubnetSampler(space, largest, smallest, sampling, PHASES, n_random, total_steps, seed=0)


def test_sandwich_releases_decision_groups_phase_by_phase():
    s = sampler("sandwich")
    assert s.n_phases == 4 and [s.phase(t) for t in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    fixed_by_phase = {0: slice(1, 5), 1: slice(3, 5), 2: slice(4, 5), 3: slice(5, 5)}
    for step in range(8):
        archs = s.draw(step)
        held = fixed_by_phase[s.phase(step)]
        assert archs[0].values == (16, 7, 7, 4, 6)  # the largest first: the teacher
        assert archs[1].values[0] == 8  # the smallest resolution: r is drawn from the start
        assert len({a.key() for a in archs}) == len(archs)  # distinct subnets only
        assert all(a.values[held] == (16, 7, 7, 4, 6)[held] for a in archs), (step, archs)
    released = [a.values for step in (6, 7) for a in s.draw(step)]
    assert Values((8, 3, 3, 2, 3)).values in released  # the last phase trains the true smallest
    assert any(v[1] != 7 for v in released) and any(v[4] != 6 for v in released)


def test_uniform_sampling_draws_one_free_subnet_per_step():
    s = sampler("uniform")
    assert s.n_phases == 1
    draws = [s.draw(step) for step in range(20)]
    assert all(len(d) == 1 for d in draws)
    assert len({d[0].values[1] for d in draws}) > 1  # kernel sizes vary from step 0: no phases


def test_fair_sampling_trains_every_choice_of_every_decision_once_per_step():
    """FairNAS's strict fairness; a sampler drawing random subnets instead leaves choices out."""
    s, choices = sampler("fair"), [d.choices for d in FakeOFASpace().decisions()]
    orders = set()
    for step in range(10):
        archs = s.draw(step)
        assert len(archs) == 3
        assert all(sorted(a.values[i] for a in archs) == sorted(c) for i, c in enumerate(choices)), archs
        orders.add(tuple(a.values for a in archs))
    assert len(orders) > 1  # permuted afresh each step, not one fixed set of subnets


class UnevenSpace(FakeOFASpace):
    def decisions(self) -> list[Decision]:
        return [Decision("a", (0, 1)), Decision("b", (0, 1, 2, 3))]


def test_fair_sampling_covers_decisions_with_fewer_choices():
    s = SubnetSampler(UnevenSpace(), Values((1, 3)), Values((0, 0)), "fair", PHASES, 0, 8, seed=0)
    for step in range(5):
        archs = s.draw(step)
        assert len(archs) == 4 and sorted(a.values[1] for a in archs) == [0, 1, 2, 3]
        assert {a.values[0] for a in archs} == {0, 1}


def test_droppath_averages_fewer_choices_as_the_warmup_goes_then_single_paths():
    """Path dropout: step 0 keeps every choice, the share kept falls to one choice per decision by
    the end of the warm-up, single subnets follow; a CPU budget's progress places it the same way."""
    from supernets.train import Mixed

    space = FakeOFASpace()
    s = SubnetSampler(space, Values((16, 7, 7, 4, 6)), Values((8, 3, 3, 2, 3)), "droppath", PHASES, 0, 100, seed=0,
                      warmup=0.5)
    first, = s.draw(0)
    assert isinstance(first, Mixed) and first.values == tuple(d.choices for d in space.decisions())
    kept = []
    for step in range(50):
        path, = s.draw(step)
        assert isinstance(path, Mixed) and all(v and set(v) <= set(d.choices)
                                              for v, d in zip(path.values, space.decisions()))
        kept.append(sum(map(len, path.values)))
    assert sum(kept[:10]) > sum(kept[20:30]) > sum(kept[40:50]) >= 5 * 10  # never fewer than one each
    assert all(isinstance(p, Values) for step in range(50, 100) for p in s.draw(step))
    assert isinstance(s.draw(0, progress=0.49)[0], Mixed) and isinstance(s.draw(0, progress=0.5)[0], Values)


def test_a_mixed_spos_block_outputs_the_mean_of_its_chosen_units():
    """`set_mixed`: the last block averaging units a and b gives the head the mean of their outputs
    (not their sum, not one of them); one choice per block is `set_active`'s path."""
    from nas.spaces import SPACES
    from supernets.base import SUPERNETS

    space = SPACES.create("spos", {"stage_repeats": [1, 1, 1, 1], "stage_channels": [8, 16, 32, 64],
                                   "stem_channels": 4, "last_channels": 32, "resolution": 16, "stem_stride": 1,
                                   "num_classes": 10})
    torch.manual_seed(0)
    net = SUPERNETS.create("spos", {"num_classes": 10}, space=space).eval()
    base, x = [0, 1, 2, 3], torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        h = net.stem(x)
        for units, c in zip(net.blocks[:-1], base):
            h = units[c](h)
        last = net.blocks[-1]
        net.set_mixed([(0,), (1,), (2,), (1, 3)])
        assert torch.allclose(net(x), net.head((last[1](h) + last[3](h)) / 2), atol=1e-6)
        net.set_mixed([(c,) for c in base])
        single = net(x)
        net.set_active(space.from_values(base))
        assert torch.equal(single, net(x))


def test_a_mixed_nb201_edge_outputs_the_mean_of_its_chosen_ops():
    from nas.spaces import SPACES
    from supernets.base import SUPERNETS
    from supernets.nb201 import MixedEdge

    space = SPACES.create("nb201", {"channels": 4, "cells_per_stage": 1})
    torch.manual_seed(0)
    net = SUPERNETS.create("nb201", {"num_classes": 10}, space=space).eval()
    values = [("nor_conv_3x3", "avg_pool_3x3"), ("skip_connect",), ("none", "nor_conv_1x1", "skip_connect"),
              ("nor_conv_3x3",), ("avg_pool_3x3",), ("nor_conv_1x1", "none")]
    net.set_mixed(values)
    edges = [m for m in net.modules() if isinstance(m, MixedEdge)]
    assert len(edges) == 3 * 6 and all(e.active == values[i % 6] for i, e in enumerate(edges))
    edge, x = edges[0], torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        expected = (edge.ops["nor_conv_3x3"](x) + edge.ops["avg_pool_3x3"](x)) / 2
        assert torch.allclose(edge(x), expected, atol=1e-6)
    with pytest.raises(ValueError, match="non-empty list of ops for each of 6 edges"):
        net.set_mixed([*values[:5], ()])


def test_droppath_needs_a_supernet_that_averages_choices():
    from nas.spaces import SPACES
    from supernets.base import SUPERNETS

    space = SPACES.create("autoformer", {"depths": [1], "embed_dims": [16], "heads": [1], "mlp_ratios": [1.0],
                                         "head_dim": 8, "patch_size": 4, "image_size": 8, "num_classes": 3})
    net = SUPERNETS.create("autoformer", {"num_classes": 3}, space=space)
    with pytest.raises(ConfigError, match="supernet.sampling=droppath: the autoformer supernet cannot average its "
                                          "choices \\(one that can: .*spos"):
        SubnetSampler.for_supernet(net, "droppath", 0, 10, seed=0)


def test_a_cpu_budget_ends_training_and_is_recorded(tmp_path):
    """200 epochs of 4 steps would run 800 steps; one CPU second stops far sooner."""
    settings = SupernetSettings(epochs=200, batch_size=64, train_subset=256, val_subset=64, recal_batches=1,
                                cpu_seconds=1.0)
    out = train_supernet(SPACE, {}, DIGITS, settings, seed=0, out_dir=tmp_path, progress=False)
    meta = json.loads(out.path.with_suffix(".json").read_text())
    assert 1 <= out.steps < 800 and out.train_cpu_seconds >= 1.0
    assert meta["train"]["cpu_seconds"] == 1.0 and meta["train_cpu_seconds"] == out.train_cpu_seconds


def test_real_supernets_declare_phases_over_their_decision_groups():
    from nas.spaces import SPACES
    from supernets.base import SUPERNETS

    for name in SUPERNETS.names():
        cls = SUPERNETS.get(name)
        assert cls.default_sampling in SAMPLINGS
        if cls.phases and name in SPACES.names():
            groups = {d.name.split("[")[0] for d in SPACES.create(name, {}).decisions()}
            assert {g for phase in cls.phases for g in phase} <= groups, name


def test_sandwich_training_with_distillation_runs(tmp_path):
    settings = SupernetSettings(epochs=1, batch_size=64, train_subset=128, val_subset=64, recal_batches=1,
                                sampling="sandwich", n_random=1)
    out = train_supernet(SPACE, {}, DIGITS, settings, seed=1, out_dir=tmp_path, progress=False)
    meta = json.loads(out.path.with_suffix(".json").read_text())
    assert meta["train"]["sampling"] == "sandwich" and meta["train"]["distill"] and out.steps == 2


@pytest.mark.parametrize("change, message", [
    ({"space": {"name": "nader"}}, "space 'nader' has no supernet"),
    ({"settings": {"sampling": "greedy"}}, "supernet.sampling: unknown 'greedy'"),
    ({"settings": {"epochs": 0}}, "supernet.epochs must be an integer >= 1"),
    ({"settings": {"cpu_seconds": 0}}, "supernet.cpu_seconds must be a number > 0 or null, got 0"),
    ({"settings": {"warmup": 1.5}}, "supernet.warmup must be a fraction from 0 to 1, got 1.5"),
    ({"settings": {"cpu_seconds": 5, "devices": 2}}, "supernet.cpu_seconds bounds one process's CPU time"),
    ({"data": {"name": "fashion_mnist", "root": "/nonexistent"}}, "fashion_mnist not found at /nonexistent"),
    ({"params": {"num_classes": 3}}, "supernet.params.num_classes is set from the data"),
])
def test_bad_training_inputs_are_one_line_errors(change, message, tmp_path):
    from nas.errors import NasError

    with pytest.raises(NasError) as info:
        settings = SupernetSettings(**{**TINY.to_dict(), **change.get("settings", {})})
        train_supernet(change.get("space", SPACE), change.get("params", {}), change.get("data", DIGITS), settings,
                       seed=0, out_dir=tmp_path, progress=False)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "supernet.pt").exists()


def test_the_cli_says_what_it_does_before_and_after_the_bar(tmp_path, capsys):
    """`nas train-supernet` was ~13 s silent before Lightning's bar (torch and Lightning's
    imports, the data) and seconds after it (scoring the subnets)."""
    from nas.cli import supernet as supernet_cli

    supernet_cli.main(["space=nb201", "space.channels=4", "space.cells_per_stage=1", "data=digits",
                       "supernet.epochs=1", "supernet.train_subset=64", "supernet.val_subset=50",
                       "supernet.recal_batches=1", f"out={tmp_path}"])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.endswith(" ...")]
    assert said == ["loading torch and Lightning ...", "loading digits and building the supernet ...",
                    "scoring the largest and smallest subnets on validation data ..."], err


# --- end to end ------------------------------------------------------------


@pytest.mark.slow
def test_cli_trains_a_supernet_then_searches_with_it(tmp_path, nas_env):
    space = ["space=nb201", "space.channels=4", "space.cells_per_stage=1", "data=digits", "progress=false"]
    out = tmp_path / "sn"
    r = run_nas(["train-supernet", *space, "supernet.epochs=1", "supernet.train_subset=256",
                 "supernet.val_subset=100", "supernet.recal_batches=2", f"out={out}"], nas_env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"supernet: {out / 'supernet.pt'} sha256 ")
    sha = json.loads((out / "supernet.json").read_text())["sha256"]
    assert sha == hashlib.sha256((out / "supernet.pt").read_bytes()).hexdigest()

    run = tmp_path / "run"
    r = run_nas(["search", *space, "strategy=random", "evaluator=supernet", f"evaluator.checkpoint={out}/supernet.pt",
                 "evaluator.recal_batches=2", "evaluator.val_subset=100", "budget.trials=3", "runner=local",
                 f"hydra.run.dir={run}"], nas_env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(row["error"] is None and 0 <= row["accuracy"] <= 100 for row in rows)

    r = run_nas(["search", "space=nb201", "strategy=random", "evaluator=supernet",
                 f"evaluator.checkpoint={out}/supernet.pt", "budget.trials=1", "runner=local",
                 f"hydra.run.dir={tmp_path / 'bad'}"], nas_env)
    assert r.returncode == 2 and "is for space nb201" in r.stderr.strip().splitlines()[-1]

"""Datasets, augmentation, the recipe, early termination and determinism (CPU, tiny)."""

from __future__ import annotations

import gzip
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from nas.data.module import random_crop, random_flip
from nas.data.sources import FASHION_MNIST_ROOT, cifar10, cifar100, digits, fashion_mnist, imagenet16_120
from nas.errors import ConfigError, MissingDependencyError, NasError
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.macro import Skeleton
from nas.spaces.nader.network import build_network
from nas.train.fit import train
from nas.train.recipe import CPU_PROXY, NB201, Recipe

RESIDUAL = (Path(__file__).resolve().parent / "data" / "blocks" / "residual.txt").read_text()


def tiny_net(channels: int, size: int, seed: int = 0):
    torch.manual_seed(seed)
    sk = Skeleton(depths=(1, 1, 1), input_size=size, in_channels=channels, num_classes=10)
    return build_network(BlockArch.from_text(RESIDUAL).plan(sk, width=8))


def test_nb201_recipe_defaults():
    assert (NB201.epochs, NB201.batch_size, NB201.lr, NB201.momentum, NB201.nesterov, NB201.weight_decay) == (
        200, 256, 0.1, 0.9, True, 5e-4)
    assert CPU_PROXY.epochs < 10 and CPU_PROXY.train_subset


def test_recipe_rejects_bad_values():
    with pytest.raises(ConfigError, match="recipe.epochs must be >= 1, got 0"):
        Recipe(epochs=0)
    with pytest.raises(ConfigError, match="recipe: unknown key 'lr_max'"):
        Recipe.from_dict({"lr_max": 1})


def test_recipe_and_supernet_share_the_sgd_cosine_settings_and_their_checks():
    from nas.train.recipe import SgdCosine
    from supernets.train import SupernetSettings

    assert isinstance(NB201, SgdCosine) and isinstance(SupernetSettings(), SgdCosine)
    assert SupernetSettings().lr == 0.05 and SupernetSettings().momentum == NB201.momentum
    assert set(SupernetSettings().to_dict()) >= {"lr", "momentum", "nesterov", "weight_decay"}
    with pytest.raises(ConfigError, match=r"recipe: need 0 <= momentum < 1 and weight_decay >= 0, got 1.0 and"):
        Recipe(momentum=1.0)
    with pytest.raises(ConfigError, match="supernet.lr must be > 0, got 0"):
        SupernetSettings(lr=0)
    with pytest.raises(ConfigError, match="recipe.lr must be > 0, got True"):
        Recipe(lr=True)


def test_sgd_cosine_steps_to_zero_and_groups_keep_their_weight_decay():
    from nas.train.optim import sgd_cosine

    a, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(2))
    opt, sched = sgd_cosine(Recipe(lr=0.2, weight_decay=0.01), [{"params": [a]}, {"params": [b], "weight_decay": 0.0}], 4)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0] and opt.defaults["nesterov"]
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.2) and lrs[2] == pytest.approx(0.1) and opt.param_groups[0]["lr"] == pytest.approx(0)
    # Nesterov needs momentum: with none the optimiser is plain SGD instead of an error from torch
    assert not sgd_cosine(Recipe(momentum=0.0), [a], 0)[0].defaults["nesterov"]


def test_normaliser_and_channel_stats():
    from nas.data.normalise import Normaliser, channel_stats

    images = torch.tensor([[[[0, 255]], [[51, 51]]]], dtype=torch.uint8)  # one 1x2 image, two channels
    mean, std = channel_stats(images)
    assert mean == pytest.approx((0.5, 0.2)) and std == pytest.approx((0.7071068, 0.0))
    out = Normaliser((0.5, 0.2), (0.5, 0.1)).images(images)
    assert torch.allclose(out, torch.tensor([[[[-1.0, 1.0]], [[0.0, 0.0]]]]), atol=1e-6)


def test_digits_split():
    d = digits()
    assert d.shape == (1, 8, 8) and d.num_classes == 10
    assert (len(d.train), len(d.valid), len(d.test)) == (1078, 359, 360)
    assert d.train.images.dtype == torch.uint8 and int(d.train.images.max()) == 255


@pytest.mark.skipif(not Path(FASHION_MNIST_ROOT).exists(), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_from_debian_package():
    d = fashion_mnist()
    assert d.shape == (1, 28, 28)
    assert (len(d.train), len(d.valid), len(d.test)) == (50_000, 10_000, 10_000)
    assert sorted(d.test.labels.unique().tolist()) == list(range(10))


def _idx(path: Path, array: np.ndarray, magic: int) -> None:
    head = struct.pack(">i", magic) + struct.pack(f">{array.ndim}i", *array.shape)
    path.write_bytes(gzip.compress(head + array.astype(np.uint8).tobytes()))


def test_fashion_mnist_idx_parsing_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60_010), ("t10k", 7)):
        _idx(tmp_path / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 255, (n, 28, 28)), 2051)
        _idx(tmp_path / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, (n,)), 2049)
    d = fashion_mnist(str(tmp_path))
    assert (len(d.train), len(d.valid), len(d.test)) == (50_000, 10_010, 7)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(struct.pack(">i", 7)))
    with pytest.raises(MissingDependencyError, match="is not a valid IDX file"):
        fashion_mnist(str(tmp_path))


def test_corrupt_data_files_are_one_line_errors_naming_the_file(tmp_path):
    (tmp_path / "train-images-idx3-ubyte.gz").write_text("x\n")
    with pytest.raises(MissingDependencyError, match=r"train-images-idx3-ubyte.gz is not a valid gzip file: "
                                                     r"BadGzipFile: Not a gzipped file"):
        fashion_mnist(str(tmp_path))
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00"))
    with pytest.raises(MissingDependencyError, match=r"train-images-idx3-ubyte.gz is not a valid IDX file: error: "):
        fashion_mnist(str(tmp_path))
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]:
        (base / name).write_bytes(bytes(range(7, 256)) * 4)
    with pytest.raises(MissingDependencyError, match=r"data_batch_1 is not a valid pickled batch file: "):
        cifar10(str(tmp_path))
    (base / "data_batch_1").write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)}))
    with pytest.raises(MissingDependencyError, match=r"data_batch_1 is not a valid pickled batch file: no 'labels'"):
        cifar10(str(tmp_path))


@pytest.mark.parametrize("loader, what", [
    (fashion_mnist, "apt-get install dataset-fashion-mnist"),
    (cifar10, "cifar-10-batches-py"),
    (cifar100, "cifar-100-python"),
    (imagenet16_120, "train_data_batch_1..10"),
])
def test_missing_dataset_names_path_and_remedy(loader, what, tmp_path):
    with pytest.raises(MissingDependencyError) as info:
        loader(str(tmp_path / "nowhere"))
    msg = str(info.value)
    assert "\n" not in msg and str(tmp_path / "nowhere") in msg and what in msg


def _pickle(path: Path, obj: dict) -> None:
    path.write_bytes(pickle.dumps(obj, protocol=2))


def test_cifar_and_imagenet16_formats(tmp_path):
    rng = np.random.default_rng(0)
    c10 = tmp_path / "cifar-10-batches-py"
    c10.mkdir()
    for i in range(1, 6):
        _pickle(c10 / f"data_batch_{i}", {b"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8),
                                           b"labels": list(rng.integers(0, 10, 4))})
    _pickle(c10 / "test_batch", {b"data": rng.integers(0, 255, (6, 3072), dtype=np.uint8), b"labels": [1] * 6})
    d = cifar10(str(tmp_path))
    assert d.shape == (3, 32, 32) and (len(d.train), len(d.valid), len(d.test)) == (10, 10, 6)

    split = tmp_path / "split.txt"
    split.write_text('{"train": ["int", ["0", "1", "2"]], "valid": ["int", ["3"]]}')
    assert (len(cifar10(str(tmp_path), split_file=str(split)).train)) == 3

    c100 = tmp_path / "cifar-100-python"
    c100.mkdir()
    for name, n in (("train", 5), ("test", 8)):
        _pickle(c100 / name, {b"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8),
                              b"fine_labels": list(rng.integers(0, 100, n))})
    d = cifar100(str(tmp_path))
    assert d.num_classes == 100 and (len(d.train), len(d.valid), len(d.test)) == (5, 4, 4)

    inet = tmp_path / "ImageNet16"
    inet.mkdir()
    labels = [1, 120, 121, 500, 7]
    _pickle(inet / "train_data_batch_1", {"data": rng.integers(0, 255, (5, 768), dtype=np.uint8), "labels": labels})
    _pickle(inet / "val_data", {"data": rng.integers(0, 255, (4, 768), dtype=np.uint8), "labels": [2, 3, 130, 4]})
    d = imagenet16_120(str(tmp_path))
    assert d.shape == (3, 16, 16) and d.num_classes == 120
    assert d.train.labels.tolist() == [0, 119, 6]  # classes 1..120 only, zero-based


def test_batches_refuse_arbitrary_pickles(tmp_path):
    c10 = tmp_path / "cifar-10-batches-py"
    c10.mkdir()

    class Evil:  # eval, not print: after a Ray test in the same worker, print is Ray's safe_print
        def __reduce__(self):
            return (eval, ("'pwned'",))

    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (c10 / name).write_bytes(pickle.dumps({"data": Evil()}))
    with pytest.raises(NasError, match="data_batch_1 is not a valid pickled batch file: UnpicklingError: "
                                       "refusing to load builtins.eval"):
        cifar10(str(tmp_path))


def test_random_crop_shifts_and_flip_mirrors():
    x = torch.arange(2 * 1 * 4 * 4, dtype=torch.float).view(2, 1, 4, 4) + 1
    gen = torch.Generator().manual_seed(0)
    out = random_crop(x, 1, gen)
    assert out.shape == x.shape
    for i in range(2):  # each crop is a shifted window of the zero-padded image
        padded = torch.nn.functional.pad(x[i], (1, 1, 1, 1))
        windows = [padded[:, r:r + 4, c:c + 4] for r in range(3) for c in range(3)]
        assert any(torch.equal(out[i], w) for w in windows)
    flipped = random_flip(x, torch.Generator().manual_seed(1))
    for i in range(2):
        assert torch.equal(flipped[i], x[i]) or torch.equal(flipped[i], x[i].flip(2))


def test_training_is_deterministic_and_learns():
    d = digits()
    recipe = Recipe(epochs=3, batch_size=64)
    a = train(tiny_net(1, 8), d, recipe, seed=0)
    b = train(tiny_net(1, 8), d, recipe, seed=0)
    assert a.loss_curve == b.loss_curve and a.valid_accuracy == b.valid_accuracy
    assert a.epochs == 3 and a.terminated is None
    assert a.loss_curve[-1] < a.loss_curve[0] and a.valid_accuracy > 30
    assert a.params > 0 and a.flops > 0 and a.device == "cpu"


def test_non_finite_loss_stops_at_once():
    r = train(tiny_net(1, 8), digits(), Recipe(epochs=5, batch_size=64, lr=1e6), seed=0)
    assert r.terminated.startswith("non-finite loss at epoch 1") and r.epochs <= 1
    assert r.valid_accuracy is None and r.test_accuracy is None  # never evaluated


def test_a_training_s_wall_seconds_hold_its_device_seconds_and_are_the_call_s():
    import time

    start = time.perf_counter()
    r = train(tiny_net(1, 8), digits(), Recipe(epochs=5, batch_size=64, lr=1e6), seed=0)  # stops in epoch 1
    took = time.perf_counter() - start
    assert 0 < r.device_seconds <= r.wall_seconds <= took + 0.001


def test_loss_not_improving_stops_after_patience():
    r = train(tiny_net(1, 8), digits(), Recipe(epochs=6, batch_size=64, lr=1e-7, patience_epochs=2), seed=0)
    assert r.terminated.startswith("loss not improving") and r.epochs == 2


@pytest.mark.parametrize("losses, stops", [
    ([1.0], False), ([1.0, 0.95], True), ([1.0, 0.8], False),
    ([1.0, 0.8, 0.95], False),          # past the patience epoch a noisy epoch is no reason to stop
    ([1.0, 0.8, 0.95, 1.2], False),
    ([1.0, 0.8, float("nan")], True),   # a non-finite loss stops at any epoch
])
def test_the_patience_rule_is_judged_once_at_its_epoch(losses, stops):
    from nas.train.early_stop import failing

    reason = failing(losses, Recipe(epochs=10, patience_epochs=2, min_loss_drop=0.1))
    assert (reason is not None) is stops, reason


def _evaluator(**recipe):
    from nas.evaluators.train import TrainEvaluator
    from nas.spaces.nb201.space import NB201Space

    base = {"epochs": 1, "batch_size": 64, "train_subset": 256, **recipe}
    return TrainEvaluator(NB201Space(), {"name": "digits"}, base, channels=4, cells_per_stage=1)


def test_train_evaluator_cache_identity_and_failures():
    import numpy as np

    from nas.errors import ConfigError

    a, b = _evaluator(), _evaluator(epochs=2)
    assert a.fingerprint() != b.fingerprint() and a.fingerprint() == _evaluator().fingerprint()
    arch = a.space.sample(np.random.default_rng(0))
    r1, r2 = a.evaluate(arch, seed=777), a.evaluate(arch, seed=777)
    assert r1.ok and r1.accuracy == r2.accuracy and r1.curve == r2.curve
    assert set(r1.metrics) >= {"valid_accuracy", "test_accuracy", "epochs", "device_seconds"}
    failing = _evaluator(lr=1e6, epochs=3)
    bad = failing.evaluate(arch, seed=777)
    assert not bad.ok and bad.error.startswith("terminated early: non-finite loss")
    with pytest.raises(ConfigError, match="data: unknown dataset 'svhn'"):
        from nas.evaluators.train import TrainEvaluator

        TrainEvaluator(a.space, {"name": "svhn"}, {})


def test_block_width_rounds_to_the_width_multiple_and_enters_the_fingerprint():
    from nas.evaluators.train import TrainEvaluator
    from nas.spaces.nader.arch import BlockArch
    from nas.spaces.nader.space import BlockSpace
    from nas.spaces.nb201.space import NB201Space
    from nas.train.build import build_model

    arch = BlockArch.from_text((Path(__file__).parent / "data" / "blocks" / "residual.txt").read_text())
    space = BlockSpace()
    shape = (3, 32, 32)
    assert space.plan(arch, 10, 3, 32).width == 24  # NB201's budget allows 25
    assert space.plan(arch, 10, 3, 32, {"width_multiple": 1}).width == 25
    net = build_model(space, arch, shape, 10, space.build_options({}), seed=0)
    assert net.classifier.in_features == 4 * 24
    recipe = {"epochs": 1, "batch_size": 64}
    default = TrainEvaluator(space, {"name": "digits"}, recipe)
    assert default.build["width_multiple"] == 8
    assert TrainEvaluator(space, {"name": "digits"}, recipe, width_multiple=1).fingerprint() != default.fingerprint()
    # NB201 cells read no width multiple: their networks, and so their cache entries, do not change
    cells = TrainEvaluator(NB201Space(), {"name": "digits"}, recipe)
    assert TrainEvaluator(NB201Space(), {"name": "digits"}, recipe, width_multiple=1).fingerprint() == cells.fingerprint()
    with pytest.raises(ConfigError, match=r"evaluator.width_multiple must be an integer >= 1, got 0"):
        TrainEvaluator(NB201Space(), {"name": "digits"}, recipe, width_multiple=0)


def test_decay_groups_spare_only_norm_weights_and_biases_from_weight_decay():
    from nas.train.optim import decay_groups

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(4, 2))
    decayed, spared = decay_groups(net.parameters())
    assert sorted(tuple(p.shape) for p in decayed["params"]) == [(2, 4), (4, 3, 3, 3)]
    assert sorted(tuple(p.shape) for p in spared["params"]) == [(2,), (4,), (4,), (4,)]
    assert "weight_decay" not in decayed and spared["weight_decay"] == 0.0

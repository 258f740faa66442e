"""nas/data case by case (issue 52, the library mutation run): each ImageNet setting at and either
side of its bound, the ImageFolder listing's errors whole, the bounded decode cache at its budget,
the papers' crops and boxes on scripted draws, the batch augmentation and the data module's loaders,
the dataset locations, and each on-disk source read from tiny files written here. In-process."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.functional as TF
from PIL import Image
from torchvision.transforms import InterpolationMode

from nas.data import imagenet as I
from nas.data import locations as L
from nas.data import sources as S
from nas.data.imagenet import Decoded, FolderSettings, FolderSplit
from nas.data.module import ImageDataModule, random_crop, random_flip
from nas.data.normalise import Normaliser, channel_stats, to_unit
from nas.data.paper_transforms import IMAGENET_MEAN, IMAGENET_STD, TRANSFORMS, opencv_linear, random_resized_box
from nas.errors import ConfigError, MissingDependencyError

# ---------------------------------------------------------------- ImageNet settings


@pytest.mark.parametrize("data, message", [
    ({"cache_gb": 0}, None),                          # nothing cached: allowed
    ({"cache_gb": -0.5}, "data.cache_gb must be a number >= 0, got -0.5"),
    ({"cache_gb": True}, "data.cache_gb must be a number >= 0, got True"),
    ({"cache_gb": "8"}, "data.cache_gb must be a number >= 0, got '8'"),
    ({"recal_images": 1}, None),
    ({"recal_images": 0}, "data.recal_images must be an integer >= 1, got 0"),
    ({"recal_images": True}, "data.recal_images must be an integer >= 1, got True"),
    ({"recal_images": 2.0}, "data.recal_images must be an integer >= 1, got 2.0"),
    ({"recal_seed": 0}, None),
    ({"recal_seed": -1}, "data.recal_seed must be an integer >= 0, got -1"),
    ({"workers": 1}, None),
    ({"workers": 0}, "data.workers must be an integer >= 1, got 0"),
    ({"recal_augment": False}, None),
    ({"recal_augment": 1}, "data.recal_augment must be true or false, got 1"),
    ({"transform": "auto"}, None),
    ({"transform": "spos"}, None),
    ({"transform": "x"}, "data.transform: unknown 'x' (valid: auto, ofa, spos, autoformer)"),
    ({"split_file": "s.json"}, "data.split_file: imagenet has none (its splits are the train/ and val/ folders)"),
])
def test_each_imagenet_setting_is_checked_at_its_bound(data, message):
    if message is None:
        FolderSettings.from_config({"name": "imagenet", **data}, "ofa_mbv3")
        return
    with pytest.raises(ConfigError) as info:
        FolderSettings.from_config({"name": "imagenet", **data}, "ofa_mbv3")
    assert str(info.value) == message


def test_settings_fill_their_defaults_resolve_auto_and_score_without_where_or_how_fast():
    s = FolderSettings.from_config({"name": "imagenet", "root": "/r", "cache_gb": 2, "split_file": None,
                                    "workers": None}, "spos")
    assert s == FolderSettings(root="/r", transform="spos", cache_gb=2.0) and type(s.cache_gb) is float
    assert s.config() == {"name": "imagenet", "root": "/r", "split_file": None, "transform": "spos",
                          "recal_images": 2000, "recal_seed": 937162211, "recal_augment": True, "cache_gb": 2.0,
                          "workers": None}
    assert s.scored() == {"name": "imagenet", "split_file": None, "transform": "spos", "recal_images": 2000,
                          "recal_seed": 937162211, "recal_augment": True}
    with pytest.raises(ConfigError) as info:
        FolderSettings.from_config({}, "nb201")
    assert str(info.value) == ("data.transform: space 'nb201' has no paper transform; set data.transform "
                               "to one of ofa, spos, autoformer")


# ---------------------------------------------------------------- the listing


def image(path: Path, w: int = 6, h: int = 5, value: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((h, w, 3), value, dtype=np.uint8)).save(path)
    return path


def tree(root: Path, train: dict[str, int], val: dict[str, int]) -> Path:
    for split, classes in (("train", train), ("val", val)):
        (root / split).mkdir(parents=True, exist_ok=True)
        for name, n in classes.items():
            (root / split / name).mkdir(exist_ok=True)
            for i in range(n):
                image(root / split / name / f"{i}.png", value=10 * i)
    return root


@pytest.fixture(autouse=True)
def fresh_scan():
    I.scan.cache_clear()
    yield
    I.scan.cache_clear()


def test_a_class_folder_lists_its_images_of_any_case_in_a_sorted_walk(tmp_path):
    for name in ("b.PNG", "a.jpeg", "z/c.JpG", "notes.txt", "y/d.webp"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert I._images(tmp_path) == ["a.jpeg", "b.PNG", "y/d.webp", "z/c.JpG"]


def test_the_listing_labels_each_file_by_its_sorted_class(tmp_path):
    root = tree(tmp_path / "in", {"b": 1, "a": 2}, {"a": 1, "b": 1})
    data = I.scan(str(root))
    assert data.classes == ("a", "b") and data.num_classes == 2
    assert data.train.files == ("a/0.png", "a/1.png", "b/0.png") and data.train.labels.tolist() == [0, 0, 1]
    assert len(data.train) == 3 and data.train.path(2) == root.absolute() / "train" / "b" / "0.png"
    part = data.train.take([2, 0])
    assert part.files == ("b/0.png", "a/0.png") and part.labels.tolist() == [1, 0] and part.base == data.train.base
    assert data.identity() == I.stable_hash(("a", "b"), data.train.files, data.val.files)
    assert str(root.absolute()) in L.locations()


@pytest.mark.parametrize("train, val, loose, message", [
    ({"a": 1, "b": 1}, {"a": 1}, 0, "class folder 'b' is in {r}/train but not in {r}/val (1 classes differ)"),
    ({"a": 1}, {"a": 1, "c": 1, "d": 1}, 0, "class folder 'c' is in {r}/val but not in {r}/train (2 classes differ)"),
    ({"a": 1}, {"a": 0}, 0, "class folder {r}/val/a holds no images (.jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, "
                            ".tiff, .webp)"),
    ({"a": 1}, {}, 2, "{r}/val has no class folders but 2 loose images: sort them into one folder per class "
                      "(ImageNet's valprep script)"),
    ({"a": 1}, {}, 0, "{r}/val has no class folders"),
])
def test_a_malformed_tree_is_one_line_naming_what_is_missing(tmp_path, train, val, loose, message):
    root = tree(tmp_path / "in", train, val)
    for i in range(loose):
        image(root / "val" / f"{i}.JPEG")
    (root / "val" / "readme.txt").write_text("x")
    with pytest.raises(MissingDependencyError) as info:
        I.scan(str(root))
    r = root.absolute()
    assert str(info.value) == ("imagenet: " + message.format(r=r) + " (expected the ImageFolder layout: train/ and val/, "
                                                      "one folder per class; set data.root)")


def test_a_missing_root_or_split_is_named(tmp_path):
    with pytest.raises(MissingDependencyError, match=rf"^imagenet: {tmp_path}/none is not a folder "):
        I.scan(str(tmp_path / "none"))
    (tmp_path / "x" / "train" / "a").mkdir(parents=True)
    with pytest.raises(MissingDependencyError, match=rf"^imagenet: {tmp_path}/x/val is not a folder "):
        I.scan(str(tmp_path / "x"))


def test_an_unreadable_image_is_one_line_and_a_grey_one_reads_as_rgb(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(MissingDependencyError) as info:
        I.open_rgb(tmp_path / "bad.png")
    assert str(info.value).startswith(f"{tmp_path / 'bad.png'} is not a readable image (UnidentifiedImageError: ")
    Image.fromarray(np.full((2, 3), 7, dtype=np.uint8)).save(tmp_path / "g.png")
    rgb = I.open_rgb(tmp_path / "g.png")
    assert rgb.mode == "RGB" and np.asarray(rgb).tolist() == [[[7, 7, 7]] * 3] * 2


# ---------------------------------------------------------------- the decode cache


def split_of(tmp_path: Path, n: int) -> FolderSplit:
    for i in range(n):
        image(tmp_path / "c" / f"{i}.png", value=i)
    return FolderSplit(tmp_path, tuple(f"c/{i}.png" for i in range(n)), np.arange(n, dtype=np.int64))


def corner(img: Image.Image, size: int, k: int) -> np.ndarray:
    """A transform: the image's top-left `size` square, plus its position (to see which one came)."""
    return np.asarray(img)[:size, :size] + np.uint8(k)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_split_that_fits_the_budget_exactly_is_decoded_once(tmp_path, workers):
    split = split_of(tmp_path, 3)
    cache = Decoded(3 * 3 * 2 * 2, workers)  # three 2x2 RGB images: exactly the budget
    for _ in range(2):
        got = list(cache.batches("train", split, 2, corner, batch_size=2))
        assert [tuple(x.shape) for x, _ in got] == [(2, 3, 2, 2), (1, 3, 2, 2)]
        assert [y.tolist() for _, y in got] == [[0, 1], [2]]
        assert [x[:, 0, 0, 0].tolist() for x, _ in got] == [[0, 2], [4]]  # image i holds i, plus its position i
    assert cache.decodes == 3 and cache.used() == 36 and list(cache.held) == [("train", 2)]


def test_a_split_one_byte_over_the_budget_is_streamed_each_time(tmp_path):
    split = split_of(tmp_path, 3)
    cache = Decoded(35, 1)
    for _ in range(2):
        assert [y.tolist() for _, y in cache.batches("train", split, 2, corner, batch_size=2)] == [[0, 1], [2]]
    assert cache.decodes == 6 and cache.held == {} and cache.used() == 0


@pytest.mark.parametrize("workers, n, threaded", [(2, 2, True), (1, 2, False), (2, 1, False)])
def test_decoding_runs_in_the_worker_threads_when_there_are_two_images_and_two_workers(tmp_path, workers, n,
                                                                                      threaded):
    import threading

    split, where = split_of(tmp_path, n), []

    def recorded(img: Image.Image, size: int, k: int) -> np.ndarray:
        where.append(threading.current_thread() is threading.main_thread())
        return corner(img, size, k)

    Decoded(0, workers)._decode(split, range(n), 2, recorded)
    assert where == [not threaded] * n


def test_the_decode_threads_default_to_the_cpus_up_to_eight():
    assert Decoded(0).workers == min(8, os.cpu_count() or 1) and Decoded(0, 3).workers == 3


# ---------------------------------------------------------------- paper transforms


def test_a_random_resized_box_may_be_one_pixel_wide():
    """A 1-wide image takes a box of width 1 from the draw, not the fallback centre box."""
    assert random_resized_box(np.random.default_rng(0), 10, 1) == (1, 0, 1, 1)
    assert random_resized_box(np.random.default_rng(2), 10, 1) == (5, 0, 2, 1)


@pytest.mark.parametrize("height, width, box", [
    (100, 10, (43, 0, 13, 10)),   # narrower than 3:4: the full width, 4:3 as tall
    (10, 100, (0, 43, 10, 13)),   # wider than 4:3
    (10, 10, (0, 0, 10, 10)),
    (4, 3, (0, 0, 4, 3)),         # exactly 3:4: the whole image
])
def test_after_ten_misses_the_box_is_the_centred_one_in_the_ratio_range(height, width, box):
    assert random_resized_box(np.random.default_rng(0), height, width, scale=(5.0, 5.0)) == box


def test_a_random_resized_box_stays_inside_the_image():
    rng = np.random.default_rng(1)
    for _ in range(50):
        top, left, h, w = random_resized_box(rng, 30, 40)
        assert 0 < h <= 30 and 0 < w <= 40 and 0 <= top <= 30 - h and 0 <= left <= 40 - w


def picture(w: int = 40, h: int = 30) -> Image.Image:
    return Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_spos_resizes_the_shorter_side_with_opencv_and_centre_crops():
    img = picture()  # 40 x 30: short 9 at size 8, the long side 12
    want = opencv_linear(np.asarray(img), 9, 12)[0:8, 2:10]
    assert np.array_equal(TRANSFORMS["spos"].eval_image(img, 8), want)
    tall = picture(30, 40)
    assert np.array_equal(TRANSFORMS["spos"].eval_image(tall, 8), opencv_linear(np.asarray(tall), 12, 9)[2:10, 0:8])


@pytest.mark.parametrize("name, short, mode", [("ofa", 10, InterpolationMode.BILINEAR),
                                              ("autoformer", 9, InterpolationMode.BICUBIC)])
def test_ofa_and_autoformer_resize_with_torchvision_and_centre_crop(name, short, mode):
    img = picture()
    resized = np.asarray(TF.resize(img, short, mode))
    top, left = round((resized.shape[0] - 8) / 2), round((resized.shape[1] - 8) / 2)
    got = TRANSFORMS[name].eval_image(img, 8)
    assert got.shape == (8, 8, 3) and np.array_equal(got, resized[top:top + 8, left:left + 8])


def test_the_resizes_are_each_paper_s():
    assert [TRANSFORMS["ofa"].resize(r) for r in (224, 160, 7)] == [256, 183, 8]
    assert [TRANSFORMS["spos"].resize(r) for r in (224, 7)] == [256, 8]
    assert [TRANSFORMS["autoformer"].resize(r) for r in (224, 7)] == [256, 8]


def test_a_recalibration_image_without_jitter_is_the_seeded_crop_and_flip():
    img = picture()
    for k in range(4):
        rng = np.random.default_rng([5, 8, k])
        top, left, h, w = random_resized_box(rng, 30, 40)
        want = TF.resized_crop(img, top, left, h, w, [8, 8], InterpolationMode.BILINEAR)
        if rng.uniform() < 0.5:
            want = TF.hflip(want)
        assert np.array_equal(TRANSFORMS["autoformer"].recal_image(5)(img, 8, k), np.asarray(want))
    ofa = TRANSFORMS["ofa"].recal_image(5)
    assert np.array_equal(ofa(img, 8, 1), ofa(img, 8, 1)) and not np.array_equal(ofa(img, 8, 1), ofa(img, 8, 2))


def test_the_jitter_draws_each_enabled_factor_in_one_plus_or_minus_its_range():
    img = picture()
    rng, replay = np.random.default_rng(3), np.random.default_rng(3)
    got = TRANSFORMS["ofa"]._jitter(img, rng)  # brightness 32/255, no contrast, saturation 0.5
    want = img
    for i in replay.permutation(3):
        if i == 0:
            want = TF.adjust_brightness(want, float(replay.uniform(1 - 32 / 255, 1 + 32 / 255)))
        elif i == 2:
            want = TF.adjust_saturation(want, float(replay.uniform(0.5, 1.5)))
    assert np.array_equal(np.asarray(got), np.asarray(want))
    spos = TRANSFORMS["spos"].__class__("x", lambda r: r, None, True, (1.5, 0.0, 0.0))
    rng, replay = np.random.default_rng(4), np.random.default_rng(4)
    replay.permutation(3)
    assert np.array_equal(np.asarray(spos._jitter(img, rng)),
                          np.asarray(TF.adjust_brightness(img, float(replay.uniform(0.0, 2.5)))))


def test_finish_is_bgr_0_255_for_spos_and_imagenet_normalised_otherwise():
    x = torch.tensor([[[[0]], [[128]], [[255]]]], dtype=torch.uint8)
    assert TRANSFORMS["spos"].finish(x).flatten().tolist() == [255.0, 128.0, 0.0]
    want = [(v / 255 - m) / s for v, m, s in zip((0, 128, 255), IMAGENET_MEAN, IMAGENET_STD)]
    assert TRANSFORMS["ofa"].finish(x).flatten().tolist() == pytest.approx(want, abs=1e-6)


# ---------------------------------------------------------------- normalise and the data module


def test_to_unit_channel_stats_and_the_normaliser():
    x = torch.tensor([[[[0, 255]], [[51, 51]]]], dtype=torch.uint8)
    assert to_unit(x).flatten().tolist() == pytest.approx([0.0, 1.0, 0.2, 0.2]) and to_unit(x).dtype == torch.float32
    mean, std = channel_stats(x)
    assert mean == pytest.approx((0.5, 0.2)) and std == pytest.approx((0.5 ** 0.5, 0.0))
    n = Normaliser((0.5, 0.2), (0.5, 0.1))
    assert n.images(x).flatten().tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0], abs=1e-6)
    assert n(torch.ones(1, 2, 1, 1, dtype=torch.float64)).flatten().tolist() == pytest.approx([1.0, 8.0])


def test_random_crop_pads_and_shifts_each_image_by_its_draw():
    x = torch.arange(1, 10, dtype=torch.float32).reshape(1, 1, 3, 3).repeat(2, 1, 1, 1)
    assert random_crop(x, 0) is x
    gen = torch.Generator().manual_seed(0)
    dy = torch.randint(0, 3, (2,), generator=gen)
    dx = torch.randint(0, 3, (2,), generator=gen)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    got = random_crop(x, 1, torch.Generator().manual_seed(0))
    for i in range(2):
        assert torch.equal(got[i, 0], padded[i, 0, dy[i]:dy[i] + 3, dx[i]:dx[i] + 3])
    assert got.shape == x.shape


def test_random_flip_mirrors_the_images_whose_draw_is_under_a_half():
    x = torch.arange(4 * 2, dtype=torch.float32).reshape(4, 1, 1, 2)
    draws = torch.rand(4, generator=torch.Generator().manual_seed(1))
    got = random_flip(x, torch.Generator().manual_seed(1))
    for i in range(4):
        assert got[i].flatten().tolist() == (x[i].flip(2) if draws[i] < 0.5 else x[i]).flatten().tolist()


def data(n: int = 8) -> S.ImageData:
    split = S.Split(torch.arange(n, dtype=torch.uint8).reshape(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous(),
                    torch.arange(n))
    return S.ImageData("toy", split, split, split, n, (0.0,), (1 / 255,), pad=1)


def test_the_module_shuffles_only_training_by_its_seed_and_takes_subsets():
    dm = ImageDataModule(data(), 8, False, False, train_subset=6, valid_subset=8, test_subset=9, seed=3)
    train = next(iter(dm.train_dataloader()))[1].tolist()
    again = ImageDataModule(data(), 8, False, False, train_subset=6, seed=3).train_dataloader()
    other = ImageDataModule(data(), 8, False, False, train_subset=6, seed=4).train_dataloader()
    assert sorted(train) == list(range(6)) and train != sorted(train)
    assert next(iter(again))[1].tolist() == train and next(iter(other))[1].tolist() != train
    assert next(iter(dm.val_dataloader()))[1].tolist() == list(range(8))
    assert next(iter(dm.test_dataloader()))[1].tolist() == list(range(8))
    assert len(dm.split("train")) == 6 and dm.split("valid") is dm.data.valid


def test_outside_training_a_batch_is_only_normalised():
    dm = ImageDataModule(data(), 256, flip=True, crop=True)
    x, y = dm.on_after_batch_transfer((dm.data.train.images, dm.data.train.labels), 0)
    assert x[:, 0, 0, 0].tolist() == pytest.approx(list(map(float, range(8))), abs=1e-4) and y.tolist() == list(range(8))


@pytest.mark.parametrize("n, kept", [(None, 5), (6, 5), (5, 5), (4, 4), (0, 0)])
def test_a_subset_is_the_first_n_or_the_whole_split(n, kept):
    s = S.Split(torch.zeros(5, 1, 1, 1, dtype=torch.uint8), torch.arange(5))
    sub = s.subset(n)
    assert len(sub) == kept and (sub is s) == (kept == 5 and n != 0)


# ---------------------------------------------------------------- locations


def test_each_source_reads_its_own_folder_under_its_root(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert L.reads("cifar10") == [str(tmp_path / "data" / "cifar-10-batches-py")]
    assert L.reads("cifar100", "/d", "/s.json") == ["/s.json", "/d/cifar-100-python"]
    assert L.reads("imagenet16_120", "/d") == ["/d/ImageNet16"]
    assert L.reads("imagenet") == [str(tmp_path / "data" / "imagenet")] and L.reads("imagenet", "/i") == ["/i"]
    assert L.reads("fashion_mnist") == ["/usr/share/datasets/fashion-mnist"]
    assert L.reads("fashion_mnist", "/f") == ["/f"]
    assert L.reads("other") == [] and L.reads("other", "/o") == ["/o"] and L.reads(None) == []
    sk = L.sklearn_data()
    assert L.reads("digits") == ([str(sk / "digits.csv.gz")] if sk else [])


def test_locations_list_the_defaults_what_was_asked_and_a_source_s_root_once_each(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(L, "_asked", set())
    L.asked("cifar10", "/c")
    sk = L.sklearn_data()
    base = ["/usr/share/datasets", str(tmp_path / "data"), *([str(sk)] if sk else [])]
    assert L.locations() == [*base, "/c", "/c/cifar-10-batches-py"]
    assert L.locations("imagenet", "/c") == [*base, "/c", "/c/cifar-10-batches-py"]
    assert L.locations("cifar100", "/e") == [*base, "/c", "/c/cifar-10-batches-py", "/e/cifar-100-python", "/e"]


# ---------------------------------------------------------------- sources


def batch(path: Path, rows: int, size: int, labels: list[int], key: str = "labels", protocol: int = 2) -> None:
    data = (np.arange(rows * 3 * size * size) % 251).astype(np.uint8).reshape(rows, 3 * size * size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps({b"data": data, key.encode(): labels}, protocol=protocol))


def test_cifar10_splits_its_training_images_by_the_split_file_or_a_seeded_permutation(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    for i in range(1, 6):
        batch(base / f"data_batch_{i}", 2, 32, [i, i + 1])
    batch(base / "test_batch", 3, 32, [7, 8, 9])
    (tmp_path / "split.json").write_text(json.dumps({"train": ["int", ["9", "0"]], "valid": ["int", ["1"]]}))
    d = S.cifar10(str(tmp_path), str(tmp_path / "split.json"))
    assert (d.name, d.num_classes, d.pad, d.mirror, d.shape) == ("cifar10", 10, 4, True, (3, 32, 32))
    assert d.train.labels.tolist() == [6, 1] and d.valid.labels.tolist() == [2] and d.test.labels.tolist() == [7, 8, 9]
    first = torch.from_numpy((np.arange(3072) % 251).astype(np.uint8)).reshape(3, 32, 32)
    assert torch.equal(d.train.images[1], first)  # row 0 of data_batch_1: channels first
    plain = S.cifar10(str(tmp_path))
    order = np.random.default_rng(0).permutation(10)
    labels = [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    assert plain.train.labels.tolist() == [labels[i] for i in order[:5]]
    assert plain.valid.labels.tolist() == [labels[i] for i in order[5:]]
    (base / "test_batch").unlink()
    with pytest.raises(MissingDependencyError) as info:
        S.cifar10(str(tmp_path))
    assert str(info.value) == (f"cifar10 not found at {base / 'test_batch'} (expected torchvision's "
                               f"cifar-10-batches-py/); {S.CIFAR_HOW}")


def test_cifar100_halves_its_test_set_into_valid_and_test(tmp_path):
    base = tmp_path / "cifar-100-python"
    batch(base / "train", 2, 32, [0, 99], "fine_labels")
    batch(base / "test", 5, 32, [1, 2, 3, 4, 5], "fine_labels")
    d = S.cifar100(str(tmp_path))
    order = np.random.default_rng(0).permutation(5)
    assert d.valid.labels.tolist() == [order[i] + 1 for i in range(2)]
    assert d.test.labels.tolist() == [order[i] + 1 for i in range(2, 5)]
    assert (d.num_classes, d.pad, d.train.labels.tolist()) == (100, 4, [0, 99])


def test_imagenet16_keeps_classes_1_to_120_numbered_from_0(tmp_path):
    base = tmp_path / "ImageNet16"
    batch(base / "train_data_batch_1", 3, 16, [1, 120, 121])
    batch(base / "train_data_batch_2", 1, 16, [5])
    batch(base / "val_data", 2, 16, [121, 2])
    d = S.imagenet16_120(str(tmp_path))
    assert d.train.labels.tolist() == [0, 119, 4] and (d.num_classes, d.pad) == (120, 2)
    assert len(d.valid) + len(d.test) == 1 and d.shape == (3, 16, 16)
    with pytest.raises(MissingDependencyError, match=r"^imagenet16_120 not found at .*ImageNet16 \(expected NB201's train_data_batch_1\.\.10 and val_data\); "):
        (base / "val_data").unlink()
        S.imagenet16_120(str(tmp_path))


@pytest.mark.parametrize("content, reason", [
    (pickle.dumps([1]), "a list, not a dict"),
    (pickle.dumps({"data": 1}), "no 'labels' entry"),
    (pickle.dumps({"labels": 1}), "no 'data' entry"),
    (pickle.dumps({"data": os.system}), "UnpicklingError: refusing to load posix.system"),
])
def test_a_bad_batch_is_one_line_naming_its_file(tmp_path, content, reason):
    (tmp_path / "b").write_bytes(content)
    with pytest.raises(MissingDependencyError) as info:
        S._load_batch(tmp_path / "b")
    assert str(info.value) == f"{tmp_path / 'b'} is not a valid pickled batch file: {reason}"


@pytest.mark.parametrize("content, reason", [
    (None, "split file not found at {p}"),
    ({"xvalid": ["int", ["1"]]}, "split file {p} has no usable ('xvalid', 'xtest') lists ('xtest')"),
    ({"xvalid": ["int"], "xtest": ["int", []]}, "split file {p} has no usable ('xvalid', 'xtest') lists "
                                                "(list index out of range)"),
])
def test_a_bad_split_file_is_one_line(tmp_path, content, reason):
    p = tmp_path / "s.json"
    if content is not None:
        p.write_text(json.dumps(content))
    with pytest.raises(MissingDependencyError) as info:
        S._split_lists(str(p), ("xvalid", "xtest"))
    assert str(info.value) == reason.format(p=p)
    assert S._split_lists(None, ("a", "b")) is None and S._split_lists("", ("a", "b")) is None


def idx(path: Path, magic: int, dims: tuple[int, ...], gz: bool) -> None:
    """An IDX file of bytes 0..6 repeating (`i % 7` at position i)."""
    raw = struct.pack(">i", magic) + struct.pack(f">{len(dims)}i", *dims) + (
        np.arange(int(np.prod(dims))) % 7).astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if gz else raw)


def test_fashion_mnist_reads_idx_files_plain_or_gzipped_and_holds_out_the_last_of_training(tmp_path):
    idx(tmp_path / "train-images-idx3-ubyte.gz", 2051, (50_002, 1, 1), True)
    idx(tmp_path / "train-labels-idx1-ubyte", 2049, (50_002,), False)
    idx(tmp_path / "t10k-images-idx3-ubyte", 2051, (3, 1, 1), False)
    idx(tmp_path / "t10k-labels-idx1-ubyte.gz", 2049, (3,), True)
    d = S.fashion_mnist(str(tmp_path))
    assert (len(d.train), len(d.valid), len(d.test), d.shape, d.pad) == (50_000, 2, 3, (1, 1, 1), 2)
    assert d.valid.labels.tolist() == [50_000 % 7, 50_001 % 7] and d.test.labels.tolist() == [0, 1, 2]
    assert d.train.images.dtype == torch.uint8 and d.valid.images.flatten().tolist() == [50_000 % 7, 50_001 % 7]


@pytest.mark.parametrize("write, reason", [
    (lambda p: p.write_bytes(struct.pack(">i", 2049)), "IDX file: magic 2049, expected 2051"),
    (lambda p: p.write_bytes(b"\x00"), "IDX file: error: unpack requires a buffer of 4 bytes"),
    (lambda p: p.write_bytes(struct.pack(">iiii", 2051, 2, 2, 2) + b"\x00"),
     "IDX file: ValueError: cannot reshape array of size 1 into shape (2,2,2)"),
])
def test_a_bad_idx_file_is_one_line(tmp_path, write, reason):
    write(tmp_path / "train-images-idx3-ubyte")
    with pytest.raises(MissingDependencyError) as info:
        S.fashion_mnist(str(tmp_path))
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'train-images-idx3-ubyte'} is not a valid ")
    assert text.endswith(reason.split(": ", 1)[1]) and reason.split(":")[0] in text


def test_a_missing_or_broken_fashion_mnist_says_how_to_get_it(tmp_path):
    with pytest.raises(MissingDependencyError) as info:
        S.fashion_mnist(str(tmp_path))
    assert str(info.value) == (f"fashion_mnist not found at {tmp_path} (expected train-images-idx3-ubyte[.gz]); "
                               "install it with `apt-get install dataset-fashion-mnist` or set data.root")
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(MissingDependencyError, match=r"is not a valid gzip file: BadGzipFile: "):
        S.fashion_mnist(str(tmp_path))


def test_digits_split_60_20_20_unmirrored_and_uncropped():
    d = S.digits()
    assert (len(d.train), len(d.valid), len(d.test)) == (1078, 359, 360)
    assert (d.pad, d.mirror, d.num_classes, d.shape) == (0, False, 10, (1, 8, 8))
    assert int(d.train.images.max()) == 255


def test_load_data_notes_the_location_and_reads_once(monkeypatch, tmp_path):
    calls = []

    def fake(**kw):
        calls.append(kw)
        return "data"

    monkeypatch.setitem(S.SOURCES, "fake_cases", fake)
    monkeypatch.setattr(L, "_asked", set())
    S.load_data.cache_clear()
    assert S.load_data("fake_cases", str(tmp_path)) == "data" and S.load_data("fake_cases", str(tmp_path)) == "data"
    assert calls == [{"root": str(tmp_path), "split_file": None}] and str(tmp_path) in L.locations()
    S.load_data.cache_clear()


def test_grey_images_become_three_equal_channels_and_other_counts_are_refused():
    grey = data(2)
    rgb = grey.rgb()
    assert rgb.shape == (3, 2, 2) and rgb.mean == (0.0, 0.0, 0.0) and rgb.std == (1 / 255,) * 3
    assert torch.equal(rgb.test.images[:, 2], grey.test.images[:, 0]) and (rgb.pad, rgb.mirror) == (1, True)
    assert rgb.rgb() is rgb and rgb.num_classes == 2 and rgb.name == "toy"
    two = S.ImageData("two", *(S.Split(torch.zeros(1, 2, 1, 1, dtype=torch.uint8), torch.zeros(1)),) * 3, 2,
                      (0.0, 0.0), (1.0, 1.0), 0)
    with pytest.raises(ValueError, match=r"^two: cannot make 2-channel images RGB$"):
        two.rgb()

"""ImageNet as an ImageFolder source for the supernet evaluator: the listing (torchvision's order),
one line per malformed folder, the papers' transforms on known images, BatchNorm recalibration on
OFA's seeded subset, the bounded decode cache, and a cache key that follows every score input."""

from __future__ import annotations

import math
import shutil
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from PIL import Image
from torch import nn

from nas.config import check_config
from nas.data import imagenet
from nas.data.imagenet import Decoded, FolderSettings, open_rgb, scan
from nas.data.locations import locations, reads
from nas.data.paper_transforms import TRANSFORMS, opencv_linear, random_resized_box
from nas.errors import ConfigError, MissingDependencyError
from nas.evaluators.base import evaluate_safely
from nas.spaces.ofa_mbv3.space import OFAMbv3Space
from supernets import evaluator as supernet_evaluator
from supernets.base import SUPERNETS
from supernets.evaluator import SupernetEvaluator
from supernets.scoring import FolderFeeder, score
from support.imagefolder import wnid, write_folder

CLASSES = 10
SPACE = OFAMbv3Space(resolutions=(24, 32), width_mult=0.5, num_classes=CLASSES)


@pytest.fixture(autouse=True)
def fresh_listing():
    scan.cache_clear()  # a folder a test changes is listed again
    yield
    scan.cache_clear()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_folder(tmp_path_factory.mktemp("imagenet") / "tiny", CLASSES, train=3, val=2)


def checkpoint(path: Path, space: OFAMbv3Space = SPACE, data: dict | None = None) -> Path:
    """A supernet file of `space` (random weights) in `nas train-supernet`'s format, trained on ImageNet."""
    torch.manual_seed(0)
    net = SUPERNETS.create("ofa_mbv3", {"num_classes": space.num_classes}, space=space)
    torch.save({"space": "ofa_mbv3", "space_params": space.params(), "supernet": net.config(),
                "state_dict": net.state_dict(), "data": data or {"name": "imagenet"}}, path)
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return checkpoint(tmp_path_factory.mktemp("ckpt") / "supernet.pt")


def evaluator(ckpt: Path, root: Path, **kw) -> SupernetEvaluator:
    data = {"name": "imagenet", "root": str(root), **kw.pop("data", {})}
    return SupernetEvaluator(SPACE, str(ckpt), data=data, **{"batch_size": 8, "device": "cpu", **kw})


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------ the listing


def test_listing_is_torchvisions_imagefolder_order(folder):
    from torchvision.datasets import ImageFolder

    data = scan(str(folder))
    assert data.classes == tuple(wnid(c) for c in range(CLASSES)) and data.num_classes == CLASSES
    for split in ("train", "val"):
        theirs = ImageFolder(str(folder / split)).samples
        ours = getattr(data, split)
        assert [(str(ours.path(k)), int(ours.labels[k])) for k in range(len(ours))] == theirs


def test_classes_are_sorted_folder_names_not_creation_order(tmp_path):
    for split in ("train", "val"):
        for name in ("n3", "n1", "n2"):  # made out of order
            (tmp_path / split / name).mkdir(parents=True)
            Image.new("RGB", (4, 4)).save(tmp_path / split / name / "a.png")
    data = scan(str(tmp_path))
    assert data.classes == ("n1", "n2", "n3") and data.val.labels.tolist() == [0, 1, 2]
    assert [f.split("/")[0] for f in data.val.files] == ["n1", "n2", "n3"]


def _no_train(root: Path) -> str:
    shutil.rmtree(root / "train")
    return f"{root / 'train'} is not a folder"


def _class_only_in_train(root: Path) -> str:
    shutil.rmtree(root / "val" / wnid(1))
    shutil.rmtree(root / "val" / wnid(2))
    return f"class folder '{wnid(1)}' is in {root / 'train'} but not in {root / 'val'} (2 classes differ)"


def _class_only_in_val(root: Path) -> str:
    shutil.rmtree(root / "train" / wnid(0))
    return f"class folder '{wnid(0)}' is in {root / 'val'} but not in {root / 'train'}"


def _empty_class(root: Path) -> str:
    for f in (root / "val" / wnid(2)).iterdir():
        f.unlink()
    (root / "val" / wnid(2) / "notes.txt").write_text("not an image")
    return f"class folder {root / 'val' / wnid(2)} holds no images"


def _val_not_sorted_into_classes(root: Path) -> str:
    shutil.rmtree(root / "val")  # ImageNet's val tarball: 50,000 files in one folder
    (root / "val").mkdir()
    for i in range(3):
        Image.new("RGB", (4, 4)).save(root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG")
    return f"{root / 'val'} has no class folders but 3 loose images: sort them into one folder per class"


def _missing_root(root: Path) -> str:
    shutil.rmtree(root)
    return f"{root} is not a folder"


@pytest.mark.parametrize("damage", [_no_train, _class_only_in_train, _class_only_in_val, _empty_class,
                                    _val_not_sorted_into_classes, _missing_root])
def test_a_malformed_folder_is_one_line_saying_what_is_missing(tmp_path, damage):
    root = write_folder(tmp_path / "inet", 6, train=1, val=1)
    expected = damage(root)
    with pytest.raises(MissingDependencyError) as err:
        scan(str(root))
    text = one_line(err)
    assert text.startswith("imagenet: ") and expected in text, text


def test_an_unreadable_image_is_one_line_naming_its_path(tmp_path, ckpt):
    root = write_folder(tmp_path / "inet", CLASSES, train=1, val=1)
    bad = root / "val" / wnid(3) / "broken.JPEG"
    bad.write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(MissingDependencyError) as err:
        open_rgb(bad)
    assert one_line(err).startswith(f"{bad} is not a readable image")
    # Through the evaluator: the subnet's result is a failure with that line, nothing raised.
    result = evaluate_safely(evaluator(ckpt, root, recal_batches=1), SPACE.sample(np.random.default_rng(0)), 0)
    assert not result.ok and result.error.startswith(f"{bad} is not a readable image")


def test_a_class_count_that_is_not_the_classifiers_is_one_line(tmp_path, ckpt):
    root = write_folder(tmp_path / "inet", CLASSES + 2, train=1, val=1)
    with pytest.raises(ConfigError) as err:
        evaluator(ckpt, root)
    assert one_line(err) == (f"imagenet: {root} has {CLASSES + 2} class folders, the supernet's classifier "
                             f"has {CLASSES} outputs")


def test_imagenets_root_is_a_dataset_location_sandboxes_do_not_see(folder):
    assert reads("imagenet", str(folder)) == [str(folder)]
    assert reads("imagenet") == [str(Path("data/imagenet").absolute())]
    scan(str(folder))
    assert str(folder) in locations()


# ------------------------------------------------------------------ the papers' transforms


def _random_image(w: int, h: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _input(name: str, img: Image.Image, size: int) -> torch.Tensor:
    """What the network gets from `img` through our transform: (3, size, size)."""
    arr = TRANSFORMS[name].eval_image(img, size)
    assert arr.shape == (size, size, 3) and arr.dtype == np.uint8
    return TRANSFORMS[name].finish(torch.from_numpy(arr).permute(2, 0, 1)[None])[0]


@pytest.mark.parametrize("r", [160, 176, 192, 208, 224])
def test_ofa_transform_is_the_ofa_packages_own_at_each_resolution(r):
    from ofa.imagenet_classification.data_providers.imagenet import ImagenetDataProvider

    # ofa's method reads only `self.normalize` when given the size.
    provider = types.SimpleNamespace(normalize=T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]))
    theirs = ImagenetDataProvider.build_valid_transform(provider, image_size=r)
    img = _random_image(300, 229, seed=r)
    assert TRANSFORMS["ofa"].resize(r) == int(math.ceil(r / 0.875))
    assert torch.allclose(_input("ofa", img, r), theirs(img), atol=1e-5)


def test_autoformer_transform_is_its_build_transform():
    from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    # AutoFormer/lib/datasets.py build_transform(is_train=False) at input_size 224 (interpolation=3: bicubic).
    theirs = T.Compose([T.Resize(int((256 / 224) * 224), interpolation=T.InterpolationMode.BICUBIC),
                        T.CenterCrop(224), T.ToTensor(), T.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)])
    img = _random_image(333, 280)
    assert torch.allclose(_input("autoformer", img, 224), theirs(img), atol=1e-5)


def _coordinates(w: int, h: int) -> Image.Image:
    """R = x, G = y (mod 256), B = 0: a pixel says where it came from."""
    y, x = np.mgrid[:h, :w]
    return Image.fromarray(np.stack([x % 256, y % 256, 0 * x], -1).astype(np.uint8))


@pytest.mark.parametrize("name", ["ofa", "autoformer", "spos"])
def test_centre_crop_takes_the_middle_rounding_halves_to_even_as_torchvision(name):
    # Shorter side 256 already: no resize at 224, so the crop's pixels are the source's.
    img = _coordinates(301, 256)  # (301 - 224) / 2 = 38.5: CenterCrop's round() gives 38
    arr = TRANSFORMS[name].eval_image(img, 224)
    assert arr.shape == (224, 224, 3)
    assert tuple(arr[0, 0, :2]) == (38, 16) and tuple(arr[-1, -1, :2]) == ((38 + 223) % 256, 16 + 223)
    assert np.array_equal(arr, np.asarray(T.CenterCrop(224)(img)))


def test_spos_feeds_bgr_0_255_unnormalised():
    x = _input("spos", Image.new("RGB", (300, 260), (250, 20, 7)), 224)
    assert x.dtype == torch.float32
    assert torch.equal(x[0], torch.full((224, 224), 7.0)) and torch.equal(x[2], torch.full((224, 224), 250.0))
    assert torch.equal(x[1], torch.full((224, 224), 20.0))
    coords = _input("spos", _coordinates(301, 256), 224)
    assert coords[2, 0, 0] == 38 and coords[1, 0, 0] == 16 and coords[0].abs().sum() == 0  # BGR: x is channel 2


def test_spos_resize_is_opencvs_bilinear():
    # cv2.resize(a, (w, h), interpolation=cv2.INTER_LINEAR)[..., 0] of this image, computed with OpenCV 4.
    a = ((np.arange(6 * 9).reshape(6, 9) * 37) % 256).astype(np.uint8)
    a3 = np.stack([a, 255 - a, a // 2], -1)
    down = [[62, 145, 100, 55], [136, 59, 126, 161], [114, 197, 136, 107]]
    up = [[0, 20, 45, 71, 97, 122, 148, 173, 199, 205, 54, 20, 40],
          [60, 80, 106, 131, 157, 183, 208, 95, 58, 80, 67, 81, 100],
          [126, 146, 172, 198, 122, 84, 110, 72, 70, 95, 121, 146, 167],
          [193, 143, 110, 136, 82, 59, 85, 110, 136, 161, 187, 153, 105],
          [167, 98, 48, 73, 99, 125, 150, 176, 167, 136, 161, 111, 42],
          [68, 88, 114, 139, 165, 174, 162, 187, 135, 37, 63, 88, 108],
          [129, 149, 174, 200, 226, 173, 21, 47, 72, 98, 123, 149, 169]]
    for (h, w), cv2 in (((3, 4), down), ((7, 13), up)):
        ours = opencv_linear(a3, h, w)[..., 0].astype(int)
        assert np.abs(ours - np.asarray(cv2)).max() <= 1  # OpenCV's fixed-point rounding: one grey level


@pytest.mark.parametrize("name", ["ofa", "spos", "autoformer"])
def test_each_transform_gives_the_subnets_resolution(name):
    img = _random_image(97, 61)
    for r in (160, 192, 224):
        assert TRANSFORMS[name].eval_image(img, r).shape == (r, r, 3)
        assert TRANSFORMS[name].recal_image(5)(img, r, 0).shape == (r, r, 3)


def test_recalibration_crops_are_seeded_per_image_and_resolution():
    img = _random_image(120, 90)
    augment = TRANSFORMS["ofa"].recal_image(7)
    first = augment(img, 64, 3)
    assert np.array_equal(first, TRANSFORMS["ofa"].recal_image(7)(img, 64, 3))  # the same for every subnet
    assert not np.array_equal(first, augment(img, 64, 4))
    assert not np.array_equal(first, TRANSFORMS["ofa"].recal_image(8)(img, 64, 3))
    assert not np.array_equal(first, TRANSFORMS["ofa"].eval_image(img, 64))


def test_random_resized_boxes_stay_in_torchvisions_ranges():
    rng = np.random.default_rng(0)
    for _ in range(300):
        top, left, h, w = random_resized_box(rng, 90, 120)
        assert 0 <= top <= 90 - h and 0 <= left <= 120 - w
        assert 0.08 * 0.9 <= h * w / (90 * 120) <= 1.0
        assert 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05


# ------------------------------------------------------------------ recalibration, validation, the cache


def _feeder(folder: Path, batch_size: int = 4, **settings) -> FolderFeeder:
    return FolderFeeder(scan(str(folder)), FolderSettings(root=str(folder), **settings), batch_size,
                        torch.device("cpu"))


def test_recalibration_images_are_ofas_seeded_draw(folder):
    from ofa.imagenet_classification.data_providers.base_provider import DataProvider
    from torchvision.datasets import ImageFolder

    samples = ImageFolder(str(folder / "train")).samples
    # ofa's build_sub_train_loader: randperm(len(train)) seeded with SUB_SEED, the first n_images.
    chosen = torch.randperm(len(samples), generator=torch.Generator().manual_seed(DataProvider.SUB_SEED)).tolist()[:7]
    feeder = _feeder(folder, recal_images=7)
    pool = feeder.recal_pool
    assert [(str(pool.path(k)), int(pool.labels[k])) for k in range(len(pool))] == [samples[i] for i in chosen]
    assert sum(len(y) for _, y in feeder.recal(24, limit=100)) == 7
    assert sum(len(y) for _, y in feeder.recal(24, limit=1)) == 4  # recal_batches x batch_size caps it
    other = _feeder(folder, recal_images=7, recal_seed=1).recal_pool
    assert other.files != pool.files


def test_each_image_is_decoded_once_per_resolution_while_it_fits(folder):
    feeder = _feeder(folder)
    n_val = len(scan(str(folder)).val)
    for _ in range(2):
        assert sum(len(y) for _, y in feeder.valid(24, None)) == n_val
    assert feeder.cache.decodes == n_val
    list(feeder.valid(32, None))
    assert feeder.cache.decodes == 2 * n_val
    # Nothing fits: every pass decodes again (and the answers stay the same).
    tight = _feeder(folder, cache_gb=0)
    a = torch.cat([x for x, _ in tight.valid(24, None)])
    b = torch.cat([x for x, _ in tight.valid(24, None)])
    assert tight.cache.decodes == 2 * n_val and torch.equal(a, b)
    assert torch.equal(a, torch.cat([x for x, _ in feeder.valid(24, None)]))


def test_a_full_cache_keeps_what_it_holds_and_streams_the_rest(folder):
    data = scan(str(folder))
    one = 3 * 24 * 24
    cache = Decoded(budget_bytes=len(data.val) * one + 10)  # room for one split at 24 px
    image = TRANSFORMS["ofa"].eval_image
    for _ in range(2):
        list(cache.batches("val", data.val, 24, image, 8))
        list(cache.batches("val", data.val, 32, image, 8))
    assert list(cache.held) == [("val", 24)] and cache.decodes == 3 * len(data.val)


def test_val_subset_is_a_fixed_random_draw_not_the_first_classes(folder):
    feeder = _feeder(folder)
    labels = torch.cat([y for _, y in feeder.valid(24, 6)])
    assert len(labels) == 6 and torch.equal(labels, torch.cat([y for _, y in feeder.valid(24, 6)]))
    assert len(set(labels.tolist())) > 3  # the first 6 files are classes 0-2 only


def test_feeder_test_is_none_and_the_score_repeats_valid(folder):
    feeder = _feeder(folder)
    assert feeder.test(24, None) is None
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(4, CLASSES))
    valid, test = score(net, feeder, 24, recal_batches=20, subset=None)
    assert valid == test and 0 <= valid <= 100
    assert feeder.cache.decodes == len(feeder.recal_pool) + len(scan(str(folder)).val)


def test_a_network_without_batchnorm_reads_no_recalibration_images(folder):
    feeder = _feeder(folder)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LayerNorm([4, 22, 22]), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(4, CLASSES))
    score(net, feeder, 24, recal_batches=20, subset=None)
    assert feeder.cache.decodes == len(scan(str(folder)).val)


# ------------------------------------------------------------------ the evaluator and its cache key


def test_the_evaluator_scores_subnets_of_an_imagenet_supernet(folder, ckpt, monkeypatch):
    monkeypatch.setattr(supernet_evaluator, "SCORES", {})
    ev = evaluator(ckpt, folder, recal_batches=2)
    assert ev.data_cfg["transform"] == "ofa" and ev.data_cfg["recal_images"] == 2000  # the space's paper, OFA's count
    for seed in range(2):
        arch = SPACE.sample(np.random.default_rng(seed))
        result = ev.evaluate(arch)
        assert result.ok and 0 <= result.accuracy <= 100 and result.params > 0
        assert result.metrics["test_accuracy"] == result.metrics["valid_accuracy"]
        assert ev.input_shape(arch) == (1, 3, arch.r, arch.r)


def test_a_released_checkpoints_data_is_imagenet_by_default(folder, tmp_path):
    path = checkpoint(tmp_path / "released.pt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["data"] = None  # a released file names no data: ImageNet
    torch.save(ckpt, path)
    with pytest.raises(MissingDependencyError, match="imagenet: .*data/imagenet is not a folder"):
        SupernetEvaluator(SPACE, str(path), device="cpu")
    with pytest.raises(ConfigError, match="trained on imagenet, the run's data is digits"):
        SupernetEvaluator(SPACE, str(path), data={"name": "digits", "root": None, "split_file": None}, device="cpu")


BASE = {"batch_size": 8, "recal_batches": 20, "val_subset": None}


@pytest.mark.parametrize("change", [
    {"data": {"transform": "autoformer"}}, {"data": {"recal_images": 5}}, {"data": {"recal_seed": 1}},
    {"data": {"recal_augment": False}}, {"val_subset": 5}, {"batch_size": 4}, {"recal_batches": 1},
], ids=lambda c: next(iter(c.get("data", c))))
def test_each_score_input_alone_changes_the_fingerprint(folder, ckpt, change):
    base = evaluator(ckpt, folder, **BASE).fingerprint()
    assert evaluator(ckpt, folder, **BASE).fingerprint() == base
    assert evaluator(ckpt, folder, **{**BASE, **change}).fingerprint() != base


def test_the_checkpoint_changes_the_fingerprint(folder, ckpt, tmp_path):
    other = checkpoint(tmp_path / "other.pt", OFAMbv3Space(resolutions=(24, 32), width_mult=0.5, num_classes=CLASSES))
    torch.manual_seed(1)
    state = torch.load(other, weights_only=True)
    state["state_dict"] = {k: v + 1 if v.is_floating_point() else v for k, v in state["state_dict"].items()}
    torch.save(state, other)
    assert evaluator(ckpt, folder).fingerprint() != evaluator(other, folder).fingerprint()


def test_the_listing_changes_the_fingerprint_and_the_place_does_not(folder, ckpt, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(folder, root)
    base = evaluator(ckpt, folder).fingerprint()
    assert evaluator(ckpt, root).fingerprint() == base  # moved, same files
    assert evaluator(ckpt, root, data={"cache_gb": 0, "workers": 1}).fingerprint() == base
    Image.new("RGB", (8, 8)).save(root / "val" / wnid(4) / "extra.JPEG")
    scan.cache_clear()
    added = evaluator(ckpt, root).fingerprint()
    (root / "val" / wnid(4) / "extra.JPEG").rename(root / "val" / wnid(4) / "renamed.JPEG")
    scan.cache_clear()
    assert len({base, added, evaluator(ckpt, root).fingerprint()}) == 3


def test_in_memory_data_keeps_its_fingerprint_with_imagenets_keys_unset(tmp_path):
    path = checkpoint(tmp_path / "digits.pt", data={"name": "digits", "root": None, "split_file": None})
    plain = {"name": "digits", "root": None, "split_file": None}
    unset = {**plain, **dict.fromkeys(imagenet.FOLDER_KEYS)}
    a = SupernetEvaluator(SPACE, str(path), data=plain, device="cpu")
    b = SupernetEvaluator(SPACE, str(path), data=unset, device="cpu")
    assert a.data_cfg == b.data_cfg == plain and a.fingerprint() == b.fingerprint()
    with pytest.raises(ConfigError, match="data: unknown key 'transform'"):
        SupernetEvaluator(SPACE, str(path), data={**plain, "transform": "ofa"}, device="cpu")


@pytest.mark.parametrize("data, message", [
    ({"transform": "vit"}, "data.transform: unknown 'vit' (valid: auto, ofa, spos, autoformer)"),
    ({"recal_images": 0}, "data.recal_images must be an integer >= 1, got 0"),
    ({"recal_augment": "yes"}, "data.recal_augment must be true or false, got 'yes'"),
    ({"cache_gb": -1}, "data.cache_gb must be a number >= 0, got -1"),
    ({"split_file": "x.txt"}, "data.split_file: imagenet has none"),
    ({"colour": 1}, "data: unknown key 'colour'"),
])
def test_bad_imagenet_settings_are_one_line(data, message):
    with pytest.raises(ConfigError) as err:
        FolderSettings.from_config({"name": "imagenet", **data}, "ofa_mbv3")
    assert one_line(err).startswith(message)


def test_auto_transform_follows_the_space_and_needs_a_paper_space():
    assert [FolderSettings.from_config({"name": "imagenet"}, s).transform
            for s in ("ofa_mbv3", "spos", "autoformer")] == ["ofa", "spos", "autoformer"]
    assert FolderSettings.from_config({"name": "imagenet", "transform": "spos"}, "ofa_mbv3").transform == "spos"
    with pytest.raises(ConfigError, match="space 'nb201' has no paper transform"):
        FolderSettings.from_config({"name": "imagenet"}, "nb201")


def test_the_data_group_reaches_the_evaluator(folder):
    cfg = check_config(["space=ofa_mbv3", "evaluator=supernet", "evaluator.checkpoint=x", "data=imagenet",
                        f"data.root={folder}", "data.recal_images=500", "data.transform=spos"])
    assert cfg["evaluator"]["data"] == {"name": "imagenet", "root": str(folder), "split_file": None,
                                        "transform": "spos", "recal_images": 500, "recal_seed": 937162211,
                                        "recal_augment": True, "cache_gb": 8, "workers": None}
    digits = check_config(["space=ofa_mbv3", "evaluator=supernet", "evaluator.checkpoint=x"])["evaluator"]["data"]
    assert digits == {"name": "digits", "root": None, "split_file": None, **dict.fromkeys(imagenet.FOLDER_KEYS)}

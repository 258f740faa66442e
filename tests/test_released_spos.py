"""SPOS's supernet in its authors' format (`{"state_dict": DataParallel(ShuffleNetV2_OneShot).state_dict()}`,
written here from `OfficialSPOS`, the authors' network restated from their code) loads by path into
the supernet evaluator at the shapes of their ImageNet supernet, and each path computes what their
own forward computes with the same weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from nas.evaluators import EVALUATORS
from nas.spaces import SPACES
from nas.spaces.spos.space import SPOSSpace
from support.imagefolder import write_folder
from support.released import official_spos, write_spos

ROOT = Path(__file__).resolve().parents[1]
CONF = {k: v for k, v in yaml.safe_load((ROOT / "conf" / "space" / "spos.yaml").read_text()).items() if k != "name"}


@pytest.fixture(scope="module")
def official():
    return official_spos(seed=3)


@pytest.fixture(scope="module")
def checkpoint(official, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_spos(tmp_path_factory.mktemp("spos") / "checkpoint-150000.pth.tar", official)


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(tmp_path_factory.mktemp("imagenet"), 1000, train=1, val=1, size=(20, 20))


def evaluator(path: Path, imagenet: Path, space: SPOSSpace):
    data = {"name": "imagenet", "root": str(imagenet), "recal_images": 2, "workers": 1}
    return EVALUATORS.create("supernet", {"checkpoint": str(path), "data": data, "batch_size": 2, "val_subset": 2,
                                          "device": "cpu"}, space=space)


def test_the_official_file_fills_every_tensor_of_the_imagenet_space(checkpoint, imagenet):
    space = SPACES.create("spos", CONF)  # conf/space/spos.yaml: SPOS's ImageNet network
    ev = evaluator(checkpoint, imagenet, space)
    ours = ev._load()[0].state_dict()
    theirs = {k.removeprefix("module."): v for k, v in torch.load(checkpoint, weights_only=True)["state_dict"].items()}
    affine = [k for k in ours if k.endswith((".weight", ".bias")) and ours[k].dim() == 1]  # our BatchNorms' affine
    assert len(ours) == len(theirs) + len(affine)  # their BatchNorms have none: every other tensor is theirs
    # Where the official names say each tensor goes (a few of every kind, written out).
    for mine, official_name in (("stem.0.weight", "first_conv.0.weight"), ("stem.1.running_var", "first_conv.1.running_var"),
                                ("blocks.0.2.proj.0.weight", "features.0.2.branch_proj.0.weight"),
                                ("blocks.4.3.proj.3.running_mean", "features.4.3.branch_proj.3.running_mean"),
                                ("blocks.7.1.main.3.weight", "features.7.1.branch_main.3.weight"),
                                ("blocks.19.3.main.12.weight", "features.19.3.branch_main.12.weight"),
                                ("blocks.19.3.main.13.num_batches_tracked", "features.19.3.branch_main.13.num_batches_tracked"),
                                ("head.0.weight", "conv_last.0.weight"), ("head.1.running_mean", "conv_last.1.running_mean"),
                                ("head.6.weight", "classifier.0.weight")):
        assert torch.equal(ours[mine], theirs[official_name]), mine
    assert all(torch.equal(ours[k], torch.ones_like(ours[k]) if k.endswith("weight") else torch.zeros_like(ours[k]))
               for k in affine)


def paths(space: SPOSSpace) -> list[list[int]]:
    n = space.num_blocks()
    rng = np.random.default_rng(0)
    return [[0] * n, [3] * n, [1, 2] * (n // 2), [int(c) for c in rng.integers(0, 4, n)]]


def test_each_path_computes_what_the_official_forward_computes(official, checkpoint, imagenet):
    space = SPACES.create("spos", CONF)
    ev = evaluator(checkpoint, imagenet, space)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0)) * 60 + 110  # BGR 0-255-like
    outputs = []
    for choices in paths(space):
        with torch.no_grad():
            want, got = official(x, choices), ev.weights(space.from_values(choices)).eval()(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
        outputs.append(got)
    assert not torch.allclose(outputs[0], outputs[1])  # paths differ: the comparison is not vacuous


def test_a_small_file_sets_nothing_the_space_does_not_say_and_an_affine_copy_loads(tmp_path):
    """Their code at other sizes: the space settings are read from the shapes (stages, widths,
    classes); a copy retrained with affine BatchNorms keeps its weights."""
    sizes = {"channels": (8, 16, 32, 64, 128, 256), "n_class": 10}
    small = SPOSSpace(stage_channels=(16, 32, 64, 128), stem_channels=8, last_channels=256, num_classes=10)
    folder = write_folder(tmp_path / "imagenet", 10, train=1, val=1, size=(20, 20))
    for affine in (False, True):
        net = official_spos(seed=5, affine=affine, **sizes)
        path = write_spos(tmp_path / f"affine-{affine}.pth.tar", net)
        ev = evaluator(path, folder, small)
        assert ev.checkpoint["space_params"] == {"stem_channels": 8, "last_channels": 256, "num_classes": 10,
                                                 "stage_repeats": (4, 4, 8, 4), "stage_channels": (16, 32, 64, 128)}
        x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
        choices = [2, 3, 0, 1] * 5
        with torch.no_grad():
            torch.testing.assert_close(ev.weights(small.from_values(choices)).eval()(x), net(x, choices),
                                       rtol=1e-4, atol=1e-5)

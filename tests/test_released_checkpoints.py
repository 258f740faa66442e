"""A released supernet file that is not the run's supernet stops in one line naming the first tensor
that does not fit, in the file's own name, before anything is scored: another width, another
family, a tensor missing, one extra, one of another shape; and files that are no supernet at all."""

from __future__ import annotations

import fractions
import json
from pathlib import Path

import pytest
import torch
import yaml

from conftest import run_nas
from nas.errors import ConfigError, MissingDependencyError, NasError
from nas.evaluators import EVALUATORS
from nas.search.spec import Component, SearchSpec
from nas.spaces.nb201.space import NB201Space
from nas.spaces.ofa_mbv3.space import OFAMbv3Space
from nas.spaces.spos.space import SPOSSpace
from support.imagefolder import write_folder
from support.released import official_spos, write_ofa_zoo, write_spos

ROOT = Path(__file__).resolve().parents[1]
OFA_CONF = {k: v for k, v in yaml.safe_load((ROOT / "conf/space/ofa_mbv3.yaml").read_text()).items() if k != "name"}
SIZES = {"channels": (8, 16, 32, 64, 128, 256), "n_class": 10}  # SPOS's code at a small size, for speed
SMALL = {"stage_channels": (16, 32, 64, 128), "stem_channels": 8, "last_channels": 256, "num_classes": 10}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("released")
    return {"w1.2": write_ofa_zoo(folder / "ofa_mbv3_d234_e346_k357_w1.2", 1.2),
            "spos": write_spos(folder / "checkpoint-150000.pth.tar", official_spos(**SIZES))}


def tensors(path: Path) -> dict[str, torch.Tensor]:
    return dict(torch.load(path, weights_only=True)["state_dict"])


def save(path: Path, state: dict[str, torch.Tensor]) -> Path:
    torch.save({"state_dict": state}, path)
    return path


def refusal(path: Path, space, kind: type[NasError] = ConfigError) -> str:
    """The one line creating the evaluator stops with (data is never reached: none is given)."""
    with pytest.raises(kind) as err:
        EVALUATORS.create("supernet", {"checkpoint": str(path)}, space=space)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"supernet checkpoint {path}")
    return line


def test_a_wider_file_with_an_explicit_width_names_its_first_conv(files):
    line = refusal(files["w1.2"], OFAMbv3Space(width_mult=1.0))
    assert "tensor 'first_conv.conv.weight' has shape [24, 3, 3, 3]" in line and "needs [16, 3, 3, 3]" in line
    assert "the file's width_mult is 1.2, the run's space's 1.0" in line
    # The config route: an explicit width is kept, and refused when building the search.
    explicit = SearchSpec(space=Component("ofa_mbv3", {**OFA_CONF, "width_mult": 1.0}), strategy=Component("random"),
                          evaluator=Component("supernet", {"checkpoint": str(files["w1.2"])}))
    with pytest.raises(ConfigError, match="tensor 'first_conv.conv.weight'"):
        explicit.build()


def test_a_setting_no_tensor_shows_is_still_one_line(files):
    """The classifier's rows are the supernet's classes; a space counting costs for others is named."""
    line = refusal(files["w1.2"], OFAMbv3Space(width_mult=1.2, num_classes=10))
    assert line.endswith("does not fit the run's ofa_mbv3 space (the file's num_classes is 1000, the run's space's 10)")


def test_a_file_of_another_family_is_named_as_such(files):
    line = refusal(files["spos"], OFAMbv3Space())
    assert "is a released spos supernet" in line and "first tensor 'first_conv.0.weight'" in line
    assert "use space=spos" in line
    assert "is a released ofa_mbv3 supernet" in refusal(files["w1.2"], SPOSSpace(**SMALL))
    assert "is a released ofa_mbv3 supernet" in refusal(files["w1.2"], NB201Space())  # a space without releases


@pytest.mark.parametrize("change, named", [
    ("drop", "lacks tensor 'features.5.2.branch_main.3.weight'"),
    ("extra", "tensor 'features.5.2.branch_main.99.weight' has no place"),
    ("shape", "tensor 'features.5.2.branch_main.3.weight' has shape [16, 1, 5, 5], the run's spos supernet "
              "needs [16, 1, 7, 7]"),
])
def test_a_missing_extra_or_misshapen_tensor_is_named(files, tmp_path, change, named):
    state = tensors(files["spos"])
    key = "module.features.5.2.branch_main.3.weight"  # block 5's 7x7 unit's depthwise conv
    if change == "drop":
        del state[key]
    elif change == "extra":
        state["module.features.5.2.branch_main.99.weight"] = torch.zeros(1)
    else:
        state[key] = state[key][:, :, 1:-1, 1:-1].clone()
    assert named in refusal(save(tmp_path / "bad.pth.tar", state), SPOSSpace(**SMALL))


def test_the_first_mismatch_in_the_files_order_is_the_one_named(files, tmp_path):
    state = tensors(files["w1.2"])
    state["zzz.weight"] = torch.zeros(1)  # last in the file
    state["blocks.2.conv.point_linear.bn.bn.bias"] = torch.zeros(5)  # earlier
    line = refusal(save(tmp_path / "two.pth", state), OFAMbv3Space(width_mult=1.2))
    assert "tensor 'blocks.2.conv.point_linear.bn.bn.bias' has shape [5]" in line


def test_ofa_lacking_a_tensor_and_a_name_with_control_characters(files, tmp_path):
    state = tensors(files["w1.2"])
    del state["blocks.6.conv.depth_conv.se.fc.expand.weight"]
    assert "lacks tensor 'blocks.6.conv.depth_conv.se.fc.expand.weight'" in refusal(
        save(tmp_path / "lacking.pth", state), OFAMbv3Space(width_mult=1.2))
    state = tensors(files["w1.2"])
    state["blocks.1.conv.\x1b[2Jfake"] = torch.zeros(1)
    line = refusal(save(tmp_path / "escape.pth", state), OFAMbv3Space(width_mult=1.2))
    assert "'blocks.1.conv.\\x1b[2Jfake' has no place" in line and "\x1b" not in line


def test_counters_a_file_lacks_are_torchs_default_and_wrappings_are_unwrapped(files, tmp_path):
    """BatchNorm's num_batches_tracked may be absent (torch < 0.4.1 saved none); `{'model': ...}`
    (AutoFormer's) and a DataParallel `module.` prefix (SPOS's) are how projects save."""
    state = {k.removeprefix("module."): v for k, v in tensors(files["spos"]).items()
             if not k.endswith("num_batches_tracked")}
    path = tmp_path / "plain.pth"
    torch.save({"model": state, "epoch": 3}, path)
    from supernets.checkpoints import load_checkpoint

    _, record = load_checkpoint(path, "spos")
    assert record["format"].family == "spos" and record["space_params"]["stage_channels"] == (16, 32, 64, 128)
    from supernets.base import SUPERNETS  # what the evaluator does with it (its data, ImageNet, left out)
    from supernets.released import convert

    net = SUPERNETS.create("spos", record["supernet"], space=SPOSSpace(**SMALL))
    loaded = convert(record["format"], record["state_dict"], net, SPOSSpace(**SMALL).params(), str(path))
    assert net.load_state_dict(loaded).missing_keys == []
    assert int(loaded["stem.1.num_batches_tracked"]) == 0


def test_files_that_are_no_supernet_get_one_line(tmp_path):
    unknown = save(tmp_path / "unknown.pth", {"encoder.weight": torch.zeros(2, 2)})
    line = refusal(unknown, SPOSSpace(**SMALL), MissingDependencyError)
    assert "neither from nas train-supernet nor a released supernet" in line and "'encoder.weight'" in line
    empty = tmp_path / "empty.pth"
    torch.save({"epoch": 1}, empty)
    assert "holds no mapping of parameter names to tensors" in refusal(empty, SPOSSpace(**SMALL), MissingDependencyError)
    pickled = tmp_path / "pickled.pth"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "ratio": fractions.Fraction(1, 3)}, pickled)
    line = refusal(pickled, SPOSSpace(**SMALL), MissingDependencyError)
    assert "unreadable (UnpicklingError: it pickles fractions.Fraction, which is not loaded)" in line


@pytest.mark.parametrize("explicit", [False, True])
def test_cli_search_with_a_released_file_of_another_width_scores_nothing(files, tmp_path, nas_env, explicit):
    run = tmp_path / "run"
    width = ["space.width_mult=1.0"] if explicit else []
    r = run_nas(["search", "space=ofa_mbv3", *width, "strategy=random", "evaluator=supernet",
                 f"evaluator.checkpoint={files['w1.2']}", "budget.trials=1", "runner=local",
                 f"hydra.run.dir={run}"], nas_env)
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    if explicit:
        assert r.returncode == 2 and "tensor 'first_conv.conv.weight' has shape [24, 3, 3, 3]" in last, r.stderr[-2000:]
        assert not (run / "history.jsonl").exists()
    else:  # null width: the file's 1.2 is taken; the run then stops at the data (no ImageNet given)
        assert r.returncode == 2 and "first_conv" not in r.stderr and "imagenet" in last.lower(), r.stderr[-2000:]
        assert not (run / "history.jsonl").exists()


def test_cli_search_scores_subnets_with_a_zoo_file_as_written(files, tmp_path, nas_env):
    """docs/released-supernets.md's command, at a tiny budget: the width from the file (w1.2), a
    1,000-class ImageFolder of one image a class and split, two validation images per subnet."""
    folder = write_folder(tmp_path / "imagenet", 1000, train=1, val=1, size=(20, 20))
    run = tmp_path / "run"
    r = run_nas(["search", "space=ofa_mbv3", "strategy=random", "evaluator=supernet",
                 f"evaluator.checkpoint={files['w1.2']}", "data=imagenet", f"data.root={folder}",
                 "data.recal_images=2", "evaluator.recal_batches=1", "evaluator.batch_size=2",
                 "evaluator.val_subset=2", "evaluator.device=cpu", "budget.trials=2", "runner=local",
                 f"hydra.run.dir={run}"], nas_env)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["error"] is None and row["accuracy"] in (0.0, 50.0, 100.0) for row in rows)

"""`nas search space=ofa_mbv3 evaluator=supernet evaluator.checkpoint=<OFA model-zoo file> data=imagenet
data.root=<ImageFolder>` through the real CLI, as written (the default runner), at tiny sizes: a
1,000-class folder of one tiny JPEG per class and split, and a zoo-format file of `ofa`'s own
OFAMobileNetV3 (random weights). A folder whose classes are not the classifier's stops in one line."""

from __future__ import annotations

import json

import pytest

from conftest import run_nas
from support.imagefolder import write_folder
from support.released import write_ofa_zoo

TINY = ["budget.trials=2", "evaluator.val_subset=8", "evaluator.recal_batches=1", "evaluator.batch_size=8",
        "progress=false"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return write_ofa_zoo(tmp_path_factory.mktemp("zoo") / "ofa_mbv3_d234_e346_k357_w1.0", 1.0)


def test_search_scores_ofa_subnets_of_a_zoo_file_on_an_imagefolder(tmp_path, nas_env, zoo):
    root = write_folder(tmp_path / "imagenet", 1000, train=1, val=1)
    run = tmp_path / "run"
    r = run_nas(["search", "space=ofa_mbv3", "evaluator=supernet", f"evaluator.checkpoint={zoo}", "data=imagenet",
                 f"data.root={root}", *TINY, f"hydra.run.dir={run}"], nas_env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["error"] is None and 0 <= row["accuracy"] <= 100 for row in rows), rows
    assert all(row["metrics"]["test_accuracy"] == row["metrics"]["valid_accuracy"] for row in rows)
    spec = json.loads((run / "summary.json").read_text())["spec"]["evaluator"]["params"]
    assert spec["data"]["name"] == "imagenet" and spec["data"]["root"] == str(root)


def test_a_folder_whose_classes_are_not_the_classifiers_stops_in_one_line(tmp_path, nas_env, zoo):
    root = write_folder(tmp_path / "imagenet", 10, train=1, val=1)
    r = run_nas(["search", "space=ofa_mbv3", "evaluator=supernet", f"evaluator.checkpoint={zoo}", "data=imagenet",
                 f"data.root={root}", *TINY, "runner=local", f"hydra.run.dir={tmp_path / 'run'}"], nas_env)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].endswith(
        f"imagenet: {root} has 10 class folders, the supernet's classifier has 1000 outputs")


def test_a_transform_feeding_other_pixels_than_the_released_network_takes_is_one_line(tmp_path, zoo):
    from nas.errors import ConfigError
    from nas.spaces.ofa_mbv3.space import OFAMbv3Space
    from supernets.evaluator import SupernetEvaluator

    with pytest.raises(ConfigError) as err:  # OFA's network takes normalised RGB, SPOS's transform feeds BGR 0-255
        SupernetEvaluator(OFAMbv3Space(), str(zoo), data={"name": "imagenet", "root": str(tmp_path),
                                                          "transform": "spos"}, device="cpu")
    assert str(err.value) == (f"data.transform=spos feeds bgr_255 pixels, the network of {zoo.resolve()} "
                              "takes rgb_normalised")

"""OFA's released MobileNetV3 supernets (model-zoo files, written here by the `ofa` package's own
OFAMobileNetV3 with the zoo's settings) load by path into the supernet evaluator: every tensor in
its place, the space's width read from the file, and each subnet computing what `ofa`'s own
`set_active_subnet` + `get_active_subnet(preserve_weight=True)` computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from nas.search.spec import Component, SearchSpec
from nas.spaces.ofa_mbv3.space import OFAMbv3Space
from support.imagefolder import write_folder
from support.released import ZOO, ofa_zoo_net, write_ofa_zoo

ROOT = Path(__file__).resolve().parents[1]
CONF = yaml.safe_load((ROOT / "conf" / "space" / "ofa_mbv3.yaml").read_text())  # width_mult: null
WIDTHS = (1.0, 1.2)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> dict[float, Path]:
    folder = tmp_path_factory.mktemp("zoo")
    return {w: write_ofa_zoo(folder / f"ofa_mbv3_d234_e346_k357_w{w}", w, seed=int(w * 10)) for w in WIDTHS}


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(tmp_path_factory.mktemp("imagenet"), 1000, train=1, val=1, size=(20, 20))  # the zoo's classifier: 1000 classes


def spec(checkpoint: Path, imagenet: Path, **space: object) -> SearchSpec:
    data = {"name": "imagenet", "root": str(imagenet), "recal_images": 2, "workers": 1}
    return SearchSpec(space=Component("ofa_mbv3", {k: v for k, v in {**CONF, **space}.items() if k != "name"}),
                      strategy=Component("random"),
                      evaluator=Component("supernet", {"checkpoint": str(checkpoint), "data": data, "batch_size": 2,
                                                       "val_subset": 2, "recal_batches": 1, "device": "cpu"}))


def evaluator(checkpoint: Path, imagenet: Path):
    built = spec(checkpoint, imagenet)
    return built.build_evaluator(built.build_space())


@pytest.mark.parametrize("width", WIDTHS)
def test_a_zoo_file_loads_every_tensor_into_its_place_and_sets_the_width(zoo, imagenet, width):
    built = spec(zoo[width], imagenet)
    space = built.build_space()
    assert CONF["width_mult"] is None and space.width_mult == width  # null follows the file
    supernet, _ = built.build_evaluator(space)._load()
    ours = supernet.state_dict()
    theirs = torch.load(zoo[width], weights_only=True)["state_dict"]
    assert len(ours) == len(theirs)  # no tensor missing, none extra
    for name, tensor in theirs.items():
        assert torch.equal(ours[f"net.{name}"], tensor), name


def test_without_a_supernet_checkpoint_a_null_width_is_one():
    built = SearchSpec(space=Component("ofa_mbv3", {k: v for k, v in CONF.items() if k != "name"}),
                       strategy=Component("random"), evaluator=Component("train"))
    assert built.build_space().width_mult == 1.0


def archs(space: OFAMbv3Space) -> list:
    rng = np.random.default_rng(1)
    largest = space.from_values([d.choices[-1] for d in space.decisions()])
    smallest = space.from_values([d.choices[0] for d in space.decisions()])
    return [largest, smallest, space.sample(rng), space.sample(rng)]


@pytest.mark.parametrize("width", WIDTHS)
def test_subnets_compute_what_ofas_own_get_active_subnet_computes(zoo, imagenet, width):
    ev = evaluator(zoo[width], imagenet)
    reference = ofa_zoo_net(width, seed=99)  # other weights, then the file through ofa's own loader
    reference.load_state_dict(torch.load(zoo[width], map_location="cpu", weights_only=True)["state_dict"])
    outputs = []
    for arch in archs(ev.space):
        x = torch.randn(2, 3, arch.r, arch.r, generator=torch.Generator().manual_seed(arch.r))
        reference.set_active_subnet(ks=list(arch.ks), e=list(arch.e), d=list(arch.d))
        theirs = reference.get_active_subnet(preserve_weight=True).eval()
        with torch.no_grad():
            ours, want = ev.weights(arch).eval()(x), theirs(x)
        torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-5)
        outputs.append(ours)
    assert not torch.allclose(outputs[0], outputs[1])  # the subnets differ: the comparison is not vacuous


def test_a_file_in_older_ofa_spellings_loads_as_ofa_itself_loads_it(zoo, imagenet, tmp_path):
    """Files saved by older `ofa` releases name blocks' layers `mobile_inverted_conv` (today `conv`)
    and spell dynamic layers singly (`.bn.` for `.bn.bn.`); `OFAMobileNetV3.load_state_dict` takes both."""
    modern = torch.load(zoo[1.0], weights_only=True)["state_dict"]
    legacy = {k.replace(".conv.", ".mobile_inverted_conv.", 1).replace(".bn.bn.", ".bn.")
              if k.startswith("blocks.") else k: v for k, v in modern.items()}
    assert legacy.keys() != modern.keys() and "blocks.1.mobile_inverted_conv.inverted_bottleneck.bn.weight" in legacy
    from ofa.imagenet_classification.elastic_nn.networks import OFAMobileNetV3

    check = OFAMobileNetV3(width_mult=1.0, **ZOO)
    check.load_state_dict(legacy)  # ofa's own loader reads these names
    assert all(torch.equal(check.state_dict()[k], v) for k, v in modern.items())
    path = tmp_path / "ofa_mbv3_legacy"
    torch.save({"state_dict": legacy}, path)
    ours = evaluator(path, imagenet)._load()[0].state_dict()
    assert len(ours) == len(modern) and all(torch.equal(ours[f"net.{k}"], v) for k, v in modern.items())

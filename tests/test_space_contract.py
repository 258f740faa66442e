"""The contract every registered space and supernet keeps, checked on every preset in
conf/space (the `_small` CPU presets included): what strategies, evaluators,
training and export rely on, so a new space folder is tested by adding its yaml.

The full-size ImageNet presets build networks of hundreds of MFLOPs: their
network checks are `slow`; their encoding checks run always."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import space_preset
from nas.core.space import SPACES, CategoricalSpace, Cost, SearchSpace
from nas.errors import ConfigError, EvaluationError
from nas.measure import count_flops, count_params
from supernets.base import SUPERNETS

PRESETS = {p.stem: space_preset(p.stem)
           for p in sorted(Path(str(resources.files("conf") / "space")).glob("*.yaml"))}
# ImageNet-size networks: seconds each to build and run on 2 cores.
LARGE = {"ofa_mbv3", "spos", "autoformer", "autoformer_t", "autoformer_s", "autoformer_b"}


def network_presets(names) -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in names]


NETWORK_PRESETS = network_presets(PRESETS)
SUPERNET_PRESETS = network_presets(p for p in PRESETS if PRESETS[p]["name"] in SUPERNETS.names())
CLASSES = 7  # not any space's own, so `build` must honour its argument


def make(preset: str) -> SearchSpace:
    params = dict(PRESETS[preset])
    return SPACES.create(params.pop("name"), params)


def example(space: SearchSpace, seed: int = 0):
    """A member of the space: a sample, or the base of an open-ended space."""
    return space.base if space.open_ended else space.sample(np.random.default_rng(seed))


def input_shape(space: SearchSpace, arch, batch: int = 2) -> tuple[int, int, int, int]:
    size = space.input_size(arch) or 32
    return (batch, 3, size, size)


def test_every_registered_space_has_a_preset_and_every_preset_a_space():
    assert {PRESETS[p]["name"] for p in PRESETS} == set(SPACES.names())


@pytest.mark.parametrize("preset", PRESETS)
def test_encoding_round_trips_through_json(preset):
    space = make(preset)
    for seed in range(3):
        arch = example(space, seed)
        back = space.decode(json.loads(json.dumps(arch.encode())))
        assert back == arch and back.key() == arch.key() and back.canonical() == arch.canonical()


@pytest.mark.parametrize("preset", PRESETS)
def test_mutation_stays_in_the_space(preset):
    space = make(preset)
    arch = example(space)
    if space.open_ended:  # moves come from LLM design strategies only
        with pytest.raises(ConfigError, match="no random moves"):
            space.mutate(arch, np.random.default_rng(0))
        return
    rng = np.random.default_rng(1)
    for _ in range(5):
        child = space.mutate(arch, rng)
        assert child != arch and space.decode(child.encode()) == child
        if isinstance(space, CategoricalSpace):
            values = space.to_values(child)
            assert all(v in d.choices for d, v in zip(space.decisions(), values, strict=True))
            assert space.from_values(values) == child
        arch = child


def test_keys_are_stable_across_processes():
    """A key is a content hash, not Python's per-process `hash`: history, caches and resume rely on it."""
    archs = {p: example(make(p)) for p in PRESETS}
    items = {p: [PRESETS[p]["name"], {k: v for k, v in PRESETS[p].items() if k != "name"}, a.encode()]
             for p, a in archs.items()}
    code = ("import json, sys\nfrom nas.core.space import SPACES\n"
            "items = json.load(sys.stdin)\n"
            "print(json.dumps({p: SPACES.create(n, q).decode(e).key() for p, (n, q, e) in items.items()}))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(items), capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "123"})
    assert json.loads(out.stdout) == {p: a.key() for p, a in archs.items()}
    assert all(len(a.key()) == 16 and int(a.key(), 16) >= 0 for a in archs.values())


@pytest.mark.parametrize("preset", NETWORK_PRESETS)
def test_built_network_gives_one_logit_per_class(preset):
    space = make(preset)
    arch = example(space)
    if not space.trusted:  # untrusted model source builds only in the sandbox
        with pytest.raises(EvaluationError, match="model source runs only in the sandbox, never in-process"):
            space.build(arch, CLASSES)
        return
    shape = input_shape(space, arch)
    net = space.build(arch, CLASSES, 3, shape[-1]).eval()
    with torch.no_grad():
        assert net(torch.randn(shape)).shape == (2, CLASSES)


@pytest.mark.parametrize("preset", NETWORK_PRESETS)
def test_cost_model_agrees_with_the_built_network(preset):
    """`cost` (often a table or a formula) is fvcore's count of `build`'s network at the space's input size."""
    space = make(preset)
    if space.cost(example(space)) is None:
        pytest.skip(f"space {space.name} has no cost model")
    classes = space.params().get("num_classes", 10)  # costs are counted at the space's own classes (NB201: 10)
    for seed in (1, 2):
        arch = example(space, seed)
        shape = input_shape(space, arch, batch=1)
        net = space.build(arch, classes, 3, shape[-1])
        assert space.cost(arch) == Cost(count_params(net), count_flops(net, shape)), arch


@pytest.mark.parametrize("preset", NETWORK_PRESETS)
def test_source_defines_the_built_network(preset, tmp_path):
    """`source` is Python defining `Network`; where it is trusted (ours, not generated from a
    design), it rebuilds the built network exactly: the built state dict loads strictly and the
    outputs agree. Generated source runs only in the sandbox (export checks it there)."""
    space = make(preset)
    arch = example(space)
    shape = input_shape(space, arch)
    text = space.source(arch, CLASSES, 3, shape[-1])
    tree = ast.parse(text)
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert "Network" in defined
    if not (space.trusted and space.source_trusted):
        return
    torch.manual_seed(0)
    net = space.build(arch, CLASSES, 3, shape[-1]).eval()
    path = tmp_path / "model.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"contract_{preset}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    twin = module.Network(num_classes=CLASSES)
    twin.load_state_dict(net.state_dict())
    x = torch.randn(shape)
    with torch.no_grad():
        assert torch.allclose(twin.eval()(x), net(x), atol=1e-5)


def test_every_registered_supernet_has_a_preset():
    assert {PRESETS[p]["name"] for p in PRESETS} >= set(SUPERNETS.names())


@pytest.mark.parametrize("preset", SUPERNET_PRESETS)
def test_supernet_subnet_runs_and_extracts_to_the_built_network(preset):
    """A sampled subnet runs through the supernet, and `extract` gives the space's network for it
    (export loads extracted weights into `build`'s network)."""
    space = make(preset)
    supernet = SUPERNETS.create(space.name, {"num_classes": CLASSES}, space=space).eval()
    arch = space.sample(np.random.default_rng(4))
    x = torch.randn(input_shape(space, arch))
    supernet.set_active(arch)
    with torch.no_grad():
        out = supernet(x)
        assert out.shape == (2, CLASSES)
        sub = supernet.extract(arch).eval()
        assert torch.allclose(sub(x), out, atol=1e-5)
    space.build(arch, CLASSES, 3, x.shape[-1]).load_state_dict(sub.state_dict())

"""The base models FairNAD's source search starts from (nas.spaces.source.bases).

Each model is verified in the sandbox at 10 classes (against itself as the
parent, which must count as unchanged) and at 100 classes, where its size is
held to FairNAD's Table 8 (CIFAR-100) and the NAS-Bench-201 CIFAR budget.
The six sandbox children run once, two at a time, in a module-scoped fixture.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from nas.errors import ConfigError
from nas.sandbox import Verdict, verify_model_source
from nas.spaces.source.arch import SourceArch
from nas.spaces.source.bases import BASE_MODELS, base_source

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "nas" / "spaces" / "source" / "bases"
# (params, FLOPs) at 100 classes: FairNAD Table 8 for the two mobile models;
# ResNet-32 is ~0.47M params and ~0.07 GFLOPs (He et al. 2016, CIFAR).
EXPECTED_100 = {"resnet32": (0.47e6, 0.07e9), "mobilenetv2_050": (0.82e6, 0.01e9),
                "shufflenetv2_050": (0.44e6, 0.01e9)}
TOLERANCE = 0.25
MAX_PARAMS, MAX_FLOPS = 1.5e6, 0.2e9  # NAS-Bench-201's largest cell on CIFAR, FairNAD's budget
ALLOWED_IMPORTS = {"torch", "typing", "math"}


@pytest.fixture(scope="module")
def verdicts() -> dict[tuple[str, int], Verdict]:
    def check(job: tuple[str, int]) -> Verdict:
        name, classes = job
        source = base_source(name)
        return verify_model_source(source, num_classes=classes,
                                   parent_source=source if classes == 10 else None,
                                   filename=f"{name}.py")

    jobs = [(name, classes) for name in BASE_MODELS for classes in (10, 100)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(check, jobs)))


@pytest.mark.parametrize("name", BASE_MODELS)
def test_verifies_and_is_its_own_unchanged_parent(verdicts, name):
    verdict = verdicts[name, 10]
    assert verdict.ok, verdict.error
    assert verdict.output_shape == [2, 10]
    assert verdict.changed is False and verdict.changed_layers == 0
    assert verdict.layers > 1  # FairNAD discards single-layer networks


@pytest.mark.parametrize("name", BASE_MODELS)
def test_size_at_100_classes_matches_the_paper(verdicts, name):
    verdict = verdicts[name, 100]
    assert verdict.ok, verdict.error
    assert verdict.output_shape == [2, 100]
    params, flops = EXPECTED_100[name]
    assert abs(verdict.params - params) <= TOLERANCE * params, verdict.params
    assert abs(verdict.flops - flops) <= TOLERANCE * flops, verdict.flops
    # only the classifier grows with the class count
    assert verdict.params > verdicts[name, 10].params
    assert verdict.flops >= verdicts[name, 10].flops


@pytest.mark.parametrize("name", BASE_MODELS)
@pytest.mark.parametrize("classes", [10, 100])
def test_within_the_cifar_budget(verdicts, name, classes):
    verdict = verdicts[name, classes]
    assert verdict.ok, verdict.error
    assert verdict.params <= MAX_PARAMS and verdict.flops <= MAX_FLOPS


@pytest.mark.parametrize("name", BASE_MODELS)
def test_runs_here_at_the_paper_s_size(name):
    """Our own source, so it may run in this process (compiled under its file name, so coverage sees
    its lines, and without the sandbox's start-up): its output at 100 classes, and the size Table 8 gives."""
    import torch

    from nas.measure import count_flops, count_params

    namespace: dict = {}
    exec(compile(base_source(name), str(SOURCES / f"{name}.py"), "exec"), namespace)
    net = namespace["Network"](num_classes=100).eval()
    with torch.no_grad():
        assert list(net(torch.randn(2, 3, 32, 32)).shape) == [2, 100]
    params, flops = EXPECTED_100[name]
    assert abs(count_params(net) - params) <= TOLERANCE * params
    assert abs(count_flops(net, (1, 3, 32, 32)) - flops) <= TOLERANCE * flops


@pytest.mark.parametrize("name", BASE_MODELS)
def test_source_follows_the_contract(name):
    source = base_source(name)
    assert source == (SOURCES / f"{name}.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    assert ast.get_docstring(tree)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= ALLOWED_IMPORTS
    network = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Network"]
    assert len(network) == 1


def test_every_source_file_is_listed():
    assert sorted(p.stem for p in SOURCES.glob("*.py") if p.stem != "__init__") == sorted(BASE_MODELS)


def test_keys_are_distinct_and_stable_across_processes():
    keys = [SourceArch(base_source(name)).key() for name in BASE_MODELS]
    assert len(set(keys)) == len(BASE_MODELS)
    # a docstring edit is not a new architecture
    edited = base_source(BASE_MODELS[0]).replace("ResNet-32 for CIFAR", "ResNet-32 (CIFAR)", 1)
    assert edited != base_source(BASE_MODELS[0]) and SourceArch(edited).key() == keys[0]
    # another interpreter (other hash seed) gets the same keys, and reading a
    # source does not import its module
    code = ("import sys\nfrom nas.spaces.source.arch import SourceArch\n"
            "from nas.spaces.source.bases import BASE_MODELS, base_source\n"
            "print(' '.join(SourceArch(base_source(n)).key() for n in BASE_MODELS))\n"
            "assert not [m for m in sys.modules if m.startswith('nas.spaces.source.bases.')]\n")
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                           env={"PYTHONHASHSEED": "12345", "PATH": ""}, timeout=60)
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == keys


def test_unknown_base_model():
    with pytest.raises(ConfigError) as err:
        base_source("nope")
    message = str(err.value)
    assert "\n" not in message
    assert message == "unknown base model 'nope'; valid: resnet32, mobilenetv2_050, shufflenetv2_050"

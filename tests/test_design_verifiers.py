"""The verifier chain on both representations: the first failing check stops
the chain, names itself, gives one LLM-readable line and the retry loop that
can fix it; a passing draft carries its measurements."""

from __future__ import annotations

from pathlib import Path

import pytest

from nas.spaces.nader.dag.macro import BlockSet, Skeleton
from nas.core.arch import SeenIndex
from nas.design.verifiers import DOWNSCALE, FIX, block_chain, source_chain
from nas.sandbox.limits import Limits
from nas.core.constraint import Constraint

DATA = Path(__file__).parent / "data"
RESIDUAL = (DATA / "blocks/residual.txt").read_text()
PARENT = (DATA / "models/cnn_parent.py").read_text()
LIMITS = Limits(wall_s=60)
NB201 = Constraint.nb201(32)  # 1.5 M params, 0.2 GFLOPs


def base_only(text: str) -> str:
    """The base section of a block file (a Modifier may rewrite only that)."""
    return text.split("##Residual_stem##")[0]


# -- block files --------------------------------------------------------------------------------------------

def test_block_chain_passes_and_measures():
    seen = SeenIndex()
    outcome = block_chain(None, Skeleton.nb201(n=1), NB201, seen).run(RESIDUAL)
    assert outcome.ok and [c.name for c in outcome.checks] == ["parse", "budget", "dedup"]
    budget = outcome.checks[1].detail
    assert budget["width"] > 0 and budget["params"] <= 1.5e6 and budget["flops"] <= 0.2e9


def test_block_chain_takes_missing_sections_from_the_parent_and_catches_duplicates():
    parent = BlockSet.from_text(RESIDUAL)
    seen = SeenIndex()
    chain = block_chain(parent, Skeleton.nb201(n=1), NB201, seen)
    first = chain.run(base_only(RESIDUAL))
    assert first.ok
    seen.add_key(first.arch.key(), "node 3")
    renumbered = base_only(RESIDUAL).replace("8:ReLU", "9:ReLU").replace("7->8", "7->9").replace("8->1", "9->1")
    again = chain.run(renumbered)
    assert not again.ok and again.failure.name == "dedup" and again.failure.retry is None
    assert again.failure.error == "duplicate of node 3 (same canonical architecture)"


@pytest.mark.parametrize("edit,message", [
    (("5:Conv2d(out_channels=C,kernel_size=3,stride=1)", "5:ROIAlign(out_channels=C)"), "node 5"),
    (("0->7\n", ""), "node 7: Add takes at least 2 inputs"),
    (("2:Conv2d(out_channels=C,kernel_size=3)", "2:Conv2d(out_channels=C,kernel_size=3,stride=2)"), "node 7"),
])
def test_block_errors_name_the_node_and_ask_for_a_fix(edit, message):
    text = RESIDUAL.replace(*edit)
    outcome = block_chain(None, Skeleton.nb201(n=1), NB201, SeenIndex()).run(text)
    failure = outcome.failure
    assert failure.name == "parse" and failure.retry == FIX and message in failure.error
    assert "\n" not in failure.error


def test_block_over_any_budget_is_reported():
    tiny = Constraint(params=10, flops=10)
    outcome = block_chain(None, Skeleton.nb201(n=1), tiny, SeenIndex()).run(RESIDUAL)
    assert outcome.failure.name == "budget" and outcome.failure.retry == FIX


# -- model source (sandboxed) -------------------------------------------------------------------------------

WIDE = PARENT.replace("ConvBlock(32, 64, stride=2)", "ConvBlock(32, 8192, stride=2)").replace(
    "nn.Linear(64, num_classes)", "nn.Linear(8192, num_classes)")
BROKEN = PARENT.replace("ConvBlock(32, 64, stride=2)", "ConvBlock(48, 64, stride=2)")
HOSTILE = PARENT.replace("import torch\n", "import os\nimport torch\nos.system('touch /tmp/pwned')\n", 1)


@pytest.mark.parametrize("text,name,retry,fragment", [
    ((DATA / "models/cnn_kernel5.py").read_text(), None, None, None),
    ("def broken(:\n", "parse", FIX, "model.py:1"),
    (BROKEN, "execute", FIX, "forward"),
    (HOSTILE, "execute", FIX, "policy"),
    (WIDE, "budget", DOWNSCALE, "params"),
    ((DATA / "models/cnn_renamed.py").read_text(), "structure", FIX, "no layer differs"),
])
def test_source_chain(text, name, retry, fragment):
    outcome = source_chain(PARENT, NB201, SeenIndex(), limits=LIMITS).run(text)
    if name is None:
        assert outcome.ok and [c.name for c in outcome.checks] == ["parse", "execute", "budget", "structure",
                                                                   "dedup"]
        assert outcome.checks[1].detail["changed_layers"] == 1
        return
    failure = outcome.failure
    assert (failure.name, failure.retry) == (name, retry) and fragment in failure.error, failure
    assert "\n" not in failure.error
    assert outcome.checks[-1] is failure  # the chain stopped there

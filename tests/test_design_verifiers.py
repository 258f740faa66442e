"""The verifier chain on both representations: the first failing check stops
the chain, names itself, gives one LLM-readable line and the retry loop that
can fix it; a passing draft carries its measurements."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from nas.core.arch import SeenIndex
from nas.core.constraint import Constraint
from nas.design.verdicts import VerdictCache, verdict_key
from nas.design.verifiers import DOWNSCALE, FIX, block_chain, source_chain
from nas.sandbox.limits import Limits
from nas.sandbox.verify import Verdict
from nas.spaces.nader.dag.macro import BlockSet, Skeleton

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


# -- kept verdicts ------------------------------------------------------------------------------------------

KERNEL5 = (DATA / "models/cnn_kernel5.py").read_text()


def _refuse(*args, **kwargs):
    raise AssertionError("the sandbox ran a design whose verdict is kept")


def test_kept_verdict_is_used_instead_of_a_second_sandbox_run(tmp_path, monkeypatch):
    cache = VerdictCache(tmp_path / "checks")
    first = source_chain(PARENT, NB201, SeenIndex(), limits=LIMITS, cache=cache).run(KERNEL5)
    assert first.ok and first.checks[1].detail["cached"] is False
    assert len(list((tmp_path / "checks").rglob("*.json"))) == 1
    monkeypatch.setattr("nas.design.verifiers.verify_model_source", _refuse)
    again = source_chain(PARENT, NB201, SeenIndex(), limits=LIMITS, cache=cache).run(KERNEL5)
    assert again.ok and again.checks[1].detail == {**first.checks[1].detail, "cached": True}
    assert [c.detail for c in again.checks[2:]] == [c.detail for c in first.checks[2:]]
    # a rejection is kept too, with its line; a different parent is another key
    hostile = source_chain(PARENT, NB201, SeenIndex(), limits=LIMITS, cache=cache)
    monkeypatch.undo()
    refused = hostile.run(HOSTILE)
    monkeypatch.setattr("nas.design.verifiers.verify_model_source", _refuse)
    replayed = hostile.run(HOSTILE)
    assert replayed.failure.detail["cached"] and replayed.failure.error == refused.failure.error
    with pytest.raises(AssertionError, match="whose verdict is kept"):
        source_chain(KERNEL5, NB201, SeenIndex(), limits=LIMITS, cache=cache).run(PARENT)


def test_key_covers_everything_a_verdict_depends_on():
    base = verdict_key(KERNEL5, PARENT, 10, (2, 3, 32, 32), LIMITS)
    assert base == verdict_key(KERNEL5, PARENT, 10, (2, 3, 32, 32), Limits(wall_s=60))
    others = [verdict_key(KERNEL5 + "\n", PARENT, 10, (2, 3, 32, 32), LIMITS),
              verdict_key(KERNEL5, None, 10, (2, 3, 32, 32), LIMITS),
              verdict_key(KERNEL5, PARENT, 100, (2, 3, 32, 32), LIMITS),
              verdict_key(KERNEL5, PARENT, 10, (2, 3, 28, 28), LIMITS),
              verdict_key(KERNEL5, PARENT, 10, (2, 3, 32, 32), Limits(wall_s=60, memory_mb=512))]
    assert len({base, *others}) == 6


def test_checker_fingerprint_follows_the_sandbox_code(tmp_path, monkeypatch):
    import nas.design.verdicts as verdicts

    checker = tmp_path / "nas"
    shutil.copytree(verdicts._CHECKER / "sandbox", checker / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(verdicts._CHECKER / "measure.py", checker / "measure.py")
    monkeypatch.setattr(verdicts, "_CHECKER", checker)
    verdicts.checker_fingerprint.cache_clear()
    try:
        before = verdicts.checker_fingerprint()
        assert before == verdicts.checker_fingerprint.__wrapped__()
        (checker / "sandbox" / "graph.py").write_text((checker / "sandbox" / "graph.py").read_text() + "\n# edited\n")
        assert verdicts.checker_fingerprint.__wrapped__() != before
    finally:
        verdicts.checker_fingerprint.cache_clear()


def test_limit_hits_crashes_and_self_reported_numbers_are_not_kept(tmp_path):
    cache = VerdictCache(tmp_path)
    for n, verdict in enumerate([Verdict(ok=False, stage="limits", error="limits: wall time 60 s exceeded"),
                                 Verdict(ok=False, stage="crash", error="crash: the child died (SIGSEGV)"),
                                 Verdict(ok=True, stage="done", params=10, flops=10, self_reported=True)]):
        cache.put(f"{n:032x}", verdict)
    assert not list(tmp_path.rglob("*"))
    kept = Verdict(ok=False, stage="forward", error="forward: channels disagree")
    cache.put("ab" * 16, kept)
    assert cache.get("ab" * 16) == kept


@pytest.mark.parametrize("damage", [
    lambda rec: "{not json",
    lambda rec: json.dumps({**rec, "key": "cd" * 16}),                                 # another key's record
    lambda rec: json.dumps({**rec, "verdict": {**rec["verdict"], "params": "1e9"}}),   # a field's type
    lambda rec: json.dumps({**rec, "verdict": {**rec["verdict"], "stage": "limits"}}),  # a verdict never kept
    lambda rec: json.dumps({**rec, "verdict": {**rec["verdict"], "ok": False}}),       # ok without an error
    lambda rec: b"\xff\xfe".decode("latin-1"),
], ids=["json", "key", "field", "stage", "ok", "encoding"])
def test_damaged_kept_verdict_is_ignored_with_a_warning(damage, tmp_path, caplog):
    cache, key = VerdictCache(tmp_path), "ab" * 16
    cache.put(key, Verdict(ok=True, stage="done", params=5466, flops=1679680, layers=4))
    path = next(tmp_path.rglob("*.json"))
    text = damage(json.loads(path.read_text()))
    path.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    with caplog.at_level(logging.WARNING, logger="nas.design.verdicts"):
        assert cache.get(key) is None
    assert [r.getMessage() for r in caplog.records if "ignoring the cached check" in r.getMessage()], caplog.text


def test_an_execute_failure_names_its_stage_once(tmp_path, monkeypatch):
    """A verdict's error starts with its stage; the execute check's line is that error, which FairNAD
    prefixes with the check's name (`execute: forward: ...` in the history, the Debugger's prompt
    reads the line), never the stage a second time."""
    cache = VerdictCache(tmp_path)
    cache.put(verdict_key(BROKEN, PARENT, 10, (2, 3, 32, 32), LIMITS),
              Verdict(ok=False, stage="forward", error="forward: channels disagree"))
    monkeypatch.setattr("nas.design.verifiers.verify_model_source", _refuse)  # the kept verdict, not a run
    failure = source_chain(PARENT, NB201, SeenIndex(), limits=LIMITS, cache=cache).run(BROKEN).failure
    assert (failure.name, failure.error, failure.detail["stage"]) == ("execute", "forward: channels disagree",
                                                                      "forward")


@pytest.mark.parametrize("changed, layers, ok, error", [
    (True, None, False, "the network has 0 layer(s) with parameters; a single-layer network is not a design"),
    (True, 0, False, "the network has 0 layer(s) with parameters; a single-layer network is not a design"),
    (True, 1, False, "the network has 1 layer(s) with parameters; a single-layer network is not a design"),
    (True, 2, True, None),
    (None, 2, True, None),  # no parent to compare with
    (False, 5, False, "no layer differs from the parent model; apply the idea to the architecture"),
])
def test_structure_refuses_an_unchanged_child_and_a_network_of_one_layer_or_none(changed, layers, ok, error):
    from nas.design.verifiers import Draft, Structure

    verdict = Verdict(ok=True, stage="done", params=10, flops=10, layers=layers, changed=changed, changed_layers=1)
    check = Structure().check(Draft("x", facts={"verdict": verdict}))
    assert (check.name, check.ok, check.error) == ("structure", ok, error)
    assert check.retry == (FIX if changed is False else None)
    if ok:
        assert check.detail == {"changed_layers": 1, "layers": layers}

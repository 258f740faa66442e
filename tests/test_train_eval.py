"""The train evaluator over every trainable representation, multi-seed averaging,
batched (concurrent) evaluation, and untrusted model source trained in the sandbox."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from nas.core.space import SearchSpace
from nas.errors import ConfigError, EncodingError, EvaluationError
from nas.evaluators.train import TrainEvaluator
from nas.sandbox.protocol import TRAINED
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.space import BlockSpace
from nas.spaces.nb201.space import NB201Space
from nas.spaces.source.arch import SourceArch
from nas.spaces.source.space import SourceSpace
from nas.train.build import build_model

BLOCKS = Path(__file__).resolve().parent / "data" / "blocks"
TINY = {"epochs": 2, "batch_size": 64, "train_subset": 256, "valid_subset": 128, "test_subset": 128}

SOURCE = '''
import torch
from torch import nn


class Network(nn.Module):
    """A one-conv digits classifier."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))

    def forward(self, x):
        return self.body(x)
'''


def evaluator(space: SearchSpace | None = None, **kw) -> TrainEvaluator:
    recipe = {**TINY, **kw.pop("recipe", {})}
    return TrainEvaluator(space or NB201Space(), {"name": "digits"}, recipe, channels=4, cells_per_stage=1, **kw)


def test_source_key_ignores_formatting_comments_and_docstrings():
    plain = SOURCE.replace('    """A one-conv digits classifier."""\n\n', "")
    assert SourceArch(SOURCE).key() == SourceArch(plain.replace("num_classes=10", "num_classes = 10")).key()
    assert SourceArch(SOURCE).key() != SourceArch(SOURCE.replace("8, 3", "8, 5")).key()
    with pytest.raises(EncodingError, match=r"model.py:\d+: "):
        SourceArch("class Network(:\n").key()


def test_block_file_builds_in_the_skeleton_within_the_budget():
    arch = BlockArch.from_text((BLOCKS / "residual.txt").read_text())
    small = BlockSpace.build_options({"cells_per_stage": 1, "budget": {"params": 20_000, "flops": 2e6},
                                      "channels": 4})  # NB201's setting: not the block space's, dropped
    assert small == {"cells_per_stage": 1, "skeleton": "nb201", "budget": {"params": 20_000, "flops": 2e6},
                     "width_multiple": 8}
    net = build_model(BlockSpace(), arch, (1, 8, 8), 10, small, seed=0)
    assert sum(p.numel() for p in net.parameters()) <= 20_000
    with pytest.raises(EvaluationError, match="cannot build the network"):
        build_model(BlockSpace(), arch, (1, 8, 8), 10, BlockSpace.build_options({"budget": {"params": 10}}), seed=0)
    with pytest.raises(ConfigError, match="evaluator.skeleton must be one of nb201, imagenet"):
        BlockSpace.build_options({"skeleton": "vit"})


@pytest.mark.parametrize("space", [BlockSpace(), SourceSpace()], ids=["nader", "source"])
def test_model_source_is_never_built_in_process_and_the_error_says_where_it_runs(space):
    with pytest.raises(EvaluationError) as err:
        build_model(space, SourceArch(SOURCE), (1, 8, 8), 10, {}, seed=0)
    assert str(err.value) == (f"model source runs only in the sandbox, never in-process (space '{space.name}'): "
                              "use space=source with evaluator=train, which trains each model file in its sandbox")


def test_sizing_settings_are_checked_by_every_space_that_reads_them_and_kept_per_space():
    assert evaluator().build == {"channels": 4, "cells_per_stage": 1}  # NB201 reads no skeleton or budget
    assert evaluator(BlockSpace()).build == {"cells_per_stage": 1, "skeleton": "nb201", "budget": {},
                                             "width_multiple": 8}
    with pytest.raises(ConfigError, match=r"^evaluator.skeleton must be one of nb201, imagenet, got 'vit'$"):
        evaluator(skeleton="vit")  # the block space's setting, refused on an NB201 run too
    with pytest.raises(ConfigError, match=r"^evaluator.channels must be an integer >= 1, got 0$"):
        TrainEvaluator(BlockSpace(), {"name": "digits"}, TINY, channels=0)  # NB201's, refused on a block run
    with pytest.raises(ConfigError, match=r"^evaluator 'train': unknown parameter 'chanels' \(accepted: budget, "):
        evaluator(chanels=8)


def test_model_source_results_from_before_the_reinitialisation_are_not_reused():
    """Model source once trained from the sandbox's initial values: its cache key changed, a
    trusted space's did not."""
    from nas.core.arch import stable_hash

    for ev, same in ((evaluator(), True), (evaluator(BlockSpace()), True), (evaluator(SourceSpace()), False)):
        before = stable_hash("train", ev.data_cfg, ev.recipe.to_dict(), ev.engine.to_dict(), ev.build, ev.seeds)
        assert (ev.fingerprint() == before) == same, ev.space.name


def test_block_file_and_nb201_cell_train():
    ev = evaluator(budget={"params": 20_000, "flops": 2e6})
    block = evaluator(BlockSpace(), budget={"params": 20_000, "flops": 2e6}).evaluate(
        BlockArch.from_text((BLOCKS / "residual.txt").read_text()), seed=1)
    cell = ev.evaluate(ev.space.sample(np.random.default_rng(0)), seed=1)
    for r in (block, cell):
        assert r.ok and 0 < r.accuracy <= 100 and len(r.curve) == 2 and r.params > 0


def test_seeds_are_averaged_and_replace_the_run_seed():
    ev = evaluator(seeds=[777, 888])
    assert not ev.uses_seed and evaluator().uses_seed
    assert ev.fingerprint() != evaluator(seeds=[777, 999]).fingerprint()
    arch = ev.space.sample(np.random.default_rng(1))
    r = ev.evaluate(arch, seed=5)
    a = evaluator().evaluate(arch, seed=777)
    b = evaluator().evaluate(arch, seed=888)
    assert r.metrics["valid_accuracy_seed777"] == a.accuracy and r.metrics["valid_accuracy_seed888"] == b.accuracy
    assert r.accuracy == pytest.approx((a.accuracy + b.accuracy) / 2, abs=1e-3)
    assert r.metrics["valid_accuracy_std"] == pytest.approx(abs(a.accuracy - b.accuracy) / 2, abs=1e-3)
    assert r.curve == pytest.approx([(x + y) / 2 for x, y in zip(a.curve, b.curve)])
    with pytest.raises(ConfigError, match="evaluator.seeds must be a non-empty list"):
        evaluator(seeds=[])


@pytest.mark.parametrize("engine", [{}, {"kind": "fast"}])
def test_a_terminated_seed_measures_no_accuracy_and_the_trial_averages_only_finished_seeds(engine):
    """Training stopped early is never evaluated: its accuracy is None, not 0 %, the trial's
    accuracy metrics are the mean of the seeds that finished, and absent when none did."""
    from nas.evaluators.train import _combine
    from nas.train.result import TrainResult
    from nas.train.run import train_one

    stops = {"patience_epochs": 2, "min_loss_drop": 0.99}  # no loss drops 99 % in two epochs
    arch = evaluator().space.sample(np.random.default_rng(4))

    def trained(ev: TrainEvaluator, seed: int) -> TrainResult:
        net = build_model(ev.space, arch, ev.data.shape, ev.data.num_classes, ev.build, seed)
        return train_one(net, ev.data, ev.recipe, seed, ev.engine)

    finished, stopped = trained(evaluator(engine=engine), 777), trained(evaluator(engine=engine, recipe=stops), 888)
    assert stopped.terminated.startswith("loss not improving") and stopped.epochs == 2
    assert stopped.valid_accuracy is None and stopped.test_accuracy is None and finished.valid_accuracy > 0
    assert TrainResult.from_untrusted(TRAINED.check(stopped.to_dict()), max_epochs=2) == stopped
    with pytest.raises(ValueError, match=r"^training report field\(s\) valid_accuracy, test_accuracy malformed$"):
        TRAINED.check({**stopped.to_dict(), "valid_accuracy": 0.0, "test_accuracy": 0.0})
    r = _combine([finished, stopped], [777, 888])
    assert r.accuracy is None and r.error.startswith("terminated early: loss not improving") and "seed 888" in r.error
    assert (r.metrics["valid_accuracy"], r.metrics["test_accuracy"]) == (finished.valid_accuracy,
                                                                       finished.test_accuracy)
    assert r.metrics["valid_accuracy_seed777"] == finished.valid_accuracy
    assert not {"valid_accuracy_seed888", "valid_accuracy_std"} & set(r.metrics)
    none = evaluator(seeds=[777, 888], engine=engine, recipe=stops).evaluate(arch)
    assert none.accuracy is None and none.error.startswith("terminated early: loss not improving")
    assert not [k for k in none.metrics if "accuracy" in k] and none.metrics["epochs"] == 2.0


def test_nas_train_prints_no_accuracy_for_a_terminated_run(capsys):
    from nas.cli.main import main as nas_main

    cell = "|nor_conv_3x3~0|+|none~0|nor_conv_3x3~1|+|skip_connect~0|none~1|skip_connect~2|"
    with pytest.raises(SystemExit) as exc:
        nas_main(["train", cell, "data=digits", "evaluator.channels=4", "evaluator.cells_per_stage=1",
                  *(f"recipe.{k}={v}" for k, v in {**TINY, "patience_epochs": 2, "min_loss_drop": 0.99}.items())])
    assert exc.value.code == 1
    assert re.search(r": failed: terminated early: loss not improving: [^;]*; no accuracy measured, \d+ params, ",
                     capsys.readouterr().out)


def test_batch_isolates_a_candidate_that_cannot_be_built():
    ev = evaluator()
    good = ev.space.sample(np.random.default_rng(2))
    bad = BlockArch.from_text((BLOCKS / "residual.txt").read_text())  # not an NB201 cell: the space cannot build it
    results = ev.evaluate_batch([good, bad], seed=0)
    assert results[0].ok and not results[1].ok
    assert results[1].error.startswith(f"space 'nb201' builds no network of a nader architecture (BlockArch {bad.key()})")


def test_model_source_trains_in_the_sandbox_per_seed():
    ev = evaluator(SourceSpace(), seeds=[777, 888], sandbox={"wall_s": 300})
    heard = []
    ev.on_epoch = heard.append  # trained here on the exported graph: each epoch is heard, as for trusted models
    arch = SourceArch(SOURCE)
    r = ev.evaluate(arch, seed=None)
    assert r.ok and r.params == 186 and set(r.metrics) >= {"valid_accuracy_seed777", "valid_accuracy_seed888"}
    assert r.metrics["epochs"] == 2.0 and len(r.curve) == 2 and "valid_accuracy_std" in r.metrics
    assert [(p.label, p.epoch) for p in heard] == [(f"source {arch.key()} seed {s}", e) for s in (777, 888)
                                                   for e in (1, 2)]


def test_sandbox_trains_each_seed_from_the_initial_weights_that_seed_draws(tmp_path):
    """Not exportable, model source trains in the sandbox (`_train`): each seed starts from
    torch.manual_seed(seed)'s weights (an exported graph's from nasflow's own, `GraphNet.reinitialise`)."""
    from nas.sandbox.worker import Reporter, _train, import_file
    from nas.train.result import TrainResult

    (tmp_path / "model.py").write_text(SOURCE)
    module = import_file(tmp_path / "model.py", "nas_seeded_candidate")
    first: list[torch.Tensor] = []

    def trainer(net: torch.nn.Module, seed: int) -> TrainResult:  # records where training would start
        first.append(net.body[0].weight.detach().clone())
        return TrainResult(valid_accuracy=10.0, test_accuracy=10.0)

    read, write = os.pipe()
    try:
        _train(module, "model.py", 10, [777, 888], trainer, Reporter(write))
        assert os.read(read, 1 << 16).decode().count('"trained"') == 2
    finally:
        os.close(read)
        os.close(write)
    for seed, weight in zip([777, 888], first):
        torch.manual_seed(seed)
        assert torch.equal(weight, module.Network(num_classes=10).body[0].weight)
    assert not torch.equal(first[0], first[1])


@pytest.mark.parametrize("body, error", [
    ("if self.training and x.shape[0] > 2:\n            raise RuntimeError('boom at batch size ' + str(x.shape[0]))",
     "train: RuntimeError: boom at batch size 64 at model.py:"),
])
def test_model_source_failing_only_in_training_is_reported_where(body, error):
    source = SOURCE.replace("    def forward(self, x):\n", f"    def forward(self, x):\n        {body}\n")
    with pytest.raises(EvaluationError) as info:
        evaluator(SourceSpace(), sandbox={"wall_s": 300}).evaluate(SourceArch(source), seed=0)
    assert str(info.value).startswith(error), str(info.value)
    assert not Path("/tmp/escaped.txt").exists()


def test_model_source_writing_while_training_stays_contained():
    """Exported, the graph trains here and the write never runs again; not
    exported, it trains in the sandbox, whose /tmp is its own. Either way nothing escapes."""
    body = "if self.training and x.shape[0] > 2:\n            open('/tmp/escaped.txt', 'w')"
    source = SOURCE.replace("    def forward(self, x):\n", f"    def forward(self, x):\n        {body}\n")
    try:
        evaluator(SourceSpace(), sandbox={"wall_s": 300}).evaluate(SourceArch(source), seed=0)
    except EvaluationError as err:
        assert "escaped.txt" in str(err)
    assert not Path("/tmp/escaped.txt").exists()


def test_sandbox_limits_are_checked():
    with pytest.raises(ConfigError, match="evaluator.sandbox: unknown key 'gpus'"):
        evaluator(sandbox={"gpus": 1})


@pytest.mark.slow
def test_ddp_trains_with_two_processes_through_the_worker():
    """Lightning DDP on two CPU processes (gloo): the same launcher runs GPUs."""
    from nas.train.worker import train_in_subprocess

    ev = evaluator(engine={"devices": 2})
    arch = ev.space.sample(np.random.default_rng(0))
    r = train_in_subprocess(ev.space, arch, data=ev.data_cfg, recipe=ev.recipe.to_dict(), engine=ev.engine.to_dict(),
                            build=ev.build, seed=0, timeout_s=300)
    assert r.world_size == 2 and r.epochs == 2 and r.terminated is None and len(r.loss_curve) == 2
    whole = ev.evaluate(arch, seed=0)
    assert whole.ok and whole.curve == pytest.approx(r.loss_curve)


def test_metrics_say_how_the_numbers_were_computed():
    """compile/capture seconds and the share of seeds trained as CUDA graphs, numeric (as the
    evaluation cache's record check wants): on CPU no graph is captured, even when asked for."""
    from tasks.evaluate import RESULT_FIELDS
    from tasks.records import check_fields

    arch = evaluator().space.sample(np.random.default_rng(3))
    for engine in ({"kind": "fast"}, {"kind": "fast", "cuda_graphs": "on"}):
        r = evaluator(seeds=[777, 888], engine=engine).evaluate(arch)
        assert r.metrics["cuda_graphs"] == 0.0 and r.metrics["compile_seconds"] >= 0.0
        assert check_fields(r.to_dict(), RESULT_FIELDS, exact=True) is None

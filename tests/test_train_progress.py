"""Per-epoch training progress: what both engines report, `nas train`'s display, and the
Prefect progress artifact of a training run inside a flow (tiny models on digits)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from nas.data.sources import digits
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.macro import Skeleton
from nas.spaces.nader.network import build_network
from nas.train.engine import Engine
from nas.train.progress import EpochDisplay, EpochProgress, clock, prefect_progress
from nas.train.recipe import Recipe
from nas.train.run import train_many
from tasks.progress import PrefectProgress, artifact_key

RESIDUAL = (Path(__file__).resolve().parent / "data" / "blocks" / "residual.txt").read_text()
RECIPE = Recipe(epochs=3, batch_size=64)


def tiny_net(seed: int = 0):
    torch.manual_seed(seed)
    sk = Skeleton(depths=(1, 1, 1), input_size=8, in_channels=1, num_classes=10)
    return build_network(BlockArch.from_text(RESIDUAL).plan(sk, width=8))


@pytest.fixture(scope="module")
def data():
    return digits()


def _nan_net():
    net = tiny_net(1)
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(float("nan"))
    return net


@pytest.mark.parametrize("graphs", ["off", "on"])
def test_fast_engine_reports_each_epoch_of_each_candidate(data, graphs):
    heard: list[EpochProgress] = []
    engine = Engine(kind="fast", concurrent=2, cuda_graphs=graphs)
    good, broken = train_many([tiny_net(), _nan_net()], data, RECIPE, 0, engine, heard.append, ["good", "broken"])
    mine = [p for p in heard if p.label == "good"]
    assert [p.epoch for p in mine] == [1, 2, 3] and all(p.epochs == 3 for p in mine)
    assert [p.loss for p in mine] == good.loss_curve  # the loss the result reports, per epoch
    assert mine[0].elapsed > 0 and [p.elapsed for p in mine] == sorted(p.elapsed for p in mine)
    assert mine[0].eta > 0 and mine[-1].eta == 0.0 and mine[-1].terminated is None
    stopped, = [p for p in heard if p.label == "broken"]  # terminated at its first epoch: reported once
    assert stopped.epoch == 1 and stopped.terminated == broken.terminated and stopped.eta == 0.0


def test_lightning_path_reports_each_epoch(data):
    heard: list[EpochProgress] = []
    r, = train_many([tiny_net()], data, Recipe(epochs=2, batch_size=64), 0, Engine(), heard.append, ["cell x"])
    assert [(p.label, p.epoch, p.epochs) for p in heard] == [("cell x", 1, 2), ("cell x", 2, 2)]
    assert [p.loss for p in heard] == r.loss_curve and heard[0].eta > 0 and heard[1].eta == 0.0


def test_eta_and_clock():
    p = EpochProgress("c", epoch=2, epochs=10, loss=1.5, elapsed=30.0)
    assert p.eta == 120.0 and p.summary() == "epoch 2/10, loss 1.5000, 0:30, ETA 2:00"
    assert EpochProgress("c", 2, 10, 9.0, 30.0, terminated="non-finite loss").eta == 0.0
    assert clock(3725.4) == "1:02:05" and clock(59.6) == "1:00"
    assert artifact_key("nb201 3F2A seed 777") == "train-nb201-3f2a-seed-777"


def test_display_without_a_terminal_is_one_line_per_epoch(capsys):
    with EpochDisplay("training x", tty=False) as show:
        show(EpochProgress("nader 1a2b", 1, 2, 2.25, 4.0))
        show(EpochProgress("nader 1a2b", 2, 2, 1.5, 8.0))
    assert capsys.readouterr().err.splitlines() == ["training x",
                                                    "nader 1a2b: epoch 1/2, loss 2.2500, 0:04, ETA 0:04",
                                                    "nader 1a2b: epoch 2/2, loss 1.5000, 0:08, ETA 0:00"]


def test_display_on_a_terminal_draws_a_bar(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with EpochDisplay("training x", tty=True) as show:
        assert [t.description for t in show.bar.tasks] == ["training x"]  # until the first epoch
        show(EpochProgress("nader 1a2b", 1, 4, 2.25, 4.0))
        show(EpochProgress("nader 1a2b", 4, 4, 1.0, 16.0, terminated="loss not improving"))
        assert [t.description for t in show.bar.tasks] == ["nader 1a2b"]
    text = err.getvalue()
    assert "nader 1a2b" in text and "epoch 4/4" in text and "stopped: loss not improving" in text


def test_no_prefect_run_no_artifacts(data):
    assert not PrefectProgress.active() and prefect_progress() is None


@pytest.mark.slow
def test_training_in_a_flow_publishes_one_progress_artifact_per_candidate(prefect_home):
    """A real (ephemeral) Prefect API: the evaluator inside a flow run creates each candidate's
    progress artifact at its first epoch and leaves it at 100 % with the last epoch's line."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from nas.evaluators import EVALUATORS
    from nas.spaces.nb201.space import NB201Space

    ev = EVALUATORS.create("train", {"data": {"name": "digits"}, "recipe": {"epochs": 2, "batch_size": 64},
                                     "channels": 4, "cells_per_stage": 1, "seeds": [777]}, space=NB201Space())
    arch = ev.space.sample(np.random.default_rng(0))

    @flow
    def train_flow() -> float:
        return ev.evaluate(arch).accuracy

    assert train_flow() > 0
    key = artifact_key(f"nb201 {arch.key()} seed 777")
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert len(found) == 1 and found[0].type == "progress" and float(found[0].data) == 100.0
    assert found[0].description.startswith(f"nb201 {arch.key()} seed 777: epoch 2/2, loss ")


@pytest.mark.parametrize("rank_zero, losses, heard", [
    (True, [0.9, 0.5], [("c", 2, 3, 0.5, None)]),  # rank 0 after its second epoch
    (False, [0.9, 0.5], []),  # another DDP rank: rank 0 reports for it
    (True, [], []),  # no epoch loss yet (an epoch without a batch): nothing to report
])
def test_an_epoch_is_reported_on_rank_zero_only_and_only_with_a_loss(rank_zero, losses, heard):
    from types import SimpleNamespace

    from nas.train.fit import EpochReport

    finished = []
    module = SimpleNamespace(epoch_losses=losses, recipe=SimpleNamespace(epochs=3), stopped=None,
                             finish_epoch=lambda: finished.append(True))
    got = []
    report = EpochReport(got.append, "c")
    report.on_train_start(None, module)
    report.on_train_epoch_end(SimpleNamespace(is_global_zero=rank_zero), module)
    assert finished == [True]  # every rank closes its epoch
    assert [(p.label, p.epoch, p.epochs, p.loss, p.terminated) for p in got] == heard
    assert all(p.elapsed >= 0 for p in got)


@pytest.mark.parametrize("world_size, synced", [(1, False), (2, True), (4, True)])
def test_validation_metrics_are_averaged_over_ranks_only_under_ddp(monkeypatch, world_size, synced):
    from types import SimpleNamespace

    import torch

    from nas.train.module import Classifier
    from nas.train.recipe import Recipe

    module = Classifier(torch.nn.Linear(3, 2), Recipe())
    module._trainer = SimpleNamespace(world_size=world_size)  # what Lightning attaches (one rank's view)
    logged = []
    monkeypatch.setattr(module, "log", lambda name, value, **kw: logged.append((name, kw["sync_dist"])))
    module.validation_step((torch.zeros(4, 3), torch.tensor([0, 1, 0, 1])), 0)
    assert logged == [("valid_acc", synced), ("valid_loss", synced)]


def test_combined_epoch_hooks_call_each_given_one_in_order():
    from nas.train.progress import EpochProgress, combine

    heard = []
    first, second = (lambda p: heard.append(("first", p.epoch))), (lambda p: heard.append(("second", p.epoch)))
    assert combine() is None and combine(None, None) is None
    assert combine(None, first) is first  # one hook: itself
    both = combine(first, None, second)
    assert both is not None
    both(EpochProgress("c", 2, 3, 0.5, 1.0))
    assert heard == [("first", 2), ("second", 2)]

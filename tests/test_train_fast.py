"""The fast training path on CPU: determinism, grouping, bf16/channels_last, agreement
with the plain path, early termination, device errors, torch.compile (tiny, digits)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from nas.data.module import random_crop, random_flip
from nas.data.sources import digits
from nas.errors import ConfigError, EvaluationError
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.macro import Skeleton
from nas.spaces.nader.network import build_network
from nas.train.engine import Engine
from nas.train.fast import train_fast
from nas.train.fit import train
from nas.train.graphs import StaticEval, StaticStep, padded_rows
from nas.train.recipe import Recipe

RESIDUAL = (Path(__file__).resolve().parent / "data" / "blocks" / "residual.txt").read_text()
FAST = Engine(kind="fast")
RECIPE = Recipe(epochs=3, batch_size=64)


def tiny_net(seed: int = 0, width: int = 8):
    torch.manual_seed(seed)
    sk = Skeleton(depths=(1, 1, 1), input_size=8, in_channels=1, num_classes=10)
    return build_network(BlockArch.from_text(RESIDUAL).plan(sk, width=width))


@pytest.fixture(scope="module")
def data():
    return digits()


def test_deterministic_and_learns(data):
    a, = train_fast([tiny_net()], data, RECIPE, 0, FAST)
    b, = train_fast([tiny_net()], data, RECIPE, 0, FAST)
    assert (a.loss_curve, a.valid_accuracy, a.test_accuracy) == (b.loss_curve, b.valid_accuracy, b.test_accuracy)
    assert a.epochs == 3 and a.terminated is None and len(a.loss_curve) == 3
    assert a.loss_curve[-1] < a.loss_curve[0] and a.valid_accuracy > 50 and a.test_accuracy > 50
    assert a.params > 0 and a.flops > 0 and a.device == "cpu"
    assert a.wall_seconds >= a.device_seconds > a.eval_seconds > 0  # the final passes are timed apart


@pytest.mark.parametrize("graphs", ["off", "on"])  # on (CPU): the static-shape step, padded masked last batch
def test_grouping_does_not_change_results(data, graphs):
    recipe = Recipe(epochs=2, batch_size=64)  # 1078 images: the last batch of each epoch is partial
    single, pair = Engine(kind="fast", cuda_graphs=graphs), Engine(kind="fast", concurrent=2, cuda_graphs=graphs)
    alone = [train_fast([tiny_net(s)], data, recipe, 3, single)[0] for s in (0, 1)]
    together = train_fast([tiny_net(0), tiny_net(1)], data, recipe, 3, pair)
    key = [(r.loss_curve, r.valid_accuracy, r.test_accuracy) for r in alone]
    assert [(r.loss_curve, r.valid_accuracy, r.test_accuracy) for r in together] == key
    assert key[0] != key[1]  # different models really were trained
    broken = tiny_net(1)
    with torch.no_grad():
        for p in broken.parameters():
            p.fill_(float("nan"))
    dropped, kept = train_fast([broken, tiny_net(0)], data, recipe, 3, pair)
    assert dropped.terminated.startswith("non-finite loss at epoch 1") and dropped.epochs == 1
    assert (kept.loss_curve, kept.valid_accuracy, kept.test_accuracy) == key[0]  # trained on without it


def test_bf16_channels_last_learns(data):
    engine = Engine(kind="fast", bf16=True, channels_last=True)
    r, = train_fast([tiny_net()], data, RECIPE, 0, engine)
    assert r.terminated is None and r.loss_curve[-1] < r.loss_curve[0] and r.valid_accuracy > 30


def test_agrees_with_plain_path(data):
    gaps = []
    for seed in (0, 1):
        plain = train(tiny_net(seed), data, RECIPE, seed=seed)
        fast, = train_fast([tiny_net(seed)], data, RECIPE, seed, FAST)
        # same shuffle, augmentation, optimiser and schedule: the first epoch is the same computation
        assert fast.loss_curve[0] == pytest.approx(plain.loss_curve[0], rel=1e-6)
        assert fast.valid_accuracy > 50 and plain.valid_accuracy > 50
        assert (fast.params, fast.flops, fast.epochs) == (plain.params, plain.flops, plain.epochs)
        gaps.append((fast.valid_accuracy - plain.valid_accuracy, fast.test_accuracy - plain.test_accuracy))
    # later epochs see other shuffles; over 8 seeds single-seed gaps reached 7 points, so average two
    assert all(abs(sum(g) / len(gaps)) < 10 for g in zip(*gaps))


def test_non_finite_loss_terminates(data):
    r, = train_fast([tiny_net()], data, Recipe(epochs=5, batch_size=64, lr=1e6), 0, FAST)
    assert r.terminated.startswith("non-finite loss at epoch 1") and r.epochs == 1
    assert r.valid_accuracy is None and r.test_accuracy is None  # never evaluated


def test_not_improving_terminates_and_leaves_group(data):
    stuck = Recipe(epochs=4, batch_size=64, lr=1e-7, patience_epochs=2)
    r, = train_fast([tiny_net()], data, stuck, 0, FAST)
    assert r.terminated.startswith("loss not improving") and r.epochs == 2 and r.valid_accuracy is None


def test_gpu_without_cuda_is_a_config_error(data, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        train_fast([tiny_net()], data, RECIPE, 0, Engine(kind="fast", accelerator="gpu"))
    assert str(info.value) == "engine.accelerator=gpu but CUDA is not available"
    r, = train_fast([tiny_net()], data, Recipe(epochs=1, batch_size=256), 0, Engine(kind="fast", accelerator="auto"))
    assert r.device == "cpu"


def test_augmentation_is_reproducible_with_a_generator():
    x = torch.rand(16, 3, 8, 8)

    def augment(seed: int) -> torch.Tensor:
        gen = torch.Generator(device=x.device).manual_seed(seed)
        return random_flip(random_crop(x, 2, gen), gen)

    assert torch.equal(augment(5), augment(5)) and not torch.equal(augment(5), augment(6))


def test_compile_failure_is_an_evaluation_error(data, monkeypatch):
    def broken_backend(graph, example_inputs):
        raise RuntimeError("no kernels today\nsecond line")

    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile_(model, backend=broken_backend, **kw))
    with pytest.raises(EvaluationError) as info:
        train_fast([tiny_net()], data, RECIPE, 0, Engine(kind="fast", compile=True))
    assert str(info.value) == "torch.compile failed: RuntimeError: no kernels today"


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="torch.compile needs a C compiler")
def test_compiled_trains_and_agrees_with_eager(data):
    recipe = Recipe(epochs=2, batch_size=128, train_subset=1024)  # no partial batch: one compilation
    eager, = train_fast([tiny_net(width=4)], data, recipe, 0, FAST)
    compiled, = train_fast([tiny_net(width=4)], data, recipe, 0, Engine(kind="fast", compile=True))
    assert compiled.terminated is None and compiled.loss_curve[-1] < compiled.loss_curve[0]
    assert compiled.loss_curve == pytest.approx(eager.loss_curve, rel=1e-3)
    assert abs(compiled.valid_accuracy - eager.valid_accuracy) < 10


# -- static shapes (CUDA graphs / compile): padded last batch with a masked loss --------------------------

def _linear(seed: int = 0) -> torch.nn.Module:
    """No BatchNorm: a padded batch must then give exactly the real rows' update."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))


def test_padded_masked_step_is_the_partial_batch_step():
    recipe = Recipe(epochs=1, batch_size=8)
    x, y = torch.randn(5, 1, 8, 8), torch.randint(0, 10, (5,))
    ref, net = _linear(), _linear()
    opt = torch.optim.SGD(ref.parameters(), lr=recipe.lr, momentum=recipe.momentum, nesterov=True,
                          weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4, eta_min=0.0)
    total = torch.zeros((), dtype=torch.float64)
    step = StaticStep(net, net, recipe, 4, (8, 1, 8, 8), torch.device("cpu"), False, False, total)
    rows, real = padded_rows(5, 0, 8, torch.device("cpu"))
    assert rows.tolist() == [0, 1, 2, 3, 4, 0, 1, 2] and real.tolist() == [True] * 5 + [False] * 3
    losses = 0.0
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(ref(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses += 5 * loss.item()
        padded = x[rows].clone()
        padded[5:] = 1e3  # whatever the padding holds, it must not reach the update
        step(padded, y[rows], real.float())
        for a, b in zip(ref.parameters(), net.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        # the cosine schedule, computed on the device in closed form
        assert step.lr.item() == pytest.approx(sched.get_last_lr()[0], rel=1e-6, abs=1e-9)
    assert total.item() == pytest.approx(losses, rel=1e-5)  # each real image's loss counted once


def test_padded_eval_counts_each_image_once():
    net, cpu = _linear().eval(), torch.device("cpu")
    images, labels = torch.randn(21, 1, 8, 8), torch.randint(0, 10, (21,))
    total = torch.zeros((), dtype=torch.float64)
    counter = StaticEval(net, (8, 1, 8, 8), cpu, False, False, total)
    for k in range(0, 21, 8):
        rows, real = padded_rows(21, k, 8, cpu)
        counter(images[rows], labels[rows], real)
    with torch.no_grad():
        assert total.item() == (net(images).argmax(1) == labels).sum().item()


def test_static_warmup_is_undone():
    """Warm-up steps (before capture, or to pay for compilation) leave no trace."""
    net, recipe, cpu = tiny_net(), Recipe(epochs=1, batch_size=16), torch.device("cpu")
    before = {k: v.clone() for k, v in net.state_dict().items()}
    step = StaticStep(net, net, recipe, 10, (16, 1, 8, 8), cpu, False, False, torch.zeros((), dtype=torch.float64))
    step.prepare(capture=False, warmup=True)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert step.lr.item() == pytest.approx(recipe.lr) and step.t.item() == 0 and step.total.item() == 0
    assert all(s["momentum_buffer"].abs().sum() == 0 for s in step.opt.state.values())
    assert step.status == "off" and step.compile_seconds > 0


def test_graphs_on_without_cuda_trains_static_shapes_and_says_so(data, caplog):
    engine = Engine(kind="fast", cuda_graphs="on")
    with caplog.at_level("WARNING", logger="nas.train.fast"):
        a, = train_fast([tiny_net()], data, RECIPE, 0, engine)
    assert [r.getMessage() for r in caplog.records] == [
        "engine.cuda_graphs=on without a CUDA device: training eagerly with static shapes"]
    assert a.cuda_graphs == "failed: no CUDA device" and a.compile_seconds == 0.0
    b, = train_fast([tiny_net()], data, RECIPE, 0, engine)
    assert (a.loss_curve, a.valid_accuracy, a.test_accuracy) == (b.loss_curve, b.valid_accuracy, b.test_accuracy)
    eager, = train_fast([tiny_net()], data, RECIPE, 0, FAST)
    assert eager.cuda_graphs == "off"
    # 1078 images in batches of 64: 17 steps, the last one padded from 54 to 64; the first epoch differs
    # from the eager one only in that step's BatchNorm statistics and the float32 learning rate
    assert a.loss_curve[0] == pytest.approx(eager.loss_curve[0], rel=2e-3)
    assert a.loss_curve[-1] < a.loss_curve[0] and a.valid_accuracy > 50 and a.test_accuracy > 50
    assert abs(a.valid_accuracy - eager.valid_accuracy) < 15


def test_cuda_graphs_setting():
    assert Engine(kind="fast").cuda_graphs == "auto" and "cuda_graphs" in Engine().to_dict()
    assert Engine(kind="fast", cuda_graphs=False).cuda_graphs == "off"  # YAML's bare off
    assert Engine(kind="fast", cuda_graphs=True).cuda_graphs == "on"
    with pytest.raises(ConfigError, match=r"engine.cuda_graphs must be one of auto, on, off, got 'yes'"):
        Engine(kind="fast", cuda_graphs="yes")
    with pytest.raises(ConfigError, match=r"cuda_graphs=on need engine.kind=fast"):
        Engine(cuda_graphs="on")
    assert Engine(kind="fast", cuda_graphs="off").to_dict() != Engine(kind="fast").to_dict()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
def test_cuda_graphs_agree_with_eager_on_gpu(data):
    recipe = Recipe(epochs=3, batch_size=64)  # 1078 images: the last batch of each epoch is padded
    eager, = train_fast([tiny_net()], data, recipe, 0, Engine(kind="fast", accelerator="gpu", cuda_graphs="off"))
    graphed, = train_fast([tiny_net()], data, recipe, 0, Engine(kind="fast", accelerator="gpu"))  # auto: on
    assert eager.cuda_graphs == "off" and graphed.cuda_graphs == "on" and graphed.device.startswith("cuda")
    assert graphed.compile_seconds > 0 and graphed.device_seconds > graphed.compile_seconds
    assert graphed.loss_curve[0] == pytest.approx(eager.loss_curve[0], rel=5e-3)
    assert graphed.loss_curve[-1] < graphed.loss_curve[0] and graphed.valid_accuracy > 50
    assert abs(graphed.valid_accuracy - eager.valid_accuracy) < 15
    pair = train_fast([tiny_net(0), tiny_net(1)], data, recipe, 0,
                      Engine(kind="fast", accelerator="gpu", concurrent=2))  # one graph per model, own streams
    assert [r.cuda_graphs for r in pair] == ["on", "on"]
    assert pair[0].loss_curve[0] == pytest.approx(graphed.loss_curve[0], rel=5e-3)  # cuDNN: not bit for bit


class _HostRead(torch.nn.Module):
    """Reads a value back to the host in forward: legal eagerly, impossible inside a CUDA graph."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x) * (2.0 if bool(torch.isnan(x).any()) else 1.0)


@needs_cuda
def test_capture_failure_falls_back_to_eager_with_one_line(data, caplog):
    with caplog.at_level("WARNING", logger="nas.train.graphs"):
        r, = train_fast([_HostRead(tiny_net())], data, RECIPE, 0, Engine(kind="fast", accelerator="gpu",
                                                                           cuda_graphs="on"))
    assert r.cuda_graphs.startswith("failed: ") and r.terminated is None and r.valid_accuracy > 50
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith("CUDA graph capture of the training step failed, running it eagerly")


@pytest.mark.parametrize("name", ["devices", "concurrent"])
@pytest.mark.parametrize("value, refused", [(1, False), (4, False), (0, True), (-1, True), (1.0, True), ("2", True)])
def test_an_engine_takes_devices_and_concurrent_as_integers_of_one_or_more(name, value, refused) -> None:
    if not refused:
        kind = "fast" if name == "concurrent" else "plain"  # concurrent > 1 needs kind=fast, devices > 1 plain
        assert getattr(Engine(kind=kind, **{name: value}), name) == value
        return
    with pytest.raises(ConfigError) as info:
        Engine(kind="fast", **{name: value})
    assert str(info.value) == f"engine.{name} must be an integer >= 1, got {value!r}"

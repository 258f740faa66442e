"""benchmarks/fused_pack.py: N models trained fused (stacked weights under vmap, one step)
end exactly as the same models trained separately by the fast engine's static step."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from nas.data.sources import digits
from nas.train.engine import Engine
from nas.train.fast import train_fast
from nas.train.recipe import Recipe

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fused_pack import Stacked, train_fused  # noqa: E402

from test_train_fast import tiny_net  # noqa: E402

SEEDS = (0, 1, 2)
# 200 images in batches of 64: the 4th step is 8 real images padded to 64 and masked
RECIPE = Recipe(epochs=2, batch_size=64, train_subset=200, valid_subset=100, test_subset=100)
STATIC = Engine(kind="fast", cuda_graphs="on")  # on CPU: the graphs' static step, run eagerly


def test_fused_members_train_exactly_as_separate_models():
    data = digits()
    separate = [tiny_net(s) for s in SEEDS]
    alone = train_fast(separate, data, RECIPE, 0, STATIC)
    fused = train_fused([tiny_net(s) for s in SEEDS], data, RECIPE, 0, STATIC)
    assert fused.cuda_graphs == alone[0].cuda_graphs == "failed: no CUDA device"  # the step ran eagerly
    for i, (net, r) in enumerate(zip(separate, alone)):
        state = fused.model.state(i)
        assert state.keys() == net.state_dict().keys()  # BatchNorm running stats and counts included
        # fp32 rounding only (grouped vs single convolutions sum in another order: up to ~1e-5
        # after these 8 steps); a gradient shared or scaled between members moves them ~1e-2
        for name, t in net.state_dict().items():
            torch.testing.assert_close(state[name], t, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"{name}: {m}")
        assert [epoch[i] for epoch in fused.losses] == pytest.approx(r.loss_curve, rel=1e-5)
        assert fused.accuracy["valid"][i] == r.valid_accuracy and fused.accuracy["test"][i] == r.test_accuracy
    # the members did train, and apart: no two end alike
    start = tiny_net(0).state_dict()
    assert not torch.allclose(fused.model.state(0)["classifier.weight"], start["classifier.weight"])
    assert not torch.allclose(fused.model.state(0)["classifier.weight"], fused.model.state(1)["classifier.weight"])


def test_convolutions_run_in_the_autocast_dtype_under_vmap():
    """autocast alone leaves vmapped convolutions in fp32 (and vmap's batch norm refuses bf16 with
    fp32 running stats); the fused model casts them, and answers as the models do under autocast."""
    nets = [tiny_net(s) for s in SEEDS[:2]]
    fused = Stacked([tiny_net(s) for s in SEEDS[:2]])
    dtypes = []
    for m in fused._base[0].modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    x = torch.randn(16, 1, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = fused(x)
        alone = torch.stack([net(x) for net in nets])
    assert logits.shape == (2, 16, 10) and dtypes and set(dtypes) == {torch.bfloat16}
    torch.testing.assert_close(logits.float(), alone.float(), atol=0.1, rtol=0.05)  # bf16 rounding apart

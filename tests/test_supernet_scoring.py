"""supernets.scoring's arithmetic: accuracy and loss weigh every image alike over batches of unequal
size, and BatchNorm recalibration re-estimates running statistics as plain averages over its batches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from supernets.scoring import accuracy, accuracy_and_loss, recalibrate_bn


def batches(sizes: list[int], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, 4, generator=gen), torch.randint(3, (n,), generator=gen)) for n in sizes]


@pytest.mark.parametrize("sizes", [[5], [5, 2], [1, 7, 3]])
def test_accuracy_and_loss_are_per_image_means(sizes):
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    data = batches(sizes)
    x, y = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    with torch.no_grad():
        out = net(x)
    acc, loss = accuracy_and_loss(net, iter(data))
    assert acc == pytest.approx(100.0 * float((out.argmax(1) == y).float().mean()))
    assert loss == pytest.approx(float(F.cross_entropy(out, y)), rel=1e-6)
    assert accuracy(net, iter(data)) == acc


def test_empty_batches_score_zero():
    assert accuracy_and_loss(nn.Linear(4, 3), iter([])) == (0.0, 0.0)


def test_recalibration_is_a_plain_average_and_restores_momentum():
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4, momentum=0.3))
    net[1].running_mean.fill_(5.0)
    data = batches([6, 2, 4], seed=1)
    with torch.no_grad():
        means = [net[0](x).mean(0) for x, _ in data]
    recalibrate_bn(net, iter(data))
    # momentum None: the running mean is the mean of the per-batch means (not weighted towards the last)
    assert torch.allclose(net[1].running_mean, torch.stack(means).mean(0), atol=1e-6)
    assert net[1].momentum == 0.3 and not net.training

"""Model sources several test files send through the sandbox's checks."""

from __future__ import annotations

# A two-layer network (137 parameters at 5 classes): the smallest the checks, export and training take.
TINY = '''import torch
from torch import nn


class Network(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        return self.fc(x.mean((2, 3)))
'''

HIDDEN_PRODUCTS = '''
import torch
from torch import nn


class Network(nn.Module):
    """A {inputs}x512 and a 512x10 matrix product spelled as broadcast multiply-and-sum."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn({inputs}, 512) * 0.02)
        self.w2 = nn.Parameter(torch.randn(512, num_classes) * 0.02)
        self.bn = nn.BatchNorm1d(512)

    def forward(self, x):
        h = torch.relu(self.bn((x.flatten(1)[:, :, None] * self.w1[None]).sum(1)))
        return (h[:, :, None] * self.w2[None]).sum(1)
'''


def hidden_products(inputs: int) -> str:
    """Two matrix products spelled as element-wise products and sums, which fvcore does not count:
    `inputs` is the flattened image size (3072 at 3x32x32, 192 at 3x8x8)."""
    return HIDDEN_PRODUCTS.format(inputs=inputs)


def matrix_products(inputs: int) -> str:
    """The same network with its products written as matrix products (counted: it passes)."""
    return (hidden_products(inputs).replace("(x.flatten(1)[:, :, None] * self.w1[None]).sum(1)", "x.flatten(1) @ self.w1")
            .replace("(h[:, :, None] * self.w2[None]).sum(1)", "h @ self.w2"))

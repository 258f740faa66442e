"""MobileNetV2 at width 0.5 (Sandler et al. 2018): 0.70M params / 0.008 GFLOPs at 10 classes, 0.82M / 0.009G at 100.

Torchvision's layout (1280-channel head); for 32x32 input only the stem's stride is 1 (ImageNet: 2), so the
network downsamples 16x to 2x2, which matches FairNAD Table 8 (0.82M / 0.01G on CIFAR-100).
"""

import torch
from torch import nn


def conv_bn_relu(c_in: int, c_out: int, kernel: int = 1, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(c_out), nn.ReLU6())


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise -> 1x1 linear projection, residual when shapes match."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int):
        super().__init__()
        hidden = c_in * expand
        layers = [conv_bn_relu(c_in, hidden)] if expand != 1 else []
        layers += [conv_bn_relu(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, c_out, 1, bias=False), nn.BatchNorm2d(c_out)]
        self.block = nn.Sequential(*layers)
        self.use_residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_residual else out


class Network(nn.Module):
    # (expansion t, output channels c at width 0.5, repeats n, first stride s)
    SETTINGS = [(1, 8, 1, 1), (6, 16, 2, 2), (6, 16, 3, 2), (6, 32, 4, 2), (6, 48, 3, 1), (6, 80, 3, 2),
                (6, 160, 1, 1)]

    def __init__(self, num_classes: int = 10):
        super().__init__()
        layers = [conv_bn_relu(3, 16, 3, stride=1)]  # ImageNet uses stride 2 here
        c_in = 16
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(c_in, c, s if i == 0 else 1, t))
                c_in = c
        layers.append(conv_bn_relu(c_in, 1280))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))

"""ShuffleNetV2 at width 0.5 (Ma et al. 2018): 0.35M params / 0.011 GFLOPs at 10 classes, 0.44M / 0.012G at 100.

Torchvision's layout (1024-channel head); for 32x32 input the stem has stride 1 and no max-pool (ImageNet:
stride 2 + max-pool), so the stages run at 16/8/4 px, which matches FairNAD Table 8 (0.44M / 0.01G on CIFAR-100).
"""

import torch
from torch import nn


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


def conv_bn(c_in: int, c_out: int, kernel: int = 1, stride: int = 1, groups: int = 1,
            relu: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, groups=groups, bias=False),
              nn.BatchNorm2d(c_out)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


class ShuffleUnit(nn.Module):
    """Stride 1: split channels, transform one half. Stride 2: two branches, both downsample."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.stride = stride
        half = c_out // 2
        if stride == 2:
            self.branch1 = nn.Sequential(conv_bn(c_in, c_in, 3, stride, groups=c_in, relu=False),
                                         conv_bn(c_in, half))
        branch_in = c_in if stride == 2 else half
        self.branch2 = nn.Sequential(conv_bn(branch_in, half),
                                     conv_bn(half, half, 3, stride, groups=half, relu=False),
                                     conv_bn(half, half))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat([x1, self.branch2(x2)], dim=1)
        else:
            out = torch.cat([self.branch1(x), self.branch2(x)], dim=1)
        return channel_shuffle(out, 2)


class Network(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        widths, repeats = [24, 48, 96, 192, 1024], [4, 8, 4]
        self.stem = conv_bn(3, widths[0], 3)  # ImageNet: stride 2 and a 3x3 max-pool
        stages, c_in = [], widths[0]
        for c_out, n in zip(widths[1:4], repeats):
            stages += [ShuffleUnit(c_in, c_out, 2)] + [ShuffleUnit(c_out, c_out, 1) for _ in range(n - 1)]
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.head = conv_bn(c_in, widths[4])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(widths[4], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.stages(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))

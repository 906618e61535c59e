"""CIFAR-style ResNet-18 in plain torch (He et al. 2016, "Deep residual learning"), width configurable.

The CIFAR variant: a 3x3 stride-1 stem without max-pooling, four stages of two basic blocks with
``width * (1, 2, 4, 8)`` channels and strides ``(1, 2, 2, 2)``, global average pooling and a linear
readout ``fc``. ``width=64`` is the usual ResNet-18; ftlab's CPU experiments use 8-16. Inputs are
``(n, in_channels, H, W)`` images of any size >= 8 pixels (28x28 Fashion-MNIST/MNIST, 32x32 CIFAR/SVHN).

Attributes: ``ftlab_readout = "fc"``; ``ftlab_stages`` names the stage outputs used for geometry.
:class:`ftlab.models.cnn.NFResNet18` is the same topology without BatchNorm and biases.
"""

from __future__ import annotations

import torch
from torch import nn

from ftlab.core.validate import check_int

__all__ = ["BasicBlock", "ResNet18", "resnet18"]


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN) shortcut, ReLU after the sum."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class Stem(nn.Module):
    """3x3 conv, batch norm, ReLU (the CIFAR stem: no 7x7 conv, no max-pool)."""

    def __init__(self, in_ch: int, out_ch: int):
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class ResNet18(nn.Module):
    """CIFAR-style ResNet-18: ``(n, in_channels, H, W)`` images -> ``(n, num_classes)`` logits."""

    ftlab_readout = "fc"
    ftlab_stages = ("stem", "layer1", "layer2", "layer3", "layer4", "pool")

    def __init__(self, *, num_classes: int = 10, width: int = 64, in_channels: int = 3):
        super().__init__()
        width = check_int("width", width, minimum=1)
        num_classes = check_int("num_classes", num_classes, minimum=1)
        in_channels = check_int("in_channels", in_channels, minimum=1)
        self.width = width
        self.stem = Stem(in_channels, width)
        chans = [width, 2 * width, 4 * width, 8 * width]
        strides = [1, 2, 2, 2]
        prev = width
        for i, (c, s) in enumerate(zip(chans, strides), start=1):
            setattr(self, f"layer{i}", nn.Sequential(BasicBlock(prev, c, s), BasicBlock(c, c, 1)))
            prev = c
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(prev, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate representation ``(n, 8 * width)`` (after global average pooling)."""
        x = self.stem(x)
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
        return torch.flatten(self.pool(x), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x))


def resnet18(*, num_classes: int = 10, width: int = 64, in_channels: int = 3, seed: int | None = None) -> ResNet18:
    """A freshly initialized :class:`ResNet18` (PyTorch default init; ``seed`` makes it reproducible)."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return ResNet18(num_classes=num_classes, width=width, in_channels=in_channels)
    return ResNet18(num_classes=num_classes, width=width, in_channels=in_channels)

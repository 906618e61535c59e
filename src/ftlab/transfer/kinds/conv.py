"""Convolutions: ``nn.Conv2d`` dense and grouped (kind ``conv2d``) and depthwise (kind ``depthwise``).

**Dense and grouped** (:class:`ConvKind`): a kernel
``(c_out, c_in / g, k...)`` is the linear map of an input patch (``c_in * prod(k)`` values, the input
unfolded) to ``c_out`` channels, so rows are unfolded patches on the input side and one row per output
position on the output side, and ``weight`` is ``R_out^T tau R_in`` on the ``out x in*k...`` matrix. A
grouped kernel is the block-diagonal dense kernel: it is expanded with A's groups, carried densely and
projected back onto B's groups (the off-diagonal blocks are dropped: the Frobenius projection onto
grouped kernels; where maps respect the group structure, e.g. permutations within and among groups,
nothing is dropped). Affine: the (dense) kernel as a matrix and the bias. LoRA: ungrouped kernels only
(PEFT's ``lora_A`` a convolution with the kernel, ``lora_B`` a 1x1 one). Zero padding only;
``padding="same"`` with an even kernel (asymmetric padding) is refused.

**Depthwise** (``groups == c_in == c_out``, :class:`DepthwiseKind`): one channel map acts on input and
output (rows: one per position on both sides), so the carried kernel stays depthwise: ``weight`` is
``diagonal`` (exact for permutations).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from ftlab.transfer.factored import left_t, right
from ftlab.transfer.kinds.base import (
    AffineMap,
    Carry,
    LayerKind,
    Point,
    Rule,
    SpecContext,
    channel_rows,
    joined,
    register_kind,
)
from ftlab.transfer.kinds.rules import WEIGHT, check_matrix

__all__ = ["ConvKind", "DepthwiseKind", "grouped_blocks", "grouped_dense", "is_depthwise"]


def grouped_dense(W: torch.Tensor, groups: int) -> torch.Tensor:
    """``(c_out, c_in / g, k...)`` -> the block-diagonal dense ``(c_out, c_in, k...)``."""
    c_out, cig = W.shape[0], W.shape[1]
    dense = torch.zeros((c_out, cig * groups) + tuple(W.shape[2:]), dtype=W.dtype)
    co = c_out // groups
    for g in range(groups):
        dense[g * co:(g + 1) * co, g * cig:(g + 1) * cig] = W[g * co:(g + 1) * co]
    return dense


def grouped_blocks(D: torch.Tensor, groups: int) -> torch.Tensor:
    """The diagonal blocks of a dense ``(c_out, c_in, k...)`` kernel as ``(c_out, c_in / g, k...)``."""
    c_out, c_in = D.shape[0], D.shape[1]
    co, ci = c_out // groups, c_in // groups
    return torch.cat([D[g * co:(g + 1) * co, g * ci:(g + 1) * ci] for g in range(groups)])


def is_depthwise(module: nn.Module) -> bool:
    """A convolution with one input and one output channel per group (``groups == in == out``)."""
    g = getattr(module, "groups", 1)
    return g > 1 and g == getattr(module, "in_channels", 0) == getattr(module, "out_channels", 0)


def _padding(name: str, mod: Any) -> tuple[int, ...]:
    """The zero padding per spatial axis (``"valid"``/``"same"`` resolved); ``ValueError`` for what is not supported."""
    padding = mod.padding
    if padding == "valid":
        out = tuple(0 for _ in mod.kernel_size)
    elif padding == "same":
        total = [d * (k - 1) for d, k in zip(mod.dilation, mod.kernel_size)]
        if any(t % 2 for t in total):
            raise ValueError(f"module {name!r} uses padding='same' with an even kernel (asymmetric padding): "
                             "give a hand-written spec")
        out = tuple(t // 2 for t in total)
    else:
        out = tuple(int(p) for p in padding)
    if mod.padding_mode != "zeros":
        raise ValueError(f"module {name!r} uses padding_mode={mod.padding_mode!r}: only zero padding is supported")
    return out


class ConvKind(LayerKind):
    """Dense and grouped convolutions of ``module_type`` (see the module docstring): everything but
    :meth:`unfold` holds for any number of spatial axes (``spatial``, named in ``axes``)."""

    name = "conv2d"
    lora_name: ClassVar[str | None] = "conv"
    module_type: ClassVar[type[nn.Module]] = nn.Conv2d
    spatial: ClassVar[int] = 2
    axes: ClassVar[str] = "(B, C, H, W)"

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, self.module_type) and not is_depthwise(module)

    def _check(self, t: torch.Tensor) -> None:
        if t.ndim != 2 + self.spatial:
            raise ValueError(f"{self.name} point got a tensor of shape {tuple(t.shape)}: expected {self.axes}")

    def unfold(self, t: torch.Tensor, conv: tuple) -> tuple[torch.Tensor, tuple[int, int] | None]:
        """Input patches ``(B, positions, C * prod(k))`` of a ``(B, C, H, W)`` tensor and the output grid."""
        k, s, p, d = conv
        cols = F.unfold(t, k, dilation=d, padding=p, stride=s)  # (B, C*k*k, L)
        h = (t.shape[2] + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
        w = (t.shape[3] + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
        return cols.transpose(1, 2), (h, w)

    def _point(self, name: str, module: Any) -> Point:
        """The capture point: input width ``c_in * prod(k)`` (an unfolded patch), output width ``c_out``."""
        W = module.weight
        assert isinstance(W, torch.Tensor)
        g = int(module.groups)
        conv = (tuple(module.kernel_size), tuple(module.stride), _padding(name, module), tuple(module.dilation))
        return Point(name, self.name, int(W.shape[1]) * g * math.prod(W.shape[2:]), int(W.shape[0]), conv, groups=g)

    def _weight_rule(self) -> str:
        return "weight"

    def spec(self, name: str, module: nn.Module, ctx: SpecContext) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
        pt = self._point(name, module)
        w = joined(name, "weight")
        rules: dict[str, tuple[Rule, ...]] = {w: (Rule(w, self._weight_rule(), name),)}
        if module.bias is not None:
            rules[joined(name, "bias")] = (Rule(joined(name, "bias"), "out_vector", name),)
        return [pt], rules

    def rows(self, t: torch.Tensor, point: Point, side: str, *, seq_first: bool = False
             ) -> tuple[torch.Tensor, tuple[int, int] | None]:
        t = t.detach()
        self._check(t)
        if side != "in":
            return channel_rows(t)
        if point.conv is None:
            raise ValueError(f"a {self.name} input point needs its (kernel, stride, padding, dilation)")
        return self.unfold(t, point.conv)

    def row_format(self, point: Point, side: str) -> tuple:
        return ("unfold", point.conv) if side == "in" else ("channels",)

    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        found = dict(model.named_modules()).get(point.name)
        if not isinstance(found, self.module_type):
            return None
        mod: Any = found
        W = mod.weight.detach()
        if mod.groups > 1:
            W = grouped_dense(W, mod.groups)
        return W.reshape(W.shape[0], -1), None if mod.bias is None else mod.bias.detach()

    def transport(self, rule: Rule, tau: torch.Tensor, shape: tuple[int, ...], maps: tuple[Any, Any], carry: Carry
                  ) -> torch.Tensor:
        R_in, R_out = maps
        T = tau.to(torch.float64)
        if rule.kind != WEIGHT.name or T.ndim < 3 or R_in is None:
            return super().transport(rule, tau, shape, maps, carry)
        kk = math.prod(T.shape[2:])
        g_a = R_in.shape[0] // max(T.shape[1] * kk, 1)
        g_b = R_in.shape[1] // max(shape[1] * kk, 1) if len(shape) == T.ndim else 1
        if g_a > 1 and R_in.shape[0] == g_a * T.shape[1] * kk:
            T = grouped_dense(T, g_a)
        M = T.reshape(T.shape[0], -1)
        check_matrix(M, R_out.shape[0], R_in.shape[0], carry, "out x in")
        D = right(left_t(R_out, M), R_in)
        if g_b > 1 and R_in.shape[1] == g_b * shape[1] * kk:
            D = grouped_blocks(D.reshape(shape[0], g_b * shape[1], *shape[2:]), g_b)
        return D.reshape(shape)

    def lora_matrix(self, module: nn.Module, delta: torch.Tensor) -> torch.Tensor | None:
        return delta.reshape(delta.shape[0], -1) if getattr(module, "groups", 1) == 1 else None

    def lora_tensors(self, key: str, B: torch.Tensor, A: torch.Tensor, module: nn.Module) -> dict[str, torch.Tensor]:
        W = module.weight
        assert isinstance(W, torch.Tensor)
        return {f"{key}.lora_A.weight": A.reshape(A.shape[0], *W.shape[1:]),
                f"{key}.lora_B.weight": B.reshape(*B.shape, *([1] * self.spatial))}

    def lora_delta(self, module: nn.Module, A: torch.Tensor, B: torch.Tensor, fan_in_fan_out: bool,
                   where: str) -> torch.Tensor:
        if getattr(module, "groups", 1) != 1:
            raise ValueError(f"{where} is a grouped convolution, which ftlab's LoRA reader does not read")
        W = module.weight
        assert isinstance(W, torch.Tensor)
        return (B.reshape(B.shape[0], -1) @ A.reshape(A.shape[0], -1)).reshape(W.shape[0], -1, *A.shape[2:])


class DepthwiseKind(ConvKind):
    """Depthwise 2-D convolutions: one channel map on both sides (see the module docstring)."""

    name = "depthwise"
    one_channel_map = True
    lora_name = None

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, self.module_type) and is_depthwise(module)

    def _point(self, name: str, module: Any) -> Point:
        """One channel space on both sides: input and output width ``c``."""
        pt = super()._point(name, module)
        return Point(name, self.name, pt.out_dim, pt.out_dim, pt.conv, groups=pt.groups)

    def _weight_rule(self) -> str:
        return "diagonal"

    def rows(self, t: torch.Tensor, point: Point, side: str, *, seq_first: bool = False
             ) -> tuple[torch.Tensor, tuple[int, int] | None]:
        t = t.detach()
        self._check(t)
        return channel_rows(t)

    def row_format(self, point: Point, side: str) -> tuple:
        return ("channels",)

    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        return None


register_kind(ConvKind())
register_kind(DepthwiseKind())

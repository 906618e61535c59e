"""Normalisation layers: gains and biases over channels, and BatchNorm's running statistics.

Two kinds, one per row layout. ``norm`` (LayerNorm, RMSNorm and Hugging Face's ``*LayerNorm``/``*RMSNorm``:
:func:`ftlab.core.hooks.is_norm`) normalises the last axis; ``norm2d`` (BatchNorm1d/2d/3d, GroupNorm) the
channel axis 1 (rows: one per position of a ``(B, C, ...)`` tensor). Neither has an input map (its
rules read ``R_out`` only). Gains: ``out_vector`` (``norm_gain="vector"``) or ``diagonal``
(``norm_gain="diagonal"``: a gain is a per-channel scale); biases and running means ``out_vector``;
running variances ``diagonal`` (a variance stays a variance under permutations). A BatchNorm in eval mode
is affine (``y = a x + c`` per channel), so its output statistics are derived from its input's, which
are then collected for that purpose alone.
"""

from __future__ import annotations

import torch
from torch import nn

from ftlab.core.hooks import is_norm
from ftlab.transfer.kinds.base import (
    AffineMap,
    LayerKind,
    Point,
    Rule,
    SpecContext,
    channel_rows,
    joined,
    register_kind,
    token_rows,
)

__all__ = ["Norm2dKind", "NormKind"]

_CHANNELS_FIRST = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm)
_RUNNING = (("running_mean", "out_vector"), ("running_var", "diagonal"))


def _running(module: nn.Module) -> dict[str, torch.Tensor]:
    bufs = dict(module.named_buffers(recurse=False))
    return {b: t for b, _ in _RUNNING if isinstance(t := bufs.get(b), torch.Tensor) and t.is_floating_point()}


class NormKind(LayerKind):
    name = "norm"
    has_input_map = False

    def matches(self, module: nn.Module) -> bool:
        return is_norm(module) and not isinstance(module, _CHANNELS_FIRST)

    def spec(self, name: str, module: nn.Module, ctx: SpecContext) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
        own = dict(module.named_parameters(recurse=False))
        bufs = dict(module.named_buffers(recurse=False))
        first = next(iter(own.values())) if own else next(v for v in bufs.values() if v.is_floating_point())
        d = int(first.shape[0])
        rules: dict[str, tuple[Rule, ...]] = {}
        for p in own:
            k = "diagonal" if (p == "weight" and ctx.norm_gain == "diagonal") else "out_vector"
            rules[joined(name, p)] = (Rule(joined(name, p), k, name),)
        for b, rule in _RUNNING:
            t = _running(module).get(b)
            if t is not None and t.ndim == 1:
                rules[joined(name, b)] = (Rule(joined(name, b), rule, name),)
        return [Point(name, self.name, d, d)], rules

    def entries(self, name: str, module: nn.Module) -> dict[str, tuple[int, ...]]:
        return {joined(name, b): tuple(t.shape) for b, t in _running(module).items()}


class Norm2dKind(NormKind):
    name = "norm2d"

    def matches(self, module: nn.Module) -> bool:
        return is_norm(module) and isinstance(module, _CHANNELS_FIRST)

    def rows(self, t: torch.Tensor, point: Point, side: str, *, seq_first: bool = False
             ) -> tuple[torch.Tensor, tuple[int, int] | None]:
        return channel_rows(t) if t.ndim >= 3 else token_rows(t, seq_first=seq_first)

    def row_format(self, point: Point, side: str) -> tuple:
        return ("channels",)

    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        mod = dict(model.named_modules()).get(point.name)
        if not isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)) or mod.training or mod.running_var is None \
                or mod.running_mean is None:
            return None
        a = torch.rsqrt(mod.running_var.detach().double() + mod.eps)
        if mod.weight is not None:
            a = a * mod.weight.detach().double()
        c = -a * mod.running_mean.detach().double()
        if mod.bias is not None:
            c = c + mod.bias.detach().double()
        return a, c


register_kind(NormKind())
register_kind(Norm2dKind())

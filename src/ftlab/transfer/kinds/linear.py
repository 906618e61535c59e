"""``nn.Linear``: ``y = x W^T + b``, weight stored ``(out, in)``.

Rows: the last axis (every token a row). Spec: one point; ``weight`` -> ``R_out^T tau R_in``, ``bias`` ->
``R_out^T tau``. Affine: ``(W, b)``, so its output statistics are derived from its input's. LoRA: the
delta itself is the ``out x in`` matrix (PEFT ``lora_A``/``lora_B``).
"""

from __future__ import annotations

import torch
from torch import nn

from ftlab.transfer.kinds.base import AffineMap, LayerKind, Point, Rule, SpecContext, joined, register_kind

__all__ = ["LINEAR", "LinearKind", "linear_spec"]


def linear_spec(name: str, module: nn.Module, kind: str, *, transposed: bool = False
                ) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
    """The point and rules of a layer computing ``x W^T + b`` (``transposed``: ``x W + b``, ``W`` stored ``(in, out)``)."""
    w = module.weight
    assert isinstance(w, torch.Tensor)
    d_out, d_in = (w.shape[1], w.shape[0]) if transposed else (w.shape[0], w.shape[1])
    w_name = joined(name, "weight")
    rules: dict[str, tuple[Rule, ...]] = {w_name: (Rule(w_name, "weight_t" if transposed else "weight", name),)}
    if getattr(module, "bias", None) is not None:
        b_name = joined(name, "bias")
        rules[b_name] = (Rule(b_name, "out_vector", name),)
    return [Point(name, kind, int(d_in), int(d_out))], rules


def module_affine(model: nn.Module, point: Point, transposed: bool = False) -> AffineMap | None:
    """``(W, b)`` (``(W^T, b)`` when ``transposed``) of the module named by the point."""
    mod = dict(model.named_modules()).get(point.name)
    if mod is None:
        return None
    bias = None if getattr(mod, "bias", None) is None else mod.bias.detach()
    W = mod.weight.detach()
    return (W.T if transposed else W), bias


class LinearKind(LayerKind):
    name = "linear"
    family = "linear"
    lora_name = "linear"

    def matches(self, module: nn.Module) -> bool:
        return isinstance(module, nn.Linear)

    def spec(self, name: str, module: nn.Module, ctx: SpecContext) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
        return linear_spec(name, module, self.name)

    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        return module_affine(model, point)

    def lora_matrix(self, module: nn.Module, delta: torch.Tensor) -> torch.Tensor | None:
        return delta


LINEAR = register_kind(LinearKind())

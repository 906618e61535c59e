"""Hugging Face's ``Conv1D`` (GPT-2): a linear layer ``y = x W + b`` whose weight is stored ``(in, out)``.

Recognised by :func:`ftlab.core.hooks.is_hf_conv1d` (the one test for it, also used by capture). Rows as
``nn.Linear`` (its points pair with linear ones); spec: ``weight`` -> ``R_in^T tau R_out`` (rule
``weight_t``); affine ``(W^T, b)``; LoRA: the transposed delta is factored and the adapter is marked
``fan_in_fan_out`` (PEFT's convention for this layer).
"""

from __future__ import annotations

import torch
from torch import nn

from ftlab.core.hooks import is_hf_conv1d
from ftlab.transfer.kinds.base import AffineMap, LayerKind, Point, Rule, SpecContext, register_kind
from ftlab.transfer.kinds.linear import linear_spec, module_affine

__all__ = ["HFConv1DKind"]


class HFConv1DKind(LayerKind):
    name = "hf_conv1d"
    family = "linear"
    lora_name = "conv1d"
    fan_in_fan_out = True

    def matches(self, module: nn.Module) -> bool:
        return is_hf_conv1d(module)

    def spec(self, name: str, module: nn.Module, ctx: SpecContext) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
        return linear_spec(name, module, self.name, transposed=True)

    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        return module_affine(model, point, transposed=True)

    def lora_matrix(self, module: nn.Module, delta: torch.Tensor) -> torch.Tensor | None:
        return delta.T


register_kind(HFConv1DKind())

"""A bare projection ``x @ P``: a 2-D parameter that belongs to no layer ftlab knows (OpenCLIP's ``visual.proj``,
``text_projection``), stored ``(in, out)``.

Not recognised by module: :func:`ftlab.transfer.spec.infer_spec` reads the remaining 2-D parameters of a
module no kind knows as bare projections (:func:`bare_projection`). Captured where the parameter is the
right operand of a matrix product (``capture(..., params=[...])``); rows over the last axis; rule
``weight_t``; affine ``(P^T, 0)``.
"""

from __future__ import annotations

import torch
from torch import nn

from ftlab.transfer.kinds.base import AffineMap, LayerKind, Point, Rule, register_kind

__all__ = ["ParamKind", "bare_projection"]


class ParamKind(LayerKind):
    name = "param"

    def hooked(self, point: Point) -> tuple[str, bool]:
        return point.name, True

    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        P = dict(model.named_parameters()).get(point.name)
        return None if P is None else (P.detach().T, None)


PARAM = register_kind(ParamKind())


def bare_projection(param: str, t: torch.Tensor) -> tuple[Point, tuple[Rule, ...]]:
    """The point (named after the parameter) and rule of a bare projection ``x @ P`` with ``P = t`` (``(in, out)``)."""
    return Point(param, PARAM.name, int(t.shape[0]), int(t.shape[1])), (Rule(param, "weight_t", param),)

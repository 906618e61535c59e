"""Applying fitted maps to a task vector: ``tau_B = R_out^T tau_A R_in`` parameter by parameter.

Fitting maps (:mod:`ftlab.transfer.align`) and applying them (here) are separate pure functions,
as in git-re-basin / TransFusion. ``maps[target_point] = (R_in, R_out)`` with ``R_in`` of shape
``d_in^A x d_in^B`` and ``R_out`` of shape ``d_out^A x d_out^B`` (float64); the rules of the
target's :class:`~ftlab.transfer.spec.TransportSpec` say which map acts on which axis, and the kind of
each rule's point carries the block (:meth:`ftlab.transfer.kinds.LayerKind.transport`: grouped
convolutions, vocabulary index maps and the rest are the kinds' business).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ftlab.transfer.kinds import Carry
from ftlab.transfer.layer_map import LayerMap
from ftlab.transfer.spec import TransportSpec
from ftlab.transfer.task_vector import TaskVector

__all__ = ["carried_points", "fused_block", "pad_truncate", "transport"]


def pad_truncate(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Zero-pad or truncate ``t`` to ``shape`` on every axis, keeping the leading (top-left) block."""
    if t.ndim != len(shape):
        raise ValueError(f"cannot pad/truncate a tensor of shape {tuple(t.shape)} to {tuple(shape)}: different ranks")
    out = torch.zeros(shape, dtype=t.dtype)
    idx = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, shape))
    out[idx] = t[idx]
    return out


def fused_block(t: torch.Tensor, part: tuple[int, int]) -> torch.Tensor:
    """Block ``i`` of ``n`` equal blocks of ``t`` along dim 0 (``part = (i, n)``)."""
    i, n = part
    if t.shape[0] % n:
        raise ValueError(f"a tensor of shape {tuple(t.shape)} cannot be split into {n} equal blocks")
    step = t.shape[0] // n
    return t[i * step:(i + 1) * step]


def carried_points(target_spec: TransportSpec, layer_map: LayerMap, tau_a: TaskVector) -> set[str]:
    """Target points through which a nonzero block of ``tau_a`` is carried (by some rule of some parameter).

    Every transport rule is linear in the block it carries, so a point outside this set receives only zero blocks
    and its maps do not change ``tau_B``: a fit may skip them (:attr:`~ftlab.transfer.problem.TransferProblem.skip`).
    """
    out: set[str] = set()
    for pname, rules in target_spec.rules.items():
        src = layer_map.source_name(pname)
        if src is None or src not in tau_a:
            continue
        tau = tau_a[src]
        for r in rules:
            if r.carries and r.point is not None and r.point not in out and bool(fused_block(tau, r.part).any()):
                out.add(r.point)
    return out


def _carried(pname: str, rules, src: str, tau: torch.Tensor, shape: tuple[int, ...], target_spec: TransportSpec,
             maps: Mapping, vocab: torch.Tensor | None) -> torch.Tensor:
    """The target parameter ``pname`` (float64) assembled from the blocks its rules carry."""
    res = torch.zeros(shape, dtype=torch.float64)
    carry = Carry(src, vocab)
    for rule in rules:
        if not rule.carries:
            continue
        if rule.point is None:
            raise RuntimeError(f"rule {rule.kind!r} of {rule.param!r} names no capture point")
        block = fused_block(tau, rule.part)
        if not block.any():
            continue  # every rule is linear in the block: a zero block stays zero (its maps may not be fitted)
        if rule.point not in maps:
            raise RuntimeError(f"no fitted maps for point {rule.point!r}, which carries a nonzero block of {src!r}")
        i, n = rule.part
        blk_shape = (shape[0] // n,) + shape[1:]
        kind = target_spec.points[rule.point].layer_kind
        val = kind.transport(rule, block, blk_shape, maps[rule.point], carry).cpu()
        res[i * blk_shape[0]:(i + 1) * blk_shape[0]] = val
    return res


def transport(tau_a: TaskVector, *, target_spec: TransportSpec, target_shapes: Mapping[str, tuple[int, ...]],
              layer_map: LayerMap, maps: Mapping[str, tuple[torch.Tensor | None, torch.Tensor]],
              vocab_maps: Mapping[str, torch.Tensor] | None = None) -> TaskVector:
    """Map ``tau_a`` (keyed by source names) onto the target's parameters.

    Target parameters whose source layer is ``None`` (e.g. ``depth_map="prefix"`` beyond the
    source depth) or whose rules carry nothing (``zero``) get zeros. Every other target parameter needs
    its source counterpart in ``tau_a`` (``ValueError`` naming it otherwise). A zero block of ``tau_a`` is carried
    as zeros without reading its maps (every rule is linear), so ``maps`` need only hold the points of
    :func:`carried_points`. ``vocab_maps[param]``: an
    index map of that embedding table's rows (target row -> source row, -1 none). Result dtype: that of
    ``tau_a`` (computations in float64).
    """
    vocab_maps = dict(vocab_maps or {})
    out: dict[str, torch.Tensor] = {}
    dtype = next(iter(tau_a.values())).dtype if len(tau_a) else torch.float32
    for pname, rules in target_spec.rules.items():
        shape = tuple(target_shapes[pname])
        src = layer_map.source_name(pname)
        if src is None or not any(r.carries for r in rules):
            out[pname] = torch.zeros(shape, dtype=dtype)
            continue
        if src not in tau_a:
            raise ValueError(f"target parameter {pname!r} needs source parameter {src!r}, which the source task "
                             "vector lacks: the architectures do not correspond")
        out[pname] = _carried(pname, rules, src, tau_a[src], shape, target_spec, maps, vocab_maps.get(pname)).to(dtype)
    return TaskVector(out)

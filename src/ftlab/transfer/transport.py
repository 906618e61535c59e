"""Applying fitted maps to a task vector: ``tau_B = R_out^T tau_A R_in`` parameter by parameter.

Fitting maps (:mod:`ftlab.transfer.align`) and applying them (here) are separate pure functions,
as in git-re-basin / TransFusion. ``maps[target_point] = (R_in, R_out)`` with ``R_in`` of shape
``d_in^A x d_in^B`` and ``R_out`` of shape ``d_out^A x d_out^B`` (float64); the rules of the
target's :class:`~ftlab.transfer.spec.TransportSpec` say which map acts on which axis.

Grouped convolutions: a ``(c_out, c_in / g, k, k)`` kernel is the block-diagonal ``(c_out, c_in, k,
k)`` dense kernel; it is expanded with A's groups, transported densely and projected back onto B's
groups (the off-diagonal blocks are dropped: the Frobenius projection onto grouped kernels). Where
maps respect the group structure (e.g. permutations within and among groups) nothing is dropped.
Vocabulary index maps: ``vocab_maps[param]`` is a ``(V_B,)`` integer tensor giving, for every row of
B's embedding table, the row of A's table it continues (``-1``: none, a zero delta), e.g. MPNet's
id = BERT's id + 4.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ftlab.transfer.factored import as_dense, left_t, right
from ftlab.transfer.layer_map import LayerMap
from ftlab.transfer.spec import Rule, TransportSpec
from ftlab.transfer.task_vector import TaskVector

__all__ = ["as_vocab_map", "fused_block", "grouped_blocks", "grouped_dense", "pad_truncate", "transport"]


def pad_truncate(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """Zero-pad or truncate ``t`` to ``shape`` on every axis, keeping the leading (top-left) block."""
    if t.ndim != len(shape):
        raise ValueError(f"cannot pad/truncate a tensor of shape {tuple(t.shape)} to {tuple(shape)}: different ranks")
    out = torch.zeros(shape, dtype=t.dtype)
    idx = tuple(slice(0, min(a, b)) for a, b in zip(t.shape, shape))
    out[idx] = t[idx]
    return out


def fused_block(t: torch.Tensor, part: tuple[int, int]) -> torch.Tensor:
    i, n = part
    if t.shape[0] % n:
        raise ValueError(f"a tensor of shape {tuple(t.shape)} cannot be split into {n} equal blocks")
    step = t.shape[0] // n
    return t[i * step:(i + 1) * step]


def as_vocab_map(index, v_a: int, v_b: int, name: str) -> torch.Tensor:
    """Validate an index map of B's vocabulary into A's: a ``(V_B,)`` integer tensor with entries in ``[-1, V_A)``."""
    idx = torch.as_tensor(index)
    if idx.ndim != 1 or idx.shape[0] != v_b or idx.is_floating_point():
        raise ValueError(f"vocab_map for {name!r} must be {v_b} integers (one per row of the target table), "
                         f"got shape {tuple(idx.shape)}")
    idx = idx.long()
    if len(idx) and (int(idx.min()) < -1 or int(idx.max()) >= v_a):
        raise ValueError(f"vocab_map for {name!r} has entries outside [-1, {v_a - 1}] (the source vocabulary)")
    return idx


def grouped_dense(W: torch.Tensor, groups: int) -> torch.Tensor:
    """``(c_out, c_in / g, k, k)`` -> the block-diagonal dense ``(c_out, c_in, k, k)``."""
    c_out, cig = W.shape[0], W.shape[1]
    dense = torch.zeros((c_out, cig * groups) + tuple(W.shape[2:]), dtype=W.dtype)
    co = c_out // groups
    for g in range(groups):
        dense[g * co:(g + 1) * co, g * cig:(g + 1) * cig] = W[g * co:(g + 1) * co]
    return dense


def grouped_blocks(D: torch.Tensor, groups: int) -> torch.Tensor:
    """The diagonal blocks of a dense ``(c_out, c_in, k, k)`` kernel as ``(c_out, c_in / g, k, k)``."""
    c_out, c_in = D.shape[0], D.shape[1]
    co, ci = c_out // groups, c_in // groups
    return torch.cat([D[g * co:(g + 1) * co, g * ci:(g + 1) * ci] for g in range(groups)])


def _apply_rule(rule: Rule, tau: torch.Tensor, shape: tuple[int, ...], R_in, R_out, src_name: str,
                vocab: torch.Tensor | None = None) -> torch.Tensor:
    """One transported block; ``R_in``/``R_out`` are dense tensors or :class:`~ftlab.transfer.factored.LowRankMap` s."""
    T = tau.to(torch.float64)
    if rule.kind == "out_vector":
        if T.ndim != 1 or T.shape[0] != R_out.shape[0]:
            raise ValueError(f"source {src_name!r} has shape {tuple(T.shape)} but its point has width {R_out.shape[0]}")
        return left_t(R_out, T[:, None]).reshape(shape)
    if rule.kind == "diagonal":
        if T.shape[0] != R_out.shape[0] or shape[0] != R_out.shape[1]:
            raise ValueError(f"source {src_name!r} has {T.shape[0]} channels but its point maps {R_out.shape[0]} -> "
                             f"{R_out.shape[1]}")
        D = as_dense(R_out)
        return ((D * D).T @ T.reshape(T.shape[0], -1).to(D.device)).reshape(shape)
    if rule.kind == "embedding":
        if T.shape[1] != R_out.shape[0]:
            raise ValueError(f"source embedding {src_name!r} has width {T.shape[1]}, expected {R_out.shape[0]}")
        if vocab is not None:
            rows = T[vocab.clamp_min(0)] * (vocab >= 0).to(T.dtype)[:, None]
            return right(rows, R_out)
        if T.shape[0] != shape[0]:
            raise ValueError(f"embedding {rule.param!r}: source vocabulary {T.shape[0]} != target vocabulary {shape[0]}; "
                             "give vocab_map= (target row -> source row) or zero it with zero_params")
        return right(T, R_out)
    M = T.reshape(T.shape[0], -1) if rule.kind == "weight" else T
    if R_in is None:
        raise ValueError(f"rule {rule.kind!r} of {rule.param!r} needs an input map")
    if rule.kind == "weight" and T.ndim == 4:  # convolution, possibly grouped in A and/or B
        kk = T.shape[2] * T.shape[3]
        g_a = R_in.shape[0] // max(T.shape[1] * kk, 1)
        g_b = R_in.shape[1] // max(shape[1] * kk, 1) if len(shape) == 4 else 1
        if g_a > 1 and R_in.shape[0] == g_a * T.shape[1] * kk:
            T = grouped_dense(T, g_a)
            M = T.reshape(T.shape[0], -1)
        if M.shape != (R_out.shape[0], R_in.shape[0]):
            raise ValueError(f"source {src_name!r} has shape {tuple(M.shape)} as out x in, but its maps expect "
                             f"{R_out.shape[0]} x {R_in.shape[0]}")
        D = right(left_t(R_out, M), R_in)
        if g_b > 1 and R_in.shape[1] == g_b * shape[1] * kk:
            D = grouped_blocks(D.reshape(shape[0], g_b * shape[1], *shape[2:]), g_b)
        return D.reshape(shape)
    if rule.kind == "weight":
        if M.shape != (R_out.shape[0], R_in.shape[0]):
            raise ValueError(f"source {src_name!r} has shape {tuple(M.shape)} as out x in, but its maps expect "
                             f"{R_out.shape[0]} x {R_in.shape[0]}")
        return right(left_t(R_out, M), R_in).reshape(shape)
    # weight_t: stored (in, out)
    if M.shape != (R_in.shape[0], R_out.shape[0]):
        raise ValueError(f"source {src_name!r} has shape {tuple(M.shape)} as in x out, but its maps expect "
                         f"{R_in.shape[0]} x {R_out.shape[0]}")
    return right(left_t(R_in, M), R_out).reshape(shape)


def transport(tau_a: TaskVector, *, target_spec: TransportSpec, target_shapes: Mapping[str, tuple[int, ...]],
              layer_map: LayerMap, maps: Mapping[str, tuple[torch.Tensor | None, torch.Tensor]],
              vocab_maps: Mapping[str, torch.Tensor] | None = None) -> TaskVector:
    """Map ``tau_a`` (keyed by source names) onto the target's parameters.

    Target parameters whose source layer is ``None`` (e.g. ``depth_map="prefix"`` beyond the
    source depth) or whose rule is ``zero`` get zeros. Every other target parameter needs its
    source counterpart in ``tau_a`` (``ValueError`` naming it otherwise). ``vocab_maps[param]``: an
    index map of that embedding's rows (see the module docstring). Result dtype: that of ``tau_a``
    (computations in float64).
    """
    vocab_maps = dict(vocab_maps or {})
    out: dict[str, torch.Tensor] = {}
    dtype = next(iter(tau_a.values())).dtype if len(tau_a) else torch.float32
    for pname, rules in target_spec.rules.items():
        shape = tuple(target_shapes[pname])
        res = torch.zeros(shape, dtype=torch.float64)
        src = layer_map.source_name(pname)
        if src is not None and any(r.kind != "zero" for r in rules):
            if src not in tau_a:
                raise ValueError(f"target parameter {pname!r} needs source parameter {src!r}, which the source task "
                                 "vector lacks: the architectures do not correspond")
            for rule in rules:
                if rule.kind == "zero":
                    continue
                if rule.point is None:
                    raise RuntimeError(f"rule {rule.kind!r} of {rule.param!r} names no capture point")
                R_in, R_out = maps[rule.point]
                n = rule.part[1]
                blk_shape = (shape[0] // n,) + shape[1:]
                vocab = vocab_maps.get(pname) if rule.kind == "embedding" else None
                val = _apply_rule(rule, fused_block(tau_a[src], rule.part), blk_shape, R_in, R_out, src, vocab).cpu()
                i = rule.part[0]
                res[i * blk_shape[0]:(i + 1) * blk_shape[0]] = val
        out[pname] = res.to(dtype)
    return TaskVector(out)

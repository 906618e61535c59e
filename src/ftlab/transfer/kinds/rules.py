"""The generic transport rules (BiCo, arXiv 2605.28444, sec. "transfer rule"), shared by every layer kind.

==============  ======================================  =======================================
rule            parameter (target shape)                transported delta
==============  ======================================  =======================================
``weight``      ``(out, in)``, or ``(out, in, k...)``    ``R_out^T tau R_in`` (a kernel read as
                read as ``out x in*k...``                ``out x in*k...`` and back; grouped
                                                         kernels: see the convolution kind)
``weight_t``    ``(in, out)`` (HF ``Conv1D``, bare      ``R_in^T tau R_out``
                ``x @ P`` projections)
``out_vector``  ``(out,)`` biases, norm biases,         ``R_out^T tau``
                BatchNorm running means
``diagonal``    ``(c, ...)`` a per-channel operator:     ``tau_B[c] = sum_a R[a, c]^2 tau_A[a]``,
                depthwise kernels, BatchNorm running     the diagonal of ``R^T diag(tau_A) R`` (exact
                variances, norm gains (``norm_gain=       for permutations; the Frobenius projection
                "diagonal"``)                            onto per-channel operators otherwise)
``zero``        anything                                zero (the target keeps its base value)
==============  ======================================  =======================================

``R_in``/``R_out`` are dense float64 tensors or :class:`~ftlab.transfer.factored.LowRankMap` s.
"""

from __future__ import annotations

import torch

from ftlab.transfer.factored import as_dense, left_t, right
from ftlab.transfer.kinds.base import Carry, Rule, RuleKind, register_rule

__all__ = ["DIAGONAL", "OUT_VECTOR", "WEIGHT", "WEIGHT_T", "ZERO", "check_matrix"]


def check_matrix(M: torch.Tensor, rows: int, cols: int, carry: Carry, layout: str) -> None:
    """``ValueError`` naming the source parameter when ``M`` is not ``rows x cols`` (``layout``: ``"out x in"``...)."""
    if M.shape != (rows, cols):
        raise ValueError(f"source {carry.src!r} has shape {tuple(M.shape)} as {layout}, but its maps expect "
                         f"{rows} x {cols}")


def _input_map(rule: Rule, R_in):
    if R_in is None:
        raise ValueError(f"rule {rule.kind!r} of {rule.param!r} needs an input map")
    return R_in


def _out_vector(rule: Rule, T: torch.Tensor, shape: tuple[int, ...], R_in, R_out, carry: Carry) -> torch.Tensor:
    if T.ndim != 1 or T.shape[0] != R_out.shape[0]:
        raise ValueError(f"source {carry.src!r} has shape {tuple(T.shape)} but its point has width {R_out.shape[0]}")
    return left_t(R_out, T[:, None]).reshape(shape)


def _diagonal(rule: Rule, T: torch.Tensor, shape: tuple[int, ...], R_in, R_out, carry: Carry) -> torch.Tensor:
    if T.shape[0] != R_out.shape[0] or shape[0] != R_out.shape[1]:
        raise ValueError(f"source {carry.src!r} has {T.shape[0]} channels but its point maps {R_out.shape[0]} -> "
                         f"{R_out.shape[1]}")
    D = as_dense(R_out)
    return ((D * D).T @ T.reshape(T.shape[0], -1).to(D.device)).reshape(shape)


def _weight(rule: Rule, T: torch.Tensor, shape: tuple[int, ...], R_in, R_out, carry: Carry) -> torch.Tensor:
    M = T.reshape(T.shape[0], -1)
    R_in = _input_map(rule, R_in)
    check_matrix(M, R_out.shape[0], R_in.shape[0], carry, "out x in")
    return right(left_t(R_out, M), R_in).reshape(shape)


def _weight_t(rule: Rule, T: torch.Tensor, shape: tuple[int, ...], R_in, R_out, carry: Carry) -> torch.Tensor:
    R_in = _input_map(rule, R_in)
    check_matrix(T, R_in.shape[0], R_out.shape[0], carry, "in x out")
    return right(left_t(R_in, T), R_out).reshape(shape)


def _zero(rule: Rule, T: torch.Tensor, shape: tuple[int, ...], R_in, R_out, carry: Carry) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float64)


WEIGHT = register_rule(RuleKind("weight", _weight))
WEIGHT_T = register_rule(RuleKind("weight_t", _weight_t))
OUT_VECTOR = register_rule(RuleKind("out_vector", _out_vector))
DIAGONAL = register_rule(RuleKind("diagonal", _diagonal))
ZERO = register_rule(RuleKind("zero", _zero, carries=False))

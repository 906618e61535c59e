"""The implicit bias of fine-tuning a diagonal linear network: the potential q_k and its geometry k.

Gradient flow on ``beta = v+ * w+ - v- * w-`` from an initialization with per-coordinate
invariants ``(lambda_e+, lambda_e-, c)`` converges (when it interpolates) to

    argmin_beta  Q_k(beta) = sum_d q_{k_d}(beta_d)   subject to   X beta = y,

with ``k_d = (lambda_e+ - lambda_e-)^2 + 4 c_d^2`` (Azulay et al. 2021, ICML, "On the implicit bias
of initialization shape"; Woodworth et al. 2020, COLT, "Kernel and rich regimes in
overparametrized models"). After pretraining (PT) and the fine-tuning (FT) reset, ``k_d`` depends on
the PT solution through :func:`k_from_pt` (Anguita et al. 2026, arXiv 2602.20062, Theorem 4.1).

Every function here is numpy-vectorized (broadcasting ``z`` against ``k``), works in float64 and
is numerically stable for ``k`` in ``[1e-20, 1e6]`` and large ``|z|``: no ``sqrt(1 + t^2)`` is
formed by squaring large numbers, and ``q_k`` is evaluated in a form free of cancellation.

Conventions
-----------
``lam`` is always the *normalized* relative scale ``lambda in [-1, 1]``:
``w(0)^2 = c (1 + lam) / 2`` (first layer), ``v(0)^2 = c (1 - lam) / 2`` (readout).
The authors' code uses an unnormalized ``lambda_u = lam * c`` (``w = sqrt((c + lambda_u)/2)``);
the later unlearning note flips the sign (``w = sqrt((c - lambda_u)/2)``), i.e. its ``lambda_u``
equals ``-lam * c`` here.
"""

from __future__ import annotations

import numpy as np

from ftlab.validate import check_finite, check_nonnegative, check_positive, check_range

__all__ = [
    "q_k",
    "q_k_prime",
    "q_k_second",
    "q_k_prime_inv",
    "Q_k",
    "k_from_pt",
    "c_ft_from_pt",
]


def _k_array(k) -> np.ndarray:
    k = np.asarray(k, dtype=np.float64)
    check_finite("k", k)
    if np.any(k <= 0):
        raise ValueError("k is out of range: every k_d must be > 0")
    return k


def _z_array(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    check_finite("z", z)
    return z


def q_k(z, k) -> np.ndarray:
    """The per-coordinate potential q_k(z) (dimensionless when z and sqrt(k) share units).

    ``q_k(z) = (sqrt(k)/4) (1 - sqrt(1 + t^2) + t asinh(t))`` with ``t = 2 z / sqrt(k)``,
    evaluated as ``(z/2) (asinh(t) - t / (1 + sqrt(1 + t^2)))`` (no cancellation for small or
    large ``t``). ``q_k(0) = 0``, even, strictly convex.
    Limits: ``|z| << sqrt(k)``: ``z^2 / (2 sqrt(k))`` (weighted l2, lazy);
    ``|z| >> sqrt(k)``: ``(|z|/2)(ln(4|z|/sqrt(k)) - 1) + sqrt(k)/4`` (l1 with log weight, rich).

    z, k : array-likes, broadcast together; k > 0.
    """
    z, k = _z_array(z), _k_array(k)
    t = 2.0 * z / np.sqrt(k)
    return 0.5 * z * (np.arcsinh(t) - t / (1.0 + np.hypot(1.0, t)))


def q_k_prime(z, k) -> np.ndarray:
    """``dq_k/dz = (1/2) asinh(2 z / sqrt(k))`` (the mirror map)."""
    z, k = _z_array(z), _k_array(k)
    return 0.5 * np.arcsinh(2.0 * z / np.sqrt(k))


def q_k_second(z, k) -> np.ndarray:
    """``d^2 q_k/dz^2 = 1 / sqrt(k + 4 z^2)`` (> 0: strictly convex)."""
    z, k = _z_array(z), _k_array(k)
    return 1.0 / np.hypot(np.sqrt(k), 2.0 * z)


def q_k_prime_inv(u, k) -> np.ndarray:
    """Inverse of the mirror map: the ``z`` with ``q_k'(z) = u``, i.e. ``(sqrt(k)/2) sinh(2u)``.

    Evaluated in log space for large ``|u|`` so that tiny ``k`` times a huge ``sinh`` does not
    overflow to ``inf * 0``; results beyond float64 range are ``+-inf``.
    """
    u = _z_array(u)
    k = _k_array(k)
    a = np.abs(2.0 * u)
    with np.errstate(over="ignore"):
        small = 0.5 * np.sqrt(k) * np.sinh(np.minimum(a, 20.0))
        big = np.exp(0.5 * np.log(k) - np.log(4.0) + a) * (-np.expm1(-2.0 * a))
    return np.sign(u) * np.where(a <= 20.0, small, big)


def Q_k(beta, k) -> float:  # noqa: N802 - the paper's name
    """``Q_k(beta) = sum_d q_{k_d}(beta_d)`` for a vector ``beta`` (D,) and ``k`` (D,) or scalar."""
    return float(np.sum(q_k(beta, k)))


def c_ft_from_pt(beta_pt, *, c: float, lam: float, gamma: float) -> np.ndarray:
    """Per-coordinate FT invariant ``c_FT,d = sqrt(k_d)/2`` after PT and the FT reset.

    ``c_FT,d = (1 + lam)(c + sqrt(c^2 + beta_PT,d^2)) + gamma^2 / 2`` (spec §1.3, §3.2), which equals
    ``(w+_PT + w-_PT)^2 + gamma^2/2`` for the summed first layer and readout ``gamma/sqrt(2)``.
    Only ``|beta_PT|`` enters. Shapes: ``beta_pt`` (D,) or any; returns the same shape.
    """
    check_positive("c", c)
    check_range("lam", lam, -1.0, 1.0)
    check_nonnegative("gamma", gamma)
    b = np.asarray(beta_pt, dtype=np.float64)
    check_finite("beta_pt", b)
    return (1.0 + lam) * (c + np.hypot(c, b)) + 0.5 * gamma**2


def k_from_pt(beta_pt, *, c: float, lam: float, gamma: float) -> np.ndarray:
    """FT geometry ``k_d`` from the PT solution (Anguita et al. 2026, Theorem 4.1).

    ``k_d = (2 c (1 + lam)(1 + sqrt(1 + (beta_PT,d / c)^2)) + gamma^2)^2``.

    c : PT absolute scale (> 0). lam : normalized PT relative scale in [-1, 1]
    (authors' unnormalized ``lambda_u = lam * c``). gamma : FT readout re-initialization scale (>= 0).
    At ``lam = -1, gamma = 0`` every ``k_d`` is 0 (pure l1 limit); solvers need ``k > 0``.
    """
    return (2.0 * c_ft_from_pt(beta_pt, c=c, lam=lam, gamma=gamma)) ** 2

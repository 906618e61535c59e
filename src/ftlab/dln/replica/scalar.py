"""The scalar denoising problem of the replica theory: the proximal map of ``theta * q_k``.

For ``k > 0`` the fine-tuning potential is (Azulay et al. 2021; arXiv 2602.20062, Thm 4.1)

    q_k(b) = (sqrt(k)/4) (1 - sqrt(1 + 4 b^2/k) + (2b/sqrt(k)) asinh(2b/sqrt(k))),
    q_k'(b) = asinh(2b/sqrt(k)) / 2,    q_k''(b) = 1 / sqrt(k + 4 b^2).

The proximal map ``eta(z; theta, k) = argmin_b (b - z)^2 / (2 theta) + q_k(b)`` is the root of
``b - z + (theta/2) asinh(2b/sqrt(k)) = 0``. We solve it in the variable ``u = asinh(2b/sqrt(k))``,
where the equation reads

    g(u) = (sqrt(k)/2) sinh(u) + (theta/2) u - |z| = 0,

a *convex increasing* function of ``u >= 0``: Newton's method started at a point with ``g >= 0``
decreases monotonically to the root (no overshoot), so no bisection fallback is needed and the
iteration is stable for any ``k > 0`` down to 1e-20 (sinh never overflows: ``u <= asinh(2|z|/sqrt(k))``,
about 50 for k = 1e-40). Then ``eta = sign(z) (sqrt(k)/2) sinh(u)`` and

    d eta / dz = 1 / (1 + theta q_k''(eta)) = S / (S + theta),   S = sqrt(k) cosh(u) = sqrt(k + 4 eta^2).

Everything is vectorized over broadcastable ``z``, ``theta``, ``k`` (float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ProxResult", "prox_qk", "prox_qk_derivatives"]

_MAX_NEWTON = 200


@dataclass(frozen=True)
class ProxResult:
    """Proximal map and its derivatives, all with the broadcast shape of ``(z, theta, k)``.

    eta : prox value (same units as z).
    deta_dz : d eta / dz in (0, 1].
    deta_dtheta : d eta / d theta (<= 0 in |eta|: shrinkage grows with theta).
    d2eta_dz2 : d^2 eta / dz^2.
    ddeta_dz_dtheta : d (d eta/dz) / d theta.
    n_iter : Newton iterations used (max over elements).
    """

    eta: np.ndarray
    deta_dz: np.ndarray
    deta_dtheta: np.ndarray
    d2eta_dz2: np.ndarray
    ddeta_dz_dtheta: np.ndarray
    n_iter: int


def _solve_u(a: np.ndarray, theta: np.ndarray, sk: np.ndarray, *, tol: float = 1e-15):
    """Root ``u >= 0`` of ``(sk/2) sinh u + (theta/2) u = a`` for ``a >= 0``; returns (u, n_iter)."""
    # Start where g >= 0: each term alone already reaches a at its own u, so the min of the two
    # single-term roots has g >= 0 (both terms are non-negative for u >= 0).
    with np.errstate(divide="ignore", invalid="ignore"):
        u_sinh = np.arcsinh(2.0 * a / sk)
        u_lin = np.where(theta > 0, 2.0 * a / np.where(theta > 0, theta, 1.0), np.inf)
    u = np.minimum(u_sinh, u_lin)
    n = 0
    for n in range(1, _MAX_NEWTON + 1):  # noqa: B007 - n is the iteration count returned
        g = 0.5 * sk * np.sinh(u) + 0.5 * theta * u - a
        gp = 0.5 * sk * np.cosh(u) + 0.5 * theta
        step = g / gp
        u = u - step
        # Convex increasing g and g(u0) >= 0: iterates decrease monotonically to the root; the
        # clip only guards against round-off below 0.
        u = np.maximum(u, 0.0)
        if np.all(np.abs(step) <= tol * np.maximum(1.0, u)):
            break
    return u, n


def prox_qk(z, theta, k):
    """``eta(z; theta, k) = argmin_b (b - z)^2/(2 theta) + q_k(b)`` (vectorized, float64).

    Parameters
    ----------
    z : array-like, the noisy observation (any shape).
    theta : array-like > 0 (or 0: identity), the effective regularization.
    k : array-like > 0, the geometry of ``q_k``.
    """
    return prox_qk_derivatives(z, theta, k).eta


def prox_qk_derivatives(z, theta, k) -> ProxResult:
    """Prox of ``theta * q_k`` with its first derivatives in ``z`` and ``theta`` (see module doc).

    ``theta = 0`` gives the identity (``eta = z``, ``d eta/dz = 1``).
    """
    z = np.asarray(z, dtype=float)
    theta = np.asarray(theta, dtype=float)
    k = np.asarray(k, dtype=float)
    if np.any(k <= 0) or not np.all(np.isfinite(k)):
        raise ValueError("k must be finite and > 0 (k = 0 is the unregularized l1 limit, not supported)")
    if np.any(theta < 0) or not np.all(np.isfinite(theta)):
        raise ValueError("theta must be finite and >= 0")
    z, theta, k = np.broadcast_arrays(z, theta, k)
    sk = np.sqrt(k)
    sign = np.where(z < 0, -1.0, 1.0)
    a = np.abs(z)
    u, n = _solve_u(a, theta, sk)
    half_sinh = 0.5 * sk * np.sinh(u)
    eta = sign * half_sinh
    S = sk * np.cosh(u)  # sqrt(k + 4 eta^2)
    D = S + theta
    deta_dz = S / D
    # u(z, theta): (S/2 + theta/2) du = dz - (u/2) dtheta
    du_dz = 2.0 / D
    du_dth = -u / D
    ssinh = sk * np.sinh(u)
    deta_dth = sign * 0.5 * S * du_dth
    # d/dz of S/(S+theta) = theta dS/(S+theta)^2 with dS = sk sinh(u) du ; sign: eta' is even in z
    d2eta = sign * theta * ssinh * du_dz / D**2
    ddeta_dth = (theta * ssinh * du_dth - S) / D**2
    return ProxResult(eta, deta_dz, deta_dth, d2eta, ddeta_dth, int(n))

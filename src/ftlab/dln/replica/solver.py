"""Replica-symmetric fixed point of the fine-tuning error (docs/replica.md), solved robustly.

Order parameters: the effective noise ``theta0`` and the effective regularization ``theta`` of the
scalar channel ``z = beta* + sqrt(theta0) xi``, ``eta = prox_{theta q_k}(z)``. With
``A = E[d eta/dz]`` and ``B = E[(eta - beta*)^2]`` the equations of the ridge-regularized problem
``min (1/2)||y - X beta||^2 + lambda_reg Q_k(beta)`` are

    theta0 = (sigma^2 + B) / alpha,        theta = lambda_reg + theta A / alpha,

and the generalization error is ``E_g = B`` (= alpha theta0 - sigma^2). Gradient flow converges to the
*interpolator*, the ``lambda_reg -> 0+`` limit, where for ``alpha < 1`` the second equation becomes the
degrees-of-freedom constraint ``A = alpha`` (the interpolation limit); no homotopy in
``lambda_reg`` is needed. We solve the two equations

    r1 = A - alpha (1 - lambda_reg/theta) = 0,      r2 = (sigma^2 + B) / (alpha theta0) - 1 = 0

by Newton's method in ``(log theta0, log theta)`` with the exact Jacobian (from the analytic
derivatives of the prox) and a backtracking line search. If Newton fails, a nested bracketed solve
takes over: ``theta(theta0)`` by Brent's method on ``r1`` (monotone in theta), then Brent's method on
the 1-D fixed-point map of ``log theta0``. A point is *converged* only if ``max(|r1|, |r2|) <= tol``;
otherwise it is returned flagged (never silently).

For ``alpha >= 1`` and ``lambda_reg = 0`` the interpolator is unique in the noiseless case
(``E_g = 0``) and is ordinary least squares with noise: ``theta = 0``, ``theta0 = sigma^2/(alpha-1)``.

The authors' scheme (damped fixed-point iteration, damping 0.25, tol 1e-6, <= 900 iterations,
``lambda_reg = 1e-6``; ``experiments/diagonal/replica/ptft_replica_qk.py`` in
github.com/Nico31415/toy-unlearning) is available as :func:`solve_damped` for comparison.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

log = logging.getLogger(__name__)

__all__ = ["FixedPoint", "solve_point", "solve_damped", "initial_guess"]


@dataclass(frozen=True)
class FixedPoint:
    """One solution of the replica equations.

    alpha : sample ratio N/D. error : E_g = E[(eta - beta*)^2] (per-coordinate parameter MSE).
    theta0 : effective noise variance. theta : effective regularization.
    converged : residual <= tol. n_iter : iterations (Newton steps, or function evaluations of the
    fallback / damped scheme). residual : max(|r1|, |r2|) at the returned point.
    method : ``"newton"``, ``"bracketed"``, ``"damped"``, ``"determined"`` (alpha >= 1, closed form).
    """

    alpha: float
    error: float
    theta0: float
    theta: float
    converged: bool
    n_iter: int
    residual: float
    method: str


def _residuals(m, theta0, theta, alpha, noise2, lambda_reg):
    r1 = m.A - alpha * (1.0 - lambda_reg / theta)
    r2 = (noise2 + m.B) / (alpha * theta0) - 1.0
    return r1, r2


def initial_guess(expect, alpha: float, noise2: float, lambda_reg: float = 0.0) -> tuple[float, float]:
    """Start from the minimum-l2 interpolator's noise level ``theta0 = ((1-a) E[b^2] + s^2)/a``."""
    m2 = max(expect.second_moment, 1e-12)
    theta0 = (max(1.0 - alpha, 0.05) * m2 + noise2) / alpha
    return theta0, _theta_given_theta0(expect, theta0, alpha, lambda_reg)[0]


def _theta_given_theta0(expect, theta0, alpha, lambda_reg, hint=None):
    """Root in log theta of ``A(theta0, theta) = alpha (1 - lambda_reg/theta)``; returns (theta, n_eval)."""
    count = [0]

    def f(lt):
        count[0] += 1
        th = math.exp(lt)
        return expect(theta0, th).A - alpha * (1.0 - lambda_reg / th)

    lo, hi = (math.log(hint) - 2.0, math.log(hint) + 2.0) if hint else (-5.0, 3.0)
    flo, fhi = f(lo), f(hi)
    # f decreases in theta: f(-inf) = 1 - (...) > 0 and f(+inf) = -alpha < 0
    while flo < 0 and lo > -120:
        lo -= 6.0
        flo = f(lo)
    while fhi > 0 and hi < 60:
        hi += 6.0
        fhi = f(hi)
    if flo < 0 or fhi > 0:
        raise FloatingPointError("could not bracket theta")
    lt = brentq(f, lo, hi, xtol=1e-13, rtol=1e-13, maxiter=200)
    return math.exp(lt), count[0]


def _bracketed(expect, alpha, noise2, lambda_reg, theta0_start, tol):
    """Nested 1-D solve: theta(theta0) by Brent, then Brent on log theta0 of the fixed-point map."""
    n_eval = [0]
    last: dict = {}

    def G(lt0):
        t0 = math.exp(lt0)
        th, ne = _theta_given_theta0(expect, t0, alpha, lambda_reg, hint=last.get("theta"))
        n_eval[0] += ne + 1
        last["theta"] = th
        m = expect(t0, th)
        return math.log(max(noise2 + m.B, 1e-300) / alpha) - lt0

    x0 = math.log(theta0_start)
    g0 = G(x0)
    step = 1.0 if g0 > 0 else -1.0
    a, ga = x0, g0
    for _ in range(80):
        b = a + step
        gb = G(b)
        if (gb > 0) != (ga > 0):
            lo, hi = (a, b) if a < b else (b, a)
            break
        a, ga = b, gb
        step *= 1.5
    else:
        raise FloatingPointError("could not bracket theta0")
    lt0 = brentq(G, lo, hi, xtol=1e-14, rtol=1e-14, maxiter=200)
    t0 = math.exp(lt0)
    th, ne = _theta_given_theta0(expect, t0, alpha, lambda_reg, hint=last.get("theta"))
    return t0, th, n_eval[0] + ne


def solve_point(
    expect,
    *,
    alpha: float,
    noise: float = 0.0,
    lambda_reg: float = 0.0,
    start: tuple[float, float] | None = None,
    tol: float = 1e-10,
    max_iter: int = 60,
) -> FixedPoint:
    """Solve the replica equations at one ``alpha`` (Newton, bracketed fallback).

    expect : a :class:`~ftlab.dln.replica.expect.QuadratureExpectation` or ``MonteCarloExpectation``.
    noise : label-noise standard deviation sigma. lambda_reg : explicit regularization (0 =
    interpolator, the gradient-flow limit). start : warm start ``(theta0, theta)``.
    """
    noise2 = float(noise) ** 2
    if alpha >= 1.0 and lambda_reg == 0.0:
        if noise2 == 0.0:
            return FixedPoint(alpha, 0.0, 0.0, 0.0, True, 0, 0.0, "determined")
        err = noise2 / (alpha - 1.0) if alpha > 1.0 else math.inf
        return FixedPoint(alpha, err, err, 0.0, True, 0, 0.0, "determined")
    if start is None or not all(np.isfinite(start)) or min(start) <= 0:
        start = initial_guess(expect, alpha, noise2, lambda_reg)
    x = np.log(np.asarray(start, dtype=float))
    m = expect(*np.exp(x))
    t0, t1 = np.exp(x)
    r = np.array(_residuals(m, t0, t1, alpha, noise2, lambda_reg))
    norm = float(np.max(np.abs(r)))
    n = 0
    for n in range(1, max_iter + 1):
        if norm <= tol:
            n -= 1
            break
        t0, th = np.exp(x)
        J = np.array(
            [
                [t0 * m.dA_dtheta0, th * (m.dA_dtheta - alpha * lambda_reg / th**2)],
                [m.dB_dtheta0 / alpha - (noise2 + m.B) / (alpha * t0), th * m.dB_dtheta / (alpha * t0)],
            ]
        )
        try:
            dx = -np.linalg.solve(J, r)
        except np.linalg.LinAlgError:
            break
        if not np.all(np.isfinite(dx)):
            break
        # keep steps bounded in log space, then backtrack on the residual's max-norm
        scale = min(1.0, 3.0 / max(float(np.max(np.abs(dx))), 1e-300))
        accepted = False
        for _ in range(30):
            xn = x + scale * dx
            mn = expect(*np.exp(xn))
            n0, n1 = np.exp(xn)
            rn = np.array(_residuals(mn, n0, n1, alpha, noise2, lambda_reg))
            nn = float(np.max(np.abs(rn)))
            if np.isfinite(nn) and nn < norm * (1.0 - 1e-4 * scale):
                accepted = True
                break
            scale *= 0.5
        if not accepted:
            break
        x, m, r, norm = xn, mn, rn, nn
    if norm <= tol:
        t0, th = np.exp(x)
        return FixedPoint(alpha, float(m.B), float(t0), float(th), True, n, norm, "newton")
    log.debug("Newton failed at alpha=%g (residual %.2e); bracketed fallback", alpha, norm)
    try:
        t0, th, ne = _bracketed(expect, alpha, noise2, lambda_reg, float(np.exp(x[0])), tol)
    except (FloatingPointError, ValueError) as exc:
        log.warning("replica solve failed at alpha=%g: %s", alpha, exc)
        t0, th = np.exp(x)
        return FixedPoint(alpha, float(m.B), float(t0), float(th), False, n, norm, "newton")
    m = expect(t0, th)
    res = float(np.max(np.abs(_residuals(m, t0, th, alpha, noise2, lambda_reg))))
    return FixedPoint(alpha, float(m.B), t0, th, res <= tol, n + ne, res, "bracketed")


#: Damping ``d`` of :func:`solve_damped` (the authors' value).
DAMPING = 0.25


def solve_damped(
    expect,
    *,
    alpha: float,
    noise: float = 0.0,
    lambda_reg: float = 1e-6,
    start: tuple[float, float] | None = None,
    tol: float = 1e-6,
    max_iter: int = 900,
) -> FixedPoint:
    """The authors' damped fixed-point iteration, the reference scheme for benchmarks.

    (github.com/Nico31415/toy-unlearning, ``experiments/diagonal/replica/ptft_replica_qk.py``.)

    ``theta0 <- (1-d) theta0 + d (sigma^2 + B)/alpha``, ``theta <- (1-d) theta + d (lambda_reg + theta A/alpha)``
    with ``d = DAMPING = 0.25``, until the relative change of both is below ``tol`` or after
    ``max_iter`` iterations; ``lambda_reg`` must be > 0. The reported residual is that of the
    interpolation-form equations with this ``lambda_reg``.
    """
    damping = DAMPING
    if lambda_reg <= 0:
        raise ValueError(f"lambda_reg={lambda_reg!r} is out of range: the damped scheme needs lambda_reg > 0")
    noise2 = float(noise) ** 2
    if start is None:
        m2 = max(expect.second_moment, 1e-12)
        start = ((1.0 / alpha - 1.0) * m2 + noise2 if alpha < 1 else m2, 0.01)
    t0, th = (float(s) for s in start)
    n = 0
    for n in range(1, max_iter + 1):  # noqa: B007 - n is the iteration count returned
        m = expect(t0, th)
        t0n = (1.0 - damping) * t0 + damping * (noise2 + m.B) / alpha
        thn = (1.0 - damping) * th + damping * (lambda_reg + th * m.A / alpha)
        change = max(abs(t0n - t0) / max(t0, 1e-300), abs(thn - th) / max(th, 1e-300))
        t0, th = max(t0n, 1e-300), max(thn, 1e-300)
        if change < tol:
            break
    m = expect(t0, th)
    res = float(np.max(np.abs(_residuals(m, t0, th, alpha, noise2, lambda_reg))))
    return FixedPoint(alpha, float(m.B), t0, th, change < tol, n, res, "damped")

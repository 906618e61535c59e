"""The implicit bias of fine-tuning a diagonal linear network: the potential q_k and its geometry k.

Gradient flow on ``beta = v+ * w+ - v- * w-`` from an initialization with per-coordinate
invariants ``(lambda_e+, lambda_e-, c)`` converges (when it interpolates) to

    argmin_beta  Q_k(beta) = sum_d q_{k_d}(beta_d)   subject to   X beta = y,

with ``k_d = (lambda_e+ - lambda_e-)^2 + 4 c_d^2`` (Azulay et al. 2021, ICML, "On the implicit bias
of initialization shape"; Woodworth et al. 2020, COLT, "Kernel and rich regimes in
overparametrized models"). After pretraining (PT) and the fine-tuning (FT) reset, ``k_d`` depends on
the PT solution through :func:`k_from_pt` (the implicit-bias theorem of Anguita et al. 2026, arXiv
2602.20062; derivation in docs/dln.md).

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

from dataclasses import dataclass

import numpy as np

from ftlab.core.validate import check_finite, check_positive

__all__ = [
    "q_k",
    "q_k_prime",
    "q_k_second",
    "q_k_prime_inv",
    "Q_k",
    "k_from_pt",
    "c_ft_from_pt",
    "check_scales",
    "InterpolatorResult",
    "solve_implicit_bias",
    "min_l1_interpolator",
    "min_l2_interpolator",
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


def _bad(name: str, arr: np.ndarray, ok: np.ndarray, rule: str):
    bad = arr[~ok] if arr.ndim else arr
    v = float(np.ravel(bad)[0])
    raise ValueError(f"{name}={v!r} is out of range: must be {rule}")


#: Largest accepted c and gamma: k = (2 c (1 + lam)(...) + gamma^2)^2 must stay finite in float64.
MAX_SCALE = 1e50


def check_scales(*, c, lam, gamma) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate the init scales (scalars or broadcastable arrays); returns them as float64 arrays.

    c in (0, 1e50], lam in [-1, 1], gamma in [0, 1e50], all finite; and never ``lam = -1`` with
    ``gamma = 0``: there the fine-tuning first layer restarts at 0 and the readout at gamma = 0, so
    k = 0 on every coordinate and the FT network sits at the zero saddle (gradient flow never moves).
    The same rule holds in every function and command of :mod:`ftlab.dln`.
    """
    out = []
    for name, v, test, rule in [("c", c, lambda a: (a > 0) & (a <= MAX_SCALE), "in (0, 1e50]"),
                                ("lam", lam, lambda a: (a >= -1) & (a <= 1), "in [-1, 1]"),
                                ("gamma", gamma, lambda a: (a >= 0) & (a <= MAX_SCALE), "in [0, 1e50]")]:
        a = np.asarray(v, dtype=np.float64)
        if a.ndim == 0:
            check_finite(name, float(a))
        else:
            check_finite(name, a)
        ok = test(a)
        if not np.all(ok):
            _bad(name, a, ok, rule)
        out.append(a)
    c_, lam_, gamma_ = out
    saddle = (lam_ == -1.0) & (gamma_ == 0.0)
    if np.any(saddle):
        raise ValueError("lam=-1 with gamma=0 leaves the fine-tuning network at the zero saddle (k = 0 on every "
                         "coordinate: the FT first layer restarts at 0 and the readout at gamma = 0): "
                         "use lam > -1 or gamma > 0")
    return c_, lam_, gamma_


def c_ft_from_pt(beta_pt, *, c, lam, gamma) -> np.ndarray:
    """Per-coordinate FT invariant ``c_FT,d = sqrt(k_d)/2`` after PT and the FT reset.

    ``c_FT,d = (1 + lam)(c + sqrt(c^2 + beta_PT,d^2)) + gamma^2 / 2`` (docs/dln.md), which equals
    ``(w+_PT + w-_PT)^2 + gamma^2/2`` for the summed first layer and readout ``gamma/sqrt(2)``.
    Only ``|beta_PT|`` enters. All arguments broadcast (scales may be arrays too).
    """
    c, lam, gamma = check_scales(c=c, lam=lam, gamma=gamma)
    b = np.asarray(beta_pt, dtype=np.float64)
    check_finite("beta_pt", b)
    return (1.0 + lam) * (c + np.hypot(c, b)) + 0.5 * gamma**2


def k_from_pt(beta_pt, *, c, lam, gamma) -> np.ndarray:
    """FT geometry ``k_d`` from the PT solution (the implicit-bias theorem of arXiv 2602.20062).

    ``k_d = (2 c (1 + lam)(1 + sqrt(1 + (beta_PT,d / c)^2)) + gamma^2)^2``.

    c : PT absolute scale (> 0). lam : normalized PT relative scale in [-1, 1]
    (authors' unnormalized ``lambda_u = lam * c``). gamma : FT readout re-initialization scale (>= 0).
    At ``lam = -1, gamma = 0`` every ``k_d`` is 0 (pure l1 limit); solvers need ``k > 0``.
    """
    return (2.0 * c_ft_from_pt(beta_pt, c=c, lam=lam, gamma=gamma)) ** 2


# ----------------------------------------------------------------------------------------------
# Interpolators: the implicit-bias argmin and its l1 / l2 limits
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InterpolatorResult:
    """An interpolator ``beta`` (D,) of ``X beta = y``.

    nu : dual variables (N,) for :func:`solve_implicit_bias` (``beta_d = (sqrt(k_d)/2) sinh(2 (X^T nu)_d)``),
    None for the l1/l2 interpolators. residual : ``||X beta - y|| / max(||y||, 1e-300)`` (relative).
    """

    beta: np.ndarray
    converged: bool
    n_iter: int
    residual: float
    nu: np.ndarray | None = None


def _check_xy(X, y) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise ValueError(f"X must be (n_samples, n_features) and y (n_samples,), got X{X.shape}, y{y.shape}")
    check_finite("X", X)
    check_finite("y", y)
    return X, y


def _rel_residual(X, beta, y) -> float:
    return float(np.linalg.norm(X @ beta - y) / max(float(np.linalg.norm(y)), 1e-300))


def _dual_potential(u: np.ndarray, sqrt_k: np.ndarray) -> float:
    """``sum_d (sqrt(k_d)/2) sinh(u_d)^2`` (convex conjugate of q_k at u), overflow-safe."""
    a = np.abs(u)
    small = a <= 20.0
    out = np.empty_like(a)
    out[small] = 0.5 * sqrt_k[small] * np.sinh(a[small]) ** 2
    ab = a[~small]
    with np.errstate(over="ignore"):
        out[~small] = np.exp(np.log(0.5 * sqrt_k[~small]) + 2.0 * (ab - np.log(2.0)) + 2.0 * np.log1p(-np.exp(-2.0 * ab)))
    return float(np.sum(out))


def _gram_lower(X: np.ndarray, h: np.ndarray, *, single: bool) -> np.ndarray:
    """Lower triangle of ``X diag(h) X^T`` (h >= 0) by a symmetric rank-k update, in float32 if ``single``."""
    from scipy.linalg.blas import dsyrk, ssyrk

    xs = X * np.sqrt(h)
    if single:
        return ssyrk(1.0, xs.astype(np.float32).T, trans=1, lower=1)
    return dsyrk(1.0, xs.T, trans=1, lower=1)


def _hessian_factor(X: np.ndarray, h: np.ndarray):
    """Cholesky factor (lower, float64 storage) of ``X diag(h) X^T``.

    Formed and factorized in float32 first: it only supplies Newton directions far from the
    solution and CG preconditioners near it, neither of which limits the final float64 residual,
    and it halves the dominant O(N^2 D) cost. If single precision is not positive definite
    (condition number beyond ~1e7, e.g. for tiny k), float64 is used, with a growing diagonal
    jitter as a last resort.
    """
    import scipy.linalg as sla

    try:
        c, low = sla.cho_factor(_gram_lower(X, h, single=True), lower=True, check_finite=False)
        return c.astype(np.float64), low
    except np.linalg.LinAlgError:
        pass
    H = _gram_lower(X, h, single=False)
    scale = np.trace(H) / H.shape[0]
    for jitter in (0.0, 1e-14, 1e-12, 1e-10, 1e-8):
        try:
            return sla.cho_factor(H + jitter * scale * np.eye(H.shape[0]), lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            continue
    raise np.linalg.LinAlgError("the Newton system X diag(h) X^T is singular: does X have full row rank?")


def _pcg(matvec, b: np.ndarray, solve_m, *, rtol: float, maxiter: int) -> tuple[np.ndarray, bool, int]:
    """Preconditioned conjugate gradients for an SPD operator; returns (x, converged, iterations)."""
    x = solve_m(b)
    r = b - matvec(x)
    bnorm = max(float(np.linalg.norm(b)), 1e-300)
    if np.linalg.norm(r) <= rtol * bnorm:
        return x, True, 0
    z = solve_m(r)
    p = z.copy()
    rz = r @ z
    for i in range(1, maxiter + 1):
        ap = matvec(p)
        pap = p @ ap
        if not pap > 0:
            return x, False, i
        step = rz / pap
        x += step * p
        r -= step * ap
        if np.linalg.norm(r) <= rtol * bnorm:
            return x, True, i
        z = solve_m(r)
        rz_new = r @ z
        p = z + (rz_new / rz) * p
        rz = rz_new
    return x, False, maxiter


#: Largest change of the dual angle ``u = X^T nu`` per Newton step of :func:`solve_implicit_bias`.
MAX_DU = 2.0


def solve_implicit_bias(X, y, k, *, tol: float = 1e-12, max_iter: int = 500, max_cg: int = 25) -> InterpolatorResult:
    """Exact ``argmin_beta Q_k(beta)`` subject to ``X beta = y`` by damped Newton on the dual.

    The minimizer has the form ``beta_d = (sqrt(k_d)/2) sinh(2 u_d)``, ``u = X^T nu``, where ``nu``
    (N,) minimizes the smooth convex dual ``F(nu) = sum_d (sqrt(k_d)/2) sinh(u_d)^2 - nu . y``
    (gradient ``X beta - y``, Hessian ``H = X diag(sqrt(k + 4 beta^2)) X^T``). Each Newton step is
    capped so that ``max |du| <= MAX_DU = 2`` (the dual is exponential: this bounds the number of steps
    by about ``max_d |u_d*| / 2`` even for tiny k) and then Armijo-backtracked.

    Newton systems are solved by conjugate gradients (float64 products with X) preconditioned
    with the Cholesky factor of the last Hessian that was formed (in float32). The Hessian is
    re-formed (O(N^2 D)) after a damped step and when CG needs more than ``max_cg`` iterations;
    ``max_cg=0`` forms one and solves directly at every step. CG tolerances shrink with the
    residual (inexact Newton), so the final steps are accurate to float64.

    X : (N, D) with full row rank (N <= D for an interpolation problem); y : (N,);
    k : (D,) or scalar, > 0 (``k = 1e-20`` works). tol : relative residual ``||X beta - y||/||y||``.
    max_iter : Newton steps at most (then ``converged=False``). n_iter counts Newton steps.
    """
    import scipy.linalg as sla

    X, y = _check_xy(X, y)
    k = np.broadcast_to(_k_array(k), (X.shape[1],))
    check_positive("tol", tol)
    sqrt_k = np.sqrt(k)
    nu = np.zeros(X.shape[0])
    ynorm = max(float(np.linalg.norm(y)), 1e-300)

    u = X.T @ nu
    beta = q_k_prime_inv(u, k)
    F = _dual_potential(u, sqrt_k) - nu @ y
    grad = X @ beta - y
    res = float(np.linalg.norm(grad) / ynorm)
    factor = None
    full_step = False
    it = 0
    while res > tol and it < max_iter:
        it += 1
        h = np.hypot(sqrt_k, 2.0 * beta)
        step = None
        if factor is not None and max_cg > 0 and full_step:
            step, ok, _ = _pcg(lambda v, h=h: X @ (h * (X.T @ v)), -grad,
                               lambda v, f=factor: sla.cho_solve(f, v, check_finite=False),
                               rtol=max(min(0.1, res), 1e-3 * tol), maxiter=max_cg)
            if not ok:
                step = None
        if step is None:
            factor = _hessian_factor(X, h)
            step = sla.cho_solve(factor, -grad, check_finite=False)
        du = X.T @ step
        s = min(1.0, MAX_DU / max(np.max(np.abs(du)), 1e-300))
        slope = grad @ step
        for _ in range(60):
            u_c = u + s * du
            beta_c = q_k_prime_inv(u_c, k)
            F_c = _dual_potential(u_c, sqrt_k) - (nu + s * step) @ y
            grad_c = X @ beta_c - y
            res_c = float(np.linalg.norm(grad_c) / ynorm)
            if np.isfinite(F_c) and (F_c <= F + 1e-4 * s * slope or res_c < 0.5 * res):
                break
            s *= 0.5
        else:
            break
        nu, u, beta, F, grad, res = nu + s * step, u_c, beta_c, F_c, grad_c, res_c
        full_step = s == 1.0
    return InterpolatorResult(beta=beta, converged=bool(res <= tol), n_iter=it, residual=res, nu=nu)


def min_l1_interpolator(X, y) -> InterpolatorResult:
    """``argmin ||beta||_1`` s.t. ``X beta = y`` (basis pursuit) by a linear program (scipy HiGHS).

    The k -> 0 limit of :func:`solve_implicit_bias` (Woodworth et al. 2020's rich regime).
    """
    from scipy.optimize import linprog

    X, y = _check_xy(X, y)
    n, d = X.shape
    res = linprog(np.ones(2 * d), A_eq=np.hstack([X, -X]), b_eq=y, bounds=(0, None), method="highs")
    if res.x is None:
        return InterpolatorResult(beta=np.full(d, np.nan), converged=False, n_iter=int(res.nit), residual=float("inf"))
    beta = res.x[:d] - res.x[d:]
    return InterpolatorResult(beta=beta, converged=bool(res.status == 0), n_iter=int(res.nit),
                              residual=_rel_residual(X, beta, y))


def min_l2_interpolator(X, y) -> InterpolatorResult:
    """``argmin ||beta||_2`` s.t. ``X beta = y`` (``X^+ y``); the k -> infinity limit (lazy regime)."""
    X, y = _check_xy(X, y)
    beta = np.linalg.lstsq(X, y, rcond=None)[0]
    return InterpolatorResult(beta=beta, converged=True, n_iter=1, residual=_rel_residual(X, beta, y))

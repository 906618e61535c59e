"""Training the diagonal network: exact gradient flow and the authors' plain gradient descent.

Loss: the mean squared error ``L = (1/N) ||y - X beta||^2`` (torch's ``mse_loss``, as in the
authors' simulations), so that gradient descent with learning rate ``lr`` after ``s`` steps
approximates the flow at time ``t = lr * s``.

**Gradient flow, exactly reduced.** Per coordinate the flow is a hyperbolic rotation of the
initial weights by the accumulated gradient ``a_d(t) = int_0^t g_d`` (see :mod:`ftlab.dln.model`).
Since ``g = (2/N) X^T r``, ``a(t) = X^T nu(t)`` with ``nu(t) = (2/N) int_0^t r`` (N,), and

    d nu / dt = (2/N) (y - X beta(X^T nu)),    beta_d(a) = A_d sinh(2 a_d) + B_d cosh(2 a_d),

an N-dimensional ODE (for N > D the D-dimensional ODE in ``a`` itself is used) equivalent to
the 4D-dimensional flow on ``(w+, w-, v+, v-)`` (no approximation). It is the gradient flow of a
convex function of ``nu`` (the dual of the implicit-bias problem), stiff when some ``k_d`` are
tiny, and is integrated with scipy's implicit ``BDF`` (or ``Radau``) method and the analytic
Jacobian ``-(2/N) X diag(dbeta/da) X^T``. The four weight vectors are then recovered by the exact
rotation, so the invariants are conserved up to rounding and their drift is reported. Because the
endpoint is the unique minimizer of that convex function, integration error along the path does not
move the endpoint; but the implicit method's Newton tolerance (set by ``rtol``/``atol``) limits how
small the final training error can get, so very loose tolerances stall above a tiny ``tol``.
This is the mirror-descent view of Azulay et al. 2021 and
Woodworth et al. 2020, applied to the four-vector parametrization of Anguita et al. 2026.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ftlab.core.validate import check_choice, check_finite, check_int, check_positive
from ftlab.dln.model import Weights, beta_coefficients, rotate

__all__ = ["TrainResult", "gradient_flow", "gradient_descent", "invariant_drift"]

_MAX_CURVE = 256


@dataclass(frozen=True)
class TrainResult:
    """Outcome of :func:`gradient_flow` or :func:`gradient_descent`.

    weights : the four weight vectors at the end. beta : their predictor (D,).
    times, mse : the training curve (flow time ``t``; for GD ``t = lr * step``) and the training
        MSE there, at most 256 points, log-spaced in the step index.
    t_final : flow time reached. invariant_drift : max over the three conserved quantities of
        ``max_d |I_d(end) - I_d(start)|``, divided by ``max(max_d |I_d(start)|, 1e-300)``.
    converged : training MSE reached tol (flow: the stopping event fired). n_iter : integrator steps (flow) or GD steps.
    residual : final training MSE. method : ``"flow-BDF"``, ``"flow-Radau"`` or ``"gd"``.
    """

    weights: Weights
    beta: np.ndarray
    times: np.ndarray
    mse: np.ndarray
    t_final: float
    invariant_drift: float
    converged: bool
    n_iter: int
    residual: float
    method: str


def invariant_drift(start: Weights, end: Weights) -> float:
    """Relative drift of the conserved quantities between two weight states (0 for exact flow)."""
    out = 0.0
    for i0, i1 in zip(start.invariants(), end.invariants()):
        scale = max(float(np.max(np.abs(i0))), 1e-300)
        out = max(out, float(np.max(np.abs(i1 - i0))) / scale)
    return out


def _check_problem(weights: Weights, X, y) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0] or X.shape[1] != weights.dim:
        raise ValueError(f"X must be (N, D={weights.dim}) and y (N,), got X{X.shape}, y{y.shape}")
    check_finite("X", X)
    check_finite("y", y)
    return X, y


def _thin(times: list, values: list) -> tuple[np.ndarray, np.ndarray]:
    t, m = np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if t.size <= _MAX_CURVE:
        return t, m
    idx = np.unique(np.concatenate([[0], np.geomspace(1, t.size - 1, _MAX_CURVE - 1).astype(int)]))
    return t[idx], m[idx]


def gradient_flow(weights: Weights, X, y, *, tol: float = 1e-20, t_max: float = 1e15, method: str = "BDF",
                  rtol: float = 1e-6, atol: float = 1e-9) -> TrainResult:
    """Integrate gradient flow of the mean-squared-error from ``weights`` until the training MSE <= ``tol``.

    weights : start (D,) x 4; X : (N, D); y : (N,). tol : absolute training MSE at which to stop
    (default 1e-20: the endpoint is then the flow's limit to ~1e-10 relative on well-posed
    problems). t_max : give up at this flow time (converged=False). method : ``"BDF"`` or
    ``"Radau"`` (scipy ``solve_ivp``); rtol/atol : its tolerances on ``nu``.
    See the module docstring for the exact reduction used.
    """
    from scipy.integrate import solve_ivp

    X, y = _check_problem(weights, X, y)
    check_positive("tol", tol)
    check_positive("t_max", t_max)
    check_choice("method", method, ("BDF", "Radau"))
    n, d = X.shape
    A, B = beta_coefficients(weights)
    scale = 2.0 / n
    # State: nu (N,) with a = X^T nu when N <= D; the accumulated gradient a (D,) itself otherwise.
    dual = n <= d

    def angle(state):
        return X.T @ state if dual else state

    def beta_of(state):
        a2 = np.clip(2.0 * angle(state), -700.0, 700.0)
        return A * np.sinh(a2) + B * np.cosh(a2), a2

    def rhs(_t, state):
        r = y - X @ beta_of(state)[0]
        return scale * (r if dual else X.T @ r)

    def jac(_t, state):
        _, a2 = beta_of(state)
        h = 2.0 * (A * np.cosh(a2) + B * np.sinh(a2))
        return -scale * ((X * h) @ X.T if dual else (X.T @ X) * h)

    def done(_t, state):
        r = y - X @ beta_of(state)[0]
        return float(r @ r) / n - tol

    done.terminal = True  # type: ignore[attr-defined]
    done.direction = -1  # type: ignore[attr-defined]

    nu0 = np.zeros(n if dual else d)
    mse0 = float(np.mean((y - X @ weights.beta) ** 2))
    if mse0 <= tol:
        return TrainResult(weights, weights.beta, np.array([0.0]), np.array([mse0]), 0.0, 0.0, True, 0, mse0,
                           f"flow-{method}")
    sol = solve_ivp(rhs, (0.0, t_max), nu0, method=method, jac=jac, events=done, rtol=rtol, atol=atol)
    end = rotate(weights, angle(sol.y[:, -1]))
    mse_curve = [float(np.mean((y - X @ beta_of(sol.y[:, i])[0]) ** 2)) for i in range(sol.y.shape[1])]
    times, mse = _thin(list(sol.t), mse_curve)
    res = mse_curve[-1]
    return TrainResult(
        weights=end, beta=end.beta, times=times, mse=mse, t_final=float(sol.t[-1]),
        invariant_drift=invariant_drift(weights, end), converged=bool(sol.status == 1), n_iter=int(sol.t.size - 1),
        residual=res, method=f"flow-{method}",
    )


def gradient_descent(weights: Weights, X, y, *, lr: float = 0.5, tol: float = 1e-4,
                     max_steps: int = 5_000_000) -> TrainResult:
    """Plain full-batch gradient descent on the four weight vectors, as in the authors' simulations.

    Mean-squared-error loss, float64, no momentum; stops when the training MSE < ``tol``
    (authors: lr 0.5, tol 1e-4; lr 0.05, tol 1e-5 for Regime I) or after ``max_steps``.
    Discrete steps do not conserve the invariants; their drift is reported (O(lr)).
    """
    X, y = _check_problem(weights, X, y)
    check_positive("lr", lr)
    check_positive("tol", tol)
    max_steps = check_int("max_steps", max_steps, 1)
    n = X.shape[0]
    wp, wm, vp, vm = (np.array(a, dtype=np.float64) for a in (weights.w_plus, weights.w_minus, weights.v_plus,
                                                               weights.v_minus))
    rec_steps, rec_mse = [], []
    next_rec = 1
    step = 0
    r = y - X @ (vp * wp - vm * wm)
    mse = float(r @ r) / n
    while mse >= tol and step < max_steps and np.isfinite(mse):
        g = (2.0 * lr / n) * (X.T @ r)
        wp, vp = wp + vp * g, vp + wp * g
        wm, vm = wm - vm * g, vm - wm * g
        step += 1
        r = y - X @ (vp * wp - vm * wm)
        mse = float(r @ r) / n
        if step >= next_rec:
            rec_steps.append(step)
            rec_mse.append(mse)
            next_rec = max(next_rec + 1, int(next_rec * 1.05))
    if not rec_steps or rec_steps[-1] != step:
        rec_steps.append(step)
        rec_mse.append(mse)
    if not np.isfinite(mse):
        raise FloatingPointError(f"gradient descent diverged at step {step}: lower lr={lr}")
    end = Weights(wp, wm, vp, vm)
    times, curve = _thin([lr * s for s in rec_steps], rec_mse)
    return TrainResult(
        weights=end, beta=end.beta, times=times, mse=curve, t_final=lr * step,
        invariant_drift=invariant_drift(weights, end), converged=bool(mse < tol), n_iter=step, residual=mse,
        method="gd",
    )

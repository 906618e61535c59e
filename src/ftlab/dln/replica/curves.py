"""Learning curves ``E_g(alpha)``: replica theory along an alpha grid, and matching simulations.

:func:`learning_curve` solves the replica equations on a grid of sample ratios with warm starts,
forward *and* backward (continuation in both directions). Where the two passes land on different
fixed points the curve has several branches: the row keeps the lower-error one (the rule of the
authors' public replica code), says which pass found it (``branch = "forward" | "backward"``) and sets
``n_branches = 2``; otherwise ``branch = "unique"``. Unconverged points are kept and flagged
(``converged = False``), never dropped.

:func:`simulate_curve` measures the same quantity on sampled problems of finite dimension ``D``:
the exact fine-tuning interpolator (``method="implicit"``: ``argmin Q_k s.t. X beta = y`` with the
``k`` of the paper's implicit-bias theorem, which gradient flow converges to) or A's gradient-flow / gradient-descent
simulation (``method="flow" | "gd"``), over seeds, through :func:`ftlab.core.sweep.run_sweep`.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Literal

import numpy as np

from ftlab.core.validate import check_choice, check_int, check_nonnegative, check_positive
from ftlab.dln.replica.expect import MonteCarloExpectation, QuadratureExpectation
from ftlab.dln.replica.prior import ft_prior, sample_prior_mc
from ftlab.dln.replica.solver import FixedPoint, solve_damped, solve_point

Expectation = Literal["quadrature", "mc"]
Solver = Literal["newton", "damped"]
Continuation = Literal["both", "forward"]
PtMagnitude = Literal["fixed", "gaussian"]
SimMethod = Literal["implicit", "flow", "gd"]

__all__ = ["make_expectation", "solve_curve", "learning_curve", "curve_records", "simulate_point",
           "simulate_curve", "check_alphas", "CURVE_COLUMNS"]

CURVE_COLUMNS = ["alpha", "error", "theta0", "theta", "converged", "n_iter", "residual", "branch", "n_branches", "method"]


def check_alphas(alphas) -> np.ndarray:
    """Validate a grid of sample ratios: finite, > 0, no duplicates. Returns a float array."""
    arr = np.atleast_1d(np.asarray(alphas, dtype=float))
    if arr.size == 0:
        raise ValueError("alpha grid is empty: give at least one alpha > 0")
    for a in arr:
        check_positive("alpha", float(a))
    if len(np.unique(arr)) != arr.size:
        raise ValueError("alpha grid has duplicate values")
    return arr


def make_expectation(spec, *, c: float, lam: float, gamma: float, alpha_pt: float | None = None,
                     expectation: Expectation = "quadrature", n_nodes: int = 800, quadrature: str = "legendre",
                     mc: int = 80_000, mc_seed: int = 0):
    """Expectation operator of the replica equations for a task and initialization.

    expectation : ``"quadrature"`` (deterministic; ``n_nodes`` points of the ``quadrature`` rule per
        mixture component) or ``"mc"`` (``mc`` samples from the authors' sampler with ``mc_seed``).
    """
    check_choice("expectation", expectation, ("quadrature", "mc"))
    if expectation == "mc":
        beta, k, xi = sample_prior_mc(spec, c=c, lam=lam, gamma=gamma, mc=mc, seed=mc_seed, alpha_pt=alpha_pt)
        return MonteCarloExpectation(beta, k, xi)
    mix, _ = ft_prior(spec, c=c, lam=lam, gamma=gamma, alpha_pt=alpha_pt)
    return QuadratureExpectation(mix, n_nodes=n_nodes, kind=quadrature)


def _solve(expect, alpha, noise, lambda_reg, start, solver, tol):
    if solver == "damped":
        return solve_damped(expect, alpha=alpha, noise=noise, lambda_reg=lambda_reg or 1e-6, start=start)
    return solve_point(expect, alpha=alpha, noise=noise, lambda_reg=lambda_reg, start=start, tol=tol)


def _start(fp: FixedPoint | None):
    if fp is None or not fp.converged or fp.theta0 <= 0 or fp.theta <= 0:
        return None
    return fp.theta0, fp.theta


def solve_curve(expect, alphas, *, noise: float = 0.0, lambda_reg: float = 0.0, solver: Solver = "newton",
                continuation: Continuation = "both", tol: float = 1e-10):
    """Solve at every alpha with warm starts; returns a DataFrame with :data:`CURVE_COLUMNS`.

    solver : ``"newton"`` (ours) or ``"damped"`` (the authors' scheme, ``lambda_reg`` defaults to 1e-6).
    continuation : ``"both"`` (forward and backward passes, branch detection) or ``"forward"``.
    """
    import pandas as pd

    check_choice("solver", solver, ("newton", "damped"))
    check_choice("continuation", continuation, ("both", "forward"))
    check_nonnegative("noise", noise)
    check_nonnegative("lambda_reg", lambda_reg)
    alphas = check_alphas(alphas)
    order = np.argsort(alphas)
    fwd: dict[int, FixedPoint] = {}
    prev = None
    for i in order:
        prev = fwd[i] = _solve(expect, float(alphas[i]), noise, lambda_reg, _start(prev), solver, tol)
    bwd: dict[int, FixedPoint] = {}
    if continuation == "both" and len(alphas) > 1:
        prev = None
        for i in order[::-1]:
            prev = bwd[i] = _solve(expect, float(alphas[i]), noise, lambda_reg, _start(prev), solver, tol)
    rows = []
    for i in range(len(alphas)):
        f, b = fwd[i], bwd.get(i)
        branch, n_br, best = "unique", 1, f
        if b is not None:
            if b.converged and not f.converged:
                best = b
                branch = "backward"
            elif b.converged and f.converged:
                scale = max(1e-8, abs(f.error), abs(b.error))
                if abs(f.error - b.error) > 1e-6 * scale:
                    n_br = 2
                    best, branch = (f, "forward") if f.error <= b.error else (b, "backward")
        row = asdict(best)
        row.update(branch=branch, n_branches=n_br)
        rows.append(row)
    return pd.DataFrame(rows)[CURVE_COLUMNS]


def learning_curve(spec, *, c: float, lam: float, gamma: float, alphas, alpha_pt: float | None = None,
                   lambda_reg: float = 0.0, expectation: Expectation = "quadrature", n_nodes: int = 800,
                   quadrature: str = "legendre", mc: int = 80_000, mc_seed: int = 0, solver: Solver = "newton",
                   continuation: Continuation = "both"):
    """Replica prediction of the FT generalization error over a grid of ``alpha = N_FT / D``.

    spec : :class:`ftlab.dln.tasks.TaskSpec` (sparsities, overlap, PT magnitudes, FT label noise
    ``spec.noise``, PT label noise ``spec.pt_noise``). c, lam, gamma : PT absolute scale (> 0), PT
    relative scale (normalized, [-1, 1]) and FT readout re-initialization scale (>= 0).
    alpha_pt : PT sample ratio for imperfect pretraining (``None``: oracle PT).
    lambda_reg : explicit regularization (0 = the interpolator gradient flow reaches).
    Other options: see :func:`make_expectation` and :func:`solve_curve`.

    Returns a DataFrame: alpha, error (E_g, per-coordinate MSE, E[beta*^2] = 1), theta0, theta,
    converged, n_iter, residual, branch, n_branches, method.

    Example::

        from ftlab.dln.tasks import TaskSpec
        spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0)
        df = learning_curve(spec, c=1e-3, lam=-0.99, gamma=0.0, alphas=np.linspace(0.01, 0.5, 80))
    """
    expect = make_expectation(spec, c=c, lam=lam, gamma=gamma, alpha_pt=alpha_pt, expectation=expectation,
                              n_nodes=n_nodes, quadrature=quadrature, mc=mc, mc_seed=mc_seed)
    return solve_curve(expect, alphas, noise=spec.noise, lambda_reg=lambda_reg, solver=solver,
                       continuation=continuation)


def _spec(rho_pt, rho_ft, overlap, pt_magnitude="fixed", a_pt=1.0, noise=0.0, pt_noise=0.0, support="exact"):
    from ftlab.dln.tasks import TaskSpec

    return TaskSpec(rho_pt=rho_pt, rho_ft=rho_ft, overlap=overlap, pt_magnitude=pt_magnitude, a_pt=a_pt,
                    noise=noise, pt_noise=pt_noise, support=support)


def curve_records(*, rho_pt: float, rho_ft: float, overlap: float, c: float, lam: float, gamma: float,
                  alphas: list, alpha_pt: float | None = None, pt_magnitude: PtMagnitude = "fixed", a_pt: float = 1.0,
                  noise: float = 0.0, pt_noise: float = 0.0, expectation: Expectation = "quadrature",
                  n_nodes: int = 800, mc: int = 80_000, mc_seed: int = 0) -> list[dict]:
    """One learning curve as a list of records (a top-level function for :func:`ftlab.core.sweep.run_sweep`).

    The sweep point's own keys (e.g. ``alphas``) become columns of the sweep's table; records carry
    ``alpha`` and the solver outputs.
    """
    spec = _spec(rho_pt, rho_ft, overlap, pt_magnitude, a_pt, noise, pt_noise)
    df = learning_curve(spec, c=c, lam=lam, gamma=gamma, alphas=alphas, alpha_pt=alpha_pt, expectation=expectation,
                        n_nodes=n_nodes, mc=mc, mc_seed=mc_seed)
    return df.to_dict("records")


def simulate_point(*, rho_pt: float, rho_ft: float, overlap: float, c: float, lam: float, gamma: float,
                   alpha: float, dim: int, seed: int, alpha_pt: float | None = None, pt_magnitude: PtMagnitude = "fixed",
                   a_pt: float = 1.0, noise: float = 0.0, pt_noise: float = 0.0, method: SimMethod = "implicit") -> dict:
    """FT test error ``||beta_hat - beta*_FT||^2 / D`` of one sampled problem (top-level, picklable).

    method : ``"implicit"``: the exact interpolator ``argmin Q_k s.t. X beta = y`` (the endpoint of FT
    gradient flow, by the paper's implicit-bias theorem), with ``k`` from the PT teacher (oracle PT) or from the PT
    interpolator ``argmin Q_{4c^2}`` on the sampled PT data (``alpha_pt`` given);
    ``"flow"`` / ``"gd"``: :func:`ftlab.dln.simulate.simulate_ptft` (gradient flow / descent of the
    network itself). Teachers use ``support="exact"`` (supports of exact size, the authors' code).
    """
    check_int("dim", dim, 2)
    check_choice("method", method, ("implicit", "flow", "gd"))
    spec = _spec(rho_pt, rho_ft, overlap, pt_magnitude, a_pt, noise, pt_noise)
    if method != "implicit":
        from ftlab.dln.simulate import simulate_ptft

        res = simulate_ptft(spec, c=c, lam=lam, gamma=gamma, alpha_pt=alpha_pt, alpha=alpha, dim=dim, seed=seed,
                            method=method)
        return {"sim_error": float(res.error), "sim_converged": bool(getattr(res, "converged", True))}
    from ftlab.dln.bias import check_scales

    check_scales(c=c, lam=lam, gamma=gamma)
    try:
        return _implicit_point(spec, c=c, lam=lam, gamma=gamma, alpha=alpha, dim=dim, seed=seed, alpha_pt=alpha_pt)
    except np.linalg.LinAlgError as exc:  # a failed interpolator solve is a flagged point, not a lost sweep
        import logging

        logging.getLogger(__name__).warning("interpolator solve failed (alpha=%g, seed=%d): %s", alpha, seed, exc)
        return {"sim_error": float("nan"), "sim_converged": False}


def _implicit_point(spec, *, c, lam, gamma, alpha, dim, seed, alpha_pt):
    from ftlab.dln.bias import solve_implicit_bias
    from ftlab.dln.replica.prior import k_from_pt
    from ftlab.dln.tasks import sample_problem

    prob = sample_problem(spec, alpha=alpha, dim=dim, seed=seed, alpha_pt=alpha_pt)
    beta_pt = prob.beta_pt_star
    ok = True
    if alpha_pt is not None:
        X_pt, y_pt = prob.X_pt, prob.y_pt
        assert X_pt is not None and y_pt is not None
        pt = solve_implicit_bias(X_pt, y_pt, np.full(dim, 4.0 * c**2)) if X_pt.shape[0] < dim else None
        if pt is None:  # over-determined PT: least squares (the lambda_reg -> 0 limit)
            beta_pt = np.linalg.lstsq(X_pt, y_pt, rcond=None)[0]
        else:
            beta_pt, ok = pt.beta, pt.converged
    k = k_from_pt(np.abs(beta_pt), c=c, lam=lam, gamma=gamma)
    if prob.X_ft.shape[0] >= dim:
        beta = np.linalg.lstsq(prob.X_ft, prob.y_ft, rcond=None)[0]
    else:
        res = solve_implicit_bias(prob.X_ft, prob.y_ft, k)
        beta, ok = res.beta, ok and res.converged
    return {"sim_error": float(np.mean((beta - prob.beta_ft_star) ** 2)), "sim_converged": bool(ok)}


def simulate_curve(*, rho_pt: float, rho_ft: float, overlap: float, c: float, lam: float, gamma: float, alphas,
                   dim: int, seeds, alpha_pt: float | None = None, pt_magnitude: PtMagnitude = "fixed", a_pt: float = 1.0,
                   noise: float = 0.0, pt_noise: float = 0.0, method: SimMethod = "implicit", store=None,
                   scheduler=None, workers: int | None = None):
    """Simulated FT error over ``alphas x seeds`` via :func:`ftlab.core.sweep.run_sweep`, aggregated per alpha.

    Returns ``(per_alpha, raw)``: per_alpha has alpha, sim_error_mean, sim_error_lo, sim_error_hi
    (Student-t 95% interval of the mean over seeds), sim_error_ci (half-width), n_seeds (finite runs),
    n_failed (runs whose solver failed or did not converge: flagged, excluded from the mean) and
    sim_converged; raw has one row per (alpha, seed). ``store`` (a .jsonl path) makes the sweep resumable.
    """
    from scipy import stats

    from ftlab.core.sweep import grid, run_sweep

    alphas = check_alphas(alphas)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    fixed = dict(rho_pt=rho_pt, rho_ft=rho_ft, overlap=overlap, c=c, lam=lam, gamma=gamma, dim=int(dim),
                 alpha_pt=alpha_pt, pt_magnitude=pt_magnitude, a_pt=a_pt, noise=noise, pt_noise=pt_noise,
                 method=method)
    points = [{**fixed, **p} for p in grid(alpha=[float(a) for a in alphas], seed=seeds)]
    raw = run_sweep(simulate_point, points, store=store, scheduler=scheduler, workers=workers, desc="simulate")
    rows = []
    for a, g in raw.groupby("alpha", sort=True):
        n_failed = int((~g["sim_converged"].astype(bool)).sum())
        e = g["sim_error"].to_numpy()[g["sim_converged"].to_numpy(dtype=bool)]
        n = len(e)
        half = float(stats.t.ppf(0.975, n - 1) * e.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
        m = float(e.mean())
        rows.append({"alpha": float(a), "sim_error_mean": m, "sim_error_ci": half, "sim_error_lo": m - half,
                     "sim_error_hi": m + half, "n_seeds": n, "n_failed": n_failed,
                     "sim_converged": n_failed == 0})
    import pandas as pd

    return pd.DataFrame(rows), raw

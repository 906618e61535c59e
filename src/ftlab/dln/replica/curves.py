"""Learning curves ``E_g(alpha)``: replica theory along an alpha grid, and matching simulations.

:func:`learning_curve` solves the replica equations on a grid of sample ratios with warm starts,
forward *and* backward (continuation in both directions). Where the two passes land on different
fixed points the curve has several branches: the row keeps the lower-error one (the rule of the
authors' public replica code), says which pass found it (``branch = "forward" | "backward"``) and sets
``n_branches = 2``; otherwise ``branch = "unique"``. Unconverged points are kept and flagged
(``converged = False``), never dropped.

:func:`simulate_curve` measures the same quantity on sampled problems of finite dimension ``D``:
the exact fine-tuning interpolator (``method="implicit"``: ``argmin Q_k s.t. X beta = y`` with the
``k`` of the paper's implicit-bias theorem, which gradient flow converges to) or the network's own
gradient flow / gradient descent (``method="flow" | "gd"``, :func:`ftlab.dln.simulate.simulate_ptft`),
over seeds, through :func:`ftlab.core.sweep.run_sweep`.

Every function takes the task as one :class:`~ftlab.dln.tasks.TaskSpec` and the initialization as
one :class:`~ftlab.dln.model.InitScales`. Sweeps need flat, JSON-able points: :func:`setting_point`
writes a setting as such a point and :func:`split_point` reads it back; :func:`curve_records` and
:func:`simulate_point` are the sweep functions that take these points.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Literal

import numpy as np

from ftlab.core.validate import check_choice, check_int, check_nonnegative, check_positive
from ftlab.dln.model import InitScales, check_setting
from ftlab.dln.replica.expect import MonteCarloExpectation, QuadratureExpectation
from ftlab.dln.replica.prior import ft_prior, sample_prior_mc
from ftlab.dln.replica.solver import FixedPoint, solve_damped, solve_point
from ftlab.dln.tasks import TaskSpec

Solver = Literal["newton", "damped"]
Continuation = Literal["both", "forward"]
SimMethod = Literal["implicit", "flow", "gd"]

__all__ = ["ExpectationOptions", "make_expectation", "solve_curve", "learning_curve", "task_point", "setting_point",
           "split_point", "curve_records", "simulated_error", "simulate_point", "simulate_curve", "check_alphas",
           "CURVE_COLUMNS"]

CURVE_COLUMNS = ["alpha", "error", "theta0", "theta", "converged", "n_iter", "residual", "branch", "n_branches", "method"]


@dataclass(frozen=True)
class ExpectationOptions:
    """How the expectations of the replica equations are computed (docs/replica.md). Validated on construction.

    kind : ``"quadrature"`` (deterministic; ``n_nodes`` points of the ``quadrature`` rule per
        mixture component) or ``"mc"`` (``mc`` samples from the authors' sampler, seeded by ``mc_seed``).
    n_nodes : nodes per component (>= 2; <= 350 for ``"hermite"``). quadrature : ``"legendre"``
        (composite 8-point Gauss-Legendre on [-12, 12] sd, the default) or ``"hermite"``.
    mc : Monte-Carlo samples (>= 1). mc_seed : their seed (>= 0).
    """

    kind: Literal["quadrature", "mc"] = "quadrature"
    n_nodes: int = 800
    quadrature: Literal["legendre", "hermite"] = "legendre"
    mc: int = 80_000
    mc_seed: int = 0

    def __post_init__(self):
        check_choice("expectation", self.kind, ("quadrature", "mc"))
        check_choice("quadrature", self.quadrature, ("legendre", "hermite"))
        check_int("n_nodes", self.n_nodes, 2)
        check_int("mc", self.mc, 1)
        check_int("mc_seed", self.mc_seed, 0)


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


def make_expectation(spec: TaskSpec, scales: InitScales, *, alpha_pt: float | None = None,
                     options: ExpectationOptions | None = None):
    """Expectation operator of the replica equations for a task and initialization.

    alpha_pt : PT sample ratio (``None``: oracle PT). options : how expectations are computed
    (default :class:`ExpectationOptions`: 800-node composite Gauss-Legendre quadrature).
    """
    opts = ExpectationOptions() if options is None else options
    if opts.kind == "mc":
        beta, k, xi = sample_prior_mc(spec, scales, mc=opts.mc, seed=opts.mc_seed, alpha_pt=alpha_pt)
        return MonteCarloExpectation(beta, k, xi)
    mix, _ = ft_prior(spec, scales, alpha_pt=alpha_pt)
    return QuadratureExpectation(mix, n_nodes=opts.n_nodes, kind=opts.quadrature)


def _solve(expect, alpha, noise, lambda_reg, start, solver):
    if solver == "damped":
        return solve_damped(expect, alpha=alpha, noise=noise, lambda_reg=lambda_reg or 1e-6, start=start)
    return solve_point(expect, alpha=alpha, noise=noise, lambda_reg=lambda_reg, start=start)


def _start(fp: FixedPoint | None):
    if fp is None or not fp.converged or fp.theta0 <= 0 or fp.theta <= 0:
        return None
    return fp.theta0, fp.theta


def _row(f: FixedPoint, b: FixedPoint | None) -> dict:
    """One curve row from the forward (``f``) and backward (``b``, or None) solutions at one alpha."""
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
    return asdict(best) | {"branch": branch, "n_branches": n_br}


def solve_curve(expect, alphas, *, noise: float = 0.0, lambda_reg: float = 0.0, solver: Solver = "newton",
                continuation: Continuation = "both"):
    """Solve at every alpha with warm starts; returns a DataFrame with :data:`CURVE_COLUMNS`.

    solver : ``"newton"`` (ftlab's, tolerance 1e-10 on the residuals) or ``"damped"`` (the authors'
    scheme, ``lambda_reg`` defaults to 1e-6). continuation : ``"both"`` (forward and backward passes,
    branch detection) or ``"forward"``.
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
        prev = fwd[i] = _solve(expect, float(alphas[i]), noise, lambda_reg, _start(prev), solver)
    bwd: dict[int, FixedPoint] = {}
    if continuation == "both" and len(alphas) > 1:
        prev = None
        for i in order[::-1]:
            prev = bwd[i] = _solve(expect, float(alphas[i]), noise, lambda_reg, _start(prev), solver)
    rows = [_row(fwd[i], bwd.get(i)) for i in range(len(alphas))]
    return pd.DataFrame(rows)[CURVE_COLUMNS]


def learning_curve(spec: TaskSpec, scales: InitScales, alphas, *, alpha_pt: float | None = None,
                   lambda_reg: float = 0.0, expectation: ExpectationOptions | None = None,
                   continuation: Continuation = "both"):
    """Replica prediction of the FT generalization error over a grid of ``alpha = N_FT / D``.

    spec : the task (sparsities, overlap, PT magnitudes, FT label noise ``spec.noise``, PT label
    noise ``spec.pt_noise``). scales : the initialization (c, lam, gamma). alphas : sample ratios
    (> 0, no duplicates). alpha_pt : PT sample ratio for imperfect pretraining (``None``: oracle PT).
    lambda_reg : explicit regularization (0 = the interpolator gradient flow reaches).
    expectation : see :class:`ExpectationOptions`. continuation : see :func:`solve_curve`.

    Returns a DataFrame: alpha, error (E_g, per-coordinate MSE, E[beta*^2] = 1), theta0, theta,
    converged, n_iter, residual, branch, n_branches, method.

    Example::

        from ftlab.dln import InitScales, TaskSpec
        spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0)
        df = learning_curve(spec, InitScales(c=1e-3, lam=-0.99, gamma=0.0), np.linspace(0.01, 0.5, 80))
    """
    expect = make_expectation(spec, scales, alpha_pt=alpha_pt, options=expectation)
    return solve_curve(expect, alphas, noise=spec.noise, lambda_reg=lambda_reg, continuation=continuation)


#: TaskSpec fields every flat point carries; the others only when they differ from their defaults.
_REQUIRED = ("rho_pt", "rho_ft", "overlap")
_SCALES = ("c", "lam", "gamma")


def task_point(spec: TaskSpec) -> dict:
    """The task part of :func:`setting_point`: ``rho_pt, rho_ft, overlap`` and the non-default fields."""
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"spec must be a TaskSpec, got {type(spec).__name__}")
    return {f.name: getattr(spec, f.name) for f in fields(TaskSpec)
            if f.name in _REQUIRED or getattr(spec, f.name) != f.default}


def setting_point(spec: TaskSpec, scales: InitScales) -> dict:
    """A setting as a flat, JSON-able dict (a sweep point, or the columns of a table).

    Keys: ``rho_pt, rho_ft, overlap``, then every other :class:`~ftlab.dln.tasks.TaskSpec` field
    whose value differs from its default, then ``c, lam, gamma``. :func:`split_point` inverts it.
    """
    check_setting(spec, scales)
    return task_point(spec) | asdict(scales)


def split_point(point: dict) -> tuple[TaskSpec, InitScales, dict]:
    """A flat point -> ``(task, scales, the remaining keys)`` (missing task fields take their defaults)."""
    rest = dict(point)
    task = {f.name: rest.pop(f.name) for f in fields(TaskSpec) if f.name in rest}
    scales = {name: rest.pop(name) for name in _SCALES if name in rest}
    return TaskSpec(**task), InitScales(**scales), rest


def curve_records(**point) -> list[dict]:
    """One learning curve as a list of records: the sweep function of :func:`ftlab.core.sweep.run_sweep`.

    point : a flat setting (:func:`setting_point`) plus ``alphas`` and optionally ``alpha_pt``,
    ``lambda_reg``, ``continuation`` (keywords of :func:`learning_curve`). The point's own keys become
    columns of the sweep's table; records carry ``alpha`` and the solver outputs.
    """
    spec, scales, rest = split_point(point)
    return learning_curve(spec, scales, **rest).to_dict("records")


def simulated_error(spec: TaskSpec, scales: InitScales, *, alpha: float, dim: int, seed: int,
                    alpha_pt: float | None = None, method: SimMethod = "implicit") -> dict:
    """FT test error ``||beta_hat - beta*_FT||^2 / D`` of one sampled problem: ``{"sim_error", "sim_converged"}``.

    method : ``"implicit"``: the exact interpolator ``argmin Q_k s.t. X beta = y`` (the endpoint of FT
    gradient flow, by the paper's implicit-bias theorem), with ``k`` from the PT teacher (oracle PT) or from
    the PT interpolator ``argmin Q_{4c^2}`` on the sampled PT data (``alpha_pt`` given);
    ``"flow"`` / ``"gd"``: :func:`ftlab.dln.simulate.simulate_ptft` (gradient flow / descent of the
    network itself). dim : D (>= 2). A failed interpolator solve gives a flagged point
    (``sim_error`` NaN, ``sim_converged`` False), not an exception.
    """
    from ftlab.dln.simulate import MIN_DIM

    check_setting(spec, scales)
    check_int("dim", dim, MIN_DIM)
    check_choice("method", method, ("implicit", "flow", "gd"))
    if method != "implicit":
        from ftlab.dln.simulate import simulate_ptft

        res = simulate_ptft(spec, scales, alpha_pt=alpha_pt, alpha=alpha, dim=dim, seed=seed, method=method)
        return {"sim_error": float(res.error), "sim_converged": bool(res.converged)}
    try:
        return _interpolator_error(spec, scales, alpha=alpha, dim=dim, seed=seed, alpha_pt=alpha_pt)
    except np.linalg.LinAlgError as exc:  # a failed interpolator solve is a flagged point, not a lost sweep
        import logging

        logging.getLogger(__name__).warning("interpolator solve failed (alpha=%g, seed=%d): %s", alpha, seed, exc)
        return {"sim_error": float("nan"), "sim_converged": False}


def simulate_point(**point) -> dict:
    """:func:`simulated_error` of a flat point: the sweep function of :func:`ftlab.core.sweep.run_sweep`.

    point : a flat setting (:func:`setting_point`) plus ``alpha``, ``dim``, ``seed`` and optionally
    ``alpha_pt`` and ``method``.
    """
    spec, scales, rest = split_point(point)
    return simulated_error(spec, scales, **rest)


def _interpolator_error(spec, scales, *, alpha, dim, seed, alpha_pt):
    from ftlab.dln.bias import k_from_pt, solve_implicit_bias
    from ftlab.dln.tasks import sample_problem

    prob = sample_problem(spec, alpha=alpha, dim=dim, seed=seed, alpha_pt=alpha_pt)
    beta_pt = prob.beta_pt_star
    ok = True
    if alpha_pt is not None:
        X_pt, y_pt = prob.X_pt, prob.y_pt
        assert X_pt is not None and y_pt is not None
        pt = solve_implicit_bias(X_pt, y_pt, np.full(dim, 4.0 * scales.c**2)) if X_pt.shape[0] < dim else None
        if pt is None:  # over-determined PT: least squares (the lambda_reg -> 0 limit)
            beta_pt = np.linalg.lstsq(X_pt, y_pt, rcond=None)[0]
        else:
            beta_pt, ok = pt.beta, pt.converged
    k = k_from_pt(np.abs(beta_pt), c=scales.c, lam=scales.lam, gamma=scales.gamma)
    if prob.X_ft.shape[0] >= dim:
        beta = np.linalg.lstsq(prob.X_ft, prob.y_ft, rcond=None)[0]
    else:
        res = solve_implicit_bias(prob.X_ft, prob.y_ft, k)
        beta, ok = res.beta, ok and res.converged
    return {"sim_error": float(np.mean((beta - prob.beta_ft_star) ** 2)), "sim_converged": bool(ok)}


def simulate_curve(spec: TaskSpec, scales: InitScales, alphas, *, dim: int, seeds, alpha_pt: float | None = None,
                   method: SimMethod = "implicit", **run):
    """Simulated FT error over ``alphas x seeds`` via :func:`ftlab.core.sweep.run_sweep`, aggregated per alpha.

    dim, alpha_pt, method : as in :func:`simulated_error`. seeds : non-empty iterable of ints.
    run : ``store`` (a .jsonl path: the sweep is resumable), ``scheduler``, ``workers``, passed to
    :func:`ftlab.core.sweep.run_sweep`.

    Returns ``(per_alpha, raw)``: per_alpha has alpha, sim_error_mean, sim_error_lo, sim_error_hi
    (Student-t 95% interval of the mean over seeds), sim_error_ci (half-width), n_seeds (finite runs),
    n_failed (runs whose solver failed or did not converge: flagged, excluded from the mean) and
    sim_converged; raw has one row per (alpha, seed) with the point's keys (:func:`setting_point`).
    """
    from scipy import stats

    from ftlab.core.sweep import grid, run_sweep

    alphas = check_alphas(alphas)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds is empty: give at least one seed")
    fixed = setting_point(spec, scales) | {"dim": int(dim), "alpha_pt": alpha_pt, "method": method}
    points = [{**fixed, **p} for p in grid(alpha=[float(a) for a in alphas], seed=seeds)]
    raw = run_sweep(simulate_point, points, desc="simulate", **run)
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

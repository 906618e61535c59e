"""Initialization advisor: which ``(c, lambda, gamma)`` minimizes the predicted fine-tuning error?

Beyond the paper (arXiv 2602.20062): the replica theory (:mod:`ftlab.dln.replica`) predicts the FT
generalization error ``E_g`` for any task statistics and initialization, so the best initialization
can be *searched*. :func:`advise` scans a grid of ``(c, lam, gamma)`` (warm-starting the fixed point
along the grid), refines the best point with Nelder-Mead in transformed coordinates
(``log c``, ``log(1 + lam)``, ``log(gamma + 1e-8)``), and also reports the error at the four regime
corners :data:`ftlab.dln.regimes.REGIME_CORNERS` (c = 1e-3):

    I  (rich, PT-independent):  lam = -1,    gamma = 1e-3   (sqrt(k) = gamma^2 on every coordinate)
    II (lazy, PT-dependent):    lam = 0,     gamma = 0
    III (lazy, PT-independent): lam = 0,     gamma = 10
    IV (rich, PT-dependent):    lam = -0.99, gamma = 0

The regime of a setting is the one of :func:`ftlab.dln.regimes.metrics` at ``|beta_PT| = a_pt``
(typical PT magnitude) and ``|beta_FT| = 1/sqrt(rho_FT)`` (typical FT magnitude) -- a convention of
ftlab [U]. :func:`phase_diagram` maps the best corner over ``(omega, rho_FT / rho_PT)`` at fixed alpha.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ftlab.core.validate import check_positive
from ftlab.dln.model import InitScales, check_setting
from ftlab.dln.regimes import CORNER_C, REGIME_CORNERS, metrics
from ftlab.dln.replica.curves import ExpectationOptions, make_expectation, task_point
from ftlab.dln.replica.solver import FixedPoint, solve_point
from ftlab.dln.tasks import TaskSpec

__all__ = ["CORNERS", "Advice", "predicted_error", "advise", "phase_diagram", "phase_row", "regime_of"]

#: The four regime corners as initializations (c = CORNER_C).
CORNERS: dict[str, InitScales] = {
    name: InitScales(c=CORNER_C, lam=lam, gamma=gamma) for name, (lam, gamma) in REGIME_CORNERS.items()
}
#: The advisor's expectations: 400-node composite Gauss-Legendre (about 2.5e-4 accuracy, docs/replica.md).
EXPECTATION = ExpectationOptions(n_nodes=400)

DEFAULT_C = tuple(float(x) for x in np.geomspace(1e-6, 1.0, 7))
DEFAULT_LAM = (-0.999999, -0.9999, -0.999, -0.99, -0.9, -0.5, 0.0, 0.5, 0.99)
DEFAULT_GAMMA = (0.0, 1e-3, 1e-2, 0.1, 1.0, 10.0)


@dataclass(frozen=True)
class Advice:
    """Result of :func:`advise`.

    scales : the best initialization found. error : its predicted E_g. regime : its regime (I-IV).
    corners : ``{regime: predicted E_g}`` at the four corners. grid : DataFrame of every scanned setting
    (c, lam, gamma, error, converged). Only converged fixed points are candidates.
    """

    scales: InitScales
    error: float
    regime: str
    corners: dict
    grid: object


def regime_of(spec: TaskSpec, scales: InitScales) -> str:
    """Regime label of a setting at typical magnitudes (see module doc)."""
    check_setting(spec, scales)
    b_ft = 1.0 / math.sqrt(spec.rho_ft) if spec.rho_ft > 0 else 1.0
    return str(metrics(beta_pt=spec.a_pt, beta_ft=b_ft, **asdict(scales)).regime)


def predicted_error(spec: TaskSpec, scales: InitScales, *, alpha: float, alpha_pt: float | None = None,
                    start=None) -> FixedPoint:
    """Replica E_g at one setting (expectations :data:`EXPECTATION`); ``start`` warm-starts ``(theta0, theta)``."""
    expect = make_expectation(spec, scales, alpha_pt=alpha_pt, options=EXPECTATION)
    return solve_point(expect, alpha=alpha, noise=spec.noise, start=start)


def _scan(spec, alpha, alpha_pt, grids):
    """Every setting of the grid (the zero saddle lam = -1, gamma = 0 skipped), warm-started along lam."""
    import pandas as pd

    c_grid, lam_grid, gamma_grid = grids
    rows = []
    for c in c_grid:
        for gamma in gamma_grid:
            start = None
            for lam in lam_grid:
                if lam <= -1.0 and gamma == 0.0:
                    continue
                fp = predicted_error(spec, InitScales(c=c, lam=lam, gamma=gamma), alpha=alpha, alpha_pt=alpha_pt,
                                     start=start)
                start = (fp.theta0, fp.theta) if fp.converged and fp.theta0 > 0 and fp.theta > 0 else None
                rows.append({"c": c, "lam": lam, "gamma": gamma, "error": fp.error, "converged": fp.converged})
    return pd.DataFrame(rows)


def _refine(spec, alpha, alpha_pt, grids, best: InitScales, err: float) -> tuple[InitScales, float]:
    """Nelder-Mead from ``best`` in (log c, log(1 + lam), log(gamma + 1e-8)), bounded to the grid's ranges."""
    from scipy.optimize import minimize

    c_grid, lam_grid, gamma_grid = grids
    lo = np.array([math.log(min(c_grid)), math.log(1e-7), math.log(1e-8)])
    hi = np.array([math.log(max(c_grid)), math.log(1.0 + max(lam_grid)), math.log(max(gamma_grid) + 1e-8)])

    def unpack(x):
        x = np.clip(x, lo, hi)
        return math.exp(x[0]), math.exp(x[1]) - 1.0, max(math.exp(x[2]) - 1e-8, 0.0)

    def f(x):
        cc, ll, gg = unpack(x)
        if ll <= -1.0 and gg == 0.0:
            return math.inf
        fp = predicted_error(spec, InitScales(c=cc, lam=ll, gamma=gg), alpha=alpha, alpha_pt=alpha_pt)
        return fp.error if fp.converged else math.inf

    x0 = np.array([math.log(best.c), math.log(1.0 + best.lam), math.log(best.gamma + 1e-8)])
    res = minimize(f, x0, method="Nelder-Mead", options={"maxfev": 60, "xatol": 1e-2, "fatol": 1e-6})
    if np.isfinite(res.fun) and res.fun < err:
        cc, ll, gg = unpack(res.x)
        return InitScales(c=cc, lam=ll, gamma=gg), float(res.fun)
    return best, err


def advise(spec: TaskSpec, *, alpha: float, alpha_pt: float | None = None, c_grid=DEFAULT_C, lam_grid=DEFAULT_LAM,
           gamma_grid=DEFAULT_GAMMA, refine: bool = True) -> Advice:
    """Search ``(c, lam, gamma)`` minimizing the replica-predicted FT error at sample ratio ``alpha``.

    spec : the task. alpha : FT samples per dimension (> 0).
    alpha_pt : PT samples per dimension (``None``: oracle PT). Grids: values to scan (lam in (-1, 1]).
    refine : polish the best grid point with Nelder-Mead (bounded to the grid's ranges).
    Unconverged settings are excluded from the search (and flagged in ``grid``); the four
    :data:`CORNERS` are candidates too.
    """
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"spec must be a TaskSpec, got {type(spec).__name__}")
    check_positive("alpha", alpha)
    grids = (c_grid, lam_grid, gamma_grid)
    grid = _scan(spec, alpha, alpha_pt, grids)
    ok = grid[grid.converged]
    if ok.empty:
        raise ValueError("the replica equations converged for no setting of the grid; check the task statistics")
    row = ok.loc[ok.error.idxmin()]
    best, err = InitScales(c=float(row.c), lam=float(row.lam), gamma=float(row.gamma)), float(row.error)
    if refine:
        best, err = _refine(spec, alpha, alpha_pt, grids, best, err)
    corners = {}
    for name, scales in CORNERS.items():
        fp = predicted_error(spec, scales, alpha=alpha, alpha_pt=alpha_pt)
        corners[name] = fp.error if fp.converged else math.nan
        if fp.converged and fp.error < err:
            best, err = scales, float(fp.error)
    return Advice(scales=best, error=err, regime=regime_of(spec, best), corners=corners, grid=grid)


def phase_row(*, overlap: float, ratios: list, alpha: float, alpha_pt: float | None = None, **task) -> list[dict]:
    """One row (fixed omega) of :func:`phase_diagram`: the best regime corner for each rho_FT/rho_PT.

    task : the other :class:`~ftlab.dln.tasks.TaskSpec` fields (``rho_pt`` and any non-default ones);
    ``rho_ft = ratio * rho_pt``. Infeasible statistics (omega rho_FT > rho_PT, or rho_FT > 1) give
    ``best = None`` and NaN errors. Top-level and picklable: a point of :func:`ftlab.core.sweep.run_sweep`.
    """
    out = []
    for r in ratios:
        rec: dict[str, Any] = {"ratio": float(r)}
        try:
            spec = TaskSpec(**task, rho_ft=float(r) * task["rho_pt"], overlap=overlap)
        except ValueError:
            out.append(rec | {"best": None} | {f"error_{n}": math.nan for n in CORNERS})
            continue
        errs = {}
        for name, scales in CORNERS.items():
            fp = predicted_error(spec, scales, alpha=alpha, alpha_pt=alpha_pt)
            errs[name] = fp.error if fp.converged else math.nan
        finite = {k: v for k, v in errs.items() if np.isfinite(v)}
        rec["best"] = min(finite, key=lambda k: finite[k]) if finite else None
        out.append(rec | {f"error_{n}": v for n, v in errs.items()})
    return out


def phase_diagram(base: TaskSpec, *, alpha: float, overlaps, ratios, alpha_pt: float | None = None, **run):
    """Best regime corner over (omega, rho_FT/rho_PT) at fixed alpha; a tidy DataFrame via run_sweep.

    base : the task whose other statistics are kept (rho_PT, PT magnitudes, label noises); its
    ``rho_ft`` and ``overlap`` are replaced by the grid. run : ``store``, ``scheduler``, ``workers``
    of :func:`ftlab.core.sweep.run_sweep`.
    Columns: overlap, rho_pt and the non-default task statistics, alpha, alpha_pt, ratio,
    best (I-IV or None if infeasible), error_I .. error_IV.
    """
    from ftlab.core.sweep import run_sweep

    if not isinstance(base, TaskSpec):
        raise TypeError(f"base must be a TaskSpec, got {type(base).__name__}")
    check_positive("rho_pt", base.rho_pt)
    check_positive("alpha", alpha)
    ratios = [float(r) for r in ratios]
    task = {k: v for k, v in task_point(base).items() if k not in ("rho_ft", "overlap")}
    points = [{"overlap": float(o), "ratios": ratios, **task, "alpha": alpha, "alpha_pt": alpha_pt} for o in overlaps]
    df = run_sweep(phase_row, points, desc="phase diagram", **run)
    return df.drop(columns=["ratios"])

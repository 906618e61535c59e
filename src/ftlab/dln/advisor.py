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
from dataclasses import dataclass
from typing import Any

import numpy as np

from ftlab.core.validate import check_positive
from ftlab.dln.regimes import CORNER_C, REGIME_CORNERS
from ftlab.dln.replica.expect import QuadratureExpectation
from ftlab.dln.replica.prior import ft_prior
from ftlab.dln.replica.solver import solve_point

__all__ = ["CORNERS", "Advice", "predicted_error", "advise", "phase_diagram", "phase_row", "regime_of"]

CORNERS: dict[str, tuple[float, float, float]] = {
    name: (CORNER_C, lam, gamma) for name, (lam, gamma) in REGIME_CORNERS.items()
}

DEFAULT_C = tuple(float(x) for x in np.geomspace(1e-6, 1.0, 7))
DEFAULT_LAM = (-0.999999, -0.9999, -0.999, -0.99, -0.9, -0.5, 0.0, 0.5, 0.99)
DEFAULT_GAMMA = (0.0, 1e-3, 1e-2, 0.1, 1.0, 10.0)


@dataclass(frozen=True)
class Advice:
    """Result of :func:`advise`.

    c, lam, gamma : best initialization found. error : its predicted E_g. regime : its regime (I-IV).
    corners : ``{regime: predicted E_g}`` at the four corners. grid : DataFrame of every scanned setting
    (c, lam, gamma, error, converged). converged : the best point's fixed point converged.
    """

    c: float
    lam: float
    gamma: float
    error: float
    regime: str
    corners: dict
    grid: object
    converged: bool


def regime_of(spec, *, c: float, lam: float, gamma: float) -> str:
    """Regime label of a setting at typical magnitudes (see module doc)."""
    from ftlab.dln.regimes import metrics

    b_ft = 1.0 / math.sqrt(spec.rho_ft) if spec.rho_ft > 0 else 1.0
    return str(metrics(beta_pt=spec.a_pt, beta_ft=b_ft, c=c, lam=lam, gamma=gamma).regime)


def predicted_error(spec, *, c: float, lam: float, gamma: float, alpha: float, alpha_pt: float | None = None,
                    start=None, n_nodes: int = 400):
    """Replica E_g at one setting; returns the :class:`~ftlab.dln.replica.solver.FixedPoint`."""
    mix, _ = ft_prior(spec, c=c, lam=lam, gamma=gamma, alpha_pt=alpha_pt)
    return solve_point(QuadratureExpectation(mix, n_nodes=n_nodes), alpha=alpha, noise=spec.noise, start=start)


def advise(spec, *, alpha: float, alpha_pt: float | None = None, c_grid=DEFAULT_C, lam_grid=DEFAULT_LAM,
           gamma_grid=DEFAULT_GAMMA, refine: bool = True) -> Advice:
    """Search ``(c, lam, gamma)`` minimizing the replica-predicted FT error at sample ratio ``alpha``.

    spec : :class:`ftlab.dln.tasks.TaskSpec`. alpha : FT samples per dimension (> 0).
    alpha_pt : PT samples per dimension (``None``: oracle PT). Grids: values to scan (lam in (-1, 1]).
    refine : polish the best grid point with Nelder-Mead (bounded to the grid's ranges).
    Unconverged settings are excluded from the search (and flagged in ``grid``).
    """
    import pandas as pd
    from scipy.optimize import minimize

    check_positive("alpha", alpha)
    rows = []
    for c in c_grid:
        for gamma in gamma_grid:
            start = None
            for lam in lam_grid:
                if lam <= -1.0 and gamma == 0.0:
                    continue
                fp = predicted_error(spec, c=c, lam=lam, gamma=gamma, alpha=alpha, alpha_pt=alpha_pt, start=start)
                start = (fp.theta0, fp.theta) if fp.converged and fp.theta0 > 0 and fp.theta > 0 else None
                rows.append({"c": c, "lam": lam, "gamma": gamma, "error": fp.error, "converged": fp.converged})
    grid = pd.DataFrame(rows)
    ok = grid[grid.converged]
    if ok.empty:
        raise ValueError("the replica equations converged for no setting of the grid; check the task statistics")
    best = ok.loc[ok.error.idxmin()]
    c, lam, gamma, err, conv = float(best.c), float(best.lam), float(best.gamma), float(best.error), True
    if refine:
        lo = np.array([math.log(min(c_grid)), math.log(1e-7), math.log(1e-8)])
        hi = np.array([math.log(max(c_grid)), math.log(1.0 + max(lam_grid)), math.log(max(gamma_grid) + 1e-8)])

        def unpack(x):
            x = np.clip(x, lo, hi)
            return math.exp(x[0]), math.exp(x[1]) - 1.0, max(math.exp(x[2]) - 1e-8, 0.0)

        def f(x):
            cc, ll, gg = unpack(x)
            if ll <= -1.0 and gg == 0.0:
                return math.inf
            fp = predicted_error(spec, c=cc, lam=ll, gamma=gg, alpha=alpha, alpha_pt=alpha_pt)
            return fp.error if fp.converged else math.inf

        x0 = np.array([math.log(c), math.log(1.0 + lam), math.log(gamma + 1e-8)])
        res = minimize(f, x0, method="Nelder-Mead", options={"maxfev": 60, "xatol": 1e-2, "fatol": 1e-6})
        if np.isfinite(res.fun) and res.fun < err:
            c, lam, gamma = unpack(res.x)
            err = float(res.fun)
    corners = {}
    for name, (cc, ll, gg) in CORNERS.items():
        fp = predicted_error(spec, c=cc, lam=ll, gamma=gg, alpha=alpha, alpha_pt=alpha_pt)
        corners[name] = fp.error if fp.converged else math.nan
        if fp.converged and fp.error < err:  # the corners are candidates too
            c, lam, gamma, err = cc, ll, gg, float(fp.error)
    return Advice(c=c, lam=lam, gamma=gamma, error=err, regime=regime_of(spec, c=c, lam=lam, gamma=gamma),
                  corners=corners, grid=grid, converged=conv)


def phase_row(*, overlap: float, ratios: list, rho_pt: float, alpha: float, alpha_pt: float | None = None,
              noise: float = 0.0, n_nodes: int = 400) -> list[dict]:
    """One row (fixed omega) of :func:`phase_diagram`: the best regime corner for each rho_FT/rho_PT.

    Infeasible statistics (omega rho_FT > rho_PT, or rho_FT > 1) give ``best = None`` and NaN errors.
    Top-level and picklable: a point of :func:`ftlab.core.sweep.run_sweep`.
    """
    from ftlab.dln.tasks import TaskSpec

    out = []
    for r in ratios:
        rec: dict[str, Any] = {"ratio": float(r)}
        rho_ft = float(r) * rho_pt
        try:
            spec = TaskSpec(rho_pt=rho_pt, rho_ft=rho_ft, overlap=overlap, noise=noise)
        except ValueError:
            out.append(rec | {"best": None} | {f"error_{n}": math.nan for n in CORNERS})
            continue
        errs = {}
        for name, (c, lam, gamma) in CORNERS.items():
            fp = predicted_error(spec, c=c, lam=lam, gamma=gamma, alpha=alpha, alpha_pt=alpha_pt, n_nodes=n_nodes)
            errs[name] = fp.error if fp.converged else math.nan
        finite = {k: v for k, v in errs.items() if np.isfinite(v)}
        rec["best"] = min(finite, key=lambda k: finite[k]) if finite else None
        out.append(rec | {f"error_{n}": v for n, v in errs.items()})
    return out


def phase_diagram(*, rho_pt: float, alpha: float, overlaps, ratios, alpha_pt: float | None = None,
                  noise: float = 0.0, store=None, scheduler=None, workers: int | None = None):
    """Best regime corner over (omega, rho_FT/rho_PT) at fixed alpha; a tidy DataFrame via run_sweep.

    Columns: overlap, ratio, best (I-IV or None if infeasible), error_I .. error_IV.
    """
    from ftlab.core.sweep import run_sweep

    check_positive("rho_pt", rho_pt)
    check_positive("alpha", alpha)
    ratios = [float(r) for r in ratios]
    points = [{"overlap": float(o), "ratios": ratios, "rho_pt": rho_pt, "alpha": alpha, "alpha_pt": alpha_pt,
               "noise": noise} for o in overlaps]
    df = run_sweep(phase_row, points, store=store, scheduler=scheduler, workers=workers, desc="phase diagram")
    return df.drop(columns=["ratios"])

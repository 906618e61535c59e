"""What the page draws, as JSON-able dicts computed by the library (no web code here).

Every number comes from one call of :mod:`ftlab.dln` -- :func:`~ftlab.dln.regimes.metrics`,
:func:`~ftlab.dln.bias.q_k` with :func:`~ftlab.dln.bias.k_from_pt`,
:func:`~ftlab.dln.replica.learning_curve`, :func:`~ftlab.dln.advisor.advise`,
:func:`~ftlab.dln.simulate.simulate_ptft` -- and is passed on unrounded (JSON keeps every digit of a
float64), so the page shows the library's numbers. Non-finite values become ``None`` (JSON has no NaN).

* :func:`point_view`: l-order, PD and regime of the current point and of the four regime corners,
  the paths of (l, PD) as lambda or c moves, the regime over the (lambda, c) plane, and the potential.
  Closed forms only: a few milliseconds.
* :func:`curve_view`: the replica learning curve E_g(alpha) of the current knobs (about 0.3 s on one
  core); :func:`corner_view`: those of the four regime corners for the task (cached per task).
* :func:`advice_view`: the advisor's best (c, lambda, gamma) for the task at the current alpha (seconds).
* :func:`simulation_view`: one simulated PT + FT network (gradient flow or GD) at one alpha and seed.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict
from typing import cast

import numpy as np

from ftlab.core.validate import check_choice, check_int
from ftlab.dln.bias import k_from_pt, q_k
from ftlab.dln.regimes import CORNER_C, REGIME_CORNERS, REGIMES, metrics
from ftlab.explore.knobs import Knobs

__all__ = ["ALPHA_GRID", "PHASE_LAM", "PHASE_LOG10_C", "REGIME_ORDER", "SIM_METHODS", "MAX_SIM_DIM", "advice_view",
           "corner_view", "curve_alphas", "curve_view", "point_view", "simulation_view", "sim_plan", "to_json"]

#: The sample ratios of every learning curve on the page: 0.02, 0.04, ..., 0.98 (the current alpha is added).
ALPHA_GRID: tuple[float, ...] = tuple(round(0.02 * i, 10) for i in range(1, 50))
#: lambda values of the (l, PD) path at the current (c, gamma).
LAM_PATH = np.linspace(-1.0, 1.0, 201)
#: c values of the (l, PD) path at the current (lambda, gamma).
C_PATH = np.geomspace(1e-6, 10.0, 141)
#: Axes of the regime map over the (lambda, c) plane: lambda in [-1, 1], log10 c in [-6, 1].
PHASE_LAM = np.linspace(-1.0, 1.0, 81)
PHASE_LOG10_C = np.linspace(-6.0, 1.0, 57)
#: Regime labels in the order of the map's integer codes 0..3.
REGIME_ORDER = ("I", "II", "III", "IV")
#: The potential is drawn for |beta| from |beta_FT| / QK_SPAN to |beta_FT| * QK_SPAN.
QK_SPAN = 1e3
QK_POINTS = 121
#: Simulation methods offered on the page (the network's own training), and the largest dimension D.
SIM_METHODS = ("flow", "gd")
MAX_SIM_DIM = 2000


def to_json(value):
    """``value`` with numpy scalars and arrays turned into Python floats/lists, and non-finite floats into ``None``."""
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, np.ndarray):  # whole arrays at once (an element-wise walk costs more than the maths)
        if value.dtype.kind == "f":
            ok = np.isfinite(value)
            if ok.all():
                return value.tolist()
            out = value.astype(object)
            out[~ok] = None
            return out.tolist()
        if value.dtype.kind in "biuU":
            return value.tolist()
        return to_json(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _metric_fields(m) -> dict:
    return {"l_order": m.l_order, "pd": m.pd, "m": m.m, "l_plus_pd": m.l_plus_pd, "k": m.k, "regime": m.regime}


def _path(knobs: Knobs, *, c, lam) -> dict:
    m = metrics(beta_pt=knobs.beta_pt, beta_ft=knobs.beta_ft, c=c, lam=lam, gamma=knobs.gamma)
    return {"l_order": m.l_order, "pd": m.pd}


def point_view(knobs: Knobs) -> dict:
    """The closed-form view of one point (all arrays as lists, JSON-able).

    Returns ``knobs``; ``metrics`` (l_order, pd, m, l_plus_pd, k, regime, regime_name) at
    ``|beta_PT| = knobs.beta_pt``, ``|beta_FT| = knobs.beta_ft``; ``corners`` {I..IV: c, lam, gamma and
    the same metrics at the corner's scales}; ``lam_path`` (lam (201,), l_order, pd at the current c,
    gamma; lam = -1 left out when gamma = 0, the zero saddle); ``c_path`` (c (141,), l_order, pd at the
    current lam, gamma); ``phase`` (lam (81,), log10_c (57,), regime: 57 x 81 codes into
    ``regimes`` = I..IV, ``None`` at the zero saddle); ``qk`` (z (121,), k_active = k at
    ``|beta_PT|``, k_inactive = k at beta_PT = 0, active/inactive = q_k(z) for both, at = {z, q} at
    ``|beta_FT|`` on the active curve).
    """
    scales = asdict(knobs.scales())
    at = {"beta_pt": knobs.beta_pt, "beta_ft": knobs.beta_ft}
    m = metrics(**at, **scales)
    corners = {name: {"c": CORNER_C, "lam": lam, "gamma": gamma,
                      **_metric_fields(metrics(**at, c=CORNER_C, lam=lam, gamma=gamma))}
               for name, (lam, gamma) in REGIME_CORNERS.items()}
    lam_path = LAM_PATH if knobs.gamma > 0 else LAM_PATH[1:]
    lam_grid, log_c = np.meshgrid(PHASE_LAM, PHASE_LOG10_C)
    saddle = (lam_grid == -1.0) & (knobs.gamma == 0.0)
    reg = metrics(**at, c=10.0**log_c, lam=np.where(saddle, 0.0, lam_grid), gamma=knobs.gamma).regime
    codes = np.vectorize(REGIME_ORDER.index, otypes=[float])(reg)
    codes[saddle] = np.nan
    b_ft = abs(knobs.beta_ft)
    centre = b_ft if b_ft > 0 else 1.0
    z = np.geomspace(centre / QK_SPAN, centre * QK_SPAN, QK_POINTS)
    k_active = float(k_from_pt(knobs.beta_pt, **scales))
    k_inactive = float(k_from_pt(0.0, **scales))
    view = {
        "knobs": knobs.as_dict(),
        "metrics": _metric_fields(m) | {"regime_name": REGIMES[str(m.regime)]},
        "corners": corners,
        "lam_path": {"lam": lam_path} | _path(knobs, c=knobs.c, lam=lam_path),
        "c_path": {"c": C_PATH} | _path(knobs, c=C_PATH, lam=knobs.lam),
        "phase": {"lam": PHASE_LAM, "log10_c": PHASE_LOG10_C, "regime": codes, "regimes": REGIME_ORDER},
        "qk": {"z": z, "k_active": k_active, "k_inactive": k_inactive, "active": q_k(z, k_active),
               "inactive": q_k(z, k_inactive), "at": {"z": b_ft, "q": float(q_k(b_ft, k_active))}},
    }
    return to_json(view)


def curve_alphas(alpha: float) -> list[float]:
    """The alphas of the current curve: :data:`ALPHA_GRID` plus ``alpha``, sorted."""
    return sorted(set(ALPHA_GRID) | {float(alpha)})


def _curve(df) -> dict:
    return {"alphas": df["alpha"].to_numpy(), "error": df["error"].to_numpy(), "converged": df["converged"].to_numpy()}


def corner_view(knobs: Knobs) -> dict:
    """The replica learning curves of the four regime corners on the task of ``knobs`` (JSON-able).

    Returns {I..IV: alphas (:data:`ALPHA_GRID`), error, converged, c, lam, gamma} with the corners'
    scales :data:`ftlab.dln.advisor.CORNERS`; it depends on the task only (cached per task).
    """
    return _corner_curves(knobs.rho_pt, knobs.rho_ft, knobs.overlap)


@functools.lru_cache(maxsize=64)
def _corner_curves(rho_pt: float, rho_ft: float, overlap: float) -> dict:
    from ftlab.dln.advisor import CORNERS
    from ftlab.dln.replica.curves import learning_curve

    task = Knobs(rho_pt=rho_pt, rho_ft=rho_ft, overlap=overlap).task()
    return to_json({name: _curve(learning_curve(task, scales, list(ALPHA_GRID))) | asdict(scales)
                    for name, scales in CORNERS.items()})


def curve_view(knobs: Knobs) -> dict:
    """The replica learning curve of the current knobs (JSON-able).

    Returns ``alphas`` (:func:`curve_alphas`), ``error`` (E_g, per-coordinate MSE with
    E[beta*_FT^2] = 1) and ``converged`` of :func:`~ftlab.dln.replica.learning_curve` for the current
    task and scales with its default options; ``alpha``, ``error_at_alpha`` and ``converged_at_alpha``
    at the current alpha; ``warning`` (one line, or ``None``) when the replica equations have no
    converged solution at some alpha. The corners' curves are :func:`corner_view`.
    """
    from ftlab.dln.replica.curves import learning_curve

    alphas = curve_alphas(knobs.alpha)
    cur = _curve(learning_curve(knobs.task(), knobs.scales(), alphas))
    i = alphas.index(float(knobs.alpha))
    ok_at = bool(cur["converged"][i])
    n_bad = int(np.sum(~cur["converged"].astype(bool)))
    warning = None
    if not ok_at:
        warning = (f"the replica equations have no converged solution at alpha={knobs.alpha!r} for these knobs "
                   f"(E_g there is not shown)")
    elif n_bad:
        warning = f"the replica equations did not converge at {n_bad} alpha point(s) of the curve (drawn as crosses)"
    return to_json(cur | {"alpha": knobs.alpha, "error_at_alpha": float(cur["error"][i]) if ok_at else None,
                          "converged_at_alpha": ok_at, "warning": warning})


def advice_view(knobs: Knobs) -> dict:
    """The advisor's best initialization for the task at the current alpha (JSON-able).

    :func:`ftlab.dln.advisor.advise` with its defaults (grid scan and Nelder-Mead polish):
    ``c, lam, gamma`` (best scales), ``error`` (predicted E_g), ``regime``, ``corners`` {I..IV: E_g},
    and the ``alpha`` and task it was computed for.
    """
    from ftlab.dln.advisor import advise

    adv = advise(knobs.task(), alpha=knobs.alpha)
    return to_json(asdict(adv.scales) | {"error": adv.error, "regime": adv.regime, "corners": adv.corners,
                                         "alpha": knobs.alpha, "rho_pt": knobs.rho_pt, "rho_ft": knobs.rho_ft,
                                         "overlap": knobs.overlap})


def sim_plan(*, dim, seeds, method: str, alphas) -> tuple[int, int, str, list[float]]:
    """Validate a simulation request: ``dim`` (D in [2, MAX_SIM_DIM]), ``seeds`` (1..20), ``method``
    (:data:`SIM_METHODS`), ``alphas`` (1..20 values > 0). Returns them normalized (alphas sorted, unique)."""
    from ftlab.core.validate import check_memory, check_positive, check_range
    from ftlab.dln.simulate import MIN_DIM, memory_estimate

    dim = check_int("dim", dim, MIN_DIM)
    check_range("dim", dim, MIN_DIM, MAX_SIM_DIM)
    seeds = check_int("seeds", seeds, 1)
    check_range("seeds", seeds, 1, 20)
    check_choice("method", method, SIM_METHODS)
    values = sorted({float(check_positive("alpha", float(a))) for a in alphas})
    if not 1 <= len(values) <= 20:
        raise ValueError(f"sim_alphas has {len(values)} value(s): give 1 to 20 sample ratios > 0")
    check_memory(f"a simulation at dim {dim}, alpha {values[-1]:g}", memory_estimate(dim=dim, alpha=values[-1]))
    return dim, seeds, method, values


def simulation_view(knobs: Knobs, *, alpha: float, seed: int, dim: int, method: str) -> dict:
    """One simulated network (:func:`ftlab.dln.simulate.simulate_ptft`, oracle PT) at ``alpha`` and ``seed``.

    Returns alpha, seed, ``error`` (the trained network's FT error (1/D)||beta_hat - beta*_FT||^2),
    ``error_pred`` (the implicit-bias prediction's), ``distance`` (relative, network to prediction)
    and ``converged``.
    """
    from ftlab.dln.simulate import Method, simulate_ptft

    check_choice("method", method, SIM_METHODS)
    r = simulate_ptft(knobs.task(), knobs.scales(), alpha=alpha, dim=dim, seed=seed, method=cast(Method, method))
    return to_json({"alpha": alpha, "seed": seed, "error": r.error, "error_pred": r.error_pred,
                    "distance": r.distance, "converged": r.converged})

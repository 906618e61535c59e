"""l-order, pretraining dependence (PD) and the regimes I-IV of fine-tuning.

For one coordinate with FT geometry ``k = k(|beta_PT|)`` (:func:`ftlab.dln.bias.k_from_pt`),
Anguita et al. 2026 (arXiv 2602.20062) characterize the fine-tuning penalty by two local log-log
slopes (ftlab evaluates them with the zero-centred definitions of the first author's public note
``zero_func.tex`` in github.com/Nico31415/toy-unlearning):

    l-order  l  = d log q_k(beta_FT) / d log |beta_FT|      (beta_PT fixed)
    PD          = d log q_k(beta_FT) / d log |beta_PT|      (beta_FT fixed)

Closed forms with ``t = 2 |beta_FT| / sqrt(k)`` (derived in docs/dln.md):

    l = t asinh(t) / (1 - sqrt(1 + t^2) + t asinh(t))                       in [1, 2]
    m = d log sqrt(k) / d log |beta_PT|
      = 2(1+lam) b^2/sqrt(c^2+b^2) / (2(1+lam)(c + sqrt(c^2+b^2)) + gamma^2)   in [0, 1),  b = |beta_PT|
    PD = (1 - l) m  in [-1, 0],     l + PD = m + (1 - m) l  in [1, 2].

l = 1 is l1-like (rich, sparse), l = 2 is l2-like (lazy); PD = -1 means the penalty on a coordinate
falls in inverse proportion to |beta_PT| (fully PT-dependent), PD = 0 that PT is irrelevant. Since
``l + PD >= 1``, PD = -1 and l = 1 are never reached together (the paper's trade-off).

Regimes: I rich & PT-independent (l ~ 1, PD ~ 0); II lazy & PT-dependent (2, -1); III lazy &
PT-independent (2, 0); IV rich & PT-dependent (in between). The numeric thresholds of
:func:`regime` are ftlab's convention [U]: *rich* when ``l < l_split`` (default 1.5, the midpoint),
*PT-dependent* when ``PD < pd_split`` (default -0.1).

:data:`REGIME_CORNERS` are ftlab's representative settings at c_PT = 1e-3 (evaluated at
|beta_PT| = |beta_FT| = 1, tested in ``tests/dln/test_dln_regimes.py``):

==========  ==========================  ==============  =========
regime      (lam, gamma)                l               PD
==========  ==========================  ==============  =========
I           (-1, 1e-3)                  1.070           0
II          (0, 0)                      1.887           -0.886
III         (0, 10)                     2.000           -0.020
IV          (-0.99, 0)                  1.230           -0.230
==========  ==========================  ==============  =========

Regime I is lam = -1 exactly with gamma > 0: the fine-tuning first layer restarts at zero, so
``sqrt(k) = gamma^2`` on every coordinate whatever PT learned (PD = 0). The corner of the authors'
draft script ``figure4.py`` (github.com/Nico31415/toy-unlearning), lam = -0.999999 with gamma =
1e-6, is kept as :data:`DRAFT_CORNER_I` for comparison with their figure only: there sqrt(k) is
about 2e-6 on PT-active coordinates and 4e-9 elsewhere, a PT-*weighted* l1 (PD = -0.074), not the
PT-independent regime I.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ftlab.core.validate import check_finite
from ftlab.dln.bias import c_ft_from_pt, check_scales

__all__ = ["CORNER_C", "DRAFT_CORNER_I", "REGIMES", "REGIME_COLORS", "REGIME_CORNERS", "Metrics", "l_order",
           "l_order_of_t", "metrics", "pretraining_dependence", "pt_sensitivity", "regime"]

#: (lam, gamma) of each regime's corner at c_PT = CORNER_C (see the module docstring) -- one definition
#: shared by the advisor, the experiments and the report.
CORNER_C = 1e-3
REGIME_CORNERS: dict[str, tuple[float, float]] = {
    "I": (-1.0, 1e-3),
    "II": (0.0, 0.0),
    "III": (0.0, 10.0),
    "IV": (-0.99, 0.0),
}
#: The regime-I corner of the authors' draft ``figure4.py`` (c = 1e-3): a PT-weighted l1, kept only to
#: compare with their figure (it is not PT-independent).
DRAFT_CORNER_I: tuple[float, float] = (-0.999999, 1e-6)
#: One colour per regime, used by every figure.
REGIME_COLORS: dict[str, str] = {"I": "#4c72b0", "II": "#dd8452", "III": "#55a868", "IV": "#c44e52"}

REGIMES = {
    "I": "rich, PT-independent (l1)",
    "II": "lazy, PT-dependent (weighted l2)",
    "III": "lazy, PT-independent (l2)",
    "IV": "rich, PT-dependent (reuse and refine)",
}


def l_order_of_t(t) -> np.ndarray:
    """``l(t) = t asinh t / (1 - sqrt(1+t^2) + t asinh t)`` for ``t >= 0``; l(0) = 2, l(inf) = 1.

    Evaluated as ``asinh t / (asinh t - t/(1 + sqrt(1+t^2)))``, and as ``2 - t^2/6`` for t < 1e-4.
    """
    t = np.abs(np.asarray(t, dtype=np.float64))
    big = t > 1.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = 1.0 / np.where(big, t, 1.0)
        # t / (1 + sqrt(1 + t^2)), written so that neither huge nor tiny t loses precision
        frac = np.where(big, 1.0 / (inv + np.hypot(inv, 1.0)), t / (1.0 + np.hypot(1.0, t)))
        ash = np.arcsinh(t)
        out = ash / (ash - frac)
    out = np.where(t < 1e-4, 2.0 - t * t / 6.0, out)  # series; the ratio loses digits for tiny t
    return np.where(np.isinf(t), 1.0, out)


def _sqrt_k(beta_pt, c, lam, gamma):
    return 2.0 * c_ft_from_pt(np.abs(beta_pt), c=c, lam=lam, gamma=gamma)


#: Largest accepted |beta|: every metric (k included) stays finite in float64 below it.
MAX_BETA = 1e100


def _magnitude(name: str, beta) -> np.ndarray:
    """``|beta|`` as float64, finite and at most :data:`MAX_BETA` (one-line ``ValueError`` otherwise)."""
    b = np.abs(np.asarray(check_finite(name, beta), dtype=np.float64))
    if np.any(b > MAX_BETA):
        raise ValueError(f"{name}={float(np.max(b))!r} is out of range: |{name}| must be <= 1e100")
    return b


def l_order(beta_ft, beta_pt, *, c: float, lam: float, gamma: float) -> np.ndarray:
    """l-order at ``|beta_FT|`` for a coordinate pretrained to ``beta_PT`` (arrays broadcast)."""
    b_ft = _magnitude("beta_ft", beta_ft)
    _magnitude("beta_pt", beta_pt)
    sk = _sqrt_k(beta_pt, c, lam, gamma)
    with np.errstate(divide="ignore"):
        t = np.where(sk > 0, 2.0 * b_ft / np.where(sk > 0, sk, 1.0), np.where(b_ft > 0, np.inf, 0.0))
    return l_order_of_t(t)


def pt_sensitivity(beta_pt, *, c: float, lam: float, gamma: float) -> np.ndarray:
    """``m = d log sqrt(k) / d log |beta_PT|`` in [0, 1)."""
    cc, ll, gg = check_scales(c=c, lam=lam, gamma=gamma)
    return _pt_sensitivity(_magnitude("beta_pt", beta_pt), cc, ll, gg)


def _pt_sensitivity(b: np.ndarray, c: np.ndarray, lam: np.ndarray, gamma: np.ndarray) -> np.ndarray:
    h = np.hypot(c, b)
    # b^2 / h written as b (b / h) (no overflow); the denominator is > 0: check_scales refuses lam = -1, gamma = 0
    return 2.0 * (1.0 + lam) * b * (b / h) / (2.0 * (1.0 + lam) * (c + h) + gamma**2)


def pretraining_dependence(beta_ft, beta_pt, *, c: float, lam: float, gamma: float) -> np.ndarray:
    """Pretraining dependence ``PD = (1 - l) m`` in [-1, 0]."""
    return (1.0 - l_order(beta_ft, beta_pt, c=c, lam=lam, gamma=gamma)) * pt_sensitivity(beta_pt, c=c, lam=lam, gamma=gamma)


def regime(l, pd_value, *, l_split: float = 1.5, pd_split: float = -0.1) -> np.ndarray:
    """Regime label(s) ``"I"``-``"IV"`` from (l, PD); thresholds are ftlab's convention [U] (module docstring)."""
    l = np.asarray(l, dtype=np.float64)
    p = np.asarray(pd_value, dtype=np.float64)
    rich = l < l_split
    dep = p < pd_split
    out = np.where(rich, np.where(dep, "IV", "I"), np.where(dep, "II", "III"))
    return out if out.ndim else out.item()


@dataclass(frozen=True)
class Metrics:
    """Per-setting metrics (arrays broadcast from the inputs, or floats/str for scalar inputs)."""

    l_order: np.ndarray
    m: np.ndarray
    pd: np.ndarray
    l_plus_pd: np.ndarray
    k: np.ndarray
    regime: np.ndarray


def metrics(*, beta_pt, beta_ft, c, lam, gamma) -> Metrics:
    """l-order, m, PD, l + PD, k and the regime; every argument may be an array (they broadcast).

    The regime uses the default thresholds of :func:`regime`; call ``regime(m.l_order, m.pd, ...)``
    for others. For one :class:`~ftlab.dln.model.InitScales` ``s``: ``metrics(..., **dataclasses.asdict(s))``.
    """
    lo = l_order(beta_ft, beta_pt, c=c, lam=lam, gamma=gamma)
    m = pt_sensitivity(beta_pt, c=c, lam=lam, gamma=gamma)
    p = (1.0 - lo) * m
    k = _sqrt_k(beta_pt, c, lam, gamma) ** 2
    reg = regime(lo, p)

    def out(a):
        a = np.asarray(a)
        return a.item() if a.ndim == 0 else a

    return Metrics(out(lo), out(m), out(p), out(lo + p), out(k), reg)

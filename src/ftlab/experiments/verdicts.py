"""One verdict vocabulary for every claim the report judges.

A claim is judged from an *effect* whose sign is the claim's direction (positive = what the paper
claims), estimated with a 95% interval. Four verdicts, the same words in every section:

* **reproduced** -- the effect is significantly positive (two-sided test of effect = 0 at level
  ``alpha`` after Holm's correction across the family of claims judged together);
* **reversed** -- significantly negative: confidently the other way;
* **no effect** -- not significant, and the whole interval lies inside ``[-margin, margin]`` (a
  stated margin of practical irrelevance);
* **inconclusive** -- anything else (the interval is too wide to tell).

Paired per-seed effects use a one-sample Student-t interval and test (:func:`t_interval`,
:func:`t_pvalue`); correlations use Fisher's z (:func:`correlation_interval`). :func:`holm` adjusts a
family of p-values (Holm 1979). :func:`judge` applies the rule to one claim, :func:`judge_family`
to a family. Deterministic comparisons have no sampling error: a single computed effect is judged by
:func:`judge_exact`, and a contrast of two theory curves over a parameter range (e.g. the sample
ratio alpha) by :func:`judge_curve`, whose "interval" is the range over which the claim holds:

* the *informative* range is where the contrast exceeds ``delta`` in absolute value (where the claimed
  curve and its best competitor tie, e.g. both ~0, the grid point is evidence for neither side);
* **reproduced** if the claim holds on at least half of the informative range (grid points of a
  log-spaced grid, so the share is a share of log-alpha), **reversed** if it holds nowhere there,
  **inconclusive** in between, **no effect** if the informative range is empty.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats as sps

__all__ = ["VERDICTS", "CurveJudgement", "Judgement", "Verdict", "correlation_interval", "holm", "judge", "judge_curve",
           "judge_exact", "judge_family", "ranges", "t_interval", "t_pvalue"]

Verdict = Literal["reproduced", "reversed", "no effect", "inconclusive"]
VERDICTS: tuple[str, ...] = ("reproduced", "reversed", "no effect", "inconclusive")


@dataclass(frozen=True)
class Judgement:
    """A claim's effect (positive = the claimed direction), its 95% interval, p-values and verdict."""

    claim: str
    effect: float
    ci_low: float
    ci_high: float
    p: float
    p_holm: float
    n: int
    margin: float
    verdict: str

    def interval(self, digits: int = 3) -> str:
        """``"+0.012 [-0.003, +0.027]"``."""
        return f"{self.effect:+.{digits}f} [{self.ci_low:+.{digits}f}, {self.ci_high:+.{digits}f}]"


def _clean(values) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the Student-t interval of the mean of the finite ``values`` (nan below 2)."""
    x = _clean(values)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = float(sps.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


def t_pvalue(values) -> float:
    """Two-sided one-sample t-test p-value of mean = 0 (1 for identical zeros; nan below 2 values)."""
    x = _clean(values)
    if x.size < 2:
        return math.nan
    sd = float(x.std(ddof=1))
    if sd == 0:
        return 1.0 if float(x.mean()) == 0 else 0.0
    t = float(x.mean()) / (sd / math.sqrt(x.size))
    return float(2 * sps.t.sf(abs(t), x.size - 1))


def correlation_interval(r: float, n: int, level: float = 0.95) -> tuple[float, float, float]:
    """``(p, low, high)`` for a Pearson correlation ``r`` of ``n`` pairs, by Fisher's z (needs n >= 4)."""
    if n < 4 or not math.isfinite(r):
        return math.nan, math.nan, math.nan
    r = float(np.clip(r, -0.999999, 0.999999))
    z, se = math.atanh(r), 1.0 / math.sqrt(n - 3)
    q = float(sps.norm.ppf(0.5 + level / 2))
    p = float(2 * sps.norm.sf(abs(z) / se))
    return p, math.tanh(z - q * se), math.tanh(z + q * se)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (nan entries stay nan and are not counted in the family)."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


def decide(effect: float, lo: float, hi: float, p_adj: float, *, margin: float, alpha: float = 0.05) -> str:
    """The verdict word for an effect, its interval and its adjusted p-value (see the module docstring)."""
    if not all(math.isfinite(v) for v in (effect, lo, hi)):
        return "inconclusive"
    if math.isfinite(p_adj) and p_adj < alpha:
        return "reproduced" if effect > 0 else "reversed"
    if -margin <= lo and hi <= margin:
        return "no effect"
    return "inconclusive"


def judge(claim: str, values, *, margin: float, p_holm: float | None = None, level: float = 0.95,
          alpha: float = 0.05) -> Judgement:
    """Judge one claim from per-seed paired effects ``values`` (positive = the claimed direction)."""
    m, lo, hi = t_interval(values, level)
    p = t_pvalue(values)
    p_adj = p if p_holm is None else p_holm
    return Judgement(claim, m, lo, hi, p, p_adj, int(_clean(values).size), margin,
                     decide(m, lo, hi, p_adj, margin=margin, alpha=alpha))


def judge_exact(claim: str, effect: float, *, margin: float) -> Judgement:
    """Judge a deterministic effect (e.g. a difference of two theory curves): no sampling error."""
    p = 0.0 if effect != 0 else 1.0
    verdict = "no effect" if abs(effect) <= margin else ("reproduced" if effect > 0 else "reversed")
    return Judgement(claim, effect, effect, effect, p, p, 0, margin, verdict)


def judge_family(effects: Mapping[str, Sequence[float]], *, margins: Mapping[str, float] | float,
                 level: float = 0.95, alpha: float = 0.05) -> list[Judgement]:
    """Judge a family of claims together: Holm's correction across all of them, then :func:`decide`."""
    names = list(effects)
    raw = [t_pvalue(effects[n]) for n in names]
    adj = holm(raw)
    out = []
    for n, pa in zip(names, adj):
        margin = margins if isinstance(margins, (int, float)) else margins[n]
        out.append(judge(n, effects[n], margin=float(margin), p_holm=pa, level=level, alpha=alpha))
    return out


def ranges(grid: Sequence[float] | np.ndarray, mask) -> list[tuple[float, float]]:
    """Maximal runs of consecutive grid points where ``mask`` is true, as ``(first, last)`` grid values."""
    g = np.asarray(grid, dtype=np.float64)
    m = np.asarray(mask, dtype=bool)
    out: list[tuple[float, float]] = []
    start = None
    for i, on in enumerate(m):
        if on and start is None:
            start = i
        if start is not None and (not on or i == len(m) - 1):
            end = i if on else i - 1
            out.append((float(g[start]), float(g[end])))
            start = None
    return out


@dataclass(frozen=True)
class CurveJudgement:
    """A deterministic curve contrast judged over a grid (see the module docstring).

    ``holds`` and ``informative`` are lists of ``(low, high)`` grid ranges; ``share`` the share of
    informative grid points where the claim holds; ``peak_at``/``peak`` the grid value and contrast
    where the contrast is largest in absolute value (positive = the claimed direction).
    """

    claim: str
    verdict: str
    holds: list[tuple[float, float]]
    informative: list[tuple[float, float]]
    share: float
    peak_at: float
    peak: float

    @staticmethod
    def fmt(rs: list[tuple[float, float]], digits: int = 3) -> str:
        """``"[0.005, 0.08] and [0.2, 0.3]"`` (or ``"nowhere"``)."""
        if not rs:
            return "nowhere"
        return " and ".join(f"[{lo:.{digits}g}, {hi:.{digits}g}]" for lo, hi in rs)


def judge_curve(claim: str, grid: Sequence[float] | np.ndarray, contrast, *, delta: float = 1e-3,
                majority: float = 0.5) -> CurveJudgement:
    """Judge a claim from a deterministic contrast curve (positive = the claim holds) on ``grid``.

    Points with ``|contrast| <= delta`` are not informative (a tie).
    """
    c = np.asarray(contrast, dtype=np.float64)
    inf = np.abs(c) > delta
    holds = inf & (c > 0)
    n_inf = int(inf.sum())
    share = float(holds.sum() / n_inf) if n_inf else math.nan
    if n_inf == 0:
        verdict = "no effect"
    elif share >= majority:
        verdict = "reproduced"
    elif share == 0:
        verdict = "reversed"
    else:
        verdict = "inconclusive"
    i = int(np.nanargmax(np.where(inf, np.abs(c), -1.0))) if n_inf else 0
    return CurveJudgement(claim, verdict, ranges(grid, holds), ranges(grid, inf), share, float(np.asarray(grid)[i]),
                          float(c[i]))

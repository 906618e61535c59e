"""One verdict vocabulary and one rule for every claim ftlab judges.

Vocabulary
----------
A claim is judged from an *effect* whose sign is the claim's direction (positive = what the paper
claims), estimated with an interval. The same words in every section:

* **reproduced** -- the effect is significantly positive (level ``alpha`` after Holm's correction
  across the family of claims judged together);
* **reversed** -- significantly negative: confidently the other way;
* **no effect** -- not significant, and the *family-level* interval (level ``1 - alpha/m`` for a
  family of ``m`` claims, the level at which "reproduced" is judged) lies inside
  ``[-margin, margin]``, a stated margin of practical irrelevance;
* **inconclusive** -- anything else: fewer seeds than :data:`MIN_SEEDS`, or an interval too wide.

Two words replace a verdict where the claim cannot be judged as stated (:data:`NOT_JUDGED`):

* **task-dependent** -- a claim pooled over strata (tasks, architectures) that is not significant on
  the pool while the strata disagree (Cochran's Q significant at ``alpha`` and I^2 >= 50%,
  :func:`heterogeneity`) and at least one stratum's mean effect lies outside ``[-margin, margin]``:
  an average of practically relevant, different effects is neither "no effect" nor a lack of seeds
  (strata that differ only inside the margin do not stop a "no effect");
* **outside the premise** -- more than ``premise_tolerance`` of the runs behind the claim missed the
  premise the claim presupposes (e.g. a training-loss target); the fraction is always reported.

The project's rule (:func:`judge_claims`), fixed before the data are seen
----------------------------------------------------------------------------
1. **Evidence** is one paired effect per seed (the runs of a seed differ only in the knob). A claim
   that pools several rows takes, per seed, the equal-weight mean over its strata
   (:func:`pool_strata`): a stratified paired test over seeds; the per-stratum effects, Q and I^2 are
   reported beside it (:func:`heterogeneity`).
2. **Test**: the exact sign-flip (paired permutation) test of "effect = 0" (:func:`sign_flip_test`).
   Under the null each seed's effect is symmetric about 0, so flipping signs leaves its distribution
   unchanged; the p-value counts the sign vectors whose sum is at least as extreme (equal-tailed,
   two-sided). All 2^n sign vectors for n <= 16; above, a random subgroup of 2^16 of them, which keeps
   the level exact (a randomization test over a subgroup is exact). The 95% interval inverts the same
   test: its ends are order statistics of the means of the subsets a sign vector flips (Hartigan 1969,
   JASA 64:1303), so "0 outside the interval" and "p <= 0.05" coincide. Zero-variance and tied
   differences need no special case: two seeds with identical differences give p = 0.5 and an
   unbounded interval, never a degenerate ``[d, d]`` with p = 0.
3. **Minimum seeds** :data:`MIN_SEEDS` = 6: below it the verdict is inconclusive whatever the
   numbers. 2^(1-n) is the smallest two-sided p the exact test can give (0.0625 at 5 seeds, 0.031 at 6).
4. **Holm** (Holm 1979) over the family: every claim declared in it counts, those with too few seeds
   included. A claim in two parts that both must hold (e.g. "compresses *and* stays aligned") is an
   intersection-union test (Berger 1982): its p-value for "reproduced" is the larger of the part
   p-values (:class:`Evidence` ``requires``), which keeps the level without a further correction.
5. **No effect** at the family level, as in the vocabulary above; **task-dependent** and **outside the
   premise** as above.
6. **Seeds by power**: :func:`seeds_for_power` and :func:`minimal_detectable_effect` use the paired
   t-test's power (noncentral t) at the Bonferroni level ``alpha/m`` (a lower bound on Holm's power),
   from a pilot's per-seed standard deviation; the sign-flip test's power is close to it from about 10
   seeds on (tested by simulation).

The Student-t settings (:func:`judge_family`, :func:`judge`)
--------------------------------------------------------------
``judge_family`` runs the same engine with a one-sample Student-t test and interval, no minimum of
seeds beyond 2 and a row-level "no effect" interval: the settings of studies recorded with 3-4 seeds
(the transfer accuracy study), at which the exact test could decide nothing. They keep the weaknesses
the rule above removes (identical differences give a zero-width interval and p = 0; "no effect" is
judged below the family level) and are not for new studies.

Correlations use Fisher's z (:func:`correlation_interval`). Deterministic comparisons have no
sampling error: a single computed effect is judged by :func:`judge_exact`, and a contrast of two
theory curves over a parameter range (e.g. the sample ratio alpha) by :func:`judge_curve`, whose
"interval" is the range over which the claim holds:

* the *informative* range is where the contrast exceeds ``delta`` in absolute value (where the claimed
  curve and its best competitor tie, e.g. both ~0, the grid point is evidence for neither side);
* **reproduced** if the claim holds on at least half of the informative range (grid points of a
  log-spaced grid, so the share is a share of log-alpha), **reversed** if it holds nowhere there,
  **inconclusive** in between, **no effect** if the informative range is empty.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import optimize as spo
from scipy import stats as sps

__all__ = ["DECIDED", "MIN_SEEDS", "NOT_JUDGED", "PREMISE_TOLERANCE", "VERDICTS", "CurveJudgement", "Evidence",
           "Heterogeneity", "Judgement", "PairedTest", "Verdict", "correlation_interval", "decide", "heterogeneity",
           "holm", "judge", "judge_claims", "judge_curve", "judge_exact", "judge_family", "minimal_detectable_effect",
           "pool_strata", "power", "ranges", "seeds_for_power", "sign_flip_test", "t_interval", "t_pvalue"]

Verdict = Literal["reproduced", "reversed", "no effect", "inconclusive", "task-dependent", "outside the premise"]
DECIDED: tuple[str, ...] = ("reproduced", "reversed", "no effect")
NOT_JUDGED: tuple[str, ...] = ("task-dependent", "outside the premise")
VERDICTS: tuple[str, ...] = (*DECIDED, "inconclusive", *NOT_JUDGED)
MIN_SEEDS = 6
PREMISE_TOLERANCE = 0.05
GROUP_LOG2 = 16  # exact enumeration up to 2^16 sign vectors; a random subgroup of that size above


# ----------------------------------------------------------------------------------------- tests
def _clean(values) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).ravel()
    return x[np.isfinite(x)]


@dataclass(frozen=True)
class PairedTest:
    """A paired test over seeds: mean effect, interval at ``level``, two-sided p of effect = 0, ``n``
    seeds and the method (``"sign-flip"``, ``"sign-flip subgroup"`` or ``"t"``)."""

    mean: float
    low: float
    high: float
    p: float
    n: int
    method: str


@functools.lru_cache(maxsize=64)
def _flip_sets(n: int) -> np.ndarray:
    """Boolean ``(N, n)``: row g marks the seeds whose sign vector g flips. All ``2^n`` subsets for
    ``n <= GROUP_LOG2``, else the subgroup (under symmetric difference) spanned by ``GROUP_LOG2``
    random subsets drawn from a fixed generator (deterministic for ``n``)."""
    if n <= GROUP_LOG2:
        gens = np.eye(n, dtype=bool)
    else:
        gens = np.random.default_rng([2026, n]).random((GROUP_LOG2, n)) < 0.5
    sets = np.zeros((1, n), dtype=bool)
    for g in gens:
        sets = np.concatenate([sets, sets ^ g])
    sets.setflags(write=False)
    return sets


def _flip_sums(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sets = _flip_sets(x.size)
    return sets.astype(np.float64) @ x, sets.sum(axis=1)


def _one_sided(x: np.ndarray, sums: np.ndarray) -> tuple[float, float]:
    """``(P(T >= t_obs), P(T <= t_obs))`` over the sign vectors, T = sum of signed values."""
    tol = 1e-12 * max(1.0, float(np.abs(x).sum()))
    return float(np.mean(sums <= tol)), float(np.mean(sums >= -tol))


def sign_flip_test(values, *, level: float = 0.95) -> PairedTest:
    """Exact sign-flip test of mean = 0 and its inverted interval (see the module docstring).

    ``values``: per-seed paired effects (non-finite entries dropped). Returns nan for no value; the
    interval is unbounded (``-inf``/``inf``) when the seeds are too few for ``level``."""
    x = _clean(values)
    n = int(x.size)
    method = "sign-flip" if n <= GROUP_LOG2 else "sign-flip subgroup"
    if n == 0:
        return PairedTest(math.nan, math.nan, math.nan, math.nan, 0, method)
    sums, sizes = _flip_sums(x)
    up, down = _one_sided(x, sums)
    p = min(1.0, 2 * min(up, down))
    n_sets = sums.size
    empty = int(np.sum(sizes == 0))
    means = np.sort(sums[sizes > 0] / sizes[sizes > 0])
    j = math.floor((1 - level) * n_sets / 2 - empty + 1e-9) + 1
    if j < 1:
        lo, hi = -math.inf, math.inf
    else:
        lo, hi = float(means[j - 1]), float(means[means.size - j])
    return PairedTest(float(x.mean()), lo, hi, p, n, method)


def _one_sided_p_above(values, bound: float) -> float:
    """Exact sign-flip p of "mean <= bound" against "mean > bound" (small = significantly above)."""
    x = _clean(values) - bound
    if x.size == 0:
        return math.nan
    sums, _ = _flip_sums(x)
    return _one_sided(x, sums)[0]


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
    """Two-sided one-sample t-test p-value of mean = 0 (nan below 2 values). With zero variance the t
    statistic is undefined and the limit is returned: 1 for identical zeros, 0 otherwise -- the
    degenerate case the project's rule (:func:`sign_flip_test`) avoids; kept for the Student-t settings."""
    x = _clean(values)
    if x.size < 2:
        return math.nan
    sd = float(x.std(ddof=1))
    if sd == 0:
        return 1.0 if float(x.mean()) == 0 else 0.0
    t = float(x.mean()) / (sd / math.sqrt(x.size))
    return float(2 * sps.t.sf(abs(t), x.size - 1))


def _t_test(values, level: float) -> PairedTest:
    m, lo, hi = t_interval(values, level)
    return PairedTest(m, lo, hi, t_pvalue(values), int(_clean(values).size), "t")


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


# ------------------------------------------------------------------------------ pooling, Q, I^2
def pool_strata(matrix) -> np.ndarray:
    """Per seed, the equal-weight mean over strata of a ``(n_seeds, n_strata)`` matrix of paired
    effects (nan = missing: averaged over the strata present; a seed with none is dropped)."""
    a = np.asarray(matrix, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"matrix has shape {a.shape}: need (n_seeds, n_strata)")
    ok = np.isfinite(a)
    keep = ok.any(axis=1)
    return np.where(ok, a, 0.0)[keep].sum(axis=1) / ok[keep].sum(axis=1)


@dataclass(frozen=True)
class Heterogeneity:
    """Between-strata heterogeneity: Cochran's Q on ``df`` degrees of freedom, its chi-square p, I^2
    (share of the variation beyond chance, 0..1), and per stratum ``(name, mean, se, n)``."""

    q: float
    df: int
    p: float
    i2: float
    strata: tuple[tuple[str, float, float, int], ...]

    def significant(self, alpha: float = 0.05) -> bool:
        """Q significant at ``alpha`` and I^2 >= 50%."""
        return bool(math.isfinite(self.p) and self.p < alpha and self.i2 >= 0.5)


def heterogeneity(matrix, names: Sequence[str] | None = None, *, se_floor: float = 0.0) -> Heterogeneity:
    """Cochran's Q and I^2 (Higgins & Thompson 2002) of the strata's mean effects, each weighted by
    1/SE^2 with SE = sd over seeds / sqrt(n), floored at ``se_floor`` (e.g. the resolution of the
    measure, so a stratum without variance does not get an infinite weight).

    The strata share seeds, so their estimates are positively correlated in a paired design; Q then
    understates the heterogeneity (the test is conservative)."""
    a = np.asarray(matrix, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"matrix has shape {a.shape}: need (n_seeds, n_strata)")
    labels = list(names) if names is not None else [str(i) for i in range(a.shape[1])]
    rows, means, ses = [], [], []
    for j, name in enumerate(labels):
        x = _clean(a[:, j])
        m = float(x.mean()) if x.size else math.nan
        se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size >= 2 else math.nan
        se = max(se, se_floor) if math.isfinite(se) else se
        rows.append((name, m, se, int(x.size)))
        if math.isfinite(m) and math.isfinite(se):
            means.append(m)
            ses.append(se)
    k = len(means)
    if k < 2:
        return Heterogeneity(math.nan, max(k - 1, 0), math.nan, math.nan, tuple(rows))
    mu, s = np.asarray(means), np.asarray(ses)
    if (s == 0).any():  # some stratum is exact: any difference from it is infinitely significant
        q = 0.0 if np.ptp(mu) == 0 else math.inf
    else:
        w = 1 / s ** 2
        q = float(np.sum(w * (mu - np.sum(w * mu) / np.sum(w)) ** 2))
    df = k - 1
    p = float(sps.chi2.sf(q, df)) if math.isfinite(q) else 0.0
    i2 = 0.0 if q <= df else (1.0 if not math.isfinite(q) else (q - df) / q)
    return Heterogeneity(q, df, p, i2, tuple(rows))


# ---------------------------------------------------------------------------------------- power
def power(effect: float, sd: float, n: int, *, alpha: float = 0.05, m: int = 1) -> float:
    """Power of the two-sided paired t-test at level ``alpha/m`` to detect a mean ``effect`` with
    per-seed standard deviation ``sd`` at ``n`` seeds (noncentral t)."""
    if n < 2 or not (sd > 0):
        return math.nan
    crit = float(sps.t.ppf(1 - alpha / (2 * m), n - 1))
    nc = abs(effect) * math.sqrt(n) / sd
    out = float(sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc))
    if not math.isfinite(out):  # scipy's nct fails far in the tail: the normal approximation of T'
        out = float(sps.norm.sf((crit - nc) / math.sqrt(1 + nc ** 2 / (2 * (n - 1)))))
    return out


def seeds_for_power(effect: float, sd: float, *, alpha: float = 0.05, m: int = 1, target: float = 0.8,
                    min_n: int = MIN_SEEDS, max_n: int = 10_000) -> int:
    """The fewest seeds (at least ``min_n``) with :func:`power` >= ``target``."""
    if not (sd > 0) or effect == 0:
        raise ValueError(f"sd={sd}, effect={effect}: need sd > 0 and a non-zero effect")
    n = max(min_n, 2)
    while power(effect, sd, n, alpha=alpha, m=m) < target:
        n += 1
        if n > max_n:
            raise ValueError(f"effect={effect} needs more than max_n={max_n} seeds at sd={sd}")
    return n


def minimal_detectable_effect(sd: float, n: int, *, alpha: float = 0.05, m: int = 1, target: float = 0.8) -> float:
    """The smallest effect with :func:`power` >= ``target`` at ``n`` seeds (same units as ``sd``)."""
    if n < 2 or not (sd > 0):
        return math.nan
    top = (float(sps.t.ppf(1 - alpha / (2 * m), n - 1)) + 10) * sd / math.sqrt(n)
    for _ in range(60):  # few seeds at a strict level: heavy tails, the bracket may need to grow
        if power(top, sd, n, alpha=alpha, m=m) >= target:
            return float(spo.brentq(lambda e: power(e, sd, n, alpha=alpha, m=m) - target, 1e-9 * sd, top))
        top *= 2
    return math.inf


# ------------------------------------------------------------------------------------- verdicts
@dataclass(frozen=True)
class Judgement:
    """A claim's effect (positive = the claimed direction), its interval at ``level`` (95%), p-values
    and verdict. ``fam_low``/``fam_high``: the interval at the family level ``1 - alpha/m`` that decides
    "no effect"; ``method``: the test; ``het``: heterogeneity of a pooled claim; ``premise_missed``: the
    share of its runs that missed the premise; ``p_requires``: the p-value of a required second part."""

    claim: str
    effect: float
    ci_low: float
    ci_high: float
    p: float
    p_holm: float
    n: int
    margin: float
    verdict: str
    fam_low: float = math.nan
    fam_high: float = math.nan
    method: str = "t"
    het: Heterogeneity | None = None
    premise_missed: float = 0.0
    p_requires: float = math.nan


@dataclass(frozen=True)
class Evidence:
    """What one claim is judged from.

    values : per-seed paired effects (positive = the claimed direction); for a pooled claim, the
        output of :func:`pool_strata` (``strata`` then holds the matrix for :func:`heterogeneity`).
    margin : margin of practical irrelevance (same units).
    strata, strata_names : optional ``(n_seeds, k)`` matrix of per-stratum effects and their names.
    se_floor : floor of a stratum's standard error in :func:`heterogeneity`.
    premise_missed : share (0..1) of the runs behind the claim that missed its premise.
    requires : optional ``(per-seed values, bound)`` of a second part the claim needs: "reproduced"
        also requires these values to be significantly above ``bound`` (intersection-union test).
    """

    values: Sequence[float] | np.ndarray
    margin: float
    strata: np.ndarray | None = None
    strata_names: tuple[str, ...] = ()
    se_floor: float = 0.0
    premise_missed: float = 0.0
    requires: tuple[Sequence[float] | np.ndarray, float] | None = field(default=None)


def decide(effect: float, lo: float, hi: float, p_adj: float, *, margin: float, alpha: float = 0.05) -> str:
    """The verdict word for an effect, the interval that decides "no effect" and an adjusted p-value."""
    if not math.isfinite(effect):
        return "inconclusive"
    if math.isfinite(p_adj) and p_adj < alpha:
        return "reproduced" if effect > 0 else "reversed"
    if math.isfinite(lo) and math.isfinite(hi) and -margin <= lo and hi <= margin:
        return "no effect"
    return "inconclusive"


def _claim_p(test: PairedTest, ev: Evidence) -> tuple[float, float]:
    """The p-value entering Holm (intersection-union with a required part when the effect is positive)
    and the required part's own p."""
    if ev.requires is None:
        return test.p, math.nan
    vals, bound = ev.requires
    p_req = _one_sided_p_above(vals, bound)
    p = test.p if not (test.mean > 0) else max(test.p, p_req if math.isfinite(p_req) else 1.0)
    return p, p_req


def judge_claims(evidence: Mapping[str, Evidence], *, alpha: float = 0.05, level: float = 0.95,
                 min_n: int = MIN_SEEDS, test: Literal["sign-flip", "t"] = "sign-flip",
                 no_effect: Literal["family", "row"] = "family",
                 premise_tolerance: float = PREMISE_TOLERANCE) -> list[Judgement]:
    """Judge a family of claims with the project's rule (module docstring); one :class:`Judgement` per
    key of ``evidence``, in order. ``test``, ``min_n`` and ``no_effect`` exist for the Student-t
    settings of :func:`judge_family`; the defaults are the rule."""
    if min_n < 1:
        raise ValueError(f"min_n={min_n} is out of range: need at least 1")
    names = list(evidence)
    m = max(len(names), 1)
    run = sign_flip_test if test == "sign-flip" else _t_test
    tests = {k: run(evidence[k].values, level=level) for k in names}
    raw = {k: _claim_p(tests[k], evidence[k]) for k in names}
    adj = dict(zip(names, holm([raw[k][0] for k in names])))
    out = []
    for k in names:
        ev, t = evidence[k], tests[k]
        fam = run(ev.values, level=1 - alpha / m) if no_effect == "family" else t
        het = (heterogeneity(ev.strata, ev.strata_names or None, se_floor=ev.se_floor)
               if ev.strata is not None else None)
        if t.n < min_n:
            verdict = "inconclusive"
        elif ev.premise_missed > premise_tolerance:
            verdict = "outside the premise"
        else:
            verdict = decide(t.mean, fam.low, fam.high, adj[k], margin=ev.margin, alpha=alpha)
            relevant = het is not None and any(abs(m) > ev.margin for _, m, _, _ in het.strata if math.isfinite(m))
            if verdict in ("no effect", "inconclusive") and relevant and het.significant(alpha):  # type: ignore[union-attr]
                verdict = "task-dependent"
        out.append(Judgement(k, t.mean, t.low, t.high, raw[k][0], adj[k], t.n, float(ev.margin), verdict,
                             fam.low, fam.high, t.method, het, float(ev.premise_missed), raw[k][1]))
    return out


def judge_family(effects: Mapping[str, Sequence[float]], *, margins: Mapping[str, float] | float,
                 level: float = 0.95, alpha: float = 0.05) -> list[Judgement]:
    """Judge a family with the Student-t settings (module docstring): one-sample t test and interval,
    Holm across the family, "no effect" from each row's own interval, at least 2 seeds."""
    ev = {n: Evidence(v, float(margins if isinstance(margins, (int, float)) else margins[n]))
          for n, v in effects.items()}
    return judge_claims(ev, alpha=alpha, level=level, min_n=2, test="t", no_effect="row")


def judge(claim: str, values, *, margin: float, p_holm: float | None = None, level: float = 0.95,
          alpha: float = 0.05) -> Judgement:
    """Judge one claim from per-seed paired effects with the Student-t settings; ``p_holm`` replaces
    the claim's own p-value when it was adjusted in a family elsewhere."""
    j = judge_family({claim: values}, margins=margin, level=level, alpha=alpha)[0]
    if p_holm is None:
        return j
    verdict = decide(j.effect, j.ci_low, j.ci_high, p_holm, margin=margin, alpha=alpha) if j.n >= 2 else j.verdict
    return Judgement(claim, j.effect, j.ci_low, j.ci_high, j.p, p_holm, j.n, margin, verdict, j.fam_low, j.fam_high,
                     j.method)


def judge_exact(claim: str, effect: float, *, margin: float) -> Judgement:
    """Judge a deterministic effect (e.g. a difference of two theory curves): no sampling error."""
    p = 0.0 if effect != 0 else 1.0
    verdict = "no effect" if abs(effect) <= margin else ("reproduced" if effect > 0 else "reversed")
    return Judgement(claim, effect, effect, effect, p, p, 0, margin, verdict, effect, effect, "exact")


# ------------------------------------------------------------------------------ theory curves
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

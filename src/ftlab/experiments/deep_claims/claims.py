"""Verdicts on the paper's deep-network claims, with intervals over seeds, and the figures.

Every effect is defined so that **positive = the direction the paper claims** and is computed per
seed from paired runs (same pretrained net, data and batch order), then summarized by its mean and a
95% Student-t interval over seeds. Verdict (ftlab's rule): *reproduced* if the interval lies above 0;
*not reproduced* if it lies below ``margin`` (the effect is confidently smaller than a practically
relevant size, or has the opposite sign); *inconclusive* otherwise. ``margin`` is 0.01 (one
percentage point of accuracy) for accuracy effects and 0.1 for correlations (whose interval is
computed on Fisher's z = atanh(r) and mapped back).

Claims (Anguita et al. 2026, spec theory.md Section 6 claim 7 and Section 7.1):

1. relative scale kappa < 1 (earlier layers smaller) improves fine-tuning accuracy vs kappa = 1;
2. decreasing the absolute scale (s < 1) degrades it (the brief's direction), and
3. increasing it (s > 1) degrades it (a third-party summary's direction); both are tested;
4. a smaller readout scale (gamma < gamma_default) helps at intermediate n_FT (grid values other
   than the smallest and largest);
5. successful interventions compress the representation: across interventions, the accuracy gain
   over the baseline correlates negatively with the change of the post-FT participation ratio of
   the penultimate layer (effect = minus the Pearson correlation);
6. ... while keeping it aligned with the pretrained one: the gain correlates positively with the
   change of the normalized ENSD ``ENSD / sqrt(PR_pre PR_post)`` (in [0, 1]) of that layer;
7. Transformers: lower balancedness helps (accuracy at the lowest minus at the highest swept
   balancedness) on new-prime tasks, on reuse tasks, and more on new-prime than on reuse tasks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["Claim", "t_interval", "verdict", "resnet_claims", "modular_claims", "claims_table",
           "plot_resnet_accuracy", "plot_resnet_geometry", "plot_modular"]

GEOMETRY_LAYER = "pool"


@dataclass(frozen=True)
class Claim:
    """One verdict: claim text, verdict, mean effect, 95% interval over seeds, number of seeds."""

    claim: str
    verdict: str
    effect: float
    ci_low: float
    ci_high: float
    seeds: int
    definition: str


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: Student-t interval of the mean of ``values`` (NaN bounds for n < 2)."""
    from scipy import stats

    x = np.asarray([v for v in values if np.isfinite(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    m = float(x.mean())
    if x.size < 2:
        return m, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return m, m - half, m + half


def verdict(lo: float, hi: float, *, margin: float) -> str:
    """``reproduced`` if ``lo > 0``, ``not reproduced`` if ``hi < margin``, else ``inconclusive``."""
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "inconclusive"
    if lo > 0:
        return "reproduced"
    if hi < margin:
        return "not reproduced"
    return "inconclusive"


def _claim(name: str, per_seed: pd.Series, definition: str, margin: float, *, correlation: bool = False) -> Claim:
    if correlation:  # interval on Fisher's z = atanh(r), mapped back into [-1, 1]
        z = np.arctanh(np.clip(per_seed.values.astype(float), -0.999999, 0.999999))
        m, lo, hi = (float(np.tanh(v)) for v in t_interval(z))
    else:
        m, lo, hi = t_interval(per_seed.values)
    return Claim(name, verdict(lo, hi, margin=margin), m, lo, hi, int(np.isfinite(per_seed.values).sum()), definition)


def _paired(ft: pd.DataFrame, metric: str = "acc") -> pd.DataFrame:
    base = ft[ft.intervention == "none"].set_index(["seed", "task", "n_ft"])[metric]
    rest = ft[ft.intervention != "none"].copy()
    rest["diff"] = rest[metric].values - base.reindex(pd.MultiIndex.from_frame(rest[["seed", "task", "n_ft"]])).values
    return rest


def resnet_claims(ft: pd.DataFrame, *, gamma_default: float = 1.0) -> list[Claim]:
    """Claims 1-6 for each fine-tuning task of a ResNet fine-tuning table (see module docs)."""
    out: list[Claim] = []
    d = _paired(ft)
    ns = sorted(ft.n_ft.unique())
    mid = [n for n in ns if n not in (ns[0], ns[-1])] if len(ns) >= 3 else ns
    for task in sorted(ft.task.unique()):
        t = d[d.task == task]

        def seedmean(rows, sign=1.0):
            return (sign * rows.groupby("seed")["diff"].mean()) if len(rows) else pd.Series(dtype=float)

        sel = t[(t.intervention == "kappa") & (t.value < 1)]
        if len(sel):
            out.append(_claim(f"relative scale kappa<1 improves FT accuracy [{task}]", seedmean(sel),
                              "acc(kappa<1) - acc(kappa=1), mean over n_FT and kappa<1 values", 0.01))
        sel = t[(t.intervention == "s") & (t.value < 1)]
        if len(sel):
            out.append(_claim(f"decreasing absolute scale s<1 degrades FT accuracy [{task}]", seedmean(sel, -1.0),
                              "acc(s=1) - acc(s<1), mean over n_FT and s<1 values", 0.01))
        sel = t[(t.intervention == "s") & (t.value > 1)]
        if len(sel):
            out.append(_claim(f"increasing absolute scale s>1 degrades FT accuracy [{task}]", seedmean(sel, -1.0),
                              "acc(s=1) - acc(s>1), mean over n_FT and s>1 values", 0.01))
        sel = t[(t.intervention == "gamma") & (t.value < gamma_default) & t.n_ft.isin(mid)]
        if len(sel):
            out.append(_claim(f"smaller readout scale gamma helps at intermediate n_FT [{task}]", seedmean(sel),
                              f"acc(gamma<{gamma_default:g}) - acc(gamma={gamma_default:g}), mean over n_FT in "
                              f"{[int(n) for n in mid]}", 0.01))
        out += _geometry_claims(ft[ft.task == task], task)
    return out


def _geometry_claims(ft: pd.DataFrame, task: str) -> list[Claim]:
    L = GEOMETRY_LAYER
    col_pre, col_post, col_e = f"pr_pre:{L}", f"pr_post:{L}", f"ensd:{L}"
    if col_post not in ft.columns:
        return []
    g = ft[ft[col_post].notna()].copy()
    g["align"] = g[col_e] / np.sqrt(g[col_pre] * g[col_post])
    rows_pr, rows_al = {}, {}
    for seed, s in g.groupby("seed"):
        base = s[s.intervention == "none"].set_index("n_ft")
        rest = s[s.intervention != "none"]
        if len(rest) < 3 or base.empty:
            continue
        dacc = rest.acc.values - base.acc.reindex(rest.n_ft).values
        dpr = rest[col_post].values - base[col_post].reindex(rest.n_ft).values
        dal = rest["align"].values - base["align"].reindex(rest.n_ft).values
        ok = np.isfinite(dacc) & np.isfinite(dpr) & np.isfinite(dal)
        if ok.sum() >= 3 and np.std(dacc[ok]) > 0:
            rows_pr[seed] = -np.corrcoef(dacc[ok], dpr[ok])[0, 1] if np.std(dpr[ok]) > 0 else math.nan
            rows_al[seed] = np.corrcoef(dacc[ok], dal[ok])[0, 1] if np.std(dal[ok]) > 0 else math.nan
    if not rows_pr:
        return []
    return [
        _claim(f"successful interventions lower the PR of the representation [{task}]", pd.Series(rows_pr),
               f"-corr over interventions of (acc gain, change of post-FT PR at layer '{L}') vs baseline", 0.1,
               correlation=True),
        _claim(f"successful interventions keep ENSD with the pre-FT representation high [{task}]", pd.Series(rows_al),
               f"corr over interventions of (acc gain, change of ENSD/sqrt(PR_pre PR_post) at layer '{L}')", 0.1,
               correlation=True),
    ]


def modular_claims(ft: pd.DataFrame) -> list[Claim]:
    """Claim 7 on a modular fine-tuning table (columns seed, p, kind, ft_frac, balancedness, acc)."""
    lo_b, hi_b = ft.balancedness.min(), ft.balancedness.max()
    if lo_b == hi_b:
        return []
    key = ["seed", "p", "kind", "ft_frac"]
    lo = ft[ft.balancedness == lo_b].set_index(key).acc
    hi = ft[ft.balancedness == hi_b].set_index(key).acc
    d = (lo - hi.reindex(lo.index)).rename("diff").reset_index()
    per = {k: d[d.kind == k].groupby("seed")["diff"].mean() for k in ("new", "reuse")}
    defn = f"acc(b={lo_b:g}) - acc(b={hi_b:g})"
    out = []
    if len(per["new"]):
        out.append(_claim("lower balancedness helps Transformer FT on new-prime tasks", per["new"],
                          defn + ", mean over new-prime tasks", 0.01))
    if len(per["reuse"]):
        out.append(_claim("lower balancedness helps Transformer FT on factor-reuse tasks", per["reuse"],
                          defn + ", mean over reuse tasks", 0.01))
    if len(per["new"]) and len(per["reuse"]):
        out.append(_claim("lower balancedness helps most on new-prime tasks", (per["new"] - per["reuse"]).dropna(),
                          "(" + defn + ")[new primes] - (same)[reuse]", 0.01))
    return out


def claims_table(claims: list[Claim]) -> pd.DataFrame:
    """Claims as a DataFrame with the columns of docs/deep-claims.csv (plus ``definition``)."""
    cols = ["claim", "verdict", "effect", "ci_low", "ci_high", "seeds", "definition"]
    return pd.DataFrame([{c: getattr(x, c) for c in cols} for x in claims], columns=cols)


# ------------------------------------------------------------------------------------------ figures
def _mean_ci(df: pd.DataFrame, by: list[str], col: str) -> pd.DataFrame:
    rows = []
    for k, g in df.groupby(by):
        m, lo, hi = t_interval(g[col].values)
        rows.append({**dict(zip(by, k if isinstance(k, tuple) else (k,))), "mean": m, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def plot_resnet_accuracy(ft: pd.DataFrame, path) -> None:
    """Fine-tuned test accuracy vs n_FT, one panel per (task, knob), a line per value (mean, 95% CI)."""
    from ftlab.core.plotting import new_figure, save_figure

    tasks = sorted(ft.task.unique())
    knobs = [k for k in ("kappa", "s", "gamma") if k in set(ft.intervention)]
    fig, axes = new_figure(len(tasks), max(len(knobs), 1), size=(4.2 * max(len(knobs), 1), 3.3 * len(tasks)))
    axes = np.atleast_2d(axes)
    for i, task in enumerate(tasks):
        for j, knob in enumerate(knobs):
            ax = axes[i, j]
            sub = ft[(ft.task == task) & ft.intervention.isin(["none", knob])].copy()
            sub["label"] = np.where(sub.intervention == "none", "baseline", knob + "=" + sub.value.map("{:g}".format))
            for label, g in _mean_ci(sub, ["label", "n_ft"], "acc").groupby("label"):
                g = g.sort_values("n_ft")
                ax.errorbar(g.n_ft, g["mean"], yerr=[g["mean"] - g.lo, g.hi - g["mean"]], marker="o", ms=3, capsize=2,
                            label=label, lw=2 if label == "baseline" else 1, color="k" if label == "baseline" else None)
            ax.set_xscale("log")
            ax.set_title(f"{task}: {knob}", fontsize=9)
            ax.set_xlabel("n_FT")
            ax.set_ylabel("FT test accuracy")
            ax.legend(fontsize=7)
    save_figure(fig, path)


def plot_resnet_geometry(ft: pd.DataFrame, path) -> None:
    """PR before / after FT and ENSD per layer (mean over seeds), a line per intervention."""
    from ftlab.core.plotting import new_figure, save_figure

    pcols = [c for c in ft.columns if c.startswith("pr_post:")]
    if not pcols:
        return
    layers = [c.split(":", 1)[1] for c in pcols]
    g = ft[ft[pcols[0]].notna()]
    n_geo = int(g.n_ft.min())
    g = g[g.n_ft == n_geo]
    tasks = sorted(g.task.unique())
    fig, axes = new_figure(len(tasks), 3, size=(13, 3.3 * len(tasks)))
    axes = np.atleast_2d(axes)
    for i, task in enumerate(tasks):
        t = g[g.task == task]
        for (knob, val), c in t.groupby(["intervention", "value"]):
            label = "baseline" if knob == "none" else f"{knob}={val:g}"
            for j, key in enumerate(("pr_pre", "pr_post", "ensd")):
                axes[i, j].plot(layers, [c[f"{key}:{L}"].mean() for L in layers], marker="o", ms=3, label=label,
                                lw=2 if knob == "none" else 1, color="k" if knob == "none" else None)
        for j, title in enumerate(("PR before FT", "PR after FT", "ENSD(before, after)")):
            axes[i, j].set_title(f"{task}, n_FT={n_geo}: {title}", fontsize=9)
            axes[i, j].set_yscale("log")
        axes[i, 2].legend(fontsize=6)
    save_figure(fig, path)


def plot_modular(ft: pd.DataFrame, path) -> None:
    """Fine-tuned test accuracy vs balancedness, a line per task modulus (solid: new prime)."""
    from ftlab.core.plotting import new_figure, save_figure

    fig, ax = new_figure(1, 1, size=(5.5, 3.8))
    for (p, kind), g in ft.groupby(["p", "kind"]):
        s = _mean_ci(g, ["balancedness"], "acc").sort_values("balancedness")
        ax.errorbar(s.balancedness, s["mean"], yerr=[s["mean"] - s.lo, s.hi - s["mean"]], marker="o", capsize=2,
                    ls="-" if kind == "new" else "--", label=f"mod {p} ({kind})")
    ax.set_xlabel("balancedness at FT start (||W_E||^2 - ||W_U||^2) / sum")
    ax.set_ylabel("FT test accuracy")
    ax.legend(fontsize=8)
    save_figure(fig, path)

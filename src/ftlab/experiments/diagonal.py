"""The theory paper's diagonal-network claims, computed and judged.

Anguita et al. 2026 (arXiv 2602.20062) make these claims about fine-tuning diagonal linear networks
(the wording is the one ftlab's report quotes, :data:`CLAIMS`):

1. four regimes, set by the initialization through the l-order and PD metrics;
2. a trade-off: PD = -1 and l-order = 1 cannot be reached together;
3. PT and FT sharing their features -> Regime II generalizes best;
4. no shared features -> Regime I generalizes best;
5. FT features a subset of the PT features -> Regime IV generalizes best, reached by an
   intermediate lambda_PT;
6. imperfect pretraining (alpha_PT < 1) -> a negative lambda_PT helps even with full overlap;
7. diagonal-network simulations agree with the theory.

Claims 1-2 are judged exactly from the closed forms of :mod:`ftlab.dln.regimes`. Claims 3-6 compare
replica learning curves (:mod:`ftlab.dln.replica`) over a log-spaced grid of alpha_FT = N_FT / D
from 0.005 to 0.5 -- wide enough to include the small-sample end where the regimes differ most --
and are judged with :func:`ftlab.experiments.verdicts.judge_curve`: the report states over which
alpha range each claim holds. Simulations (the exact FT interpolator ``argmin Q_k s.t. X beta = y``
on sampled problems, paired across regimes by seed) stand beside every curve, and claim 7 counts how
often their 95% interval contains the theory.

Task parameters: rho_PT = 0.1 with PT magnitudes a_PT = 1 on an exact-size support (the authors'
oracle setting in github.com/Nico31415/toy-unlearning, ``experiments/diagonal/replica``) [U]; the
regime corners are :data:`ftlab.dln.regimes.REGIME_CORNERS` at c_PT = 1e-3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ftlab.core.sweep import run_sweep
from ftlab.dln.model import InitScales
from ftlab.dln.regimes import CORNER_C, DRAFT_CORNER_I, REGIME_COLORS, REGIME_CORNERS, metrics
from ftlab.dln.replica.curves import curve_records, setting_point, simulate_point
from ftlab.dln.tasks import TaskSpec
from ftlab.experiments.verdicts import CurveJudgement, judge_curve, judge_exact, t_interval

__all__ = ["CLAIMS", "RHO_PT", "TASKS", "Size", "curves", "judge_tasks", "regime_table", "simulations", "size",
           "tradeoff_sample"]

RHO_PT = 0.1
#: task key -> (label, task statistics); rho_PT = 0.1, PT magnitudes a_PT = 1, no label noise.
TASKS: dict[str, tuple[str, TaskSpec]] = {
    "shared": ("shared features (omega 1, rho_FT 0.1)", TaskSpec(rho_pt=RHO_PT, rho_ft=0.1, overlap=1.0)),
    "new": ("no shared features (omega 0, rho_FT 0.1)", TaskSpec(rho_pt=RHO_PT, rho_ft=0.1, overlap=0.0)),
    "subset": ("FT features a sparse subset of PT features (omega 1, rho_FT 0.01)",
               TaskSpec(rho_pt=RHO_PT, rho_ft=0.01, overlap=1.0)),
}
#: The claimed best regime per task.
CLAIMED = {"shared": "II", "new": "I", "subset": "IV"}
#: claim id -> the claim as ftlab's report quotes it (Anguita et al. 2026, arXiv 2602.20062).
CLAIMS: dict[str, str] = {
    "regimes": "Four regimes of fine-tuning: I rich and PT-independent, II lazy and PT-dependent, III lazy and "
               "PT-independent, IV rich and PT-dependent, characterized by the l-order and PD metrics.",
    "tradeoff": "There is a trade-off: PD = -1 and l-order = 1 cannot be reached together.",
    "shared": "When PT and FT share their features, Regime II generalizes best.",
    "new": "When PT and FT share no features, Regime I generalizes best.",
    "subset": "When the FT features are a subset of the PT features, Regime IV, reached with an intermediate "
              "lambda_PT, generalizes best.",
    "imperfect": "With imperfect pretraining (alpha_PT < 1), a negative lambda_PT helps even with full overlap.",
    "simulation": "Diagonal-network simulations agree with the theory.",
}
#: lambda values of the scan behind claim 5 (gamma = 0), plus the regime-I corner (lambda = -1, gamma > 0).
LAM_SCAN = (-0.99999, -0.9999, -0.999, -0.99, -0.9, -0.5, 0.0)
IMPERFECT = {"alpha_pt": 0.2, "lam_negative": -0.9}


@dataclass(frozen=True)
class Size:
    """Grids of one run: theory alphas (log-spaced), simulated alphas, dimension D and seeds."""

    alphas: tuple[float, ...]
    sim_alphas: tuple[float, ...]
    dim: int
    seeds: tuple[int, ...]
    lam_scan: tuple[float, ...] = LAM_SCAN


def size(full: bool, seed: int = 0) -> Size:
    """Quick: 31 alphas, simulations at D = 500 with 5 seeds; full: 81 alphas, D = 1000, 10 seeds."""
    if full:
        return Size(tuple(np.geomspace(0.005, 0.5, 81)), tuple(np.geomspace(0.01, 0.5, 8)), 1000,
                    tuple(range(seed, seed + 10)))
    return Size(tuple(np.geomspace(0.005, 0.5, 31)), (0.01, 0.03, 0.1, 0.3), 500, tuple(range(seed, seed + 5)))


def _setting(task: str, lam: float, gamma: float, **kw) -> dict:
    """The flat sweep point of a task at the corner scale c = CORNER_C (:func:`ftlab.dln.replica.curves.setting_point`)."""
    return setting_point(TASKS[task][1], InitScales(c=CORNER_C, lam=lam, gamma=gamma)) | kw


def curves(settings: Sequence[dict], alphas: Sequence[float], *, store: Path, workers=None, scheduler=None
           ) -> pd.DataFrame:
    """Replica curves, one resumable sweep point per setting; columns of the setting plus ``alpha``, ``error``."""
    points = [dict(s, alphas=[float(a) for a in alphas]) for s in settings]
    df = run_sweep(curve_records, points, store=store, workers=workers, scheduler=scheduler, desc="replica curves")
    return df.drop(columns=["alphas"])


def simulations(settings: Sequence[dict], alphas: Sequence[float], dim: int, seeds: Sequence[int], *, store: Path,
                workers=None, scheduler=None) -> pd.DataFrame:
    """Per-seed simulated FT errors (exact interpolator) for settings x alphas x seeds (resumable)."""
    points = [dict(s, alpha=float(a), dim=int(dim), seed=int(sd)) for s in settings for a in alphas for sd in seeds]
    return run_sweep(simulate_point, points, store=store, workers=workers, scheduler=scheduler, desc="simulations")


def select(df: pd.DataFrame, setting: dict) -> pd.DataFrame:
    """Rows of ``df`` matching every key of ``setting`` (None matches NaN)."""
    m = np.ones(len(df), dtype=bool)
    for k, v in setting.items():
        if k not in df.columns:
            continue
        m &= df[k].isna().to_numpy() if v is None else np.isclose(df[k].to_numpy(dtype=float), float(v))
    return df[m]


# --------------------------------------------------------------------------------- claims 1-2 (exact)
def regime_table() -> list[dict]:
    """Each corner's (l, PD, regime) at |beta_PT| = |beta_FT| = 1, c = 1e-3, and the draft corner for comparison."""
    rows = []
    for name, (lam, gamma) in [*REGIME_CORNERS.items(), ("I (authors' draft corner)", DRAFT_CORNER_I)]:
        m = metrics(beta_pt=1.0, beta_ft=1.0, c=CORNER_C, lam=lam, gamma=gamma)
        rows.append({"corner": name, "lam": lam, "gamma": gamma, "l_order": float(m.l_order), "pd": float(m.pd),
                     "regime": str(m.regime)})
    return rows


def regimes_judgement(rows: list[dict]):
    """Claim 1: every corner of :data:`REGIME_CORNERS` classifies as its own regime (an exact check)."""
    ok = all(r["regime"] == r["corner"] for r in rows if r["corner"] in REGIME_CORNERS)
    return judge_exact(CLAIMS["regimes"], 1.0 if ok else -1.0, margin=0.0)


def tradeoff_sample(seed: int, n: int = 20_000) -> pd.DataFrame:
    """(l, PD) of ``n`` random settings: c in [1e-6, 1e2], lam in (-1, 1], gamma 0 or [1e-4, 1e2], |beta| in [1e-4, 1e3]."""
    rng = np.random.default_rng(seed)
    c = 10 ** rng.uniform(-6, 2, n)
    lam = rng.uniform(-1, 1, n)
    lam = np.where(lam <= -1.0, 0.0, lam)
    gamma = np.where(rng.random(n) < 0.5, 0.0, 10 ** rng.uniform(-4, 2, n))
    b_pt, b_ft = 10 ** rng.uniform(-4, 3, n), 10 ** rng.uniform(-4, 3, n)
    m = metrics(beta_pt=b_pt, beta_ft=b_ft, c=c, lam=lam, gamma=gamma)
    return pd.DataFrame({"l_order": m.l_order, "pd": m.pd})


def tradeoff_judgement(sample: pd.DataFrame):
    """Claim 2 from the bound ``l + PD >= 1``: the effect is the closest approach to the corner (1, -1)."""
    closest = float(np.min(np.maximum(sample.l_order - 1.0, sample.pd + 1.0)))
    ok = float((sample.l_order + sample.pd).min()) >= 1.0 - 1e-9
    return judge_exact(CLAIMS["tradeoff"], closest if ok else -1.0, margin=0.0), closest


# --------------------------------------------------------------------------------- claims 3-6 (curves)
def corner_settings(tasks: Sequence[str] = tuple(TASKS)) -> list[dict]:
    return [_setting(t, lam, g) for t in tasks for lam, g in REGIME_CORNERS.values()]


def _interp(curve: pd.DataFrame, alphas) -> np.ndarray:
    """A theory curve (rows with ``alpha``, ``error``) read at ``alphas`` (linear interpolation)."""
    d = curve.sort_values("alpha")
    return np.interp(np.asarray(alphas, dtype=np.float64), d.alpha.to_numpy(), d.error.to_numpy())


def _errors(theory: pd.DataFrame, task: str, alphas) -> dict[str, np.ndarray]:
    return {name: _interp(select(theory, _setting(task, lam, g)), alphas) for name, (lam, g) in REGIME_CORNERS.items()}


def _sim_contrast(sims: pd.DataFrame, task: str, claimed: str, other_of_alpha: dict[float, str]) -> list[dict]:
    """Paired per-seed contrasts E_other - E_claimed at each simulated alpha (positive = the claim holds)."""
    rows = []
    lam_c, g_c = REGIME_CORNERS[claimed]
    mine = select(sims, _setting(task, lam_c, g_c))
    for a, other in other_of_alpha.items():
        lam_o, g_o = REGIME_CORNERS[other]
        theirs = select(sims, _setting(task, lam_o, g_o))
        x = mine[np.isclose(mine.alpha, a)].set_index("seed").sim_error
        y = theirs[np.isclose(theirs.alpha, a)].set_index("seed").sim_error
        d = (y - x).dropna()
        m, lo, hi = t_interval(d.to_numpy())
        rows.append({"alpha": a, "other": other, "mean": m, "lo": lo, "hi": hi, "n": len(d)})
    return rows


@dataclass(frozen=True)
class TaskVerdict:
    """Claims 3-5 for one task: the curve judgement, the simulated contrasts, and (claim 5) the lambda scan."""

    task: str
    claimed: str
    judgement: CurveJudgement
    best: list[str]  # best regime at each theory alpha
    sim: list[dict]
    lam_best: list[float] = field(default_factory=list)  # claim 5: best lambda of the scan at each alpha
    lam_judgement: CurveJudgement | None = None

    @property
    def verdict(self) -> str:
        if self.lam_judgement is None:
            return self.judgement.verdict
        both = (self.judgement.verdict, self.lam_judgement.verdict)
        if both == ("reproduced", "reproduced"):
            return "reproduced"
        if "reversed" in both and "reproduced" not in both:
            return "reversed"
        if both == ("no effect", "no effect"):
            return "no effect"
        return "inconclusive"


def judge_tasks(theory: pd.DataFrame, sims: pd.DataFrame, alphas: Sequence[float], sim_alphas: Sequence[float],
                scan: pd.DataFrame | None = None) -> dict[str, TaskVerdict]:
    """Claims 3-5 from the corner curves (and, for the subset task, the lambda scan)."""
    out = {}
    a = np.asarray(alphas, dtype=np.float64)
    for task, claimed in CLAIMED.items():
        e = _errors(theory, task, a)
        others = [r for r in REGIME_CORNERS if r != claimed]
        best_other = np.min([e[r] for r in others], axis=0)
        allv = np.array([e[r] for r in REGIME_CORNERS])
        j = judge_curve(CLAIMS[task], a, best_other - e[claimed])
        best = [list(REGIME_CORNERS)[int(i)] for i in np.argmin(allv, axis=0)]
        e_sim = _errors(theory, task, sim_alphas)
        other_at = {float(s): others[int(np.argmin([e_sim[r][i] for r in others]))] for i, s in enumerate(sim_alphas)}
        sim = _sim_contrast(sims, task, claimed, other_at)
        lam_best: list[float] = []
        lam_j = None
        if task == "subset" and scan is not None:
            grid = np.array(sorted({*LAM_SCAN}))
            E = np.array([_interp(select(scan, _setting(task, lam, 0.0)), a) for lam in grid])
            lam_best = [float(grid[i]) for i in np.argmin(E, axis=0)]
            # intermediate: the scan's optimum lies strictly inside it, and it beats both ends of the lambda axis,
            # the regime-I corner (lambda = -1) and lambda = 0 (regime II)
            ends = np.minimum(e["I"], e["II"])
            inner = np.min(E[:-1], axis=0)  # every scanned lambda strictly inside (-1, 0)
            lam_j = judge_curve("intermediate lambda_PT is optimal", a, ends - inner)
        out[task] = TaskVerdict(task, claimed, j, best, sim, lam_best, lam_j)
    return out


def imperfect_settings() -> list[dict]:
    """Claim 6: full overlap, rho_FT 0.1; lambda 0 and a negative lambda, with imperfect and with oracle PT."""
    lam_n = IMPERFECT["lam_negative"]
    return [_setting("shared", lam, 0.0, alpha_pt=ap) for ap in (IMPERFECT["alpha_pt"], None) for lam in (lam_n, 0.0)]


def judge_imperfect(theory: pd.DataFrame, sims: pd.DataFrame, alphas: Sequence[float], sim_alphas: Sequence[float]):
    """Claim 6: E(lambda = 0) - E(lambda < 0) under imperfect PT (positive = negative lambda helps); the same
    contrast under oracle PT is returned for context (the theory predicts it hurts there)."""
    a = np.asarray(alphas, dtype=np.float64)
    lam_n = IMPERFECT["lam_negative"]
    out = {}
    for ap in (IMPERFECT["alpha_pt"], None):
        en = _interp(select(theory, _setting("shared", lam_n, 0.0, alpha_pt=ap)), a)
        ez = _interp(select(theory, _setting("shared", 0.0, 0.0, alpha_pt=ap)), a)
        j = judge_curve(CLAIMS["imperfect"], a, ez - en)
        sim = []
        sn = select(sims, _setting("shared", lam_n, 0.0, alpha_pt=ap))
        sz = select(sims, _setting("shared", 0.0, 0.0, alpha_pt=ap))
        for s in sim_alphas:
            x = sn[np.isclose(sn.alpha, s)].set_index("seed").sim_error
            y = sz[np.isclose(sz.alpha, s)].set_index("seed").sim_error
            m, lo, hi = t_interval((y - x).dropna().to_numpy())
            sim.append({"alpha": float(s), "mean": m, "lo": lo, "hi": hi})
        out["imperfect" if ap is not None else "oracle"] = (j, sim)
    return out


def agreement(theory: pd.DataFrame, sims: pd.DataFrame, settings: Sequence[dict], *, tol: float = 2e-3) -> pd.DataFrame:
    """Claim 7: per simulated (setting, alpha), the simulation mean and 95% interval beside the theory."""
    rows = []
    for s in settings:
        th = select(theory, s)
        sm = select(sims, s)
        for a, g in sm.groupby("alpha"):
            ok = g.sim_converged.astype(bool).to_numpy()
            m, lo, hi = t_interval(g.sim_error.to_numpy()[ok])
            pred = float(_interp(th, [float(a)])[0])
            half = (hi - lo) / 2 if math.isfinite(hi) else 0.0
            rows.append({**{k: s[k] for k in ("rho_ft", "overlap", "lam", "gamma")}, "alpha_pt": s.get("alpha_pt"),
                         "alpha": float(a), "theory": pred, "sim_mean": m, "sim_lo": lo, "sim_hi": hi,
                         "inside": bool(abs(m - pred) <= half + tol), "n": int(ok.sum())})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------- figures
def plot_tasks(theory: pd.DataFrame, sims: pd.DataFrame, verdicts: dict[str, TaskVerdict], scan: pd.DataFrame | None,
               alphas: Sequence[float], path: Path) -> None:
    """One panel per task (corner curves, simulations, the alpha range where the claim holds) + the lambda scan."""
    from ftlab.core.plotting import new_figure, save_figure

    fig, axes = new_figure(1, 4, size=(20, 4.6))
    for ax, (task, v) in zip(axes, verdicts.items()):
        for name, (lam, g) in REGIME_CORNERS.items():
            th = select(theory, _setting(task, lam, g)).sort_values("alpha")
            col = REGIME_COLORS[name]
            ax.plot(th.alpha, th.error, "-", color=col, lw=1.4, label=f"Regime {name} (lam {lam:g}, gamma {g:g})")
            sm = select(sims, _setting(task, lam, g))
            agg = sm.groupby("alpha").sim_error.apply(lambda e: t_interval(e.to_numpy())).to_dict()
            xs = sorted(agg)
            ms = [agg[x][0] for x in xs]
            err = [[agg[x][0] - agg[x][1] for x in xs], [agg[x][2] - agg[x][0] for x in xs]]
            ax.errorbar(xs, ms, yerr=np.nan_to_num(err), fmt="o", ms=3, color=col, capsize=2, lw=0.8)
        for lo, hi in v.judgement.holds:
            ax.axvspan(lo, hi, color=REGIME_COLORS[v.claimed], alpha=0.08)
        ax.set_xscale("log")
        ax.set_xlabel(r"$\alpha_{FT} = N_{FT}/D$")
        ax.set_ylabel(r"FT error $E_g$")
        ax.set_title(f"{TASKS[task][0]}\nshaded: Regime {v.claimed} best", fontsize=8)
    axes[0].legend(fontsize=6)
    ax = axes[3]
    if scan is not None:
        from matplotlib import colormaps

        cmap = colormaps["viridis"]
        for i, lam in enumerate(LAM_SCAN):
            th = select(scan, _setting("subset", lam, 0.0)).sort_values("alpha")
            ax.plot(th.alpha, th.error, "-", color=cmap(i / max(1, len(LAM_SCAN) - 1)), lw=1.1, label=f"lam {lam:g}")
        lam1, g1 = REGIME_CORNERS["I"]
        th = select(theory, _setting("subset", lam1, g1)).sort_values("alpha")
        ax.plot(th.alpha, th.error, "--", color=REGIME_COLORS["I"], lw=1.2, label=f"Regime I (lam -1, gamma {g1:g})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(r"$\alpha_{FT}$")
        ax.set_ylabel(r"$E_g$ (log)")
        ax.set_title("sparse subset: lambda_PT scan (c 1e-3, gamma 0)", fontsize=8)
        ax.legend(fontsize=6)
    save_figure(fig, path)


def plot_imperfect(theory: pd.DataFrame, sims: pd.DataFrame, path: Path) -> None:
    from ftlab.core.plotting import new_figure, save_figure

    fig, axes = new_figure(1, 2, size=(11, 4.2))
    lam_n = IMPERFECT["lam_negative"]
    for ax, ap, title in zip(axes, (IMPERFECT["alpha_pt"], None), (f"imperfect PT (alpha_PT {IMPERFECT['alpha_pt']:g})",
                                                                   "oracle PT (context)")):
        for lam, col in ((lam_n, REGIME_COLORS["IV"]), (0.0, REGIME_COLORS["II"])):
            s = _setting("shared", lam, 0.0, alpha_pt=ap)
            th = select(theory, s).sort_values("alpha")
            ax.plot(th.alpha, th.error, "-", color=col, label=f"lam {lam:g}")
            agg = select(sims, s).groupby("alpha").sim_error.apply(lambda e: t_interval(e.to_numpy())).to_dict()
            xs = sorted(agg)
            ax.errorbar(xs, [agg[x][0] for x in xs], yerr=np.nan_to_num([[agg[x][0] - agg[x][1] for x in xs],
                                                                        [agg[x][2] - agg[x][0] for x in xs]]),
                        fmt="o", ms=3, color=col, capsize=2)
        ax.set_xscale("log")
        ax.set_xlabel(r"$\alpha_{FT}$")
        ax.set_ylabel(r"$E_g$")
        ax.set_title(f"full overlap, rho_FT 0.1: {title}", fontsize=9)
        ax.legend(fontsize=7)
    save_figure(fig, path)


def plot_agreement(agree: pd.DataFrame, path: Path) -> None:
    from ftlab.core.plotting import new_figure, save_figure

    fig, ax = new_figure(1, 1, size=(5, 4.5))
    lo = np.clip(agree.sim_mean - agree.sim_lo, 0, None).fillna(0)
    hi = np.clip(agree.sim_hi - agree.sim_mean, 0, None).fillna(0)
    ax.errorbar(agree.theory, agree.sim_mean, yerr=[lo, hi], fmt="o", ms=3, alpha=0.7, capsize=1.5)
    top = float(max(agree.theory.max(), agree.sim_mean.max())) * 1.05 + 1e-3
    ax.plot([0, top], [0, top], "k--", lw=1)
    ax.set_xlabel("replica theory E_g")
    ax.set_ylabel("simulation (mean, 95% interval)")
    save_figure(fig, path)

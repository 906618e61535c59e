"""Report section ``replica``: replica learning curves in the layout of the authors' draft figures.

The paper's claims are judged in the ``dln`` section (one verdict each). This section shows the replica
theory against simulation in the panel layout of the first author's public draft scripts
(github.com/Nico31415/toy-unlearning, ``experiments/diagonal/replica/figure3.py`` and ``figure4.py``;
their parameters are [U] for the paper's final figures), the l-order/PD maps, and ftlab's own checks,
each labelled as ftlab's.

Named figures (``ftlab reproduce replica --figure NAME``): ``fig3`` (c, gamma and lambda sweeps of
E_g(alpha)), ``fig4`` (the four regime corners on three task types, with the draft regime-I corner beside
the strict one), ``lorder`` (l-order and PD maps), ``single_task`` (lambda does not change the
implicit bias of training from scratch).

Quick mode (default): coarse alpha grids, D = 400 simulations with 3 seeds (5 for ``fig4``), the exact
FT interpolator as the simulated endpoint. ``--full``: 80-point grids and D = 2000 with 14 seeds (14 seeds as in
the authors' notes, experiments/diagonal/replica/ExperimentSetup.md in github.com/Nico31415/toy-unlearning; the
grid size and D are ftlab's choices). All sweeps go through :func:`ftlab.core.sweep.run_sweep` with stores under
``<out>/replica/`` (resumable).

Every sentence of the section is in :data:`TEXT` (one template per block, named fields) and every check
in :data:`CHECKS`; the code below only computes the fields.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import pandas as pd

from ftlab.dln.model import InitScales
from ftlab.dln.regimes import DRAFT_CORNER_I, REGIME_COLORS, REGIME_CORNERS
from ftlab.dln.replica.curves import setting_point
from ftlab.dln.tasks import TaskSpec

log = logging.getLogger(__name__)

FIGURES = ("fig3", "fig4", "lorder", "single_task")
#: plot/table order; "I (draft)" is the authors' draft corner, shown for comparison only
REGIMES = {**{name: REGIME_CORNERS[name] for name in ("II", "IV", "I", "III")}, "I (draft)": DRAFT_CORNER_I}
TASKS = {"new features (omega 0, rho_FT 0.1)": (0.0, 0.1), "same features (omega 1, rho_FT 0.1)": (1.0, 0.1),
         "sparse subset (omega 1, rho_FT 0.01)": (1.0, 0.01)}
TABLE_ALPHAS = [0.01, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5]

#: The section's prose (``str.format`` templates with named fields).
TEXT = {
    "intro": ("Replica-symmetric theory of the FT generalization error of diagonal linear networks (arXiv 2602.20062), "
              "solved by Newton's method with exact derivatives on deterministic quadrature (docs/replica.md). The "
              "paper's claims are judged in the dln section; here the curves are drawn in the layout of the authors' "
              "public draft scripts (parameters [U]) and every table holds ftlab's own checks.\n"),
    "checks_head": "| ftlab's check | {computed} | status |\n|---|---|---|",
    "check_row": "| {check} | {computed} | {status} |",
    "fig3": (
        "### Scale sweeps against the sample ratio (layout of the authors' draft figure 3)\n\n"
        "![](replica/fig3.png)\n\n"
        "Lines: replica theory ({n_alphas} alphas per curve, {n_curves} curves; {unconverged} unconverged points, "
        "marked x). Dots: exact FT interpolator on sampled problems, D = {dim}, {n_seeds} seeds, mean and 95% "
        "t-interval. rho_PT = 0.1, a_PT = 1 (fixed PT magnitudes [U]).\n"
        "Panel layout follows the authors' public draft `figure3.py` (github.com/Nico31415/toy-unlearning) [U].\n\n"
        "ftlab's own checks of the theory's behaviour (expectations derived from the closed forms in docs/dln.md; "
        "not claims of the paper, which are judged in the dln section):\n\n{checks}\n"
    ),
    "fig4": (
        "### The four regime corners on three task types (layout of the authors' draft figure 4)\n\n"
        "![](replica/fig4.png)\n\n"
        "Corners (c_PT = 1e-3, normalized lambda): ftlab's `REGIME_CORNERS` -- II lam 0, gamma 0; IV lam -0.99, "
        "gamma 0; I lam -1, gamma 1e-3; III lam 0, gamma 10 -- and, dashed, the authors' draft regime-I corner "
        "(lam -0.999999, gamma 1e-6), which is PT-weighted rather than PT-independent (see the dln section). "
        "E_g at alpha = {alphas} (composite Gauss-Legendre, 800 nodes). Simulations: exact FT interpolator, "
        "D = {dim}, {n_seeds} seeds. Which regime is best, over which alpha range, is judged once, in the dln "
        "section.\n\n"
        "| task | regime | replica theory E_g | simulation (mean ± 95% half-width) |\n|---|---|---|---|\n{rows}\n\n"
        "Simulated points inside the 95% interval (+2e-3) of the theory: {inside}/{total}.\n"
    ),
    "fig4_row": "| {task} | {regime} | {theory} | {sims} |",
    "fig4_sim": "{mean:.3f}±{half:.3f}",
    "lorder": (
        "### l-order and pretraining dependence maps\n\n![](replica/lorder.png)\n\n"
        "l-order = d log q_k(beta_FT)/d log|beta_FT| and PD = d log q_k/d log|beta_PT| at |beta_FT| = 1 [U: evaluation "
        "point], from `ftlab.dln.regimes`; white line l = 1.5 (rich/lazy), cyan dashed PD = -0.1 (PT-(in)dependent): "
        "ftlab's regime boundaries [U]. The trade-off claim (PD = -1 and l = 1 never together) is judged in the dln "
        "section.\n\n{checks}\n"
    ),
    "single_task": (
        "### Single task: lambda does not matter in pretraining\n\n![](replica/single_task.png)\n\n"
        "Gradient flow of the network from the (c, lambda) initialization, D = {dim}, rho = 0.1, identical data "
        "across lambda ({n_runs} runs); replica curves for rho in {rhos}, c in {cs} (k = 4c^2 for every lambda).\n\n"
        "ftlab's own check of the theory (PT init: k = 4 c^2 for every lambda, docs/dln.md); the authors' public "
        "scripts run a similar single-task experiment (`compute_*_worker_exp4.py`) [U]:\n\n{checks}\n"
    ),
}

#: ftlab's own checks: name -> (what is checked, what was computed). Status words: holds / fails.
CHECKS = {
    "overlap": ("small c and gamma exploit overlap: E_g(omega=1) < E_g(0.5) < E_g(0) at c = 1e-3",
                "{e1:.3f} < {e05:.3f} < {e0:.3f}"),
    "overlap_blind": ("larger c is more overlap-blind (the spread of E_g over omega shrinks)",
                      "spread c=1e-6: {s6:.3f}, 1e-3: {s3:.3f}, 1: {s0:.3f}"),
    "big_gamma": ("gamma = 10 gives the min-l2 error 1 - alpha for every omega",
                  "max deviation from 1 - alpha: {dev:.4f}"),
    "lam_new": ("lambda -> -1 helps new features (omega 0)", "lam -0.99 / 0 / 0.99: {m:.3f} / {z:.3f} / {p:.3f}"),
    "lam_full": ("lambda -> +1 helps full reuse (omega 1)", "lam 0.99 / 0: {p:.4f} / {z:.4f}"),
    "lam_sparse": ("lambda -> -1 helps a sparse subset (omega 1, rho_FT 0.01, alpha 0.1)",
                   "lam -0.99 / 0 / 0.99: {m:.4f} / {z:.4f} / {p:.4f}"),
    "inside": ("simulated points inside the 95% interval (+2e-3) of the theory (the paper's claim 7 is judged in the "
               "dln section)", "{inside}/{total}"),
    "bounds": ("l in [1,2], PD in [-1,0], l + PD in [1,2] on every cell", "all {n} cells: {ok}"),
    "corner": ("no cell reaches (l, PD) = (1, -1)", "min over cells of max(l - 1, PD + 1) = {closest:.3f}"),
    "pt_bias": ("PT implicit bias depends on c only: GF endpoint = argmin Q_(4c^2) for every lambda",
                "max relative distance to argmin Q_(4c^2): {dist:.1e}"),
    "lam_spread": ("test error identical across lambda on the same data", "max spread over lambda: {spread:.1e}"),
}


def _size(ctx):
    if ctx.full:
        return {"alphas": list(np.linspace(0.01, 0.5, 80)), "sim_alphas": list(np.linspace(0.01, 0.5, 11)),
                "dim": 2000, "seeds": list(range(14))}
    return {"alphas": list(np.linspace(0.01, 0.5, 25)), "sim_alphas": [0.1, 0.2, 0.35], "dim": 400,
            "seeds": [0, 1, 2]}


def _curves(ctx, name, settings, alphas):
    """Replica curves for a list of setting dicts (curve_records kwargs without alphas), one sweep point each."""
    from ftlab.core.sweep import run_sweep
    from ftlab.dln.replica.curves import curve_records

    points = [dict(s, alphas=[float(a) for a in alphas]) for s in settings]
    df = run_sweep(curve_records, points, store=ctx.section_dir("replica") / f"{name}_theory.jsonl",
                   scheduler=ctx.scheduler, workers=ctx.workers, desc=f"{name} theory")
    return df.drop(columns=["alphas"])


def _sims(ctx, name, settings, alphas, dim, seeds):
    """Simulated errors (exact FT interpolator) for settings x alphas x seeds; aggregated mean and 95% CI."""
    from scipy import stats

    from ftlab.core.sweep import run_sweep
    from ftlab.dln.replica.curves import simulate_point

    points = [dict(s, alpha=float(a), dim=int(dim), seed=int(sd)) for s in settings for a in alphas for sd in seeds]
    raw = run_sweep(simulate_point, points, store=ctx.section_dir("replica") / f"{name}_sims.jsonl",
                    scheduler=ctx.scheduler, workers=ctx.workers, desc=f"{name} simulations")
    keys = [k for k in raw.columns if k not in ("seed", "sim_error", "sim_converged")]
    rows = []
    for key, g in raw.groupby(keys, dropna=False, sort=False):
        e = g.sim_error.to_numpy()[g.sim_converged.to_numpy(dtype=bool)]  # failed solves: counted in n_failed
        n = len(e)
        if n == 0:
            continue
        half = float(stats.t.ppf(0.975, n - 1) * e.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
        rows.append(dict(zip(keys, key)) | {"sim_mean": float(e.mean()), "sim_ci": half, "n": n,
                                            "n_failed": int((~g.sim_converged.astype(bool)).sum())})
    return pd.DataFrame(rows)


def _match(df, s):
    m = np.ones(len(df), dtype=bool)
    for k, v in s.items():
        if v is None:
            m &= df[k].isna().to_numpy()
        else:
            m &= np.isclose(df[k].to_numpy(dtype=float), float(v))
    return df[m]


def _agreement(theory, sims, settings):
    """Fraction of simulated points whose 95% CI (+ 2e-3) contains the replica prediction."""
    inside = total = 0
    for s in settings:
        th = _match(theory, s)
        sm = _match(sims, s)
        for _, r in sm.iterrows():
            pred = np.interp(r.alpha, th.alpha, th.error)
            exact = th[np.isclose(th.alpha, r.alpha)]
            if len(exact):
                pred = float(exact.error.iloc[0])
            inside += int(abs(r.sim_mean - pred) <= (r.sim_ci if np.isfinite(r.sim_ci) else 0) + 2e-3)
            total += 1
    return inside, total


def _checks(header: str, rows: list[tuple[str, bool, dict]]) -> str:
    """A table of ftlab's own checks (not claims of the paper): ``(name in CHECKS, holds, fields)`` per row."""
    lines = [TEXT["checks_head"].format(computed=header)]
    for name, ok, fields in rows:
        check, computed = CHECKS[name]
        lines.append(TEXT["check_row"].format(check=check, computed=computed.format(**fields),
                                              status="holds" if ok else "fails"))
    return "\n".join(lines)


def _base(overlap, rho_ft, c=1e-3, lam=0.0, gamma=0.0, **kw):
    """The flat sweep point of a task with rho_PT = 0.1 (:func:`ftlab.dln.replica.curves.setting_point`)."""
    spec = TaskSpec(rho_pt=0.1, rho_ft=rho_ft, overlap=overlap)
    return setting_point(spec, InitScales(c=c, lam=lam, gamma=gamma)) | kw


def _err_at(theory, s, alpha):
    th = _match(theory, s)
    return float(np.interp(alpha, th.alpha, th.error))


# ------------------------------------------------------------------------------------------- fig3


def _fig3(ctx) -> str:
    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.core.results import save_table

    size = _size(ctx)
    omegas = {0.0: ":", 0.5: "--", 1.0: "-"}
    panels = []  # (title, [(label, setting, linestyle, color)])
    cols = ["C0", "C1", "C2"]
    for title, key, vals in [("A: c (lam 0, gamma 0)", "c", [1e-6, 1e-3, 1.0]),
                             ("B: gamma (c 1e-3, lam 0)", "gamma", [0.0, 1.0, 10.0]),
                             ("C: lambda (c 1e-3, gamma 0)", "lam", [-0.99, 0.0, 0.99])]:
        panels.append((title, [(f"{key}={v:g}, omega={o:g}", _base(o, 0.1, **{key: v}), ls, cols[i])
                               for i, v in enumerate(vals) for o, ls in omegas.items()]))
    for title, key, vals in [("D: c, new features (omega 0)", "c", [1e-6, 1e-3, 1.0]),
                             ("E: gamma, new features (omega 0)", "gamma", [0.0, 1.0, 10.0])]:
        panels.append((title, [(f"{key}={v:g}, rho_FT={r:g}", _base(0.0, r, **{key: v}), ls, cols[i])
                               for i, v in enumerate(vals) for r, ls in [(0.1, ":"), (0.9, "-")]]))
    panels.append(("F: lambda, full overlap (omega 1)",
                   [(f"lam={v:g}, rho_FT={r:g}", _base(1.0, r, lam=v), ls, cols[i])
                    for i, v in enumerate([-0.99, 0.0, 0.99]) for r, ls in [(0.01, "--"), (0.04, "-."), (0.1, "-")]]))
    settings = []
    for _, curves in panels:
        for _, s, _, _ in curves:
            if s not in settings:
                settings.append(s)
    theory = _curves(ctx, "fig3", settings, size["alphas"])
    sims = _sims(ctx, "fig3", settings, size["sim_alphas"], size["dim"], size["seeds"])
    d = ctx.output_dir("replica")
    save_table(theory, d / "fig3_theory.csv", params={"figure": "fig3"})
    save_table(sims, d / "fig3_sims.csv", params={"figure": "fig3", "dim": size["dim"], "seeds": size["seeds"]})
    fig, axes = new_figure(2, 3, size=(15, 8.5))
    for ax, (title, curves) in zip(axes.ravel(), panels):
        for label, s, ls, col in curves:
            th = _match(theory, s)
            ax.plot(th.alpha, th.error, ls, color=col, lw=1.3, label=label)
            sm = _match(sims, s)
            ax.errorbar(sm.alpha, sm.sim_mean, yerr=sm.sim_ci, fmt="o", ms=2.5, color=col, capsize=1.5, lw=0.8)
            bad = th[~th.converged.astype(bool)]
            ax.plot(bad.alpha, bad.error, "rx")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(r"$\alpha_{FT}$")
        ax.set_ylabel(r"$E_g$")
        ax.legend(fontsize=6, ncol=1)
    save_figure(fig, d / "fig3.png")

    a = 0.2
    e = {(k, v, o): _err_at(theory, _base(o, 0.1, **{k: v}), a) for k, vals in
         [("c", [1e-6, 1e-3, 1.0]), ("gamma", [0.0, 1.0, 10.0]), ("lam", [-0.99, 0.0, 0.99])]
         for v in vals for o in omegas}
    small_c_order = e[("c", 1e-3, 1.0)] < e[("c", 1e-3, 0.5)] < e[("c", 1e-3, 0.0)]
    spread = {v: max(e[("c", v, o)] for o in omegas) - min(e[("c", v, o)] for o in omegas) for v in [1e-6, 1e-3, 1.0]}
    big_gamma = max(abs(e[("gamma", 10.0, o)] - (1 - a)) for o in omegas)
    lam_new = e[("lam", -0.99, 0.0)] < e[("lam", 0.0, 0.0)] <= e[("lam", 0.99, 0.0)] + 1e-9
    lam_full = e[("lam", 0.99, 1.0)] <= e[("lam", 0.0, 1.0)] + 1e-9
    sparse = {v: _err_at(theory, _base(1.0, 0.01, lam=v), 0.1) for v in [-0.99, 0.0, 0.99]}
    inside, total = _agreement(theory, sims, settings)
    unconv = int((~theory.converged.astype(bool)).sum())
    checks = _checks("computed (alpha = 0.2 unless noted)", [
        ("overlap", small_c_order, {"e1": e[("c", 1e-3, 1.0)], "e05": e[("c", 1e-3, 0.5)], "e0": e[("c", 1e-3, 0.0)]}),
        ("overlap_blind", spread[1.0] < spread[1e-3], {"s6": spread[1e-6], "s3": spread[1e-3], "s0": spread[1.0]}),
        ("big_gamma", big_gamma < 0.02, {"dev": big_gamma}),
        ("lam_new", lam_new, {"m": e[("lam", -0.99, 0.0)], "z": e[("lam", 0.0, 0.0)], "p": e[("lam", 0.99, 0.0)]}),
        ("lam_full", lam_full, {"p": e[("lam", 0.99, 1.0)], "z": e[("lam", 0.0, 1.0)]}),
        ("lam_sparse", sparse[-0.99] < sparse[0.0], {"m": sparse[-0.99], "z": sparse[0.0], "p": sparse[0.99]}),
        ("inside", inside >= 0.8 * total, {"inside": inside, "total": total}),
    ])
    return TEXT["fig3"].format(n_alphas=len(size["alphas"]), n_curves=len(settings), unconverged=unconv,
                               dim=size["dim"], n_seeds=len(size["seeds"]), checks=checks)


# ------------------------------------------------------------------------------------------- fig4


def _fig4(ctx) -> str:
    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.core.results import save_table

    size = _size(ctx)
    settings = [_base(o, r, lam=lam, gamma=g) for (o, r) in TASKS.values() for lam, g in REGIMES.values()]
    alphas = sorted(set(size["alphas"]) | set(TABLE_ALPHAS))
    theory = _curves(ctx, "fig4", settings, alphas)
    seeds = size["seeds"] if ctx.full else [0, 1, 2, 3, 4]
    sims = _sims(ctx, "fig4", settings, TABLE_ALPHAS, size["dim"], seeds)
    d = ctx.output_dir("replica")
    save_table(theory, d / "fig4_theory.csv", params={"figure": "fig4"})
    save_table(sims, d / "fig4_sims.csv", params={"figure": "fig4", "dim": size["dim"], "seeds": seeds})
    fig, ax = new_figure(size=(7, 5))
    styles = dict(zip(TASKS.values(), [":", "-", "--"]))
    for (o, r) in TASKS.values():
        for reg, (lam, g) in REGIMES.items():
            th = _match(theory, _base(o, r, lam=lam, gamma=g))
            color = REGIME_COLORS[reg.split()[0]]
            ax.plot(th.alpha, th.error, styles[(o, r)], color=color, lw=0.8 if "draft" in reg else 1.4,
                    alpha=0.6 if "draft" in reg else 1.0, label=f"{reg}, omega={o:g}, rho_FT={r:g}")
    ax.set_xscale("log")
    ax.set_ylim(-0.05, 1.7)
    ax.set_xlabel(r"$\alpha_{FT}$")
    ax.set_ylabel(r"$E_g$")
    ax.legend(fontsize=6, ncol=2)
    save_figure(fig, d / "fig4.png")

    rows = []
    for tname, (o, r) in TASKS.items():
        for reg, (lam, g) in REGIMES.items():
            s_ = _base(o, r, lam=lam, gamma=g)
            th = _match(theory, s_)
            ours = [float(th[np.isclose(th.alpha, a)].error.iloc[0]) for a in TABLE_ALPHAS]
            sm = _match(sims, s_).sort_values("alpha")
            sim_txt = " / ".join(TEXT["fig4_sim"].format(mean=m, half=h) for m, h in zip(sm.sim_mean, sm.sim_ci))
            rows.append(TEXT["fig4_row"].format(task=tname, regime=reg, theory=" / ".join(f"{x:.4f}" for x in ours),
                                                sims=sim_txt))
    inside, total = _agreement(theory, sims, settings)
    return TEXT["fig4"].format(alphas=" / ".join(f"{a:g}" for a in TABLE_ALPHAS), dim=size["dim"],
                               n_seeds=len(seeds), rows="\n".join(rows), inside=inside, total=total)


# ------------------------------------------------------------------------------------------- lorder


def _lorder(ctx) -> str:
    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.core.results import save_table
    from ftlab.dln.regimes import l_order, pretraining_dependence

    n = 160 if ctx.full else 80
    b_pt = np.geomspace(5e-4, 2e3, n)
    maps = [
        ("lambda (c = 0.1, gamma = 0)", "lam", np.linspace(-0.999, 1.0, n), lambda v: {"c": 0.1, "lam": v, "gamma": 0.0}),
        ("c (lambda = 0.05, gamma = 0)", "c", np.geomspace(1e-3, 10.0, n), lambda v: {"c": v, "lam": 0.05, "gamma": 0.0}),
        ("gamma (c = 1e-3, lambda = 0)", "gamma", np.geomspace(1e-2, 1e3, n),
         lambda v: {"c": 1e-3, "lam": 0.0, "gamma": v}),
    ]
    fig, axes = new_figure(2, 3, size=(15, 8))
    frames = []
    worst_both = math.inf
    for j, (title, key, vals, kw) in enumerate(maps):
        L = np.empty((len(vals), n))
        P = np.empty((len(vals), n))
        for i, v in enumerate(vals):
            L[i] = l_order(1.0, b_pt, **kw(v))
            P[i] = pretraining_dependence(1.0, b_pt, **kw(v))
        frames.append(pd.DataFrame({"axis": key, "value": np.repeat(vals, n), "beta_pt": np.tile(b_pt, len(vals)),
                                     "l_order": L.ravel(), "pd": P.ravel()}))
        # how close a cell gets to the corner (l = 1, PD = -1) in both coordinates at once
        worst_both = min(worst_both, float(np.min(np.maximum(L - 1.0, P + 1.0))))
        for row, (Z, lab, cmap, lim) in enumerate([(L, "l-order", "viridis", (1, 2)), (P, "PD", "magma", (-1, 0))]):
            ax = axes[row, j]
            mesh = ax.pcolormesh(b_pt, vals, Z, cmap=cmap, vmin=lim[0], vmax=lim[1], shading="auto")
            ax.contour(b_pt, vals, L, levels=[1.5], colors="w", linewidths=1.0)
            ax.contour(b_pt, vals, P, levels=[-0.1], colors="c", linewidths=1.0, linestyles="--")
            ax.set_xscale("log")
            if key != "lam":
                ax.set_yscale("log")
            ax.set_xlabel(r"$|\beta_{PT}|$ ($|\beta_{FT}| = 1$)")
            ax.set_ylabel(key)
            ax.set_title(f"{lab} over |beta_PT| x {title}", fontsize=8)
            fig.colorbar(mesh, ax=ax)
    d = ctx.output_dir("replica")
    save_figure(fig, d / "lorder.png")
    allf = pd.concat(frames)
    save_table(allf, d / "lorder.csv", params={"figure": "lorder", "beta_ft": 1.0})
    lp = allf.l_order + allf.pd
    in_range = bool(allf.l_order.between(1, 2).all() and allf.pd.between(-1, 0).all() and lp.between(1 - 1e-9, 2).all())
    checks = _checks("computed", [("bounds", in_range, {"n": len(allf), "ok": in_range}),
                                  ("corner", worst_both > 0.05, {"closest": worst_both})])
    return TEXT["lorder"].format(checks=checks)


# ------------------------------------------------------------------------------------------- single task


def single_task_point(*, rho: float, c: float, lam: float, alpha: float, dim: int, seed: int) -> dict:
    """Gradient flow of the diagonal network from scratch on one sparse task (top-level for run_sweep).

    Same data for every ``lam`` (the seed fixes teacher and design). Returns the test error and the
    predictor's distance to ``argmin Q_{4c^2}`` (the lambda-independent implicit bias).
    """
    from ftlab.dln.bias import solve_implicit_bias
    from ftlab.dln.flow import gradient_flow
    from ftlab.dln.model import init_pt

    rng = np.random.default_rng(seed)
    beta = np.where(rng.random(dim) < rho, rng.standard_normal(dim) / math.sqrt(rho), 0.0)
    n = max(1, int(round(alpha * dim)))
    X = rng.standard_normal((n, dim)) / math.sqrt(dim)
    y = X @ beta
    res = gradient_flow(init_pt(dim, c=c, lam=lam), X, y)
    pred = solve_implicit_bias(X, y, np.full(dim, 4.0 * c**2)).beta
    return {"sim_error": float(np.mean((res.beta - beta) ** 2)), "pred_error": float(np.mean((pred - beta) ** 2)),
            "distance": float(np.linalg.norm(res.beta - pred) / max(float(np.linalg.norm(pred)), 1e-300)),
            "sim_converged": bool(res.converged)}


def _single_task(ctx) -> str:
    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.core.results import save_table
    from ftlab.core.sweep import run_sweep
    from ftlab.dln.replica.curves import solve_curve
    from ftlab.dln.replica.expect import QuadratureExpectation
    from ftlab.dln.replica.prior import single_task_prior

    size = _size(ctx)
    rhos = [0.01, 0.04, 0.1, 0.9]
    cs = [1e-6, 1e-3, 1.0]
    lams = [-0.99, 0.0, 0.99]
    dim = 800 if ctx.full else 200
    seeds = range(5) if ctx.full else range(2)
    sim_alphas = [0.2, 0.5] if not ctx.full else [0.1, 0.2, 0.3, 0.5, 0.7]
    points = [{"rho": 0.1, "c": c, "lam": lam, "alpha": a, "dim": dim, "seed": s}
              for c in cs for lam in lams for a in sim_alphas for s in seeds]
    raw = run_sweep(single_task_point, points, store=ctx.section_dir("replica") / "single_task_sims.jsonl",
                    scheduler=ctx.scheduler, workers=ctx.workers, desc="single-task flows")
    d = ctx.output_dir("replica")
    save_table(raw, d / "single_task_sims.csv", params={"figure": "single_task"})
    fig, axes = new_figure(1, 2, size=(11, 4))
    rows = []
    for i, c in enumerate(cs):
        for j, rho in enumerate(rhos):
            th = solve_curve(QuadratureExpectation(single_task_prior(rho=rho, c=c)), size["alphas"])
            rows += [{"rho": rho, "c": c, **r} for r in th.to_dict("records")]
            axes[0].plot(th.alpha, th.error, ["-", "--", ":"][i], color=f"C{j}", label=f"rho={rho:g}, c={c:g}")
    theory = pd.DataFrame(rows)
    save_table(theory, d / "single_task_theory.csv", params={"figure": "single_task"})
    axes[0].set_xlabel(r"$\alpha$")
    axes[0].set_ylabel(r"$E_g$ (replica; identical for every $\lambda$)")
    axes[0].legend(fontsize=6, ncol=2)
    for k, lam in enumerate(lams):
        g = raw[np.isclose(raw.lam, lam)].groupby(["c", "alpha"]).sim_error.mean().reset_index()
        for c in cs:
            gc = g[np.isclose(g.c, c)]
            axes[1].plot(gc.alpha + 0.005 * (k - 1), gc.sim_error, "os^"[k], color=f"C{cs.index(c)}",
                         label=f"lam={lam:g}, c={c:g}")
    axes[1].set_xlabel(r"$\alpha$")
    axes[1].set_ylabel("gradient-flow test error (rho = 0.1)")
    axes[1].legend(fontsize=6, ncol=3)
    save_figure(fig, d / "single_task.png")
    # lambda-spread of the trained predictors on identical data
    spread = raw.groupby(["c", "alpha", "seed"]).sim_error.agg(lambda e: float(e.max() - e.min()))
    max_dist = float(raw.distance.max())
    worst = float(spread.max())
    checks = _checks("computed", [("pt_bias", max_dist < 1e-3, {"dist": max_dist}),
                                  ("lam_spread", worst < 1e-4, {"spread": worst})])
    return TEXT["single_task"].format(dim=dim, n_runs=len(raw), rhos=rhos, cs=cs, checks=checks)


# ------------------------------------------------------------------------------------------- entry


def run(ctx) -> str:
    """Build the replica section: the named figures requested by ``ctx`` (all by default)."""
    parts = [TEXT["intro"]]
    builders = {"fig3": _fig3, "fig4": _fig4, "lorder": _lorder, "single_task": _single_task}
    for name in FIGURES:
        if ctx.wants(name):
            log.info("replica: building %s", name)
            parts.append(builders[name](ctx))
    return "\n".join(parts)

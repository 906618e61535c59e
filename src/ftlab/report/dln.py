"""Report section ``dln``: the theory paper's diagonal-network claims, each with one verdict.

Computations: :mod:`ftlab.experiments.diagonal`. Named figures (``ftlab reproduce dln --figure NAME``):
``regimes`` (claims 1-2), ``tasks`` (claims 3-5), ``imperfect`` (claim 6), ``flow_check`` (ftlab's own
check that gradient flow of the network ends at the implicit-bias argmin). Claim 7 (simulations agree
with the theory) is judged from the simulations of the other figures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ftlab.core.results import save_table
from ftlab.dln.regimes import CORNER_C, DRAFT_CORNER_I, REGIME_COLORS, REGIME_CORNERS
from ftlab.experiments import diagonal as D
from ftlab.experiments.verdicts import CurveJudgement

FIGURES = ("regimes", "tasks", "imperfect", "flow_check")


def _v(word: str) -> str:
    return f"**{word}**"


def _regime_map(out) -> None:
    from matplotlib.colors import ListedColormap

    from ftlab.core.plotting import new_figure, save_figure
    from ftlab.dln.regimes import metrics

    lam = np.linspace(-0.9999, 1.0, 161)
    gam = np.logspace(-4, 2, 181)
    b_pt = np.logspace(np.log10(5e-4), np.log10(2e3), 181)
    panels = [("|beta_PT|", b_pt, lambda x, l_: metrics(beta_pt=x, beta_ft=1.0, c=0.1, lam=l_, gamma=0.0),
               "c = 0.1, gamma = 0, |beta_FT| = 1"),
              ("gamma", gam, lambda x, l_: metrics(beta_pt=1.0, beta_ft=1.0, c=CORNER_C, lam=l_, gamma=x),
               "c = 1e-3, |beta_PT| = |beta_FT| = 1")]
    names = list(REGIME_COLORS)
    cmap = ListedColormap([REGIME_COLORS[n] for n in names])
    fig, axes = new_figure(1, 2, size=(12, 4.6))
    for ax, (xname, xs, fn, title) in zip(axes, panels):
        R = np.empty((lam.size, xs.size))
        for j, l_ in enumerate(lam):
            R[j] = [names.index(r) for r in fn(xs, float(l_)).regime]
        im = ax.pcolormesh(xs, lam, R, shading="auto", cmap=cmap, vmin=-0.5, vmax=3.5)
        ax.set_xscale("log")
        ax.set_xlabel(xname)
        ax.set_ylabel("lambda_PT (normalized)")
        ax.set_title(f"regime: {title}", fontsize=8)
        cb = fig.colorbar(im, ax=ax, ticks=[0, 1, 2, 3])
        cb.set_ticklabels(names)
    for name, (lam_c, g_c) in REGIME_CORNERS.items():  # the corners on the gamma panel
        axes[1].plot(max(g_c, 1e-4), lam_c, "k*", ms=9)
        axes[1].annotate(name, (max(g_c, 1e-4), lam_c), textcoords="offset points", xytext=(5, 3), fontsize=8)
    save_figure(fig, out / "regime_map.png")


def _tradeoff_plot(sample: pd.DataFrame, out) -> None:
    from ftlab.core.plotting import new_figure, save_figure

    fig, ax = new_figure(1, 1, size=(5, 4))
    ax.scatter(sample.l_order, sample.pd, s=2, alpha=0.3)
    ax.plot([1, 2], [0, -1], "k--", lw=1, label="l + PD = 1")
    ax.plot([1], [-1], "rx", ms=10, label="(1, -1): never reached")
    ax.set_xlabel("l-order")
    ax.set_ylabel("PD")
    ax.legend(fontsize=8)
    save_figure(fig, out / "tradeoff.png")


def _holds(j: CurveJudgement) -> str:
    return (f"holds for alpha in {CurveJudgement.fmt(j.holds)} of the informative range {CurveJudgement.fmt(j.informative)}"
            f" ({100 * j.share:.0f}% of it)" if j.informative else "the compared curves do not differ")


def _sim_txt(rows: list[dict]) -> str:
    return "; ".join(f"alpha {r['alpha']:.3g}: {r['mean']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
                     + (f" vs {r['other']}" if "other" in r else "") for r in rows)


def _flow_check(ctx, out) -> tuple[str, float, bool]:
    """ftlab's own check: gradient flow of the four weight vectors ends at the implicit-bias argmin."""
    from ftlab.core.sweep import grid, run_sweep
    from ftlab.dln.replica.curves import simulate_point

    dim = 300 if ctx.full else 150
    pts = [dict(p, dim=dim, seed=ctx.seed, method="flow")
           for p in grid(task=list(D.TASKS), corner=list(REGIME_CORNERS), alpha=[0.1, 0.3])]
    points = [{**D._setting(p.pop("task"), *REGIME_CORNERS[p.pop("corner")]), **p} for p in pts]
    flow = run_sweep(simulate_point, points, store=out / "flow_check.jsonl", workers=ctx.workers,
                     scheduler=ctx.scheduler, desc="dln gradient flows")
    pred = run_sweep(simulate_point, [dict(p, method="implicit") for p in points], store=out / "flow_check_pred.jsonl",
                     workers=ctx.workers, scheduler=ctx.scheduler, desc="dln implicit-bias argmin")
    gap = float(np.max(np.abs(flow.sim_error.to_numpy() - pred.sim_error.to_numpy())))
    ok = bool(flow.sim_converged.all())
    return (f"| Gradient flow of the network (exact, D = {dim}) ends at the implicit-bias argmin, for every corner and "
            f"task ({len(points)} runs) | max |E_flow - E_argmin| = {gap:.1e}; all converged: {ok} | "
            f"{_v('reproduced') if ok and gap < 1e-3 else _v('inconclusive')} |"), gap, ok


def run(ctx) -> str:
    """Write the dln section's tables and figures under ``ctx.out_dir/dln`` and return its Markdown."""
    out = ctx.section_dir("dln")
    sz = D.size(ctx.full, ctx.seed)
    kw = dict(workers=ctx.workers, scheduler=ctx.scheduler)
    rows: list[str] = []
    own: list[str] = []
    body: list[str] = []

    # claims 1-2 (exact)
    table = D.regime_table()
    j1 = D.regimes_judgement(table)
    sample = D.tradeoff_sample(ctx.seed)
    j2, closest = D.tradeoff_judgement(sample)
    corners = ", ".join(f"{r['corner']}: l {r['l_order']:.3f}, PD {r['pd']:+.3f} ({r['regime']})" for r in table[:4])
    rows.append(f"| 1 | {D.CLAIMS['regimes']} | corners at c = {CORNER_C:g}, |beta_PT| = |beta_FT| = 1: {corners} | "
                f"{_v(j1.verdict)} (exact) |")
    rows.append(f"| 2 | {D.CLAIMS['tradeoff']} | over {len(sample)} random settings min(l + PD) = "
                f"{float((sample.l_order + sample.pd).min()):.6f} >= 1; closest approach to (1, -1): {closest:.3f} | "
                f"{_v(j2.verdict)} (exact: l + PD = m + (1 - m) l >= 1) |")
    if ctx.wants("regimes"):
        _regime_map(out)
        _tradeoff_plot(sample, out)
        save_table(pd.DataFrame(table), out / "corners.csv", params={"c": CORNER_C, "beta_pt": 1.0, "beta_ft": 1.0})
        draft = table[-1]
        body += ["### Regimes and the trade-off (claims 1-2)", "", "![](dln/regime_map.png) ![](dln/tradeoff.png)", "",
                 "Stars: ftlab's regime corners (`ftlab.dln.REGIME_CORNERS`). Regime I is lambda = -1 exactly with "
                 "gamma > 0: the fine-tuning first layer restarts at 0, so sqrt(k) = gamma^2 on every coordinate "
                 "(PD = 0). Regime thresholds (l < 1.5 rich, PD < -0.1 PT-dependent) are ftlab's convention [U].", "",
                 "| corner | lambda | gamma | l-order | PD | regime |", "|---|---|---|---|---|---|",
                 *[f"| {r['corner']} | {r['lam']:g} | {r['gamma']:g} | {r['l_order']:.3f} | {r['pd']:+.3f} | "
                   f"{r['regime']} |" for r in table], ""]
        own.append(f"| The authors' draft regime-I corner (lambda {DRAFT_CORNER_I[0]:g}, gamma {DRAFT_CORNER_I[1]:g}, "
                   f"github.com/Nico31415/toy-unlearning `experiments/diagonal/replica/figure4.py`) is PT-weighted, not "
                   f"PT-independent | PD = {draft['pd']:+.3f}, l = {draft['l_order']:.3f} at beta = 1 | ftlab's finding |")

    # claims 3-5 (curves) and 7
    agree_frames = []
    if ctx.wants("tasks"):
        settings = D.corner_settings() + [D._setting("subset", *DRAFT_CORNER_I)]
        theory = D.curves(settings, sz.alphas, store=out / "tasks_theory.jsonl", **kw)
        sims = D.simulations(D.corner_settings(), sz.sim_alphas, sz.dim, sz.seeds, store=out / "tasks_sims.jsonl", **kw)
        scan = D.curves([D._setting("subset", lam, 0.0) for lam in sz.lam_scan], sz.alphas,
                        store=out / "lambda_scan.jsonl", **kw)
        verdicts = D.judge_tasks(theory, sims, sz.alphas, sz.sim_alphas, scan)
        save_table(theory, out / "tasks_theory.csv", params={"alphas": "geomspace(0.005, 0.5)", "c": CORNER_C})
        save_table(sims, out / "tasks_sims.csv", params={"dim": sz.dim, "seeds": list(sz.seeds)})
        save_table(scan, out / "lambda_scan.csv", params={"lam": list(sz.lam_scan)})
        D.plot_tasks(theory, sims, verdicts, scan, sz.alphas, out / "tasks.png")
        for n, task in enumerate(("shared", "new", "subset"), start=3):
            v = verdicts[task]
            extra = ""
            if v.lam_judgement is not None:
                extra = (f"; lambda scan (c {CORNER_C:g}, gamma 0): an intermediate lambda beats both lambda = -1 "
                         f"(Regime I) and lambda = 0 (II): {_holds(v.lam_judgement)}")
            rows.append(f"| {n} | {D.CLAIMS[task]} | theory: Regime {v.claimed} {_holds(v.judgement)}; largest "
                        f"contrast E(best other) - E({v.claimed}) = {v.judgement.peak:+.4f} at alpha "
                        f"{v.judgement.peak_at:.3g}{extra}. Simulations (paired by seed, D = {sz.dim}, "
                        f"{len(sz.seeds)} seeds, E(best other) - E({v.claimed}), 95% interval): {_sim_txt(v.sim)} | "
                        f"{_v(v.verdict)} |")
        e_draft = D.select(theory, D._setting("subset", *DRAFT_CORNER_I)).sort_values("alpha")
        e_iv = D.select(theory, D._setting("subset", *REGIME_CORNERS["IV"])).sort_values("alpha")
        at = [0.01, 0.03, 0.05]
        cmp_txt = "; ".join(f"alpha {a:g}: draft I {np.interp(a, e_draft.alpha, e_draft.error):.4f} vs IV "
                            f"{np.interp(a, e_iv.alpha, e_iv.error):.4f}" for a in at)
        own.append(f"| On the sparse-subset task, the authors' draft regime-I corner competes with IV (it is itself "
                   f"PT-weighted) | {cmp_txt} | ftlab's finding |")
        body += ["### Which regime generalizes best (claims 3-5)", "", "![](dln/tasks.png)", "",
                 f"Lines: replica theory over {len(sz.alphas)} log-spaced alphas in [0.005, 0.5] (rho_PT = 0.1, a_PT = 1 "
                 f"[U], c = {CORNER_C:g}); dots: the exact FT interpolator on sampled problems (D = {sz.dim}, "
                 f"{len(sz.seeds)} seeds, mean and 95% interval); shaded: where the claimed regime has the lowest theory "
                 "error. A claim is judged on the *informative* alpha range, where the claimed regime and its best "
                 "competitor differ by more than 1e-3 (at large alpha the rich regimes all recover the teacher and tie): "
                 "reproduced if it holds on at least half of that range (log-alpha measure), reversed if nowhere, "
                 "inconclusive in between (`ftlab.experiments.verdicts.judge_curve`).", ""]
        agree_frames.append(D.agreement(theory, sims, D.corner_settings()))
    if ctx.wants("imperfect"):
        settings = D.imperfect_settings()
        theory_i = D.curves(settings, sz.alphas, store=out / "imperfect_theory.jsonl", **kw)
        sims_i = D.simulations(settings, sz.sim_alphas, sz.dim, sz.seeds, store=out / "imperfect_sims.jsonl", **kw)
        res = D.judge_imperfect(theory_i, sims_i, sz.alphas, sz.sim_alphas)
        save_table(theory_i, out / "imperfect_theory.csv", params=D.IMPERFECT)
        save_table(sims_i, out / "imperfect_sims.csv", params={**D.IMPERFECT, "dim": sz.dim})
        D.plot_imperfect(theory_i, sims_i, out / "imperfect.png")
        j6, sim6 = res["imperfect"]
        jo, simo = res["oracle"]
        lam_n, ap = D.IMPERFECT["lam_negative"], D.IMPERFECT["alpha_pt"]
        rows.append(f"| 6 | {D.CLAIMS['imperfect']} | theory (alpha_PT {ap:g}, omega 1, rho_FT 0.1, lambda {lam_n:g} vs 0): "
                    f"lambda {lam_n:g} {_holds(j6)}; largest gain {j6.peak:+.4f} at alpha {j6.peak_at:.3g}. Simulations "
                    f"(E(lambda 0) - E(lambda {lam_n:g})): {_sim_txt(sim6)}. Context, oracle PT: lambda {lam_n:g} "
                    f"{_holds(jo)} (largest contrast {jo.peak:+.4f}) | {_v(j6.verdict)} |")
        body += ["### Imperfect pretraining (claim 6)", "", "![](dln/imperfect.png)", "",
                 f"PT from alpha_PT = {ap:g} samples: the PT estimate is the interpolator argmin Q_(4c^2) on the PT data "
                 "(replica: the single-task scalar channel), then k = K(|beta_hat_PT|). Right: the same contrast with "
                 "perfect (oracle) PT, where the theory predicts the negative lambda does not help under full overlap.", ""]
        agree_frames.append(D.agreement(theory_i, sims_i, [s for s in settings if s.get("alpha_pt") is not None]))
    if agree_frames:
        agree = pd.concat(agree_frames, ignore_index=True)
        save_table(agree, out / "agreement.csv", params={"tolerance": "95% interval + 2e-3"})
        D.plot_agreement(agree, out / "agreement.png")
        share = float(agree.inside.mean())
        verdict = "reproduced" if share >= 0.8 else "inconclusive"
        worst = agree.assign(dev=(agree.sim_mean - agree.theory).abs()).sort_values("dev").iloc[-1]
        rows.append(f"| 7 | {D.CLAIMS['simulation']} | {int(agree.inside.sum())}/{len(agree)} simulated points "
                    f"(D = {sz.dim}, {len(sz.seeds)} seeds) contain the replica prediction in their 95% interval (+2e-3); "
                    f"largest deviation {worst.dev:.3f} at alpha {worst.alpha:.3g} (finite D) | {_v(verdict)} "
                    "(reproduced when >= 80% agree) |")
        body += ["### Theory against simulation (claim 7)", "", "![](dln/agreement.png)", ""]
    if ctx.wants("flow_check"):
        line, _, _ = _flow_check(ctx, out)
        own.append(line.replace(f"| {_v('reproduced')} |", "| ftlab's check: holds |")
                   .replace(f"| {_v('inconclusive')} |", "| ftlab's check: fails |"))

    head = [
        "Anguita, Locatello, Saxe, Mondelli, Mancini, Lippl, Dominé, *A Theory of How Pretraining Shapes Inductive Bias "
        "in Fine-Tuning*, arXiv 2602.20062 (2026). Fine-tuning a diagonal linear network from the readout "
        "re-initialization converges to argmin Q_k(beta) subject to X beta = y, with per-coordinate "
        "k_d = (2 c (1 + lam)(1 + sqrt(1 + (beta_PT,d / c)^2)) + gamma^2)^2; the l-order and pretraining dependence "
        "(PD) are local log-slopes of that penalty (docs/dln.md). The FT reset convention (first layer summed over "
        "the two pathways, readout gamma/sqrt(2)) follows the first author's public code "
        "(github.com/Nico31415/toy-unlearning) [U].",
        "",
        "Every claim of the paper gets one verdict: reproduced, reversed, no effect or inconclusive "
        "(`ftlab.experiments.verdicts`); for curve claims the interval is the range of alpha over which the claim holds.",
        "",
        "| # | the paper's claim | ftlab computed | verdict |",
        "|---|---|---|---|",
        *rows,
        "",
    ]
    if own:
        head += ["ftlab's own findings (not claims of the paper; not counted above):", "",
                 "| finding | computed | status |", "|---|---|---|", *own, ""]
    return "\n".join(head + body) + "\n"


def verdict_count(md: str) -> dict[str, int]:
    """How many claim rows of a rendered section carry each verdict (used by tests)."""
    out: dict[str, int] = {}
    for line in md.splitlines():
        if line.startswith("| ") and line.split("|")[1].strip().isdigit():
            word = line.rsplit("|", 2)[-2].strip().split("**")[1] if "**" in line else ""
            out[word] = out.get(word, 0) + 1
    return out


"""Report section ``dln``: the theory paper's diagonal-network claims, each with one verdict.

Computations: :mod:`ftlab.experiments.diagonal`. Named figures (``ftlab reproduce dln --figure NAME``):
``regimes`` (claims 1-2), ``tasks`` (claims 3-5), ``imperfect`` (claim 6), ``flow_check`` (ftlab's own
check that gradient flow of the network ends at the implicit-bias argmin). Claim 7 (simulations agree
with the theory) is judged from the simulations of the other figures.

Every sentence of the section is in :data:`TEXT`, one template per block with named fields; the
code below only computes the fields.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ftlab.core.results import save_table
from ftlab.dln.regimes import CORNER_C, DRAFT_CORNER_I, REGIME_COLORS, REGIME_CORNERS
from ftlab.experiments import diagonal as D
from ftlab.experiments.verdicts import CurveJudgement

FIGURES = ("regimes", "tasks", "imperfect", "flow_check")

#: The section's prose (``str.format`` templates). Claim rows keep the form ``| n | claim | computed | verdict |``.
TEXT = {
    "intro": (
        "Anguita, Locatello, Saxe, Mondelli, Mancini, Lippl, Dominé, *A Theory of How Pretraining Shapes Inductive "
        "Bias in Fine-Tuning*, arXiv 2602.20062 (2026). A two-layer diagonal linear network is pretrained (PT) from "
        "an initialization of absolute scale c and relative scale lambda (first layer against readout, normalized "
        "to [-1, 1]), then its readout is re-initialized with scale gamma and it is fine-tuned (FT). Fine-tuning "
        "converges to argmin Q_k(beta) subject to X beta = y, with per-coordinate "
        "k_d = (2 c (1 + lam)(1 + sqrt(1 + (beta_PT,d / c)^2)) + gamma^2)^2; the l-order and pretraining dependence "
        "(PD) are local log-slopes of that penalty (docs/dln.md). The FT reset convention (first layer summed over "
        "the two pathways, readout gamma/sqrt(2)) follows the first author's public code "
        "(github.com/Nico31415/toy-unlearning) [U].\n\n"
        "Every claim of the paper gets one verdict: reproduced, reversed, no effect or inconclusive "
        "(`ftlab.experiments.verdicts`); for curve claims the interval is the range of alpha over which the claim "
        "holds.\n\n"
        "| # | the paper's claim | ftlab computed | verdict |\n|---|---|---|---|"
    ),
    "claim_row": "| {n} | {claim} | {computed} | {verdict} |",
    "verdict": "**{word}**",
    "verdict_exact": "**{word}** (exact)",
    "verdict_tradeoff": "**{word}** (exact: l + PD = m + (1 - m) l >= 1)",
    "verdict_agreement": "**{word}** (reproduced when >= 80% agree)",
    "regimes": "corners at c = {c:g}, |beta_PT| = |beta_FT| = 1: {corners}",
    "corner_item": "{corner}: l {l_order:.3f}, PD {pd:+.3f} ({regime})",
    "tradeoff": ("over {n} random settings min(l + PD) = {min_sum:.6f} >= 1; closest approach to (1, -1): "
                 "{closest:.3f}"),
    "holds": "holds for alpha in {holds} of the informative range {informative} ({share:.0f}% of it)",
    "holds_nowhere": "the compared curves do not differ",
    "task": ("theory: Regime {claimed} {holds}; largest contrast E(best other) - E({claimed}) = {peak:+.4f} at alpha "
             "{peak_at:.3g}{scan}. Simulations (paired by seed, D = {dim}, {n_seeds} seeds, E(best other) - "
             "E({claimed}), 95% interval): {sims}"),
    "lambda_scan": ("; lambda scan (c {c:g}, gamma 0): an intermediate lambda beats both lambda = -1 (Regime I) and "
                    "lambda = 0 (II): {holds}"),
    "sim_item": "alpha {alpha:.3g}: {mean:+.3f} [{lo:+.3f}, {hi:+.3f}]",
    "sim_item_vs": "alpha {alpha:.3g}: {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] vs {other}",
    "imperfect": ("theory (alpha_PT {alpha_pt:g}, omega 1, rho_FT 0.1, lambda {lam:g} vs 0): lambda {lam:g} {holds}; "
                  "largest gain {peak:+.4f} at alpha {peak_at:.3g}. Simulations (E(lambda 0) - E(lambda {lam:g})): "
                  "{sims}. Context, oracle PT: lambda {lam:g} {holds_oracle} (largest contrast {peak_oracle:+.4f})"),
    "agreement": ("{inside}/{total} simulated points (D = {dim}, {n_seeds} seeds) contain the replica prediction in "
                  "their 95% interval (+2e-3); largest deviation {dev:.3f} at alpha {alpha:.3g} (finite D)"),
    "own_head": ("ftlab's own findings (not claims of the paper; not counted above):\n\n"
                 "| finding | computed | status |\n|---|---|---|"),
    "own_row": "| {finding} | {computed} | {status} |",
    "finding": "ftlab's finding",
    "check_holds": "ftlab's check: holds",
    "check_fails": "ftlab's check: fails",
    "draft_corner": ("The authors' draft regime-I corner (lambda {lam:g}, gamma {gamma:g}, "
                     "github.com/Nico31415/toy-unlearning `experiments/diagonal/replica/figure4.py`) is PT-weighted, "
                     "not PT-independent"),
    "draft_corner_computed": "PD = {pd:+.3f}, l = {l_order:.3f} at beta = 1",
    "draft_vs_iv": ("On the sparse-subset task, the authors' draft regime-I corner competes with IV (it is itself "
                    "PT-weighted)"),
    "draft_vs_iv_item": "alpha {alpha:g}: draft I {draft:.4f} vs IV {iv:.4f}",
    "flow_check": ("Gradient flow of the network (exact, D = {dim}) ends at the implicit-bias argmin, for every corner "
                   "and task ({n} runs)"),
    "flow_check_computed": "max |E_flow - E_argmin| = {gap:.1e}; all converged: {ok}",
    "body_regimes": (
        "### Regimes and the trade-off (claims 1-2)\n\n![](dln/regime_map.png) ![](dln/tradeoff.png)\n\n"
        "Stars: ftlab's regime corners (`ftlab.dln.REGIME_CORNERS`). Regime I is lambda = -1 exactly with gamma > 0: "
        "the fine-tuning first layer restarts at 0, so sqrt(k) = gamma^2 on every coordinate (PD = 0). Regime "
        "thresholds (l < 1.5 rich, PD < -0.1 PT-dependent) are ftlab's convention [U].\n\n"
        "| corner | lambda | gamma | l-order | PD | regime |\n|---|---|---|---|---|---|\n{rows}\n"
    ),
    "corner_row": "| {corner} | {lam:g} | {gamma:g} | {l_order:.3f} | {pd:+.3f} | {regime} |",
    "body_tasks": (
        "### Which regime generalizes best (claims 3-5)\n\n![](dln/tasks.png)\n\n"
        "Lines: replica theory over {n_alphas} log-spaced alphas in [0.005, 0.5] (rho_PT = 0.1, a_PT = 1 [U], "
        "c = {c:g}); dots: the exact FT interpolator on sampled problems (D = {dim}, {n_seeds} seeds, mean and 95% "
        "interval); shaded: where the claimed regime has the lowest theory error. A claim is judged on the "
        "*informative* alpha range, where the claimed regime and its best competitor differ by more than 1e-3 (at "
        "large alpha the rich regimes all recover the teacher and tie): reproduced if it holds on at least half of "
        "that range (log-alpha measure), reversed if nowhere, inconclusive in between "
        "(`ftlab.experiments.verdicts.judge_curve`).\n"
    ),
    "body_imperfect": (
        "### Imperfect pretraining (claim 6)\n\n![](dln/imperfect.png)\n\n"
        "PT from alpha_PT = {alpha_pt:g} samples: the PT estimate is the interpolator argmin Q_(4c^2) on the PT data "
        "(replica: the single-task scalar channel), then k = K(|beta_hat_PT|). Right: the same contrast with perfect "
        "(oracle) PT, where the theory predicts the negative lambda does not help under full overlap.\n"
    ),
    "body_agreement": "### Theory against simulation (claim 7)\n\n![](dln/agreement.png)\n",
}


def _holds(j: CurveJudgement) -> str:
    if not j.informative:
        return TEXT["holds_nowhere"]
    return TEXT["holds"].format(holds=CurveJudgement.fmt(j.holds), informative=CurveJudgement.fmt(j.informative),
                                share=100 * j.share)


def _sims(rows: list[dict]) -> str:
    return "; ".join(TEXT["sim_item_vs" if "other" in r else "sim_item"].format(**r) for r in rows)


def _claim(n, claim: str, computed: str, verdict: str) -> str:
    return TEXT["claim_row"].format(n=n, claim=claim, computed=computed, verdict=verdict)


def _own(finding: str, computed: str, status: str) -> str:
    return TEXT["own_row"].format(finding=finding, computed=computed, status=status)


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


def _exact_claims(ctx, out, rows: list[str], own: list[str], body: list[str]) -> None:
    """Claims 1-2 from the closed forms, and (figure ``regimes``) the regime map, the trade-off and the corner table."""
    table = D.regime_table()
    j1 = D.regimes_judgement(table)
    sample = D.tradeoff_sample(ctx.seed)
    j2, closest = D.tradeoff_judgement(sample)
    corners = ", ".join(TEXT["corner_item"].format(**r) for r in table[:4])
    rows.append(_claim(1, D.CLAIMS["regimes"], TEXT["regimes"].format(c=CORNER_C, corners=corners),
                       TEXT["verdict_exact"].format(word=j1.verdict)))
    rows.append(_claim(2, D.CLAIMS["tradeoff"],
                       TEXT["tradeoff"].format(n=len(sample), min_sum=float((sample.l_order + sample.pd).min()),
                                               closest=closest),
                       TEXT["verdict_tradeoff"].format(word=j2.verdict)))
    if not ctx.wants("regimes"):
        return
    _regime_map(out)
    _tradeoff_plot(sample, out)
    save_table(pd.DataFrame(table), out / "corners.csv", params={"c": CORNER_C, "beta_pt": 1.0, "beta_ft": 1.0})
    body.append(TEXT["body_regimes"].format(rows="\n".join(TEXT["corner_row"].format(**r) for r in table)))
    draft = table[-1]
    own.append(_own(TEXT["draft_corner"].format(lam=DRAFT_CORNER_I[0], gamma=DRAFT_CORNER_I[1]),
                    TEXT["draft_corner_computed"].format(**draft), TEXT["finding"]))


def _task_claims(ctx, out, sz, rows: list[str], own: list[str], body: list[str]) -> pd.DataFrame:
    """Claims 3-5 from the corner curves and the lambda scan; returns the theory/simulation agreement rows."""
    kw = dict(workers=ctx.workers, scheduler=ctx.scheduler)
    stores = ctx.section_dir("dln")
    settings = D.corner_settings() + [D._setting("subset", *DRAFT_CORNER_I)]
    theory = D.curves(settings, sz.alphas, store=stores / "tasks_theory.jsonl", **kw)
    sims = D.simulations(D.corner_settings(), sz.sim_alphas, sz.dim, sz.seeds, store=stores / "tasks_sims.jsonl", **kw)
    scan = D.curves([D._setting("subset", lam, 0.0) for lam in sz.lam_scan], sz.alphas,
                    store=stores / "lambda_scan.jsonl", **kw)
    verdicts = D.judge_tasks(theory, sims, sz.alphas, sz.sim_alphas, scan)
    save_table(theory, out / "tasks_theory.csv", params={"alphas": "geomspace(0.005, 0.5)", "c": CORNER_C})
    save_table(sims, out / "tasks_sims.csv", params={"dim": sz.dim, "seeds": list(sz.seeds)})
    save_table(scan, out / "lambda_scan.csv", params={"lam": list(sz.lam_scan)})
    D.plot_tasks(theory, sims, verdicts, scan, sz.alphas, out / "tasks.png")
    for n, task in enumerate(("shared", "new", "subset"), start=3):
        v = verdicts[task]
        scan_txt = "" if v.lam_judgement is None else TEXT["lambda_scan"].format(c=CORNER_C,
                                                                                   holds=_holds(v.lam_judgement))
        computed = TEXT["task"].format(claimed=v.claimed, holds=_holds(v.judgement), peak=v.judgement.peak,
                                       peak_at=v.judgement.peak_at, scan=scan_txt, dim=sz.dim,
                                       n_seeds=len(sz.seeds), sims=_sims(v.sim))
        rows.append(_claim(n, D.CLAIMS[task], computed, TEXT["verdict"].format(word=v.verdict)))
    e_draft = D.select(theory, D._setting("subset", *DRAFT_CORNER_I)).sort_values("alpha")
    e_iv = D.select(theory, D._setting("subset", *REGIME_CORNERS["IV"])).sort_values("alpha")
    items = [TEXT["draft_vs_iv_item"].format(alpha=a, draft=np.interp(a, e_draft.alpha, e_draft.error),
                                             iv=np.interp(a, e_iv.alpha, e_iv.error)) for a in (0.01, 0.03, 0.05)]
    own.append(_own(TEXT["draft_vs_iv"], "; ".join(items), TEXT["finding"]))
    body.append(TEXT["body_tasks"].format(n_alphas=len(sz.alphas), c=CORNER_C, dim=sz.dim, n_seeds=len(sz.seeds)))
    return D.agreement(theory, sims, D.corner_settings())


def _imperfect_claim(ctx, out, sz, rows: list[str], body: list[str]) -> pd.DataFrame:
    """Claim 6 (imperfect pretraining); returns the theory/simulation agreement rows."""
    kw = dict(workers=ctx.workers, scheduler=ctx.scheduler)
    stores = ctx.section_dir("dln")
    settings = D.imperfect_settings()
    theory = D.curves(settings, sz.alphas, store=stores / "imperfect_theory.jsonl", **kw)
    sims = D.simulations(settings, sz.sim_alphas, sz.dim, sz.seeds, store=stores / "imperfect_sims.jsonl", **kw)
    res = D.judge_imperfect(theory, sims, sz.alphas, sz.sim_alphas)
    save_table(theory, out / "imperfect_theory.csv", params=D.IMPERFECT)
    save_table(sims, out / "imperfect_sims.csv", params={**D.IMPERFECT, "dim": sz.dim})
    D.plot_imperfect(theory, sims, out / "imperfect.png")
    j6, sim6 = res["imperfect"]
    jo, _ = res["oracle"]
    ap = D.IMPERFECT["alpha_pt"]
    computed = TEXT["imperfect"].format(alpha_pt=ap, lam=D.IMPERFECT["lam_negative"], holds=_holds(j6), peak=j6.peak,
                                        peak_at=j6.peak_at, sims=_sims(sim6), holds_oracle=_holds(jo),
                                        peak_oracle=jo.peak)
    rows.append(_claim(6, D.CLAIMS["imperfect"], computed, TEXT["verdict"].format(word=j6.verdict)))
    body.append(TEXT["body_imperfect"].format(alpha_pt=ap))
    return D.agreement(theory, sims, [s for s in settings if s.get("alpha_pt") is not None])


def _agreement_claim(out, sz, frames: list[pd.DataFrame], rows: list[str], body: list[str]) -> None:
    """Claim 7: the share of simulated points whose 95% interval contains the replica prediction."""
    agree = pd.concat(frames, ignore_index=True)
    save_table(agree, out / "agreement.csv", params={"tolerance": "95% interval + 2e-3"})
    D.plot_agreement(agree, out / "agreement.png")
    verdict = "reproduced" if float(agree.inside.mean()) >= 0.8 else "inconclusive"
    worst = agree.assign(dev=(agree.sim_mean - agree.theory).abs()).sort_values("dev").iloc[-1]
    computed = TEXT["agreement"].format(inside=int(agree.inside.sum()), total=len(agree), dim=sz.dim,
                                        n_seeds=len(sz.seeds), dev=worst.dev, alpha=worst.alpha)
    rows.append(_claim(7, D.CLAIMS["simulation"], computed, TEXT["verdict_agreement"].format(word=verdict)))
    body.append(TEXT["body_agreement"])


def _flow_check(ctx) -> str:
    """ftlab's own check: gradient flow of the four weight vectors ends at the implicit-bias argmin."""
    from ftlab.core.sweep import grid, run_sweep
    from ftlab.dln.replica.curves import simulate_point

    dim = 300 if ctx.full else 150
    pts = [dict(p, dim=dim, seed=ctx.seed, method="flow")
           for p in grid(task=list(D.TASKS), corner=list(REGIME_CORNERS), alpha=[0.1, 0.3])]
    points = [{**D._setting(p.pop("task"), *REGIME_CORNERS[p.pop("corner")]), **p} for p in pts]
    stores = ctx.section_dir("dln")
    flow = run_sweep(simulate_point, points, store=stores / "flow_check.jsonl", workers=ctx.workers,
                     scheduler=ctx.scheduler, desc="dln gradient flows")
    pred = run_sweep(simulate_point, [dict(p, method="implicit") for p in points], store=stores / "flow_check_pred.jsonl",
                     workers=ctx.workers, scheduler=ctx.scheduler, desc="dln implicit-bias argmin")
    gap = float(np.max(np.abs(flow.sim_error.to_numpy() - pred.sim_error.to_numpy())))
    ok = bool(flow.sim_converged.all())
    status = TEXT["check_holds"] if ok and gap < 1e-3 else TEXT["check_fails"]
    return _own(TEXT["flow_check"].format(dim=dim, n=len(points)), TEXT["flow_check_computed"].format(gap=gap, ok=ok),
                status)


def run(ctx) -> str:
    """Write the dln section's tables and figures to ``ctx.output_dir("dln")`` and return its Markdown (the sweep
    stores stay in ``ctx.section_dir("dln")``, so an interrupted run resumes)."""
    out = ctx.output_dir("dln")
    sz = D.size(ctx.full, ctx.seed)
    rows: list[str] = []
    own: list[str] = []
    body: list[str] = []
    _exact_claims(ctx, out, rows, own, body)
    agree_frames = []
    if ctx.wants("tasks"):
        agree_frames.append(_task_claims(ctx, out, sz, rows, own, body))
    if ctx.wants("imperfect"):
        agree_frames.append(_imperfect_claim(ctx, out, sz, rows, body))
    if agree_frames:
        _agreement_claim(out, sz, agree_frames, rows, body)
    if ctx.wants("flow_check"):
        own.append(_flow_check(ctx))
    parts = [TEXT["intro"], *rows, ""]
    if own:
        parts += [TEXT["own_head"], *own, ""]
    return "\n".join(parts + body)


def verdict_count(md: str) -> dict[str, int]:
    """How many claim rows of a rendered section carry each verdict (used by tests)."""
    out: dict[str, int] = {}
    for line in md.splitlines():
        if line.startswith("| ") and line.split("|")[1].strip().isdigit():
            word = line.rsplit("|", 2)[-2].strip().split("**")[1] if "**" in line else ""
            out[word] = out.get(word, 0) + 1
    return out


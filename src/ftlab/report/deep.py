"""Report section ``deep``: the paper's deep-network claims at CPU scale (``ftlab reproduce deep``).

Quick run (default, a few minutes): 2 seeds, both vision architectures, three tasks, one value per
knob; below the rule's minimum of seeds, so it cannot decide and says so first. ``--full``: the seeds
chosen by power from the pilot and the full grids (:data:`ftlab.experiments.deep_claims.vision.FULL`,
:data:`ftlab.experiments.deep_claims.modular.FULL`). The section prints the declared primary tests
first, then the secondary rows, then ftlab's own findings. Protocols:
:mod:`ftlab.experiments.deep_claims.vision`, :mod:`~ftlab.experiments.deep_claims.modular`; effects and
verdicts: :mod:`ftlab.experiments.deep_claims.claims`.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from ftlab.experiments.deep_claims.figures import FIGURES
from ftlab.report import ReportContext

__all__ = ["FIGURES", "primaries_markdown", "quick_banner", "rows_markdown", "run", "sentence"]

ARCH_LABEL = {"resnet18": "(a) BatchNorm", "nf_resnet18": "(b) norm-free", "transformer": "Transformer",
              "both vision": "(a) + (b)"}


def _pts(x: float, unit: str, sign: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "unbounded" if x is not None and math.isinf(x) else "n/a"
    v, d = (100 * x, 1) if unit == "accuracy" else (x, 3)
    return f"{v:+.{d}f}" if sign else f"{v:.{d}f}"


def _interval(lo: float, hi: float, unit: str) -> str:
    return f"[{_pts(lo, unit)}, {_pts(hi, unit)}]"


def sentence(row) -> str:
    """One sentence for a primary that is reversed or task-dependent (empty otherwise)."""
    unit = "points" if row.unit == "accuracy" else "log PR"
    eff = f"{_pts(row.effect, row.unit)} {unit} {_interval(row.ci_low, row.ci_high, row.unit)}"
    if row.verdict == "reversed":
        return (f"Claim {row.claim} is reversed here: the pooled effect is {eff}, confidently against the paper's "
                f"direction (p = {row.p_holm:.2g} after Holm).")
    if row.verdict == "task-dependent":
        return (f"Claim {row.claim} is task-dependent here: the pooled effect is {eff}, but its strata disagree "
                f"(I² = {100 * row.i2:.0f}%, Q p = {row.p_q:.2g}: {row.strata}).")
    return ""


def primaries_markdown(table: pd.DataFrame) -> str:
    """The five primaries: effect with its 95% and family-level intervals, Holm p, verdict, seeds, power for
    a 2-point effect, minimal detectable effect, heterogeneity and the share of runs outside the premise."""
    t = table[table.level == "primary"]
    lines = ["| claim | effect [95% CI] | family interval | p (Holm) | verdict | seeds | power (2 pt) | MDE | Q, I² | "
             "outside premise |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in t.itertuples():
        unit = "pt" if r.unit == "accuracy" else "log PR"
        power = "—" if not math.isfinite(r.power_2pt) else f"{100 * r.power_2pt:.0f}%"
        het = "—" if not math.isfinite(r.q) else f"{r.q:.1f}, {100 * r.i2:.0f}%"
        lines.append(f"| {r.claim} | {_pts(r.effect, r.unit)} {_interval(r.ci_low, r.ci_high, r.unit)} {unit} | "
                     f"{_interval(r.fam_low, r.fam_high, r.unit)} | {r.p_holm:.2g} | **{r.verdict}** | {r.seeds} | "
                     f"{power} | {_pts(r.mde, r.unit, sign=False)} {unit} | {het} | {100 * r.premise_missed:.1f}% |")
    return "\n".join(lines)


def rows_markdown(table: pd.DataFrame) -> str:
    """Secondary rows or ftlab's own findings, one line each."""
    lines = ["| claim | architecture | task | knob | when | effect [95% CI] | p (Holm) | seeds | verdict | "
             "outside premise |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.claim} | {ARCH_LABEL.get(r.arch, r.arch)} | {r.task} | {r.knob} | {r.when} | "
                     f"{_pts(r.effect, r.unit)} {_interval(r.ci_low, r.ci_high, r.unit)} | {r.p_holm:.2g} | {r.seeds} | "
                     f"**{r.verdict}** | {100 * r.premise_missed:.1f}% |")
    return "\n".join(lines)


def quick_banner(n_vision: int, n_modular: int) -> str:
    """What the quick run can and cannot say: below the minimum of seeds, with each primary's planned
    seeds and its power at the quick run's seeds (from the pilot's standard deviation)."""
    from ftlab.experiments.deep_claims.claims import PAPER, POWER_EFFECT, PRIMARIES
    from ftlab.experiments.verdicts import MIN_SEEDS, power

    parts = []
    for p in PRIMARIES:
        n = n_modular if p.claim == 5 else n_vision
        need = p.seeds_needed()
        if need is None:
            parts.append(f"claim {p.claim}: no accuracy effect to power (its minimal detectable effect is reported)")
        else:
            pw = power(POWER_EFFECT, p.pilot_sd, n, m=len(PAPER))
            parts.append(f"claim {p.claim}: {need} seeds planned, power {100 * pw:.0f}% at {n}")
    return (f"> **Quick run: it cannot decide.** {n_vision} vision and {n_modular} Transformer seeds are below the "
            f"rule's minimum of {MIN_SEEDS} seeds, so every verdict below is *inconclusive* by construction, whatever "
            f"the numbers. Power for a {100 * POWER_EFFECT:.0f}-point effect (pilot standard deviations, level 0.05/5): "
            + "; ".join(parts) + ". The decided verdicts are those of the recorded full run (docs/deep.md, "
            "docs/deep-claims.csv; `ftlab reproduce deep --full`).")


def _premise_markdown(vis: dict, mod: dict) -> str:
    pt, ft, mpt, mft = vis["pt"], vis["ft"], mod["pt"], mod["ft"]
    ev = pt[pt.seed.isin(set(ft.seed))]
    lines = ["| | pretrainings below the loss target | fine-tunings below it | rate (PT / FT), every arm | "
             "runs redone at a lower rate |", "|---|---|---|---|---|"]
    for arch in dict.fromkeys(ft.arch):
        p, f = ev[ev.arch == arch], ft[ft.arch == arch]
        redone = int((p.pt_retries > 0).sum() + (f.ft_retries > 0).sum())
        lines.append(f"| {ARCH_LABEL.get(arch, arch)} | {int(p.pt_converged.sum())} of {len(p)} (max loss "
                     f"{p.pt_loss.max():.3g}) | {int(f.ft_converged.sum())} of {len(f)} | "
                     f"{'/'.join(map(str, sorted(set(p.lr))))} / {'/'.join(map(str, sorted(set(f.lr))))} | {redone} |")
    mp = mpt[mpt.seed.isin(set(mft.seed))]
    redone = int((mp.pt_retries > 0).sum() + (mft.ft_retries > 0).sum())
    lines.append(f"| Transformer | {int(mp.pt_converged.sum())} of {len(mp)} (max loss {mp.pt_loss.max():.3g}) | "
                 f"{int(mft.ft_converged.sum())} of {len(mft)} | {'/'.join(map(str, sorted(set(mp.lr))))} / "
                 f"{'/'.join(map(str, sorted(set(mft.lr))))} | {redone} |")
    return "\n".join(lines)


def _figure(ctx: ReportContext, out, rel, name: str, caption: str) -> list[str]:
    if ctx.wants(name) and (out / f"{name}.png").exists():
        return [f"![{caption}]({rel}/{name}.png)", "", f"*{caption}*", ""]
    return []


def run(ctx: ReportContext) -> str:
    """Run the deep study and return the section's Markdown: sweep stores and checkpoints in
    ``ctx.section_dir("deep")`` (a rerun resumes), tables, verdicts and figures in ``ctx.output_dir("deep")``
    (they replace an earlier section's only when this one finishes)."""
    from ftlab.experiments.deep_claims import modular as M
    from ftlab.experiments.deep_claims import vision as V
    from ftlab.experiments.deep_claims.claims import PAPER, primaries_table
    from ftlab.experiments.deep_claims.pipeline import judge, run_modular_part, run_vision_part

    stores, out = ctx.section_dir("deep"), ctx.output_dir("deep")  # sweep stores resume; tables and figures are staged
    vproto, vgrid = V.FULL if ctx.full else V.QUICK
    mproto, mgrid = M.FULL if ctx.full else M.QUICK
    if ctx.seed:
        vgrid = dataclasses.replace(vgrid, seeds=tuple(ctx.seed + s for s in vgrid.seeds))
        mgrid = dataclasses.replace(mgrid, seeds=tuple(ctx.seed + s for s in mgrid.seeds))
    kw = dict(workers=ctx.workers, scheduler=ctx.scheduler, tables_dir=out)
    vis = run_vision_part(stores, proto=vproto, grid=vgrid, **kw)  # DatasetMissing: the report skips the section
    mod = run_modular_part(stores, proto=mproto, grid=mgrid, **kw)
    res = judge(out, vis, mod, gamma_default=vproto.gamma_default, geometry_at=vproto.geometry_at,
                stages=vproto.stages, figures=ctx.figures)
    table, rel = res.claims, "deep"
    md = [quick_banner(len(vgrid.seeds), len(mgrid.seeds)), ""] if not ctx.full else []
    md += [
        "Claims of Anguita et al. (2026, arXiv 2602.20062) on deep networks, tested at CPU scale "
        f"({'full' if ctx.full else 'quick'} run): two vision architectures side by side ((a) a CIFAR-style ResNet-18 "
        "with BatchNorm, (b) the same without normalization and biases, where a rescale is exact; width "
        f"{vproto.width}, Fashion-MNIST at {28 // vproto.downsample}x{28 // vproto.downsample}), pretrained on "
        f"{vproto.n_pt} images of 8 classes and fine-tuned on 2 of them, on the 2 held-out classes and on MNIST "
        f"(n_FT in {list(vgrid.n_ft)}), and a Transformer on modular arithmetic. One knob at a time against a paired "
        "baseline; **one learning rate per architecture and stage for every arm** (tuned on the baseline arm). "
        "**The mapping of the knobs, the data, the sizes and the optimizers are ftlab's choices, not the paper's** "
        "(docs/deep.md).",
        "",
        "**Primary tests** (declared in code before the run; one per claim, Holm over the five; effects paired per "
        "seed, positive = the paper's direction, pooled over their strata with equal weights; exact sign-flip test "
        "and interval; 'no effect' needs the family-level interval inside the margin):",
        "",
        "| claim | statistic | pooled over | margin |", "|---|---|---|---|",
        *[f"| {r.claim} | {r.statistic} | {r.pools} | {r.margin:g} ({r.unit}) |" for r in primaries_table().itertuples()],
        "",
        primaries_markdown(table),
        "",
    ]
    md += [s for s in (sentence(r) for r in table[table.level == "primary"].itertuples()) if s]
    md += ["", *[f"{c}. {PAPER[c]}" for c in PAPER], ""]
    md += _figure(ctx, out, rel, "fig_primaries", "Each primary: its strata (grey, descriptive 95% t intervals) and "
                  "the pooled effect with its 95% (thick) and family-level (thin) sign-flip intervals.")
    md += ["**Secondary rows** (their own Holm family; the primaries decide the claims):", "",
           rows_markdown(table[table.level == "secondary"]), ""]
    for name, cap in (("fig_claim1_kappa", "Claim 1: accuracy change against kappa (solid: at PT initialization; "
                       "dashed: after PT, at the start of fine-tuning)."),
                      ("fig_claim2_s", "Claim 2: accuracy change against s at PT initialization."),
                      ("fig_claim3_gamma", "Claim 3: accuracy change against the fresh readout's scale gamma."),
                      ("fig_claim4_signature", "Claim 4: compression against alignment per intervention."),
                      ("fig_claim5_balancedness", "Claim 5: accuracy change against balancedness b.")):
        md += _figure(ctx, out, rel, name, cap)
    own = table[table.level == "ftlab"]
    if not own.empty:
        md += ["**ftlab's own findings** (the opposite knob directions; claims the paper does not make, their own "
               "Holm family):", "", rows_markdown(own), ""]
    md += ["**Training premise and learning rates** (a run is inside the premise when it and the pretraining it "
           "starts from reached the training-loss target; a claim with more than 5% of its runs outside is "
           "'outside the premise'):", "", _premise_markdown(vis, mod), ""]
    md += _figure(ctx, out, rel, "fig_accuracy", "Fine-tuned test accuracy against n_FT per arm.")
    md += _figure(ctx, out, rel, "fig_geometry", "Per stage: centred PR after fine-tuning, centred ENSD and CKA with "
                  "the unintervened pretrained network.")
    md.append(f"Tables: `{rel}/claims.csv` (primaries, secondary rows, ftlab's own findings), `{rel}/primaries.csv` "
              f"(the declared tests), `{rel}/vision_*.csv`, `{rel}/modular_*.csv` (sidecars hold the protocol).")
    return "\n".join(md)

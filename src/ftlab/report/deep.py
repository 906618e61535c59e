"""Report section ``deep``: the paper's deep-network claims at CPU scale (``ftlab reproduce deep``).

Quick run (default, a few minutes): 2 seeds, both vision architectures, three tasks, one value per
knob; its verdicts are indicative only. ``--full``: 8 paired seeds and the full grids
(:data:`ftlab.experiments.deep_claims.vision.FULL`, :data:`ftlab.experiments.deep_claims.modular.FULL`).
Protocols: :mod:`ftlab.experiments.deep_claims.vision` and :mod:`~ftlab.experiments.deep_claims.modular`;
effects and verdicts: :mod:`ftlab.experiments.deep_claims.claims`.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from ftlab.experiments.deep_claims.figures import FIGURES
from ftlab.report import DataUnavailable, ReportContext

__all__ = ["FIGURES", "claims_markdown", "holds", "run", "verdict_summary"]

ARCH_LABEL = {"resnet18": "(a) ResNet-18 with BatchNorm", "nf_resnet18": "(b) normalization-free ResNet-18",
              "transformer": "Transformer"}
MEANING = {
    1: "Moving weight norm from the early layers to the readout (kappa < 1), at pretraining initialization or as "
       "an exact rebalance of the pretrained network, {verb} fine-tuning accuracy against kappa = 1.",
    2: "Starting pretraining from a smaller absolute scale (s < 1) {verb} fine-tuning accuracy against s = 1 "
       "(the claim is that it degrades: a positive effect).",
    3: "A smaller fresh readout (gamma < 1) {verb} accuracy against gamma = 1 at the intermediate n_FT.",
    4: "Across arms, accuracy gains {verb} with compression (lower centred PR) and with alignment to the "
       "unintervened pretrained network (higher centred ENSD) of the pooled features.",
    5: "Lower balancedness (b < 0 vs b = 0) {verb} Transformer fine-tuning accuracy on modular arithmetic.",
}


def _num(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:+.{digits}f}"


def holds(table: pd.DataFrame, claim: int, arch: str) -> str | None:
    """``"holds"`` when at least half of the claim's rows for ``arch`` are reproduced and none is
    reversed; ``"reversed"`` when at least half are reversed and none reproduced; ``"mixed"`` when
    both occur; ``"undecided"`` otherwise; ``None`` without rows (ftlab's summary rule)."""
    t = table[(table.claim.astype(str) == str(claim)) & (table.arch == arch)]
    if t.empty:
        return None
    rep, rev = int((t.verdict == "reproduced").sum()), int((t.verdict == "reversed").sum())
    if rep and rev:
        return "mixed"
    if rep * 2 >= len(t):
        return "holds"
    if rev * 2 >= len(t):
        return "reversed"
    return "undecided"


def verdict_summary(table: pd.DataFrame, claim: int) -> str:
    """One sentence: in which architecture(s) the claim holds, with the verdict counts per architecture."""
    parts, held = [], []
    for arch in ("resnet18", "nf_resnet18", "transformer"):
        h = holds(table, claim, arch)
        if h is None:
            continue
        t = table[(table.claim.astype(str) == str(claim)) & (table.arch == arch)]
        counts = ", ".join(f"{n} {v}" for v, n in t.verdict.value_counts().items())
        parts.append(f"{ARCH_LABEL[arch]}: {h} ({counts} of {len(t)})")
        if h == "holds":
            held.append(arch)
    vision = [a for a in ("resnet18", "nf_resnet18") if holds(table, claim, a) is not None]
    if vision:
        where = ("both" if len(held) == 2 else "(a) only" if held == ["resnet18"] else "(b) only" if held ==
                 ["nf_resnet18"] else "neither")
        return f"Holds in {where}. " + "; ".join(parts) + "."
    return ("Holds. " if held else "Does not hold. ") + "; ".join(parts) + "."


def claims_markdown(table: pd.DataFrame, *, own: bool = False) -> str:
    head = ("| claim | architecture | task | knob | when | effect [95% CI] | p (Holm) | seeds | verdict | PT loss | "
            "FT loss |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.claim} | {r.arch} | {r.task} | {r.knob} | {r.when} | {_num(r.effect)} "
                     f"[{_num(r.ci_low)}, {_num(r.ci_high)}] | {r.p_holm:.3g} | {r.seeds} | **{r.verdict}** | "
                     f"{r.pt_train_loss:.3g} | {r.ft_train_loss:.3g} |")
    if own:
        lines.append("")
        lines += [f"* {s}" for s in dict.fromkeys(table.paper_statement)]
    return "\n".join(lines)


def _elr_markdown(elr: pd.DataFrame) -> str:
    e = elr[elr.arch == "resnet18"]
    if e.empty:
        return ""
    stages = list(dict.fromkeys(e.stage))
    lines = ["| arm | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for (knob, when, value), g in e.groupby(["knob", "when", "value"], sort=False):
        cell = {r.stage: (f"x{r.weight_factor:.2g} (ELR x{r.elr_factor:.2g})" if math.isfinite(r.elr_factor)
                          else f"x{r.weight_factor:.2g}") for r in g.itertuples()}
        lines.append(f"| {knob}={value:g} ({when}) | " + " | ".join(cell.get(s, "") for s in stages) + " |")
    return "\n".join(lines)


def _redone(*tables: pd.DataFrame) -> int:
    """How many runs of the tables were redone at a lower rate (their ``*_retries`` columns)."""
    n = 0
    for t in tables:
        for col in ("pt_retries", "ft_retries"):
            if col in t.columns:
                n += int((pd.to_numeric(t[col], errors="coerce").fillna(0) > 0).sum())
    return n


def run(ctx: ReportContext) -> str:
    from ftlab.data import DatasetMissing
    from ftlab.experiments.deep_claims import modular as M
    from ftlab.experiments.deep_claims import vision as V
    from ftlab.experiments.deep_claims.claims import PAPER
    from ftlab.experiments.deep_claims.pipeline import judge, run_modular_part, run_vision_part

    out = ctx.section_dir("deep")
    vproto, vgrid = V.FULL if ctx.full else V.QUICK
    mproto, mgrid = M.FULL if ctx.full else M.QUICK
    if ctx.seed:
        vgrid = dataclasses.replace(vgrid, seeds=tuple(ctx.seed + s for s in vgrid.seeds))
        mgrid = dataclasses.replace(mgrid, seeds=tuple(ctx.seed + s for s in mgrid.seeds))
    try:
        vis = run_vision_part(out, proto=vproto, grid=vgrid, workers=ctx.workers, scheduler=ctx.scheduler)
    except DatasetMissing as exc:
        raise DataUnavailable(str(exc)) from exc
    mod = run_modular_part(out, proto=mproto, grid=mgrid, workers=ctx.workers, scheduler=ctx.scheduler)
    res = judge(out, vis, mod, gamma_default=vproto.gamma_default, geometry_at=vproto.geometry_at,
                stages=vproto.stages, figures=ctx.figures)
    table, own = res.claims, res.own
    rel = out.relative_to(ctx.out_dir)
    pt, ft, mpt, mft = vis["pt"], vis["ft"], mod["pt"], mod["ft"]
    counts = ", ".join(f"{n} {v}" for v, n in table.verdict.value_counts().items())
    md = []
    if not ctx.full:
        md += ["> **Quick run: the verdicts below are indicative only.** "
               f"{len(vgrid.seeds)} seeds and one value per knob cannot decide most claims; the recorded full run "
               "(8 paired seeds, full grids, `ftlab reproduce deep --full`) is in docs/deep.md and "
               "docs/deep-claims.csv.", ""]
    md += [
        "Claims of Anguita et al. (2026, arXiv 2602.20062) on deep networks, tested at CPU scale "
        f"({'full' if ctx.full else 'quick'} run). Two vision architectures side by side: (a) a CIFAR-style ResNet-18 "
        "with BatchNorm (the paper's architecture) and (b) the same topology without normalization and biases, in "
        f"which a rescale is exact; width {vproto.width}, Fashion-MNIST at {28 // vproto.downsample}x"
        f"{28 // vproto.downsample} pixels. Pretraining on {vproto.n_pt} images of 8 Fashion-MNIST classes; "
        "fine-tuning on 2 of those classes (`pt_subset`), on the 2 held-out classes (`heldout`) and on MNIST "
        f"(`mnist`, the stand-in for SVHN), n_FT in {list(vgrid.n_ft)}. One knob at a time against a paired "
        f"baseline: kappa in {list(vgrid.kappa)} at pretraining initialization and as an exact rebalance after "
        f"pretraining, s in {list(vgrid.s)} at initialization, gamma in {list(vgrid.gamma)} (baseline "
        f"{vproto.gamma_default:g}) at the start of fine-tuning. Both stages train towards a training loss "
        f"< {vproto.loss_target:g}; every arm's learning rate comes from a small grid on a separate tuning seed. "
        "**How the knobs map onto deep networks, the data, the sizes and the optimizers are ftlab's choices, not "
        "the paper's** (docs/deep.md). Effects are paired per seed and signed so that positive = the paper's "
        "direction; intervals are 95% Student-t over seeds (correlations: over Fisher's z); p-values are "
        "Holm-corrected across the whole family of the paper's claims.",
        "",
        f"Verdicts ({len(table)} rows): {counts}.",
        "",
    ]
    figs = {1: "fig_claim1_kappa", 2: "fig_claim2_s", 3: "fig_claim3_gamma", 4: "fig_claim4_signature",
            5: "fig_claim5_balancedness"}
    for c in (1, 2, 3, 4, 5):
        t = table[table.claim.astype(str) == str(c)]
        if t.empty:
            continue
        rep = (t.verdict == "reproduced").sum()
        verb = "improved" if c != 2 else "degraded"
        verb = verb if rep * 2 >= len(t) else f"did not consistently change (the claim: {verb})"
        if c == 4:
            verb = "correlated" if rep * 2 >= len(t) else "did not consistently correlate"
        md += [f"### Claim {c}: {PAPER[c]}", "", f"{verdict_summary(table, c)} {MEANING[c].format(verb=verb)}", "",
               claims_markdown(t), ""]
        if ctx.wants(figs[c]) and (out / f"{figs[c]}.png").exists():
            md += [f"![Claim {c}: effect against the knob]({rel}/{figs[c]}.png)", ""]
    elr = vis.get("elr")
    if elr is not None and not elr.empty:
        md += ["**What a rescale does to (a).** In the BatchNorm network a weight that feeds a BatchNorm is "
               "scale-invariant: multiplying it by f leaves the function unchanged and multiplies its effective SGD "
               "learning rate by 1/f^2. The rebalance therefore cannot include (a)'s readout and acts on (a) only "
               "through these learning-rate changes (geometric mean per stage, at initialization):", "",
               _elr_markdown(elr), ""]
    conv = ft.ft_converged.astype(bool).mean() if len(ft) else math.nan
    md += [f"**Training premise.** Pretraining reached a training loss of median {pt.pt_loss.median():.3g} "
           f"(max {pt.pt_loss.max():.3g}; test accuracy on the pretraining classes {pt.pt_acc.mean():.3f}); "
           f"{100 * conv:.0f}% of the {len(ft)} vision fine-tunings reached the loss target "
           f"(largest reached loss {ft.ft_loss.max():.3g}). Transformer: pretraining loss median "
           f"{mpt.pt_loss.median():.3g}, test accuracy {mpt.pt_acc.mean():.3f} on (a + b) mod {mproto.modulus}; "
           f"{100 * mft.ft_converged.astype(bool).mean():.0f}% of {len(mft)} fine-tunings reached the target. "
           "The learning rates chosen per arm are in the `lr` columns of the tables; "
           f"{_redone(pt, ft, mpt, mft)} evaluation runs that diverged (or, in vision pretraining, collapsed) at "
           "that rate were redone from the same start at the next lower rate of the grid (`pt_lr_used`, "
           "`ft_lr_used`).", ""]
    if not own.empty:
        md += ["**ftlab's own findings** (claims the paper does not make; their own Holm family, never counted "
               "with the paper's):", "", claims_markdown(own, own=True), ""]
    for name, cap in (("fig_accuracy", "Fine-tuned test accuracy against n_FT per arm (mean, unpaired 95% interval)."),
                      ("fig_geometry", "Per stage: centred PR after fine-tuning, centred ENSD and CKA with the "
                                       "unintervened pretrained network (means over seeds and tasks).")):
        if ctx.wants(name) and (out / f"{name}.png").exists():
            md += [f"![{cap}]({rel}/{name}.png)", "", f"*{cap}*", ""]
    md.append(f"Tables: `{rel}/claims.csv` (the paper's claims), `{rel}/claims_own.csv`, `{rel}/vision_*.csv`, "
              f"`{rel}/modular_*.csv` (sidecars hold the protocol).")
    return "\n".join(md)

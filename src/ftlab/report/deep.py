"""Report section ``deep``: the paper's deep-network claims at CPU scale (``ftlab reproduce deep``).

Quick run (default): ResNet-18 width 8, 3 seeds, n_FT in {10, 30, 100, 300}; Transformer on
(a + b) mod 30, 3 seeds. ``--full``: width 8, 6 seeds, n_FT in {10, ..., 1000}, more values of
every knob. Protocols: :mod:`ftlab.experiments.deep_claims.resnet` and :mod:`ftlab.experiments.deep_claims.modular`;
verdict rule: :mod:`ftlab.experiments.deep_claims.claims`.
"""

from __future__ import annotations

import dataclasses

from ftlab.report import DataUnavailable, ReportContext


def _fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:+.3f}"


def _claims_md(table) -> str:
    lines = ["| claim | verdict | effect | 95% CI over seeds | seeds | effect definition |", "|---|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.claim} | **{r.verdict}** | {_fmt(r.effect)} | [{_fmt(r.ci_low)}, {_fmt(r.ci_high)}] | "
                     f"{r.seeds} | {r.definition} |")
    return "\n".join(lines)


def run(ctx: ReportContext) -> str:
    from ftlab.data import DatasetMissing
    from ftlab.experiments.deep_claims import modular as M
    from ftlab.experiments.deep_claims import resnet as R
    from ftlab.experiments.deep_claims.pipeline import run_modular_part, run_resnet_part, write_claims

    out = ctx.section_dir("deep")
    figs = ctx.figures
    rproto, rgrid = R.FULL if ctx.full else R.QUICK
    mproto, mgrid = M.FULL if ctx.full else M.QUICK
    if ctx.seed:
        rgrid = dataclasses.replace(rgrid, seeds=tuple(ctx.seed + s for s in rgrid.seeds))
        mgrid = dataclasses.replace(mgrid, seeds=tuple(ctx.seed + s for s in mgrid.seeds))
    try:
        rpt, rft, rclaims = run_resnet_part(out, proto=rproto, grid=rgrid, workers=ctx.workers,
                                            scheduler=ctx.scheduler, figures=figs)
    except DatasetMissing as exc:
        raise DataUnavailable(str(exc)) from exc
    mpt, mft, mclaims = run_modular_part(out, proto=mproto, grid=mgrid, workers=ctx.workers, scheduler=ctx.scheduler,
                                         figures=figs)
    table = write_claims(rclaims + mclaims, out / "claims.csv")
    rel = out.relative_to(ctx.out_dir)
    mode = "full" if ctx.full else "quick"
    counts = table.verdict.value_counts().to_dict()
    md = [
        "Claims of Anguita et al. (2026, arXiv 2602.20062) on deep networks (spec theory.md §6 claim 7, §7.1), "
        f"measured by ftlab at CPU scale ({mode} run). The paper used ResNet-18 on CIFAR-100/SVHN; here a width-"
        f"{rproto.width} CIFAR-style ResNet-18 is pretrained on {rproto.n_pt} Fashion-MNIST images of "
        f"{rproto.n_pt_classes} classes and fine-tuned on the 2 held-out classes (`fmnist_heldout`) or on MNIST "
        "(`mnist`, the offline stand-in for SVHN). **How the knobs map to deep networks, where they are applied "
        f"(here: `{rproto.when}`), the layer split, the optimizer and every size are ftlab's choices ([U] in the "
        "spec), not the paper's.** Effects are signed so that positive = the paper's direction; intervals are 95% "
        "Student-t over seeds of paired differences. Verdict: reproduced if the interval is above 0, not "
        "reproduced if it is below the margin (1 accuracy point; 0.1 for correlations), else inconclusive.",
        "",
        f"Verdicts: {', '.join(f'{v} {n}' for v, n in sorted(counts.items()))}.",
        "",
        _claims_md(table),
        "",
        f"Pretraining test accuracy (PT classes): mean {rpt.pt_acc.mean():.3f} over {len(rpt)} networks. "
        f"Transformer PT test accuracy on (a + b) mod {mproto.modulus}: mean {mpt.pt_acc.mean():.3f}.",
        "",
    ]
    for name, cap in (("fig_resnet_accuracy", "Fine-tuned test accuracy vs n_FT per intervention (mean and unpaired 95% CI "
                                              "over seeds, which differ in their held-out classes; verdicts use paired "
                                              "differences)."),
                      ("fig_resnet_geometry", "PR before/after fine-tuning and ENSD per layer (mean over seeds)."),
                      ("fig_modular", "Transformer: fine-tuned accuracy vs balancedness at FT start.")):
        if ctx.wants(name) and (out / f"{name}.png").exists():
            md += [f"![{cap}]({rel}/{name}.png)", "", f"*{cap}*", ""]
    md.append(f"Tables: `{rel}/resnet_ft.csv`, `{rel}/modular_ft.csv`, `{rel}/claims.csv` (sidecars hold the protocol).")
    return "\n".join(md)

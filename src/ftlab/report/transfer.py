"""Report section ``transfer``: training-free task-vector transfer on real pretrained pairs (BiCo and baselines).

``ftlab reproduce transfer`` runs :func:`ftlab.experiments.transfer_accuracy.run.run_benchmark` (quick by default,
``--full`` for the recorded design) and writes, under ``<out>/transfer/``: ``records.csv`` (the compact per-seed
records, the format of ``docs/transfer-benchmark-records.csv``), ``table.csv`` (accuracies with intervals),
``gap_closed.csv``, ``verdicts.csv`` and one figure per family of pairs (``vision.png``, ``text.png``,
``family.png``; figure names ``vision``, ``text``, ``family``). Every number and verdict is computed from this run's
records by :func:`ftlab.experiments.transfer_accuracy.records.summarize`; :func:`render` writes the Markdown, the
same for the report and for docs/transfer-benchmark.md. The prose of the section is :data:`TEXT`.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from ftlab.report import ReportContext

__all__ = ["FIGURES", "TEXT", "check_data", "render", "run", "verdict_table"]

#: The section's prose, one block per part (``str.format`` fields filled by :func:`render`).
TEXT = {
    "intro": (
        "Can a fine-tuning be carried from one pretrained model to another without training? BiCo (Son, Jung, Park, "
        "Baik, arXiv 2605.28444) maps a task vector with two orthogonal Procrustes maps per layer, fitted on input "
        "activations and on output gradients. Here it meets its baselines (naive pad/truncate, activation-only "
        "(Theseus-like), the paper's one-sided ablations, TransFusion on equal architectures) and direct fine-tuning "
        "on **real pretrained pairs that install offline**: EfficientNet-Lite0 → Lite1 (depth), Lite1 → Lite2 "
        "(width), Lite0 → Lite2 (both), paraphrase-MiniLM-L3-v2 → all-MiniLM-L6-v2 (depth) and all-MiniLM-L6-v2 → "
        "all-mpnet-base-v2 (width ×2, depth ×2, other pretraining), and on small ViTs trained here along an axis "
        "of relatedness. The real models have no head for the tasks, so each reads them through a linear probe "
        "fitted on its frozen base and kept frozen while fine-tuning (as the paper evaluates T5); the target's own "
        "probe is the baseline. `bico` is BiCo with uncentred cross-covariances, as the public reimplementation "
        "`apanariello4/merge-and-rebase` computes it (whether the paper centres is not confirmed), copies summed and "
        "no repair; `bico_centred` centres them (ftlab's variant); `+repair` adds ftlab's statistics repair and copy "
        "rule; `recommended` is ftlab's recommended transfer (`ftlab.transfer`'s defaults: uncentred BiCo, copies "
        "split, BatchNorm statistics re-pinned by mean and spread) with α chosen on validation, and "
        "`recommended/<rule>` the same under each copy rule. Held-out settings (`… held-out`) are the real pairs on "
        "a task that designed none of ftlab's defaults (Fashion-MNIST; WordNet verb glosses)."),
    "recommended": (
        "### ftlab's recommended transfer, judged\n\nFixed in code before the recorded run "
        "(`ftlab.experiments.transfer_accuracy.claims.RECOMMENDED_PRIMARIES`) and judged as their own family (Holm over "
        "{n}) with the same rule as the paper's claims. \"At least the target's own accuracy\" holds where an "
        "accuracy claim's verdict is *reproduced* or *no effect* (the interval inside ±{acc_margin:.0f} points)."),
    "run": "Run: {run}. Wall time of this invocation {wall:.1f} min (finished points are read from the sweep store).",
    "verdicts": (
        "### Primary tests\n\nFixed in code before the recorded run "
        "(`ftlab.experiments.transfer_accuracy.claims.PRIMARIES`): one per claim of the paper as ftlab states it "
        "for the offline pairs, plus \"BiCo at α = 1 beats the target's own accuracy\" for each family of real pairs "
        "and the share-of-the-gap yardstick. Per seed a paired effect (pooled over the claim's pairs), the exact "
        "sign-flip test and its 95% interval, Holm's correction over the {n} primaries, at least {min_seeds} seeds, "
        "margins of practical irrelevance {acc_margin:.0f} accuracy points and {gap_margin:.2f} of the gap "
        "(`ftlab.experiments.verdicts`). The paper's figures are gains over CLIP's zero-shot accuracy averaged over 8 "
        "vision tasks; the effects here are measured on the offline analogues named in the second column."),
    "premise": (
        "### Premise, checked before judging\n\nA share of the gap means something only where direct fine-tuning "
        "clearly beats the target's own accuracy: every setting needs a mean gap of at least {min_gap:.0f} points and "
        "no run below {min_run_gap:.0f} points. Premise {premise_state}."),
    "pairs": (
        "### Per pair\n\nThe target's own accuracy (linear probe; the pretrained head for the controlled ViTs), its "
        "direct fine-tuning, and the share of that gap each method closes (mean [95% t-interval] over seeds; "
        "`(acc − base) / (fine-tuned − base)` per seed, accuracies averaged over the tasks):"),
    "variants": (
        "ftlab's options side by side (share of the gap closed, mean [95% t-interval]): the statistics repair on its "
        "own (`naive+repair`), with uncentred and centred BiCo, and the recommended transfer under each copy rule:"),
    "figures": "One figure per family of pairs (test accuracy, mean over seeds with its 95% interval):",
    "alpha": (
        "### Where the searched α landed\n\nα is searched on validation over {grid} (0: the target left as it is; ties "
        "go to the smallest α). Per setting and method: the median α and how often it landed at an end of the grid. "
        "A search that lands at 0 declined the transfer; one at {top:g} may want a wider grid."),
    "mechanism": (
        "### The mechanism: drift at the head norm and collapsed predictions (α = 1)\n\nPer pair: the RMS shift of "
        "the channel means at the target's last BatchNorm on the calibration images, in base B's channel standard "
        "deviations (before any repair; B's own fine-tuning freezes these statistics too), the largest share of "
        "test images predicted as one class, and the number of classes never predicted."),
    "findings": ("### ftlab's own findings (not claims of the paper; judged as a separate family with the same "
                 "rule)"),
    "roc": (
        "### Can the diagnostic tell a harmful transfer?\n\nThe estimate against \"the transfer at α = 1 scores below "
        "the target's own accuracy\" over every recorded cell (setting, task, seed): AUROC with a 95% bootstrap "
        "interval (cells resampled; cells of one setting are not independent, so it is optimistic). A warning is worth "
        "printing only at an operating point with at most {fa:.0f}% false alarms and at least {hits:.0f}% hits, chosen "
        "on the validation outcomes of the design cells and checked on the cells that did not set it."),
    "diagnostic": (
        "### The diagnostic's threshold, checked\n\n`ftlab.transfer.diagnose` estimates the share of the "
        "task vector that carries over from the Procrustes similarity of each layer's statistics, weighted by where "
        "the task vector sits (ftlab's estimator). ftlab's rule (`ftlab.transfer.diagnose.expectation`) was first "
        "meant to expect a transfer below the target's own accuracy at α = 1 when the estimate is below a threshold; "
        "here that threshold is set on the validation cells of the EfficientNet-Lite pairs and the controlled ViTs "
        "and judged on the test cells of the text pairs, which did not set it (\"warned\" counts the cells the "
        "threshold calls low). Where the AUROC above shows no operating point, `ftlab transfer` reports the estimate "
        "as an estimate of alignment only, never as a prediction of accuracy. {rule_text}"),
    "layers": (
        "### Where the task vector sits and how well the bases align (BiCo's fit, 100 samples)\n\nMedians over the "
        "layers of each fifth of the target's depth, over tasks and seeds, of the Procrustes similarity "
        "`‖AᵀB‖_* / (‖A‖‖B‖)` of the two bases' rows (1 when one row set is an orthogonal re-coding of the other)."),
}

#: Figures, one per family of pairs: ``(name, title, which settings)``.
FIGURES = (("vision", "EfficientNet-Lite pairs", "vision"), ("text", "Text pairs (MiniLM, MPNet)", "text"),
           ("family", "Controlled ViTs, most related target first", "family"))


#: The methods of the main per-pair table; ftlab's options get a table of their own (:data:`VARIANT_COLUMNS`).
MAIN_COLUMNS = ("naive", "transfusion", "bico_input_only", "bico_output_only", "activation_only", "bico",
                "bico_centred", "recommended")
VARIANT_COLUMNS = ("naive+repair", "bico+repair", "bico_centred+repair", "recommended/sum", "recommended/split",
                   "recommended/first")


def check_data(*, full: bool = False) -> list[str]:
    """Raise :class:`ftlab.data.DatasetMissing` (one line naming the package) if a dataset or required weights are
    missing (the report then skips the section and says why).

    Returns notes for optional pieces that are missing (all-mpnet-base-v2, which only ``--full`` uses).
    """
    from ftlab.data import DatasetMissing, load_digits, load_fashion_mnist, load_mnist
    from ftlab.data.text import load_wordnet_supersenses, minilm_l3_onnx_path, minilm_l6_path
    from ftlab.data.weights import efficientnet_lite_path, mpnet_part_paths

    load_fashion_mnist("test")
    load_mnist("test")
    load_digits("test")
    load_wordnet_supersenses()
    minilm_l6_path()
    minilm_l3_onnx_path()
    for v in ("lite0", "lite1", "lite2"):
        efficientnet_lite_path(v)
    notes = []
    if full:
        try:
            mpnet_part_paths()
        except DatasetMissing as exc:
            notes.append(f"The pair minilm_l6->mpnet_base was left out: {exc}.")
    return notes


def _pct(x, digits: int = 0) -> str:
    return "–" if x is None or not math.isfinite(float(x)) else f"{100 * float(x):.{digits}f}%"


def _effect(c, j) -> str:
    """Effect [95% interval]: accuracy effects in points, gap effects in % of the gap."""
    if not math.isfinite(j.effect):
        return "–"
    unit, fmt = (" of the gap", "{:+.0f}%") if c.kind in ("gap", "dose") else (" pts", "{:+.1f}")
    bounded = math.isfinite(j.ci_low) and math.isfinite(j.ci_high)
    iv = f" [{fmt.format(100 * j.ci_low)}, {fmt.format(100 * j.ci_high)}]" if bounded else " [unbounded]"
    return fmt.format(100 * j.effect) + iv + unit


def verdict_table(rows, *, primaries: bool) -> str:
    """One row per claim: the claim, what is measured, effect [95% interval], Holm p, seeds, premise, verdict."""
    head = ("| claim | source | measured here | effect [95% interval] | p (Holm) | seeds | premise missed | verdict |"
            if primaries else "| ftlab's finding | measured here | effect [95% interval] | p (Holm) | seeds | verdict |")
    lines = [head, "|---" * (8 if primaries else 6) + "|"]
    for c, j, _ in rows:
        src = "the paper (arXiv 2605.28444)" if c.source == "paper" else "ftlab"
        cells = ([c.quote, src, c.measured] if primaries else [c.quote, c.measured])
        cells += [_effect(c, j), f"{j.p_holm:.3g}" if math.isfinite(j.p_holm) else "–", str(j.n)]
        if primaries:
            cells.append(_pct(j.premise_missed))
        cells.append(f"**{j.verdict}**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def premise_markdown(premise) -> str:
    lines = ["| setting | target's own accuracy | direct fine-tuning | gap [95% interval] | seeds | runs below floor | "
             "premise |", "|---|---|---|---|---|---|---|"]
    for _, r in premise.iterrows():
        iv = f" [{100 * r.gap_low:.1f}, {100 * r.gap_high:.1f}]" if math.isfinite(r.gap_low) else ""
        lines.append(f"| {r.setting} | {_pct(r.base, 1)} | {_pct(r.finetuned, 1)} | {100 * r.gap:.1f} pts{iv} | "
                     f"{r.seeds} | {r.runs_below} | {'holds' if r.premise else '**fails**'} |")
    return "\n".join(lines)


def pairs_markdown(sm, settings, *, calibration: str = "n100", columns=MAIN_COLUMNS) -> str:
    """Per setting: base and fine-tuned accuracy, then per method of ``columns`` the share of the gap closed at
    alpha = 1 and with alpha searched (mean [95% t-interval] over seeds)."""
    gaps = sm.gaps[sm.gaps["setting"].isin(settings)]
    methods = [m for m in columns if m in set(gaps["method"])]
    prem = sm.premise.set_index("setting") if len(sm.premise) else None
    lines = ["| setting | base | fine-tuned | α | " + " | ".join(methods) + " |",
             "|---|---|---|---" + "|---" * len(methods) + "|"]
    for s in settings:
        for mode in ("fixed", "searched"):
            g = gaps[(gaps["setting"] == s) & (gaps["alpha_mode"] == mode) & (gaps["calibration"] == calibration)]
            g = g.set_index("method")
            if not len(g):
                continue
            cells = [f"{_pct(g.loc[m, 'gap_closed'])} [{_pct(g.loc[m, 'gap_low'])}, {_pct(g.loc[m, 'gap_high'])}]"
                     if m in g.index and math.isfinite(g.loc[m, "gap_closed"]) else "–" for m in methods]
            first = mode == "fixed"
            base = _pct(prem.loc[s, "base"], 1) if first and prem is not None and s in prem.index else ""
            ft = _pct(prem.loc[s, "finetuned"], 1) if first and prem is not None and s in prem.index else ""
            lines.append(f"| {s if first else ''} | {base} | {ft} | {'= 1' if first else 'searched'} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def layer_markdown(layers) -> str:
    if not len(layers):
        return "*No layer diagnostics in this run.*"
    lines = ["| setting | relative depth | layers | similarity of inputs | similarity of output gradients | share of "
             "‖τ_A‖² |", "|---|---|---|---|---|---|"]
    for _, r in layers.iterrows():
        lines.append(f"| {r.setting} | {r.depth} | {int(r.layers)} | {r.in_similarity:.2f} | {r.out_similarity:.2f} | "
                     f"{100 * r.tau_share:.0f}% |")
    return "\n".join(lines)


def rule_markdown(rule: dict, ranking: dict) -> str:
    """The diagnostic rule's check: threshold, hits and false alarms on the cells that set it and on the others."""
    if not rule:
        return "*The diagnostic's estimate was not recorded in this run.*"

    def part(name: str, r: dict) -> str:
        if "error_rate" not in r:
            return f"{name}: no cells"
        return (f"{name}: {r['cells']} cells, {r['below']} below the target's own accuracy, {r['warned']} warned; "
                f"{r['hits']} hits, {r['false_alarms']} false alarms, {r['misses']} misses (error rate "
                f"{100 * r['error_rate']:.0f}%)")

    text = (f"Threshold set on the design cells: **{rule['fitted']:.3f}** (library default "
            f"`BELOW_TARGET_ESTIMATE = {rule['library']:.3f}`). " + "; ".join(
                [part("design cells", rule["design"]), part("cells kept apart (text pairs)", rule["held_out"]),
                 part("all cells with the library's threshold", rule["all_library"])]) + ".")
    if ranking.get("rho") is not None:
        text += (f" The estimate ranks the {ranking['n']} (setting, task) cells by BiCo's gain with Spearman ρ = "
                 f"{ranking['rho']:+.2f} [{ranking['low']:+.2f}, {ranking['high']:+.2f}].")
    per = rule.get("per_setting")
    if per is not None and len(per):
        lines = ["| setting | mean estimate | BiCo minus base (pts) | share of cells below | cells |",
                 "|---|---|---|---|---|"]
        for _, r in per.iterrows():
            lines.append(f"| {r.setting} | {r.estimate:.3f} | {100 * r.gain:+.1f} | {_pct(r.below)} | {int(r.cells)} |")
        text += "\n\n" + "\n".join(lines)
    return text


def alpha_markdown(alpha) -> str:
    if not len(alpha):
        return "*No searched α in this run.*"
    lines = ["| setting | method | cells | median α | at 0 | at the top |", "|---|---|---|---|---|---|"]
    for _, r in alpha.iterrows():
        if r.method in VARIANT_COLUMNS:
            continue
        lines.append(f"| {r.setting} | {r.method} | {int(r.cells)} | {r.median_alpha:g} | {_pct(r.at_zero)} | "
                     f"{_pct(r.at_top)} |")
    return "\n".join(lines)


def mechanism_markdown(mech) -> str:
    if not len(mech):
        return "*No mechanism records in this run.*"
    lines = ["| setting | transfer | drift at the head norm (sd) | largest class share | classes never predicted | "
             "seeds |", "|---|---|---|---|---|---|"]
    for _, r in mech.iterrows():
        drift = f"{r.head_drift:.2f}" if math.isfinite(r.head_drift) else "–"
        lines.append(f"| {r.setting} | {r.method} | {drift} | {_pct(r.top_share)} | {r.never_predicted:.1f} | "
                     f"{int(r.seeds)} |")
    return "\n".join(lines)


def roc_markdown(roc: dict) -> str:
    if not roc:
        return "*The diagnostic's estimate was not recorded in this run.*"
    lines = ["| transfer (α = 1) | cells | below the target | AUROC [95% interval] | operating point (design cells) | "
             "held-out hits / false alarms | worth a warning |", "|---|---|---|---|---|---|---|"]
    for m, r in roc.items():
        op = "none reaches the criteria" if r.get("operating") is None else f"estimate < {r['operating']:.3f}"
        ho = (f"{_pct(r.get('held_out_hits'))} / {_pct(r.get('held_out_false_alarms'))}"
              if r.get("operating") is not None else "–")
        lines.append(f"| {m} | {r['cells']} | {r['below']} | {r['auroc']:.2f} [{r['auroc_low']:.2f}, "
                     f"{r['auroc_high']:.2f}] | {op} | {ho} | {'yes' if r.get('held_out_ok') else 'no'} |")
    return "\n".join(lines)


def _premise_state(sm) -> str:
    if not len(sm.premise):
        return "not checked (no records)"
    failing = list(sm.premise.loc[~sm.premise["premise"], "setting"])
    return "holds on every setting" if not failing else "fails on " + ", ".join(failing)


def render(sm, *, figures: dict[str, str], run: str = "", wall: float = math.nan) -> str:
    """The section's Markdown from a :class:`~ftlab.experiments.transfer_accuracy.records.BenchmarkSummary`:
    the primaries' verdicts first, then the premise, per-pair shares, figures, ftlab's findings, the diagnostic and
    the per-layer alignment. ``figures``: ``{figure name: relative path}`` of the figures written."""
    from ftlab.experiments.transfer_accuracy.claims import ACC_MARGIN, GAP_MARGIN, MIN_RUN_GAP
    from ftlab.experiments.transfer_accuracy.pilot import MIN_GAP
    from ftlab.experiments.verdicts import MIN_SEEDS

    md = []
    if sm.recommended:
        md += [TEXT["recommended"].format(n=len(sm.recommended), acc_margin=100 * ACC_MARGIN),
               verdict_table(sm.recommended, primaries=True)]
    md += [TEXT["verdicts"].format(n=len(sm.primaries), min_seeds=MIN_SEEDS, acc_margin=100 * ACC_MARGIN,
                                   gap_margin=GAP_MARGIN),
           verdict_table(sm.primaries, primaries=True) if sm.primaries else "*No primary has data in this run.*",
           TEXT["intro"]]
    if run:
        md.append(TEXT["run"].format(run=run, wall=wall))
    md += [TEXT["premise"].format(min_gap=100 * MIN_GAP, min_run_gap=100 * MIN_RUN_GAP,
                                  premise_state=_premise_state(sm)), premise_markdown(sm.premise)]
    settings = [*sm.real, *sm.held_out, *sm.family]
    md += [TEXT["pairs"], pairs_markdown(sm, settings)]
    if set(VARIANT_COLUMNS) & set(sm.gaps["method"]):
        md += [TEXT["variants"], pairs_markdown(sm, settings, columns=VARIANT_COLUMNS)]
    if figures:
        md.append(TEXT["figures"] + "\n\n" + "\n\n".join(f"![{name}]({p})" for name, p in figures.items()))
    grid = sorted(set(sm.alpha["top"])) if len(sm.alpha) else []
    if grid:
        md += [TEXT["alpha"].format(grid="0 … " + f"{grid[-1]:g}", top=grid[-1]), alpha_markdown(sm.alpha)]
    if len(sm.mechanism):
        md += [TEXT["mechanism"], mechanism_markdown(sm.mechanism)]
    md += [TEXT["findings"], verdict_table(sm.findings, primaries=False) if sm.findings else "*None in this run.*"]
    from ftlab.experiments.transfer_accuracy.records import MAX_FALSE_ALARMS, MIN_HITS

    md += [TEXT["roc"].format(fa=100 * MAX_FALSE_ALARMS, hits=100 * MIN_HITS), roc_markdown(sm.roc)]
    md.append(TEXT["diagnostic"].format(rule_text=rule_markdown(sm.rule, sm.ranking)))
    if len(sm.layers):
        md += [TEXT["layers"], layer_markdown(sm.layers)]
    return "\n\n".join(md)


def write_figures(sm, folder: Path, *, prefix: str = "", wants=lambda name: True) -> dict[str, Path]:
    """One figure per family of pairs present (:data:`FIGURES`), as ``<folder>/<prefix><name>.png``."""
    from ftlab.experiments.transfer_accuracy.table import family_figure

    out = {}
    for name, title, which in FIGURES:
        settings = getattr(sm, which)
        if settings and wants(name):
            out[name] = family_figure(sm.table, settings, folder / f"{prefix}{name}.png", title=title)
    return out


def run(ctx: ReportContext) -> str:
    import pandas as pd

    from ftlab.core.results import save_table
    from ftlab.experiments.transfer_accuracy.records import summarize, write_records
    from ftlab.experiments.transfer_accuracy.run import full_config, quick_config, run_benchmark

    notes = check_data(full=ctx.full)
    cfg = full_config() if ctx.full else quick_config()
    out = ctx.output_dir("transfer")
    t0 = time.perf_counter()
    raw = run_benchmark(cfg, store=ctx.section_dir("transfer") / ("runs-full.jsonl" if ctx.full else "runs-quick.jsonl"),
                        workers=ctx.workers, scheduler=ctx.scheduler)
    wall = time.perf_counter() - t0
    params = cfg.to_dict()
    write_records(raw, out / "records.csv")
    sm = summarize(raw, alpha_top=max(cfg.alpha_grid))
    save_table(sm.table, out / "table.csv", params=params, seed=ctx.seed)
    save_table(sm.gaps, out / "gap_closed.csv", params=params, seed=ctx.seed)
    save_table(pd.DataFrame([{"family": fam, "claim": c.key, "quote": c.quote, "measured": c.measured,
                              "effect": j.effect, "ci_low": j.ci_low, "ci_high": j.ci_high, "p_holm": j.p_holm,
                              "seeds": j.n, "premise_missed": j.premise_missed, "verdict": j.verdict}
                             for fam, rows in (("recommended", sm.recommended), ("primary", sm.primaries),
                                               ("ftlab", sm.findings)) for c, j, _ in rows]),
               out / "verdicts.csv", params=params, seed=ctx.seed)
    figs = write_figures(sm, out, wants=ctx.wants)
    run_line = (f"{'full' if ctx.full else 'quick'}; images {cfg.resolution} px, {', '.join(cfg.image_tasks)}, "
                f"{cfg.n_train} training images; text {', '.join(cfg.text_tasks)}, {cfg.text_n_train} glosses; "
                f"calibration {', '.join(cfg.calibrations)} (n100: 100 samples, k5: 5 per class); α grid "
                f"{list(cfg.alpha_grid)} searched on validation, and α = 1")
    md = render(sm, figures={k: f"transfer/{Path(v).name}" for k, v in figs.items()}, run=run_line, wall=wall / 60)
    md += "\n\nSources (this run): per-seed records [records.csv](transfer/records.csv), accuracies with intervals " \
          "[table.csv](transfer/table.csv), gap closed [gap_closed.csv](transfer/gap_closed.csv), verdicts " \
          "[verdicts.csv](transfer/verdicts.csv). Protocol and the recorded run: docs/transfer-benchmark.md."
    return "\n\n".join([md, *notes])

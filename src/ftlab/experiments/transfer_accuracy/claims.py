"""The paper's claims and ftlab's own findings, judged from a benchmark run with :mod:`ftlab.experiments.verdicts`.

The BiCo paper (Son, Jung, Park, Baik, arXiv 2605.28444) is quoted as issue 14 states it; its models (CLIP
ViTs, T5) are not available offline, so each claim is judged on the offline analogues, *per seed* (a seed
redraws the fine-tuning set, the calibration set and the fine-tuning order) with paired effects averaged
over the tasks of the settings named:

* **paper** -- :data:`PAPER_CLAIMS`: BiCo +18.88 vs Theseus +3.81 (ViT-B/16 -> B/16-plus, 100 calibration
  samples; judged on the width-only pair lite1->lite2), +17.81 (same architecture, other pretraining, 5 per
  class; judged on the controlled ViTs of another seed and data), +12.89 (ViT-B/16 -> L/14; judged on the
  depth + width pairs); one-sided alignment insufficient; gradients essential for the output side; the issue's
  goal that BiCo at alpha = 1 closes at least half of the gap on average over the real pairs, as the paper
  reports for its model families. A claim whose settings or calibration are not in a run is left out.
* **ftlab** -- :func:`ftlab_findings`: claims the paper does not make (alpha search, calibration regime,
  where BiCo stays below the target's linear probe, the dose-response of relatedness), labelled as ftlab's
  and never counted with the paper's.

Every family of claims is judged together (:func:`ftlab.experiments.verdicts.judge_family`, Holm's
correction): accuracy effects with a margin of practical irrelevance of 1 point, gap shares 0.05.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ftlab.experiments.transfer_accuracy.table import BASELINES, accuracy_records, per_seed_gaps
from ftlab.experiments.verdicts import Judgement, judge_family

__all__ = ["BenchmarkSummary", "Claim", "PAPER_CLAIMS", "ftlab_findings", "judge_claims", "paired_effect", "summarize"]

ACC_MARGIN = 0.01
GAP_MARGIN = 0.05


@dataclass(frozen=True)
class Claim:
    """A claim judged from per-seed effects: ``quote`` (as issue 14 states it), what is measured, and how.

    ``kind``: ``diff`` (accuracy of ``a`` minus ``b``), ``gap`` (the gap closed by ``a`` minus ``threshold``),
    ``below`` (``b`` minus ``a``: claims that ``a`` falls below ``b``). ``settings``: ``"real"`` (the real pairs),
    ``"family"`` or a tuple of setting names. ``calibration`` and ``alpha_mode`` select the rows.
    """

    key: str
    quote: str
    measured: str
    kind: str
    a: str
    b: str = ""
    settings: object = "real"
    calibration: str = "n100"
    alpha_mode: str = "fixed"
    threshold: float = 0.0


PAPER_CLAIMS: tuple[Claim, ...] = (
    Claim("half_gap", "BiCo at α = 1 closes at least half of the gap to direct fine-tuning on average over the "
          "model families (issue 14's goal, as the paper reports for its families)",
          "gap closed by BiCo at α = 1, averaged over the real pairs, minus 0.5", "gap", "bico", threshold=0.5),
    Claim("gain_width", "BiCo +18.88 points over the target's zero-shot accuracy for ViT-B/16 → B/16-plus (a wider "
          "target) with 100 calibration samples", "BiCo minus the target's linear probe on the width-only pair "
          "lite1->lite2, 100 samples, α = 1", "diff", "bico", "base", settings=("lite1->lite2",)),
    Claim("gain_depth_width", "BiCo +12.89 points for ViT-B/16 → L/14 (wider and deeper)",
          "BiCo minus the target's linear probe on the depth + width pair lite0->lite2, 100 samples, α = 1", "diff",
          "bico", "base", settings=("lite0->lite2", "minilm_l6->mpnet_base")),
    Claim("gain_5pc", "BiCo +17.81 points for the same architecture with different pretraining, 5 samples per "
          "class", "BiCo minus the target's zero-shot head on the controlled ViTs of the same architecture, another "
          "seed and other pretraining images (`pretraining`), 5 per class, α = 1", "diff", "bico", "base",
          settings=("pretraining",), calibration="k5"),
    Claim("beats_theseus", "BiCo +18.88 vs Theseus +3.81 (ViT-B/16 → B/16-plus, 100 calibration samples)",
          "BiCo minus activation-only (Theseus-like), real pairs, 100 samples, α = 1", "diff", "bico",
          "activation_only"),
    Claim("input_only", "one-sided alignment is insufficient (input side only)",
          "BiCo minus bico_input_only, real pairs, α = 1", "diff", "bico", "bico_input_only"),
    Claim("output_only", "one-sided alignment is insufficient (output side only)",
          "BiCo minus bico_output_only, real pairs, α = 1", "diff", "bico", "bico_output_only"),
    Claim("grad_output", "gradients are essential for the output side",
          "BiCo (output map from gradients) minus activation_only (output map from activations), real pairs, α "
          "searched on validation for each", "diff", "bico", "activation_only", alpha_mode="searched"),
)


def _setting_names(spec, settings: Sequence[str], real: Sequence[str]) -> list[str]:
    if spec == "real":
        return [s for s in settings if s in real]
    if spec == "family":
        return [s for s in settings if s not in real]
    return [s for s in settings if s in tuple(spec)]


def paired_effect(raw: pd.DataFrame, claim: Claim, real: Sequence[str]) -> np.ndarray:
    """Per-seed effect of ``claim`` (positive = the claimed direction), averaged over tasks and settings."""
    if claim.kind == "gap":
        g = per_seed_gaps(raw)
        names = _setting_names(claim.settings, list(dict.fromkeys(g["setting"])), real) if len(g) else []
        g = g[(g["setting"].isin(names)) & (g["method"] == claim.a) & (g["calibration"] == claim.calibration)
              & (g["alpha_mode"] == claim.alpha_mode)]
        if not len(g):
            return np.array([])
        return (g.groupby("seed")["gap_closed"].mean() - claim.threshold).to_numpy(dtype=float)
    acc = accuracy_records(raw)
    names = _setting_names(claim.settings, list(dict.fromkeys(acc["setting"])), real)
    acc = acc[acc["setting"].isin(names) & (acc["alpha_mode"] == claim.alpha_mode)]

    def method_rows(m):
        if m == "base":
            return acc[acc["method"].isin(BASELINES)]
        sel = acc[acc["method"] == m]
        return sel if m == "naive" else sel[sel["calibration"] == claim.calibration]

    ra, rb = method_rows(claim.a), method_rows(claim.b)
    if not len(ra) or not len(rb):
        return np.array([])
    key = ["setting", "task", "seed"]
    both = ra.set_index(key)["accuracy"].rename("a").to_frame().join(rb.set_index(key)["accuracy"].rename("b"),
                                                                       how="inner")
    if not len(both):
        return np.array([])
    d = (both["a"] - both["b"]) if claim.kind == "diff" else (both["b"] - both["a"])
    return d.groupby(level="seed").mean().to_numpy(dtype=float)


def judge_claims(raw: pd.DataFrame, claims: Sequence[Claim], real: Sequence[str]) -> list[tuple[Claim, Judgement]]:
    """Judge ``claims`` as one family (Holm); claims without data are left out."""
    effects: dict[str, list[float]] = {}
    margins: dict[str, float] = {}
    kept = []
    for c in claims:
        e = paired_effect(raw, c, real)
        if e.size:
            effects[c.key] = e.tolist()
            margins[c.key] = GAP_MARGIN if c.kind == "gap" else ACC_MARGIN
            kept.append(c)
    if not effects:
        return []
    js = {j.claim: j for j in judge_family(effects, margins=margins)}
    return [(c, js[c.key]) for c in kept]


def ftlab_findings(raw: pd.DataFrame, real: Sequence[str], dose: Sequence[str]) -> list[Claim]:
    """ftlab's own claims for this run (not the paper's): one per real pair where BiCo at alpha = 1 falls below the
    linear probe, plus the alpha search, the calibration regime and the relatedness dose-response."""
    acc = accuracy_records(raw)
    out = [Claim("alpha_search", "searching α on validation improves BiCo over α = 1 (ftlab)",
                 "BiCo with α searched minus BiCo at α = 1, real pairs", "diff", "bico@searched", "bico"),
           Claim("k5_vs_n100", "5 samples per class calibrate BiCo as well as 100 random samples (ftlab)",
                 "BiCo with 5 per class minus BiCo with 100 samples, real pairs, α = 1", "diff", "bico@k5", "bico")]
    for s in [s for s in dict.fromkeys(acc["setting"]) if s in real]:
        out.append(Claim(f"below_probe:{s}", f"on {s}, BiCo at α = 1 falls below the target's linear probe (ftlab)",
                         f"probe minus BiCo at α = 1 on {s}", "below", "bico", "base", settings=(s,)))
    if "pretraining" in set(acc["setting"]):
        out.append(Claim("naive_degrades", "naive transfer degrades the target across a change of pretraining (same "
                         "architecture) (ftlab)", "target zero-shot minus naive transfer, controlled ViTs of another "
                         "seed and data", "below", "naive", "base", settings=("pretraining",)))
    present = [s for s in dose if s in set(acc["setting"])]
    if len(present) >= 2:
        out.append(Claim("dose", f"BiCo closes more of the gap on the most related target ({present[0]}) than on the "
                         f"least related ({present[-1]}) (ftlab)", f"gap closed on {present[0]} minus on {present[-1]}",
                         "dose", "bico", settings=(present[0], present[-1])))
    return out


def judge_findings(raw: pd.DataFrame, findings: Sequence[Claim], real: Sequence[str]) -> list[tuple[Claim, Judgement]]:
    """Judge ftlab's findings as one family (their special kinds resolved here)."""
    effects: dict[str, list[float]] = {}
    margins: dict[str, float] = {}
    kept = []
    for c in findings:
        if c.kind == "dose":
            g = per_seed_gaps(raw)
            pair: tuple[str, ...] = tuple(c.settings)  # type: ignore[arg-type]
            first, last = pair[0], pair[-1]
            g = g[(g["method"] == c.a) & (g["calibration"] == c.calibration) & (g["alpha_mode"] == c.alpha_mode)]
            a = g[g["setting"] == first].set_index("seed")["gap_closed"]
            b = g[g["setting"] == last].set_index("seed")["gap_closed"]
            e = (a - b).dropna().to_numpy(dtype=float)
            margin = GAP_MARGIN
        elif "@" in c.a:
            m, tag = c.a.split("@")
            variant = Claim(c.key, c.quote, c.measured, "diff", m, c.b,
                            calibration=tag if tag in ("k5", "n100") else c.calibration,
                            alpha_mode=tag if tag in ("searched", "fixed") else c.alpha_mode)
            if tag in ("k5", "n100"):
                ea = _method_acc(raw, m, tag, c.alpha_mode, real)
                eb = _method_acc(raw, c.b, c.calibration, c.alpha_mode, real)
            else:
                ea = _method_acc(raw, m, variant.calibration, tag, real)
                eb = _method_acc(raw, c.b, c.calibration, c.alpha_mode, real)
            j = ea.to_frame("a").join(eb.to_frame("b"), how="inner")
            e = (j["a"] - j["b"]).groupby(level="seed").mean().to_numpy(dtype=float) if len(j) else np.array([])
            margin = ACC_MARGIN
        else:
            e = paired_effect(raw, c, real)
            margin = ACC_MARGIN
        if e.size:
            effects[c.key], margins[c.key] = e.tolist(), margin
            kept.append(c)
    if not effects:
        return []
    js = {j.claim: j for j in judge_family(effects, margins=margins)}
    return [(c, js[c.key]) for c in kept]


def _method_acc(raw: pd.DataFrame, method: str, calibration: str, alpha_mode: str, real: Sequence[str]) -> pd.Series:
    acc = accuracy_records(raw)
    acc = acc[acc["setting"].isin(list(real)) & (acc["method"] == method) & (acc["calibration"] == calibration)
              & (acc["alpha_mode"] == alpha_mode)]
    return acc.set_index(["setting", "task", "seed"])["accuracy"]


@dataclass(frozen=True)
class BenchmarkSummary:
    """What the report section and the docs' generated blocks read from one run's records (:func:`summarize`).

    ``table``: accuracies with intervals; ``gaps``: share of the gap closed per (setting, method, calibration, alpha
    mode); ``real`` / ``family``: the settings that are real pretrained pairs / controlled ViTs, in order;
    ``headline``: the gap averaged over the real pairs; ``layers``: per-layer alignment; ``paper`` / ``mine``: the
    paper's claims and ftlab's own findings with their judgements.
    """

    table: pd.DataFrame
    gaps: pd.DataFrame
    real: list[str]
    family: list[str]
    headline: pd.DataFrame
    layers: pd.DataFrame
    paper: list
    mine: list


def summarize(raw: pd.DataFrame) -> BenchmarkSummary:
    """Tables and judgements of one benchmark run (``raw``: its records), computed once for every reader."""
    from ftlab.experiments.transfer_accuracy.family import DOSE_SETTINGS
    from ftlab.experiments.transfer_accuracy.pairs import PAIRS
    from ftlab.experiments.transfer_accuracy.table import gap_closed, layer_table, real_pairs_gap, summary_table

    table = summary_table(raw)
    real = [p for p in PAIRS if p in set(table["setting"])]
    family = [s for s in dict.fromkeys(table["setting"]) if s not in real]
    return BenchmarkSummary(table=table, gaps=gap_closed(raw), real=real, family=family,
                            headline=real_pairs_gap(raw, real), layers=layer_table(raw),
                            paper=judge_claims(raw, PAPER_CLAIMS, real),
                            mine=judge_findings(raw, ftlab_findings(raw, real, DOSE_SETTINGS), real))


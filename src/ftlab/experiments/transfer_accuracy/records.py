"""Everything the benchmark reports, computed from its per-seed records alone (no training).

A run's records (:func:`~ftlab.experiments.transfer_accuracy.run.run_benchmark`) are kept compactly under docs/
(:func:`write_records`, ``docs/transfer-benchmark-records.csv``: one row per setting, task, seed, method,
calibration and alpha mode, the diagnostic's estimates and the per-layer alignment binned by depth).
:func:`summarize` turns records into every table, verdict and diagnostic-rule check the report and
docs/transfer-benchmark.md show; ``python benchmarks/bench_transfer_benchmark.py --from-records
docs/transfer-benchmark-records.csv`` regenerates the page's tables and figures from the committed records.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import pandas as pd

from ftlab.experiments.transfer_accuracy.claims import (
    PRIMARIES,
    REAL_TEXT,
    REAL_TEXT_HELD_OUT,
    REAL_VISION,
    REAL_VISION_HELD_OUT,
    RECOMMENDED_PRIMARIES,
    Claim,
    claim_matrix,
    ftlab_findings,
    judge,
    premise_table,
)
from ftlab.experiments.verdicts import MIN_SEEDS as MIN_SEEDS_FOR_POWER
from ftlab.experiments.verdicts import pool_strata

__all__ = ["BenchmarkSummary", "MAX_FALSE_ALARMS", "MIN_HITS", "POWER_EFFECT", "REQUIRED", "diagnostic_roc",
           "gap_halfwidth", "power_plan", "read_records", "rule_check", "summarize", "write_records"]

#: Columns every record file must hold (others are optional).
REQUIRED = ("record", "setting", "task", "seed", "method", "calibration", "alpha_mode", "accuracy")
#: The controlled ViT settings, most related first (the wider one last).
FAMILY_ORDER = ("permuted", "continued_1ep", "continued_4ep", "independent", "pretraining", "width", "depth")
#: Settings whose validation cells set the diagnostic rule's threshold; the others (the text pairs) are kept apart
#: and judge it on their test cells.
RULE_DESIGN = (*REAL_VISION, "permuted", "continued_1ep", "continued_4ep", "independent", "pretraining", "width",
               "depth")


def write_records(raw: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write the compact records of a run (:func:`~ftlab.experiments.transfer_accuracy.table.compact_records`)."""
    from ftlab.core.results import atomic_write_text
    from ftlab.experiments.transfer_accuracy.table import compact_records

    atomic_write_text(path, compact_records(raw).to_csv(index=False, float_format="%.5g"))


def read_records(path: str | os.PathLike) -> pd.DataFrame:
    """Read a record file; a missing column or a non-numeric accuracy is a ``ValueError`` naming the file."""
    df = pd.read_csv(path, keep_default_na=True)
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{os.fspath(path)}: column {missing[0]!r} is missing (need {', '.join(REQUIRED)})")
    acc = df[df["record"] == "accuracy"]
    bad = pd.to_numeric(acc["accuracy"], errors="coerce").isna()
    if bad.any():
        raise ValueError(f"{os.fspath(path)}: accuracy on line {int(bad.idxmax()) + 2} is not a number")
    df["seed"] = df["seed"].astype(int)
    for c in ("calibration", "method", "alpha_mode", "task", "setting"):
        df[c] = df[c].fillna("-" if c == "calibration" else "").astype(str)
    return df


@dataclass(frozen=True)
class BenchmarkSummary:
    """Every table and verdict of one run (:func:`summarize`).

    ``table``: accuracies with intervals; ``gaps``: share of the gap closed per (setting, method, calibration,
    alpha mode); ``premise``: per setting the base, fine-tuned accuracy and the gap; ``vision`` / ``text`` /
    ``family``: the settings present, in order; ``headline``: the gap averaged over the real pairs;
    ``layers``: per-layer alignment; ``primaries`` / ``findings``: ``(claim, judgement, per-seed matrix)``;
    ``rule``: the diagnostic rule's check (:func:`rule_check`); ``ranking``: the estimate's rank correlation;
    ``recommended``: the verdicts of ftlab's recommended transfer (its own family); ``held_out``: the real pairs on
    held-out tasks present; ``alpha``: where the searched alpha landed; ``mechanism``: drift at the head norm and
    the spread of predictions; ``roc``: the diagnostic's ROC per transfer (``bico``, ``recommended``).
    """

    table: pd.DataFrame
    gaps: pd.DataFrame
    premise: pd.DataFrame
    vision: list[str]
    text: list[str]
    family: list[str]
    headline: pd.DataFrame
    layers: pd.DataFrame
    primaries: list = field(default_factory=list)
    findings: list = field(default_factory=list)
    rule: dict = field(default_factory=dict)
    ranking: dict = field(default_factory=dict)
    recommended: list = field(default_factory=list)
    held_out: list[str] = field(default_factory=list)
    alpha: pd.DataFrame = field(default_factory=pd.DataFrame)
    mechanism: pd.DataFrame = field(default_factory=pd.DataFrame)
    roc: dict = field(default_factory=dict)

    @property
    def real(self) -> list[str]:
        return [*self.vision, *self.text]


def rule_check(cells: pd.DataFrame, *, design=RULE_DESIGN) -> dict:
    """The diagnostic rule on recorded cells (one per setting, task, seed): the threshold that misclassifies the
    fewest *validation* cells of the ``design`` settings (:func:`ftlab.transfer.diagnose.fit_threshold`; "below" =
    BiCo at alpha = 1 below the target's own validation accuracy), then how often it predicts "below the target's
    own accuracy" on the *test* cells: the design cells, the cells kept apart (settings that did not set it), and
    every cell with the library's threshold (:data:`ftlab.transfer.diagnose.BELOW_TARGET_ESTIMATE`)."""
    from ftlab.transfer.diagnose import BELOW_TARGET_ESTIMATE, fit_threshold

    if not len(cells):
        return {}
    d = cells[cells["setting"].isin(list(design))]
    h = cells[~cells["setting"].isin(list(design))]
    dv = d[d["val_gain"].notna()] if "val_gain" in d else d.iloc[:0]
    fitted, _ = fit_threshold(dv["estimate"], dv["below_val"]) if len(dv) else (math.nan, 0)

    def score(df: pd.DataFrame, t: float) -> dict:
        if not len(df) or not math.isfinite(t):
            return {"cells": len(df)}
        pred = df["estimate"] < t
        truth = df["below"].astype(bool)
        return {"cells": len(df), "below": int(truth.sum()), "warned": int(pred.sum()),
                "hits": int((pred & truth).sum()), "false_alarms": int((pred & ~truth).sum()),
                "misses": int((~pred & truth).sum()), "error_rate": float((pred != truth).mean())}

    return {"fitted": fitted, "library": BELOW_TARGET_ESTIMATE, "design": score(d, fitted),
            "held_out": score(h, fitted), "held_out_library": score(h, BELOW_TARGET_ESTIMATE),
            "all_library": score(cells, BELOW_TARGET_ESTIMATE),
            "per_setting": cells.groupby("setting", sort=False).agg(
                estimate=("estimate", "mean"), gain=("gain", "mean"), below=("below", "mean"),
                cells=("gain", "size")).reset_index()}


#: The operating point a warning must reach on cells that did not set it: at most this share of false alarms among
#: transfers that are not below the target, at least this share of hits among those that are.
MAX_FALSE_ALARMS = 0.20
MIN_HITS = 0.80


def _auroc(estimate, below) -> float:
    """P(a cell below the target has a lower estimate than one that is not), ties counted half (Mann-Whitney)."""
    import numpy as np

    e, b = np.asarray(estimate, dtype=float), np.asarray(below, dtype=bool)
    pos, neg = e[b], e[~b]
    if not len(pos) or not len(neg):
        return math.nan
    less = (pos[:, None] < neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(less / (len(pos) * len(neg)))


def _rates(estimate, below, t: float) -> tuple[float, float]:
    """(hit rate, false-alarm rate) of the warning "estimate < t"."""
    import numpy as np

    e, b = np.asarray(estimate, dtype=float), np.asarray(below, dtype=bool)
    warn = e < t
    hits = float(warn[b].mean()) if b.any() else math.nan
    fa = float(warn[~b].mean()) if (~b).any() else math.nan
    return hits, fa


def diagnostic_roc(cells: pd.DataFrame, *, design=RULE_DESIGN, n_boot: int = 2000, seed: int = 0) -> dict:
    """How well the diagnostic's estimate tells a transfer below the target's own accuracy (test cells) from one that
    is not: the AUROC over all cells with a 95% percentile-bootstrap interval (cells resampled; cells of one setting
    are not independent, so the interval is optimistic), and an operating point: the threshold with the most hits
    minus false alarms among those reaching at most :data:`MAX_FALSE_ALARMS` false alarms and at least
    :data:`MIN_HITS` hits on the *validation* outcomes of the ``design`` cells, then scored on the test outcomes of
    the cells that did not set it. ``operating`` is None when no threshold reaches the criteria on the design cells;
    ``held_out_ok`` says whether the chosen one still reaches them on the cells kept apart."""
    import numpy as np

    if not len(cells):
        return {}
    e, b = cells["estimate"].to_numpy(float), cells["below"].to_numpy(bool)
    auc = _auroc(e, b)
    rng = np.random.default_rng(seed)
    boots = [_auroc(e[i], b[i]) for i in (rng.integers(0, len(e), len(e)) for _ in range(n_boot))]
    boots = [x for x in boots if math.isfinite(x)]
    lo, hi = (float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))) if boots else (math.nan, math.nan)
    d = cells[cells["setting"].isin(list(design)) & cells["val_gain"].notna()]
    h = cells[~cells["setting"].isin(list(design))]
    op = None
    if len(d):
        ev = np.sort(np.unique(d["estimate"].to_numpy(float)))
        cands = np.concatenate([[ev[0] - 1e-9], (ev[1:] + ev[:-1]) / 2, [ev[-1] + 1e-9]])
        best = -math.inf
        for t in cands:
            hit, fa = _rates(d["estimate"], d["below_val"], t)
            if math.isfinite(hit) and math.isfinite(fa) and fa <= MAX_FALSE_ALARMS and hit >= MIN_HITS \
                    and hit - fa > best:
                best, op = hit - fa, float(t)
    out = {"auroc": auc, "auroc_low": lo, "auroc_high": hi, "cells": len(cells), "below": int(b.sum()),
           "operating": op, "design_cells": len(d), "held_out_cells": len(h)}
    if op is not None and len(h):
        hit, fa = _rates(h["estimate"], h["below"], op)
        out.update(held_out_hits=hit, held_out_false_alarms=fa,
                   held_out_ok=bool(math.isfinite(hit) and fa <= MAX_FALSE_ALARMS and hit >= MIN_HITS))
    else:
        out["held_out_ok"] = False
    return out


def summarize(raw: pd.DataFrame, *, primaries: tuple[Claim, ...] = PRIMARIES, alpha_top: float | None = None
              ) -> BenchmarkSummary:
    """Tables, premise, verdicts and the diagnostic rule's check of one run's records, computed once for every
    reader (the report section, the docs page, the tests); ``alpha_top``: the largest alpha of the run's grid."""
    from ftlab.experiments.transfer_accuracy.table import (
        alpha_landing,
        estimate_cells,
        estimate_ranking,
        gap_closed,
        layer_table,
        mechanism_table,
        real_pairs_gap,
        summary_table,
    )

    table = summary_table(raw)
    present = list(dict.fromkeys(table["setting"]))
    vision = [s for s in REAL_VISION if s in present]
    text = [s for s in REAL_TEXT if s in present]
    held_out = [s for s in REAL_VISION_HELD_OUT + REAL_TEXT_HELD_OUT if s in present]
    family = [s for s in FAMILY_ORDER if s in present]
    roc = {m: diagnostic_roc(estimate_cells(raw, method=m)) for m in ("bico", "recommended")}
    return BenchmarkSummary(table=table, gaps=gap_closed(raw), premise=premise_table(raw), vision=vision, text=text,
                            family=family, headline=real_pairs_gap(raw, [*vision, *text]), layers=layer_table(raw),
                            primaries=judge(raw, primaries), findings=judge(raw, ftlab_findings(raw)),
                            rule=rule_check(estimate_cells(raw)), ranking=estimate_ranking(raw),
                            recommended=judge(raw, RECOMMENDED_PRIMARIES), held_out=held_out,
                            alpha=alpha_landing(raw, top=alpha_top), mechanism=mechanism_table(raw),
                            roc={k: v for k, v in roc.items() if v})


#: The effect every primary is powered for (accuracy, 3 points) and the power asked.
POWER_EFFECT = 0.03
POWER_TARGET = 0.80


def power_plan(raw: pd.DataFrame, *, primaries: tuple[Claim, ...] = PRIMARIES, effect: float = POWER_EFFECT,
               target: float = POWER_TARGET, alpha: float = 0.05) -> pd.DataFrame:
    """Seeds by power from a pilot's records: per primary, the per-seed standard deviation of its pooled effect
    (``sd``; for a gap claim, in shares of the gap) over the pilot's seeds, and the seeds the paired test needs for
    ``target`` power against ``effect`` (3 points; for a gap claim, 0.15 of the gap) at the Bonferroni level
    ``alpha / m`` over the ``m`` primaries (:func:`ftlab.experiments.verdicts.seeds_for_power`, a lower bound on
    Holm's power). Also the projected half-width of the 95% interval of the gap closed per pair at those seeds."""
    import numpy as np

    from ftlab.experiments.verdicts import seeds_for_power

    m = len(primaries)
    rows = []
    for c in primaries:
        mat = claim_matrix(raw, c)
        if not len(mat):
            continue
        vals = pool_strata(mat.to_numpy(dtype=float))
        sd = float(np.std(vals, ddof=1)) if vals.size > 1 else math.nan
        eff = 5 * effect if c.kind == "gap" else effect
        n = seeds_for_power(eff, sd, alpha=alpha, m=m, target=target) if sd > 0 else MIN_SEEDS_FOR_POWER
        rows.append({"claim": c.key, "pilot_seeds": int(vals.size), "mean": float(np.mean(vals)), "sd": sd,
                     "effect": eff, "seeds_needed": int(n)})
    return pd.DataFrame(rows)


def gap_halfwidth(raw: pd.DataFrame, n: int, *, method: str = "bico") -> pd.DataFrame:
    """Per real pair: the pilot's per-seed standard deviation of the gap closed by ``method`` (100 samples, alpha =
    1) and the half-width of the 95% t-interval it projects at ``n`` seeds."""
    import numpy as np
    from scipy import stats as sps

    from ftlab.experiments.transfer_accuracy.table import per_seed_gaps

    g = per_seed_gaps(raw)
    if not len(g):
        return pd.DataFrame()
    g = g[(g["method"] == method) & (g["calibration"] == "n100") & (g["alpha_mode"] == "fixed")]
    out = []
    for s, gg in g.groupby("setting", sort=False):
        sd = float(np.nanstd(gg["gap_closed"].to_numpy(dtype=float), ddof=1))
        out.append({"setting": s, "sd": sd, "seeds": n, "halfwidth": float(sps.t.ppf(0.975, n - 1) * sd / math.sqrt(n))})
    return pd.DataFrame(out)

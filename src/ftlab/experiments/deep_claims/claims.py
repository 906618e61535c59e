"""The paper's five deep-network claims as paired effects, judged with :mod:`ftlab.experiments.verdicts`.

Claims of Anguita et al. (2026, arXiv 2602.20062) as this project states them:

1. decreasing the relative scale of the early layers (the analogue of lambda_PT < 0) improves
   fine-tuning generalization;
2. decreasing the absolute scale (c_PT) degrades it;
3. decreasing the readout re-initialization scale (gamma_FT) improves it at intermediate sample sizes;
4. successful interventions give a "rich and pretraining-dependent" signature: the representation
   compresses (lower PR) while staying aligned with the pretrained one (high ENSD);
5. in Transformers on modular arithmetic, lower balancedness (the analogue of a negative relative
   scale) improves generalization, particularly on tasks involving new prime factors.

Every effect is signed so that **positive = the paper's direction** and computed per seed from
paired runs (same seed, task and n_FT; only the knob differs), then judged over seeds:

* claim 1 -- ``acc(kappa) - acc(kappa = 1)``, mean over n_FT and the values kappa < 1, per
  architecture, task and when (at PT initialization / rebalance after PT);
* claim 2 -- ``acc(s = 1) - acc(s)``, mean over n_FT and s < 1;
* claim 3 -- ``acc(gamma) - acc(gamma_default)``, mean over gamma < gamma_default and the
  intermediate n_FT (every grid value but the smallest and the largest);
* claim 4 -- per seed, the Pearson correlation across arms (every arm fine-tuned at the geometry
  n_FT, the baseline included) between the accuracy change and the change of the centred PR of the
  pooled features (sign flipped: compression with gain is positive), and between the accuracy
  change and the change of their centred ENSD with the unintervened pretrained network; judged on
  Fisher's z = atanh(r) over seeds, reported back as r;
* claim 5 -- ``acc(b) - acc(b = 0)``, mean over b < 0 and the moduli of a kind (new / reuse), per
  when; and "particularly on new prime factors" as the difference new - reuse of that effect.

Verdicts (:func:`ftlab.experiments.verdicts.judge_family`): Holm's correction across the whole
family of the paper's claims (both architectures, all tasks); margins of practical irrelevance 0.01
(one accuracy point) and 0.1 (a correlation). Claims the paper does not make (increasing s or
kappa degrades; ``claim = "own"``) are returned separately by :func:`vision_effects` and judged as
their own family, never with the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ftlab.experiments.verdicts import judge_family

__all__ = ["COLUMNS", "PAPER", "Row", "ACC_MARGIN", "CORR_MARGIN", "GEOMETRY_LAYER", "claims_table", "modular_effects",
           "paired", "vision_effects"]

ACC_MARGIN = 0.01
CORR_MARGIN = 0.1
GEOMETRY_LAYER = "pool"
COLUMNS = ["claim", "paper_statement", "arch", "task", "knob", "when", "effect", "ci_low", "ci_high", "p_holm", "seeds",
           "verdict", "pt_train_loss", "ft_train_loss"]
PAPER = {
    1: "decreasing the relative scale of the early layers (lambda_PT < 0) improves fine-tuning generalization",
    2: "decreasing the absolute scale c_PT degrades fine-tuning generalization",
    3: "decreasing the readout re-initialization scale gamma_FT improves generalization at intermediate sample sizes",
    4: "successful interventions compress the representation (lower PR) while it stays aligned with the pretrained "
       "one (high ENSD)",
    5: "lower balancedness improves Transformer generalization on modular arithmetic, particularly on tasks with new "
       "prime factors",
}


@dataclass(frozen=True)
class Row:
    """One effect to judge: its CSV fields, per-seed values, margin, and whether it is a correlation."""

    claim: int | str
    statement: str
    arch: str
    task: str
    knob: str
    when: str
    definition: str
    values: pd.Series  # per seed
    pt_loss: float
    ft_loss: float
    correlation: bool = False


def paired(ft: pd.DataFrame, base: Callable[[pd.DataFrame], pd.Series], keys: list[str],
           metric: str = "acc") -> pd.DataFrame:
    """Rows of ``ft`` with ``diff`` = metric minus the reference arm's metric at the same ``keys``;
    ``base(ft)`` selects the reference rows (one per key)."""
    ref = ft[base(ft)].set_index(keys)[metric]
    if ref.index.duplicated().any():
        raise ValueError(f"the reference arm has several rows per {keys}")
    out = ft.copy()
    out["diff"] = out[metric].to_numpy() - ref.reindex(pd.MultiIndex.from_frame(out[keys])).to_numpy()
    return out


def _max(values) -> float:
    v = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce"), dtype=float)
    return float(np.nanmax(v)) if v.size and np.isfinite(v).any() else math.nan


def _pt_loss(pt: pd.DataFrame | None, arch: str, knobs: set[tuple[str, float]]) -> float:
    if pt is None or pt.empty:
        return math.nan
    mine = np.array([(k, float(v)) in knobs for k, v in zip(pt.knob, pt.value)], dtype=bool)
    sel = pt[(pt.arch == arch).to_numpy() & mine]
    return _max(sel.pt_loss)


def _row(claim: int | str, knob: str, when: str, sel: pd.DataFrame, base: pd.DataFrame, sign: float, definition: str,
         arch: str, task: str, pt: pd.DataFrame | None, statement: str | None = None) -> Row:
    vals = sign * sel.groupby("seed")["diff"].mean()
    pts = {("none", 1.0)} | {(k, float(v)) for k, w, v in zip(sel.knob, sel.when, sel.value) if w == "init"}
    ft_loss = _max(pd.concat([sel.ft_loss, base[base.n_ft.isin(sel.n_ft)].ft_loss]))
    return Row(claim, statement or PAPER[int(claim)], arch, task, knob, when, definition, vals,
               _pt_loss(pt, arch, pts), ft_loss)


def vision_effects(ft: pd.DataFrame, pt: pd.DataFrame | None = None, *, gamma_default: float = 1.0,
                   geometry_at: int | None = None) -> tuple[list[Row], list[Row]]:
    """Claims 1-4 (``paper``) and ftlab's own findings (``own``) from a vision fine-tuning table
    (columns arch, seed, task, n_ft, knob, when, value, acc, ft_loss and ``pr_post_c:pool`` /
    ``ensd_c:pool`` at ``geometry_at``)."""
    d = paired(ft, lambda f: f.knob == "none", ["arch", "seed", "task", "n_ft"])
    paper: list[Row] = []
    own: list[Row] = []
    ns = sorted(ft.n_ft.unique())
    mid = ns[1:-1] if len(ns) >= 3 else ns
    for arch in sorted(ft.arch.unique()):
        for task in sorted(ft.task.unique()):
            t = d[(d.arch == arch) & (d.task == task)]
            ctx = dict(base=t[t.knob == "none"], arch=arch, task=task, pt=pt)
            for when in ("init", "post"):
                k = t[(t.knob == "kappa") & (t.when == when)]
                if (k.value < 1).any():
                    paper.append(_row(1, "kappa", when, k[k.value < 1], sign=1.0,
                                      definition="acc(kappa<1) - acc(kappa=1), mean over n_FT", **ctx))
                if (k.value > 1).any():
                    own.append(_row("own", "kappa", when, k[k.value > 1], sign=-1.0,
                                    definition="acc(kappa=1) - acc(kappa>1), mean over n_FT",
                                    statement="increasing the relative scale of the early layers (kappa > 1) degrades "
                                              "fine-tuning", **ctx))
            s = t[t.knob == "s"]
            if (s.value < 1).any():
                paper.append(_row(2, "s", "init", s[s.value < 1], sign=-1.0,
                                  definition="acc(s=1) - acc(s<1), mean over n_FT", **ctx))
            if (s.value > 1).any():
                own.append(_row("own", "s", "init", s[s.value > 1], sign=-1.0,
                                definition="acc(s=1) - acc(s>1), mean over n_FT",
                                statement="increasing the absolute scale (s > 1) degrades fine-tuning", **ctx))
            g = t[(t.knob == "gamma") & (t.value < gamma_default) & t.n_ft.isin(mid)]
            if len(g):
                paper.append(_row(3, "gamma", "ft", g, sign=1.0,
                                  definition=f"acc(gamma<{gamma_default:g}) - acc(gamma={gamma_default:g}), mean over "
                                             f"n_FT in {[int(n) for n in mid]}", **ctx))
            paper += _signature(ft[(ft.arch == arch) & (ft.task == task)], arch, task, geometry_at, pt)
    return paper, own


def _signature(ft: pd.DataFrame, arch: str, task: str, geometry_at: int | None, pt) -> list[Row]:
    L = GEOMETRY_LAYER
    cols = {"PR": f"pr_post_c:{L}", "ENSD": f"ensd_c:{L}"}
    if any(c not in ft.columns for c in cols.values()):
        return []
    g = ft[ft[cols["PR"]].notna()]
    if geometry_at is not None:
        g = g[g.n_ft == geometry_at]
    if g.empty:
        return []
    out = []
    for measure, col, sign in (("PR", cols["PR"], -1.0), ("ENSD", cols["ENSD"], 1.0)):
        per: dict[int, float] = {}
        for seed, s in g.groupby("seed"):
            base = s[s.knob == "none"]
            if len(base) != 1 or len(s) < 4:
                continue
            dacc = s.acc.to_numpy() - float(base.acc.iloc[0])
            dm = sign * (s[col].to_numpy(dtype=float) - float(base[col].iloc[0]))
            ok = np.isfinite(dacc) & np.isfinite(dm)
            if ok.sum() >= 4 and np.std(dacc[ok]) > 0 and np.std(dm[ok]) > 0:
                r = float(np.corrcoef(dacc[ok], dm[ok])[0, 1])
                per[int(seed)] = math.atanh(float(np.clip(r, -0.999999, 0.999999)))
        if not per:
            continue
        what = ("minus the change of centred PR" if measure == "PR" else
                "the change of centred ENSD with the unintervened PT network")
        out.append(Row(4, PAPER[4], arch, task, f"all arms ({measure})", "-",
                       f"corr across arms (n_FT={int(g.n_ft.iloc[0])}) of the accuracy change and {what} at layer "
                       f"'{L}'; Fisher z over seeds", pd.Series(per),
                       _pt_loss(pt, arch, {(k, float(v)) for k, w, v in zip(g.knob, g.when, g.value) if w == "init"}
                                | {("none", 1.0)}), _max(g.ft_loss), correlation=True))
    return out


def modular_effects(ft: pd.DataFrame, pt: pd.DataFrame | None = None) -> list[Row]:
    """Claim 5 from a modular fine-tuning table (columns seed, p, kind, when, b, acc, ft_loss)."""
    out: list[Row] = []
    d = paired(ft, lambda f: f.b == 0.0, ["seed", "p", "when"])
    for when in sorted(d.when.unique()):
        t = d[(d.when == when) & (d.b < 0)]
        if t.empty:
            continue
        per = {k: t[t.kind == k].groupby("seed")["diff"].mean() for k in ("new", "reuse")}
        ptl = math.nan
        if pt is not None and not pt.empty:
            sel = pt if when == "init" else pt[pt.b_init.isna()]
            ptl = _max(sel.pt_loss)
        ftl = _max(d[d.when == when].ft_loss)
        for kind in ("new", "reuse"):
            if len(per[kind]):
                out.append(Row(5, PAPER[5], "transformer", f"{kind} primes" if kind == "new" else "factor reuse", "b",
                               when, f"acc(b<0) - acc(b=0), mean over b<0 and the {kind} moduli", per[kind], ptl, ftl))
        if len(per["new"]) and len(per["reuse"]):
            out.append(Row(5, PAPER[5], "transformer", "new minus reuse", "b", when,
                           "(acc(b<0) - acc(b=0))[new] - (same)[reuse], per seed", (per["new"] - per["reuse"]).dropna(),
                           ptl, ftl))
    return out


def claims_table(rows: list[Row]) -> pd.DataFrame:
    """Judge ``rows`` as one family (Holm) and return them with :data:`COLUMNS` plus ``definition``
    and ``margin``; correlation rows report r = tanh of the Fisher-z mean and interval."""
    if not rows:
        return pd.DataFrame(columns=[*COLUMNS, "definition", "margin"])
    effects = {str(i): r.values.to_numpy(dtype=float) for i, r in enumerate(rows)}
    margins = {str(i): (math.atanh(CORR_MARGIN) if r.correlation else ACC_MARGIN) for i, r in enumerate(rows)}
    out = []
    for r, j in zip(rows, judge_family(effects, margins=margins)):
        eff, lo, hi = j.effect, j.ci_low, j.ci_high
        if r.correlation:
            eff, lo, hi = (math.tanh(v) if math.isfinite(v) else math.nan for v in (eff, lo, hi))
        out.append({"claim": r.claim, "paper_statement": r.statement, "arch": r.arch, "task": r.task, "knob": r.knob,
                    "when": r.when, "effect": eff, "ci_low": lo, "ci_high": hi, "p_holm": j.p_holm, "seeds": j.n,
                    "verdict": j.verdict, "pt_train_loss": r.pt_loss, "ft_train_loss": r.ft_loss,
                    "definition": r.definition, "margin": CORR_MARGIN if r.correlation else ACC_MARGIN})
    return pd.DataFrame(out, columns=[*COLUMNS, "definition", "margin"])

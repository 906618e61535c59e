"""Why output gradients do not align, and what changes it -- ftlab's own investigation.

For a set of (setting, task, seed) cases (:func:`prepare` builds each once: probe heads, fine-tuned source
and target), BiCo is fitted under each calibration *variant* (:data:`VARIANTS`), one knob changed from the
benchmark's protocol at a time:

=====================  ==========================================================================
variant                what changes
=====================  ==========================================================================
``default``            cross-entropy with the labels through each model's own frozen head, one row
                       per token / pixel, no centring, 100 samples, gradients at the source's base
``centred``            rows centred before the cross-covariances (``center=True``)
``pooled rows``        one row per sample: tokens / pixels averaged (``seq_align="mean"``)
``300 rows``           300 calibration samples instead of 100
``fine-tuned source``  source statistics taken at ``A_ft`` (``source_stats="finetuned"``)
``logit loss``         minus the true class's logit (relative to the mean logit): every sample
                       pulls its class equally, whatever the model's own error
``pseudo-label loss``  cross-entropy with each model's own prediction as the label (no labels)
=====================  ==========================================================================

Per case and variant it records, per target capture point, the alignment of the two bases' output
gradients and input activations (linear CKA and the Procrustes similarity ``||A^T B||_* / (||A|| ||B||)``,
1 when one is an orthogonal re-coding of the other) beside the share of ``||tau_A||^2`` the layer carries,
and the accuracy of ``B + alpha tau_B`` on the validation split (at ``alpha = 1`` and the best alpha of the
grid) and on the test split. :func:`choose_default` picks the variant with the best mean *validation*
accuracy at ``alpha = 1`` -- test data never decide.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence

import numpy as np

__all__ = ["VARIANTS", "choose_default", "investigate_case", "layer_ablation", "summarize"]

#: name -> knob changed (``loss``: calibration loss kind; ``n_cal``: calibration samples; others: transfer options).
VARIANTS: dict[str, dict] = {
    "default": {},
    "centred": {"center": True},
    "pooled rows": {"seq_align": "mean"},
    "300 rows": {"n_cal": 300},
    "fine-tuned source": {"source_stats": "finetuned"},
    "logit loss": {"loss": "logit"},
    "pseudo-label loss": {"loss": "pseudo"},
}


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    ok = np.isfinite(values) & np.isfinite(weights) & (weights > 0)
    if not ok.any():
        return math.nan
    v, w = values[ok], weights[ok]
    order = np.argsort(v)
    c = np.cumsum(w[order])
    return float(v[order][np.searchsorted(c, 0.5 * c[-1])])


def investigate_case(kind: str, setting: str, task: str, seed: int, config: dict, *,
                     variants: Sequence[str] = tuple(VARIANTS), alpha_grid: Sequence[float] | None = None,
                     cache: str | None = None, ablate: Sequence[str] = ()) -> list[dict]:
    """Records for one case: ``record="case"`` (probe / fine-tuned accuracies), ``"variant"`` (accuracies and
    alignment summaries per variant), ``"layer"`` (per capture point and variant) and, for the variants named in
    ``ablate``, ``"ablation"`` (:func:`layer_ablation`)."""
    from ftlab.experiments.transfer_accuracy.finetune import batches_of, task_loss
    from ftlab.experiments.transfer_accuracy.run import BenchmarkConfig, prepare
    from ftlab.transfer import TransferOptions, fit_transfer, get_method
    from ftlab.transfer.align import RankWarning

    cfg = BenchmarkConfig.from_dict(config)
    grid = tuple(alpha_grid) if alpha_grid is not None else cfg.alpha_grid
    p = prepare(kind, setting, task, seed, config, cache)
    head = {"setting": setting, "task": task, "seed": int(seed)}
    rows: list[dict] = [{"record": "case", **head, "kind": kind,
                         "probe_val": p.score(p.target_base, "val"), "probe_test": p.score(p.target_base, "test"),
                         "ft_val": p.score(p.target_ft, "val"), "ft_test": p.score(p.target_ft, "test")}]
    x, y = p.splits["train"]
    for name in variants:
        knobs = dict(VARIANTS[name])
        kind_loss = knobs.pop("loss", cfg.cal_loss)
        n_cal = int(knobs.pop("n_cal", 100))
        from ftlab.experiments.training import n_rows

        batches = batches_of(x, y, batch_size=cfg.cal_batch_size, n=min(n_cal, n_rows(x)), seed=seed)
        opts = {**p.transfer_options, **knobs, "diagnostics": True}
        method_opts = {k: opts.pop(k) for k in ("center",) if k in opts}
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RankWarning)
            res = fit_transfer(p.source_base, p.source_ft, p.target_base, batches, task_loss(p.classes, kind_loss),
                               method=get_method("bico", **method_opts), options=TransferOptions(**opts))
        seconds = time.perf_counter() - t0
        tau = res.task_vector
        val = {a: p.score(tau.apply(p.target_base, a), "val") for a in grid}
        best = max(grid, key=lambda a: (val[a], -a))
        test1 = p.score(tau.apply(p.target_base, 1.0), "test")
        test_best = test1 if best == 1.0 else p.score(tau.apply(p.target_base, best), "test")
        total = float(res.source_norms.get("total") or 0.0) ** 2
        layer = []
        for i, rec in enumerate(res.layers()):
            share = rec.get("source_norm", math.nan) ** 2 / total if total > 0 else math.nan
            layer.append({"record": "layer", **head, "variant": name, "order": i, "point": rec["target"],
                          "in_cka": rec.get("in_cka", math.nan), "out_cka": rec.get("out_cka", math.nan),
                          "in_similarity": rec.get("in_similarity", math.nan),
                          "out_similarity": rec.get("out_similarity", math.nan),
                          "out_rank": rec.get("out_rank", math.nan), "out_dims": rec.get("out_dims", math.nan),
                          "tau_share": share})
        lw = np.array([r["tau_share"] for r in layer], dtype=float)
        summary = {k: _weighted_median(np.array([r[k] for r in layer], dtype=float), lw)
                   for k in ("in_cka", "out_cka", "in_similarity", "out_similarity")}
        rows.append({"record": "variant", **head, "variant": name, "val_alpha1": val[1.0], "val_best": val[best],
                     "alpha_best": best, "test_alpha1": test1, "test_best": test_best, "seconds": seconds,
                     **{f"{k}_wmedian": v for k, v in summary.items()}})
        rows += layer
        if name in ablate:
            rows += [{**r, "variant": name} for r in layer_ablation(p, res, alpha_grid=grid)]
    return rows


def _point_of(param: str, points: set[str]) -> str | None:
    head = param
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in points:
            return head
    return None


def layer_ablation(p, res, *, alpha_grid: Sequence[float]) -> list[dict]:
    """Where does a transferred task vector help or hurt? ``tau_B`` of a finished fit ``res`` kept on subsets of the
    target's layers (the rest zero): the early or late half by depth, and the layers whose estimated carried share
    ``c_l = rho_in * rho_out`` (Procrustes similarities of the two sides) is above or below the median; plus the naive
    transfer of the same ``tau_A``. No refitting: the same maps, evaluated on validation and test."""
    import torch

    from ftlab.transfer import TaskVector, fit_transfer

    layers = res.layers()
    order = {r["target"]: i for i, r in enumerate(layers)}
    carry = {}
    for r in layers:
        sims = [r.get(f"{s}_similarity", math.nan) for s in ("in", "out") if f"{s}_map" in r]
        carry[r["target"]] = math.prod(0.0 if not math.isfinite(x) else x for x in sims) if sims else math.nan
    finite = [c for c in carry.values() if math.isfinite(c)]
    med = float(np.median(finite)) if finite else math.nan
    half = len(layers) / 2
    subsets = {"early half": lambda t: order[t] < half, "late half": lambda t: order[t] >= half,
               "carry above median": lambda t: math.isfinite(carry[t]) and carry[t] >= med,
               "carry below median": lambda t: not (math.isfinite(carry[t]) and carry[t] >= med)}
    tau = res.task_vector
    points = set(order)
    head = {"setting": p.setting, "task": p.task, "seed": int(p.seed)}
    out = []
    for name, keep in subsets.items():
        kept = {}
        for k, v in tau.items():
            pt = _point_of(k, points)
            kept[k] = v if (pt is not None and keep(pt)) else torch.zeros_like(v)
        sub = TaskVector(kept)
        share = sum(float(v.double().pow(2).sum()) for v in kept.values()) / max(tau.norm() ** 2, 1e-300)
        val = {a: p.score(sub.apply(p.target_base, a), "val") for a in alpha_grid}
        best = max(alpha_grid, key=lambda a: (val[a], -a))
        out.append({"record": "ablation", **head, "subset": name, "norm_share": share, "val_alpha1": val[1.0],
                    "val_best": val[best], "alpha_best": best, "test_alpha1": p.score(sub.apply(p.target_base, 1.0), "test"),
                    "test_best": p.score(sub.apply(p.target_base, best), "test")})
    naive = fit_transfer(p.source_base, p.source_ft, p.target_base, method="naive").task_vector
    val = {a: p.score(naive.apply(p.target_base, a), "val") for a in alpha_grid}
    best = max(alpha_grid, key=lambda a: (val[a], -a))
    out.append({"record": "ablation", **head, "subset": "naive transfer", "norm_share": math.nan,
                "val_alpha1": val[1.0], "val_best": val[best], "alpha_best": best,
                "test_alpha1": p.score(naive.apply(p.target_base, 1.0), "test"),
                "test_best": p.score(naive.apply(p.target_base, best), "test")})
    return out


def summarize(df):
    """Per variant: mean gain over the probe (validation and test, alpha = 1 and best), the share of cases where
    BiCo at alpha = 1 stays below the probe on test, and the tau-weighted median alignments; sorted as
    :data:`VARIANTS`."""
    import pandas as pd

    cols = ["probe_val", "probe_test", "ft_val", "ft_test"]
    case = df[df["record"] == "case"].set_index(["setting", "task", "seed"])[cols]
    var = df[df["record"] == "variant"].drop(columns=[c for c in cols if c in df.columns])
    var = var.join(case, on=["setting", "task", "seed"])
    out = []
    for name, g in var.groupby("variant", sort=False):
        gap = (g["ft_test"] - g["probe_test"]).to_numpy()
        gain1 = (g["test_alpha1"] - g["probe_test"]).to_numpy()
        out.append({"variant": name, "cases": len(g),
                    "val_gain_alpha1": float((g["val_alpha1"] - g["probe_val"]).mean()),
                    "val_gain_best": float((g["val_best"] - g["probe_val"]).mean()),
                    "test_gain_alpha1": float(gain1.mean()),
                    "test_gain_best": float((g["test_best"] - g["probe_test"]).mean()),
                    "gap_closed_alpha1": float(np.mean(gain1) / np.mean(gap)) if np.mean(gap) > 0 else math.nan,
                    "below_probe_alpha1": float((gain1 < 0).mean()),
                    "out_similarity": float(g["out_similarity_wmedian"].median()),
                    "in_similarity": float(g["in_similarity_wmedian"].median()),
                    "out_cka": float(g["out_cka_wmedian"].median()), "in_cka": float(g["in_cka_wmedian"].median()),
                    "seconds": float(g["seconds"].mean())})
    order = {v: i for i, v in enumerate(VARIANTS)}
    res = pd.DataFrame(out)
    return res.sort_values("variant", key=lambda s: s.map(lambda v: order.get(v, len(order)))).reset_index(drop=True)


def choose_default(summary) -> str:
    """The variant with the highest mean validation gain at ``alpha = 1`` (ties: the earlier in :data:`VARIANTS`)."""
    best = summary.loc[summary["val_gain_alpha1"].idxmax()]
    return str(best["variant"])

"""Why output gradients do not align, and what changes it -- ftlab's own investigation.

For a set of (setting, task, seed) cases (:class:`~ftlab.experiments.transfer_accuracy.setup.TaskSetup` builds
each once, as the benchmark does: probe heads, fine-tuned source and target), BiCo is fitted under each
calibration *variant* (:data:`VARIANTS`), one knob changed from the benchmark's protocol at a time:

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
import torch

from ftlab.experiments.training import n_rows
from ftlab.experiments.transfer_accuracy.compare import AlphaChoice, PairData, PairModels, choose_alpha, layer_records
from ftlab.experiments.transfer_accuracy.design import BenchmarkConfig
from ftlab.experiments.transfer_accuracy.finetune import batches_of, task_loss
from ftlab.experiments.transfer_accuracy.setup import TaskSetup
from ftlab.transfer import TaskVector, fit_transfer, split_options
from ftlab.transfer.align import RankWarning
from ftlab.transfer.diagnose import diagnosis_from_result

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
#: The alignment statistics summarised per variant (medians over layers weighted by ``tau_share``).
ALIGNMENT: tuple[str, ...] = ("in_cka", "out_cka", "in_similarity", "out_similarity")


def _weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    ok = np.isfinite(values) & np.isfinite(weights) & (weights > 0)
    if not ok.any():
        return math.nan
    v, w = values[ok], weights[ok]
    order = np.argsort(v)
    c = np.cumsum(w[order])
    return float(v[order][np.searchsorted(c, 0.5 * c[-1])])


def _alpha_record(choice: AlphaChoice) -> dict:
    return {"val_alpha1": choice.val[1.0], "val_best": choice.val[choice.alpha], "alpha_best": choice.alpha,
            "test_alpha1": choice.test_fixed, "test_best": choice.test_searched}


def _fit_variant(setup: TaskSetup, m: PairModels, d: PairData, name: str):
    """BiCo under one calibration variant (``diagnostics=True``); ``(result, seconds)``."""
    knobs = dict(VARIANTS[name])
    loss = task_loss(setup.classes, knobs.pop("loss", setup.cfg.settings.cal_loss))
    n_cal = int(knobs.pop("n_cal", 100))
    x, y = d.cal_pool
    batches = batches_of(x, y, batch_size=setup.cfg.settings.cal_batch_size, n=min(n_cal, n_rows(x)), seed=m.seed)
    options, method = split_options("bico", {**d.transfer_options, **knobs, "diagnostics": True,
                                             "all_maps": True})  # the alignment of every layer is recorded
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RankWarning)
        res = fit_transfer(m.source_base, m.source_ft, m.target_base, batches, loss, method=method, options=options)
    return res, time.perf_counter() - t0


def investigate_case(kind: str, setting: str, task: str, seed: int, config: dict, *,
                     variants: Sequence[str] = tuple(VARIANTS), cache: str | None = None,
                     ablate: Sequence[str] = ()) -> list[dict]:
    """Records for one case, built by :class:`~ftlab.experiments.transfer_accuracy.setup.TaskSetup` as the benchmark
    builds it, alpha searched over the configuration's grid: ``record="case"`` (probe / fine-tuned accuracies),
    ``"variant"`` (accuracies and alignment summaries per variant), ``"layer"`` (per capture point and variant,
    :func:`~ftlab.experiments.transfer_accuracy.compare.layer_records`) and, for the variants named in ``ablate``,
    ``"ablation"`` (:func:`layer_ablation`)."""
    cfg = BenchmarkConfig.from_dict(config)
    grid = cfg.settings.alpha_grid
    setup = TaskSetup(kind, task, seed, cfg, pair=setting, cache=cache)
    m, d = setup.pair(setting)
    head = {"setting": setting, "task": task, "seed": int(seed)}
    probe_test, ft_test = d.target_scores or (math.nan, math.nan)
    rows: list[dict] = [{"record": "case", **head, "kind": kind, "probe_val": d.score(m.target_base, "val"),
                         "probe_test": probe_test, "ft_val": d.score(m.target_ft, "val"), "ft_test": ft_test}]
    for name in variants:
        res, seconds = _fit_variant(setup, m, d, name)
        choice = choose_alpha(lambda a: res.task_vector.apply(m.target_base, a), d.score, grid)  # noqa: B023
        layer = [{"record": "layer", **head, "variant": name, **rec} for rec in layer_records(res)]
        weights = np.array([r["tau_share"] for r in layer], dtype=float)
        summary = {f"{k}_wmedian": _weighted_median(np.array([r[k] for r in layer], dtype=float), weights)
                   for k in ALIGNMENT}
        rows.append({"record": "variant", **head, "variant": name, **_alpha_record(choice), "seconds": seconds,
                     **summary})
        rows += layer
        if name in ablate:
            rows += [{"record": "ablation", **head, **r, "variant": name}
                     for r in layer_ablation(m, d, res, alpha_grid=grid)]
    return rows


def _point_of(param: str, points: set[str]) -> str | None:
    head = param
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in points:
            return head
    return None


def layer_ablation(m: PairModels, d: PairData, res, *, alpha_grid: Sequence[float]) -> list[dict]:
    """Where does a transferred task vector help or hurt? ``tau_B`` of a finished fit ``res`` kept on subsets of the
    target's layers (the rest zero): the early or late half by depth, and the layers whose carried share ``c_l``
    (:func:`ftlab.transfer.diagnose.diagnosis_from_result`: the product of the two sides' Procrustes similarities)
    is above or below the median; plus the naive transfer of the same ``tau_A``. No refitting: the same maps,
    evaluated on validation and test. One dict per subset: ``subset``, ``norm_share`` (its share of
    ``||tau_B||^2``) and the accuracies at alpha = 1 and searched."""
    carry = {r["target"]: r["carry"] for r in diagnosis_from_result(res).layers}
    order = {t: i for i, t in enumerate(carry)}
    finite = [c for c in carry.values() if math.isfinite(c)]
    med = float(np.median(finite)) if finite else math.nan
    half = len(order) / 2
    subsets = {"early half": lambda t: order[t] < half, "late half": lambda t: order[t] >= half,
               "carry above median": lambda t: math.isfinite(carry[t]) and carry[t] >= med,
               "carry below median": lambda t: not (math.isfinite(carry[t]) and carry[t] >= med)}
    tau = res.task_vector
    points = set(order)
    out = []
    for name, keep in subsets.items():
        kept = {}
        for k, v in tau.items():
            pt = _point_of(k, points)
            kept[k] = v if (pt is not None and keep(pt)) else torch.zeros_like(v)
        sub = TaskVector(kept)
        choice = choose_alpha(lambda a: sub.apply(m.target_base, a), d.score, alpha_grid)  # noqa: B023
        out.append({"subset": name, "norm_share": sub.norm() ** 2 / max(tau.norm() ** 2, 1e-300),
                    **_alpha_record(choice)})
    naive = fit_transfer(m.source_base, m.source_ft, m.target_base, method="naive").task_vector
    choice = choose_alpha(lambda a: naive.apply(m.target_base, a), d.score, alpha_grid)
    out.append({"subset": "naive transfer", "norm_share": math.nan, **_alpha_record(choice)})
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

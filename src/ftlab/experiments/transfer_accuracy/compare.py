"""Every transfer of one (setting, task, seed): fits shared by variants, alpha at 1 and searched, and the mechanism.

:func:`evaluate_pair` takes the two bases and their fine-tunings (:class:`PairModels`), how to calibrate and score
them (:class:`PairData`) and a plan ``{calibration: variant names}`` (:mod:`~ftlab.experiments.transfer_accuracy
.variants`), and returns the run's records:

* ``record="accuracy"``: the target's own accuracy (``probe`` or ``zero_shot``), its direct fine-tuning
  (``finetuned``) and every variant at ``alpha = 1`` (``alpha_mode="fixed"``) and at the alpha chosen on the
  validation split over the grid (``"searched"``; ties go to the smallest alpha, so 0 -- the target untouched --
  wins a tie);
* ``record="layer"`` / ``"estimate"``: BiCo's per-layer alignment and the diagnostic's estimate
  (:func:`ftlab.transfer.diagnose.diagnosis_from_result`), read off the fits of ``bico`` and ``recommended``;
* ``record="mechanism"``: at ``alpha = 1``, the drift of the channel means at the target's last norm layer with
  running statistics (in base B's channel standard deviations, before any repair) and how the test predictions
  spread over the classes (the largest share predicted as one class, the classes never predicted).

Variants that share a method and its options share one fit (:func:`~ftlab.experiments.transfer_accuracy.variants
.fit_key`); the statistics repair is fitted once per calibration set on the target's calibration inputs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ftlab.core.modes import module_mode
from ftlab.core.validate import check_choice
from ftlab.experiments.training import n_rows, take_rows
from ftlab.experiments.transfer_accuracy.finetune import batches_of
from ftlab.experiments.transfer_accuracy.variants import Variant, fit_key, get_variant
from ftlab.transfer import TransferOptions, fit_transfer, get_method, search_alpha, split_options
from ftlab.transfer.align import RankWarning
from ftlab.transfer.diagnose import diagnosis_from_result
from ftlab.transfer.methods import method_info, reads_batches
from ftlab.transfer.repair import fit_repair

__all__ = ["MECHANISM", "AlphaChoice", "PairData", "PairModels", "Scorer", "calibration_batches", "choose_alpha",
           "evaluate_pair", "layer_records", "reads_no_data"]

log = logging.getLogger(__name__)

#: Variants whose mechanism (drift at the head norm, spread of the predictions) is recorded at alpha = 1.
MECHANISM: tuple[str, ...] = ("naive", "bico", "bico+repair", "recommended")
#: Variants whose fits also give the diagnostic's estimate (the first also the per-layer rows).
LAYER_VARIANTS: tuple[str, ...] = ("bico", "recommended")
#: Calibration sets: 100 samples drawn at random from the training draw, or 5 per class (the paper's two regimes).
CALIBRATIONS: tuple[str, ...] = ("n100", "k5")


class Scorer:
    """Accuracy and predictions of a model on the ``splits`` (``{"val"|"test": (inputs, labels)}``), logits restricted
    to ``classes`` (indices into the model's outputs; None: all), in eval mode without autograd."""

    def __init__(self, splits: Mapping[str, tuple], classes: Sequence[int] | None = None, batch_size: int = 64):
        self.splits, self.batch_size = splits, batch_size
        self.classes = None if classes is None else torch.as_tensor(list(classes), dtype=torch.long)

    def predictions(self, model, split: str) -> torch.Tensor:
        x, _ = self.splits[split]
        out = []
        with torch.inference_mode(), module_mode(model):
            for i in range(0, n_rows(x), self.batch_size):
                z = model(take_rows(x, slice(i, i + self.batch_size)))
                out.append((z if self.classes is None else z[:, self.classes]).argmax(1))
        return torch.cat(out)

    def __call__(self, model, split: str) -> float:
        return float((self.predictions(model, split) == self.splits[split][1]).double().mean())


@dataclass
class PairModels:
    """One (setting, task, seed): the two bases and their direct fine-tunings; ``baseline`` names the target's own
    accuracy (``probe`` or ``zero_shot``)."""

    setting: str
    task: str
    seed: int
    source_base: Any
    source_ft: Any
    target_base: Any
    target_ft: Any
    baseline: str = "probe"


@dataclass
class PairData:
    """How to calibrate and score one pair: ``cal_pool`` ``(inputs, labels)`` the calibration sets are drawn from,
    ``loss(model, batch)`` through each model's own frozen head, ``score`` (a :class:`Scorer` or ``score(model,
    split)``), ``transfer_options`` (:class:`~ftlab.transfer.TransferOptions` fields and method options for every
    method; options a method does not take are dropped for it), ``target_scores`` the known test accuracies of the
    target base and its fine-tuning (None: scored here)."""

    cal_pool: tuple
    loss: Callable
    score: Callable[[Any, str], float]
    transfer_options: dict = field(default_factory=dict)
    target_scores: tuple[float, float] | None = None


def reads_no_data(method: str) -> bool:
    """Whether a registered method reads no calibration batches (:func:`ftlab.transfer.methods.reads_batches`; it may
    still read both bases' weights): such a method runs once per (setting, task, seed), recorded with calibration
    ``"-"``."""
    return not reads_batches(get_method(method))


def _records(m: PairModels, method: str, calibration: str, n_cal: int, fixed: tuple, searched: tuple,
             seconds: float = math.nan) -> list[dict]:
    """The ``fixed`` and ``searched`` accuracy records of one method, each from ``(alpha, test accuracy, validation
    accuracy)``."""
    return [{"record": "accuracy", "setting": m.setting, "task": m.task, "seed": int(m.seed), "method": method,
             "calibration": calibration, "alpha_mode": mode, "alpha": float(alpha), "n_cal": int(n_cal),
             "accuracy": float(acc), "val_accuracy": float(val), "seconds": float(seconds)}
            for mode, (alpha, acc, val) in (("fixed", fixed), ("searched", searched))]


@dataclass(frozen=True)
class AlphaChoice:
    """The alpha of ``B + alpha tau_B`` chosen on validation and the test accuracies: ``alpha`` (the grid's best
    validation accuracy, ties to the smallest), ``val`` (validation accuracy per alpha of the grid), ``test_fixed``
    (at alpha = 1) and ``test_searched`` (at ``alpha``)."""

    alpha: float
    val: Mapping[float, float]
    test_fixed: float
    test_searched: float


def choose_alpha(model_at: Callable[[float], Any], score: Callable[[Any, str], float], grid: Sequence[float], *,
                 known_val: Mapping[float, float] | None = None) -> AlphaChoice:
    """Search ``grid`` (which holds 1) on the validation split with :func:`ftlab.transfer.search_alpha` and score
    the test split at alpha = 1 and at the chosen alpha. ``model_at(alpha)`` builds ``B + alpha tau_B``,
    ``score(model, split)`` is an accuracy; ``known_val``: validation accuracies already known (alpha = 0: the
    target's own)."""
    if 1.0 not in grid:
        raise ValueError(f"alpha_grid={tuple(grid)!r} must contain 1.0")
    known = known_val or {}
    vals: dict[float, float] = {}

    def val_score(a: float) -> float:
        vals[a] = known[a] if a in known else score(model_at(a), "val")
        return vals[a]

    best, _ = search_alpha(val_score, grid=grid)
    test1 = score(model_at(1.0), "test")
    return AlphaChoice(best, vals, test1, test1 if best == 1.0 else score(model_at(best), "test"))


def calibration_batches(inputs, labels, *, kind: str, seed: int, batch_size: int = 32) -> list[tuple]:
    """The calibration batches ``kind`` (``n100``: 100 samples drawn by ``seed``; ``k5``: 5 per class, the first
    five of each class in a ``seed``-drawn order), as ``(inputs, labels)`` batches of ``batch_size``."""
    check_choice("calibration", kind, CALIBRATIONS)
    if kind == "n100":
        return batches_of(inputs, labels, batch_size=batch_size, n=min(100, n_rows(inputs)), seed=seed)
    order = np.random.default_rng(seed).permutation(n_rows(inputs))
    y = np.asarray(labels)[order]
    picked = np.concatenate([order[y == c][:5] for c in np.unique(y)])
    idx = torch.from_numpy(np.random.default_rng(seed + 1).permutation(picked))
    return [(take_rows(inputs, idx[i:i + batch_size]), labels[idx[i:i + batch_size]])
            for i in range(0, len(idx), batch_size)]


def _diagnose(res) -> dict:
    """The diagnostic's estimate of the share of tau_A that carries over, read off a finished fit (no second pass)."""
    try:
        dg = diagnosis_from_result(res)
    except ValueError as exc:
        log.info("diagnose failed: %s", exc)
        return {}
    return {"estimate": float(dg.estimate), "estimate_cka": float(dg.estimate_cka), "zeroed_share": float(dg.zeroed_share)}


def layer_records(res) -> list[dict]:
    """Per target capture point of a finished fit, in order: CKA, Procrustes similarity, rank, dimensions and rows of
    each side's map, the alignment residuals, and ``tau_share``, the share of ``||tau_A||^2`` held by the paired
    source layer. (The diagnostic's ``tau_share``, :func:`ftlab.transfer.diagnose.diagnosis_from_result`, is the
    share of the task vector as the target receives it: a source layer feeding two target layers counts twice and
    the target's zeroed parameters count; the records keep the source's view.)"""
    total = float(res.source_norms.get("total") or 0.0) ** 2
    return [{"order": i, "point": rec["target"], "source_point": rec["source"],
             **{f"{s}_{k}": rec.get(f"{s}_{k}", math.nan) for s in ("in", "out")
                for k in ("cka", "similarity", "rank", "dims", "rows")},
             "in_residual": rec.get("in_residual_fit", math.nan), "out_residual": rec.get("out_residual_fit", math.nan),
             "tau_share": (rec.get("source_norm", math.nan) ** 2 / total) if total > 0 else math.nan}
            for i, rec in enumerate(res.layers())]


def _layer_rows(res, m: PairModels, calibration: str) -> list[dict]:
    head = {"record": "layer", "setting": m.setting, "task": m.task, "seed": int(m.seed), "calibration": calibration}
    return [{**head, **rec} for rec in layer_records(res)]


def _fit(v: Variant, options: dict, m: PairModels, batches, loss):
    """One transfer of variant ``v`` with copies summed and no repair (both applied per variant afterwards);
    ``None`` when the method does not apply to these models."""
    own = {f.name for f in dataclasses.fields(method_info(v.method).options_type)}
    general = set(TransferOptions.field_names())
    mine = {k: val for k, val in options.items() if k in general or k in own}
    # all_maps: the layer rows record the alignment of every layer, also of those the task vector leaves at zero
    mine.update(v.method_options, copies="sum", repair="none", all_maps=True)
    try:
        topts, method = split_options(v.method, mine)
        if hasattr(method, "bind"):  # a method that reads both bases' weights (TransFusion)
            method = method.bind(m.source_base, m.target_base)
        with warnings.catch_warnings():  # rank deficits are expected at 100 rows; the layer rows record them
            warnings.simplefilter("ignore", RankWarning)
            return fit_transfer(m.source_base, m.source_ft, m.target_base,
                                batches if reads_batches(method) else None, loss, method=method, options=topts)
    except ValueError as exc:
        log.info("method %s skipped: %s", v.name, exc)
        return None


class _Candidate:
    """One variant's task vector and how to build ``B + alpha tau_B`` (repaired when the variant asks)."""

    def __init__(self, m: PairModels, tau, repair):
        self.m, self.tau, self.repair = m, tau, repair

    def model(self, alpha: float):
        out = self.tau.apply(self.m.target_base, alpha)
        if self.repair is not None and alpha != 0.0:
            self.repair.apply_(out)
        return out


def _mechanism(m: PairModels, name: str, model, scorer: Scorer | Callable, drift_of: Callable | None) -> dict:
    """Drift at the head norm (before any repair) and the spread of the test predictions over the classes."""
    counts = None
    if isinstance(scorer, Scorer):
        n_classes = len(scorer.classes) if scorer.classes is not None else int(scorer.splits["test"][1].max()) + 1
        counts = np.bincount(scorer.predictions(model, "test").numpy(), minlength=n_classes)
    return {"record": "mechanism", "setting": m.setting, "task": m.task, "seed": int(m.seed), "method": name,
            "head_drift": drift_of(model) if drift_of is not None else math.nan,
            "top_share": float(counts.max() / counts.sum()) if counts is not None else math.nan,
            "never_predicted": int((counts == 0).sum()) if counts is not None else -1}


class _PairRun:
    """The state of one :func:`evaluate_pair` call: shared fits and repairs, validation scores at alpha = 0."""

    def __init__(self, m: PairModels, d: PairData, grid: Sequence[float], cal_batch_size: int):
        self.m, self.d, self.grid, self.cal_batch_size = m, d, tuple(grid), cal_batch_size
        self.base_val = d.score(m.target_base, "val")
        self.fits: dict = {}
        self.repairs: dict = {}
        self.drift_ref = None
        self.scored: dict = {}  # variants that build the same models share their scores

    def fit(self, v: Variant, calibration: str, batches):
        key = (fit_key(v), "-" if reads_no_data(v.method) else calibration)
        if key not in self.fits:
            t0 = time.perf_counter()
            res = _fit(v, self.d.transfer_options, self.m, batches, self.d.loss)
            self.fits[key] = (res, time.perf_counter() - t0)
        return self.fits[key]

    def repair(self, mode: str, calibration: str, batches):
        if mode == "none":
            return None
        if (mode, calibration) not in self.repairs:
            self.repairs[(mode, calibration)] = fit_repair(self.m.target_base, [bb for bb in batches], mode=mode)
        return self.repairs[(mode, calibration)]

    def drift(self, model) -> float:
        """RMS channel-mean drift at the target's last norm layer with running statistics (nan without one)."""
        if self.drift_ref is None:
            return math.nan
        per_layer = self.drift_ref.drift(model)
        return float(list(per_layer.values())[-1]) if per_layer else math.nan

    def choice(self, cand: _Candidate) -> AlphaChoice:
        """The candidate's alpha chosen on validation and its test accuracies (alpha = 0 is the target itself)."""
        return choose_alpha(cand.model, self.d.score, self.grid, known_val={0.0: self.base_val})


def evaluate_pair(m: PairModels, d: PairData, plan: Mapping[str, Sequence[str]], *, alpha_grid: Sequence[float],
                  cal_batch_size: int = 32, layers: bool = True, diagnose: bool = False,
                  mechanism: Sequence[str] = MECHANISM) -> list[dict]:
    """Rows for one (setting, task, seed): the baseline, fine-tuned, and every variant of ``plan`` (``{calibration:
    variant names}``) at alpha = 1 and searched (see the module docstring). A variant whose method does not apply to
    these shapes (``ValueError`` from ``ftlab.transfer``) is skipped and logged; methods that read no calibration data
    (:func:`reads_no_data`) run once."""
    if 1.0 not in alpha_grid:
        raise ValueError(f"alpha_grid={tuple(alpha_grid)!r} must contain 1.0")
    run = _PairRun(m, d, alpha_grid, cal_batch_size)
    base_acc, ft_acc = d.target_scores if d.target_scores is not None else (d.score(m.target_base, "test"),
                                                                            d.score(m.target_ft, "test"))
    own = (math.nan, base_acc, run.base_val)
    rows = _records(m, m.baseline, "-", 0, own, own)
    rows += _records(m, "finetuned", "-", 0, (math.nan, ft_acc, math.nan), (math.nan, ft_acc, math.nan))
    first = next(iter(plan), "n100")
    done_free: set[str] = set()
    for calibration, names in plan.items():
        batches = calibration_batches(d.cal_pool[0], d.cal_pool[1], kind=calibration, seed=m.seed,
                                      batch_size=cal_batch_size)
        n_cal = sum(len(b[1]) for b in batches)
        if calibration == first and mechanism:
            run.drift_ref = run.repair("mean", calibration, batches)
            rows.append(_mechanism(m, "finetuned", m.target_ft, d.score, run.drift))
            rows.append(_mechanism(m, m.baseline, m.target_base, d.score, run.drift))
        for name in names:
            v = get_variant(name)
            free = reads_no_data(v.method)
            if free and name in done_free:
                continue
            done_free.add(name)
            res, seconds = run.fit(v, calibration, batches)
            if res is None:
                continue
            copies = v.copies  # where no source layer feeds two target layers, every copy rule gives the same tau_B
            if copies != "sum" and all(w == 1.0 for w in res.layer_map_object.copy_weights(
                    list(res.task_vector), copies).values()):
                copies = "sum"
            tau = res.task_vector if copies == "sum" else res.with_copies(copies)
            repair = run.repair(v.repair, calibration, batches)
            cand = _Candidate(m, tau, repair)
            cal, ncal = ("-", 0) if free else (calibration, n_cal)
            key = (fit_key(v), cal, copies, v.repair if repair is not None else "none")
            if key not in run.scored:
                run.scored[key] = run.choice(cand)
            ch = run.scored[key]
            rows += _records(m, name, cal, ncal, (1.0, ch.test_fixed, ch.val[1.0]),
                             (ch.alpha, ch.test_searched, ch.val[ch.alpha]), seconds)
            if calibration == first and name in mechanism:
                rec = _mechanism(m, name, cand.model(1.0), d.score, None)
                rows.append({**rec, "head_drift": run.drift(tau.apply(m.target_base, 1.0))})
            if layers and name in LAYER_VARIANTS and calibration == first:
                if name == LAYER_VARIANTS[0]:
                    rows += _layer_rows(res, m, calibration)
                est = _diagnose(res) if diagnose else {}
                if est:
                    rows.append({"record": "estimate", "setting": m.setting, "task": m.task, "seed": int(m.seed),
                                 "calibration": calibration, "method": name, **est})
    return rows

"""``transfer(...)``: carry a task vector from source base A to target base B without training.

Steps (BiCo, Son et al. 2026, arXiv:2605.28444; pseudocode in ``spec/bico.md`` sec. 3.11):

1. ``tau_A = theta_A^ft - theta_A^pre`` (strict: same names and shapes).
2. Transport specs of A and B (:func:`~ftlab.transfer.spec.infer_spec`) and the depth map
   (:mod:`~ftlab.transfer.layer_map`), pairing every target capture point with a source point.
3. One forward-backward pass of both frozen *base* models over the calibration batches,
   streaming row statistics into float64 cross-covariances (:mod:`~ftlab.transfer.calibrate`).
4. The method fits its maps (``prepare``) and maps ``tau_A`` onto B's parameters (``apply``).

The models are never modified (training flags and ``requires_grad`` are restored).
"""

from __future__ import annotations

import inspect
import logging
import resource
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ftlab.transfer.align import SEQ_ALIGN, MapFit
from ftlab.transfer.calibrate import collect_maps_stats, collect_target_grads, layer_cka_scores, paired_batches, peek
from ftlab.transfer.layer_map import DEPTH_RULES, LayerMap, build_layer_map, find_stacks
from ftlab.transfer.methods import get_method
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.spec import DEFAULT_ZERO, TransportSpec, infer_spec
from ftlab.transfer.task_vector import TaskVector
from ftlab.validate import check_choice, check_int

__all__ = ["TransferResult", "fit_transfer", "pair_points", "transfer"]

log = logging.getLogger(__name__)


def _peak_rss_mb() -> float:
    """Peak resident memory of this process (MB): ``VmHWM`` on Linux, else ``getrusage``.

    ``ru_maxrss`` survives ``exec``, so a child started from a large parent would report the
    parent's peak; ``VmHWM`` belongs to the current address space.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass(frozen=True)
class TransferResult:
    """The target task vector and how it was obtained.

    ``fits[target_point] = (fit_in, fit_out)`` (:class:`~ftlab.transfer.align.MapFit` or None),
    ``pairs[target_point] = source_point``; ``layer_map`` per stack; ``time_s`` wall time, split
    in ``timings`` (``calibration_s``: the forward-backward pass with capture and statistics;
    ``fit_s``: all map solves; ``apply_s``: transport); ``peak_rss_mb`` the process's peak resident
    memory so far (``VmHWM``).
    """

    task_vector: TaskVector
    method: str
    options: dict
    layer_map: dict
    pairs: dict = field(default_factory=dict)
    fits: dict = field(default_factory=dict)
    n_batches: int = 0
    time_s: float = 0.0
    peak_rss_mb: float = 0.0
    source_norms: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    point_norms: dict = field(default_factory=dict)

    def layers(self) -> list[dict]:
        """One record per target capture point: map shapes, CKA, alignment residuals, delta norms."""
        rows = []
        for tp, sp in self.pairs.items():
            rec: dict = {"target": tp, "source": sp}
            for side, fit in zip(("in", "out"), self.fits.get(tp, (None, None))):
                if isinstance(fit, MapFit):
                    rec.update({f"{side}_map": list(fit.R.shape), f"{side}_source": fit.source, f"{side}_rows": fit.n_rows,
                                f"{side}_rank": fit.rank, f"{side}_cka": fit.cka, f"{side}_cka_naive": fit.cka_naive,
                                f"{side}_cka_fit": fit.cka_fit,
                                f"{side}_residual_naive": fit.residual_naive, f"{side}_residual_fit": fit.residual})
            rec.update(self.point_norms.get(tp, {}))
            rows.append(rec)
        return rows

    def report(self) -> dict:
        """A JSON-ready summary (the CLI writes it)."""
        return {"method": self.method, "options": self.options, "layer_map": self.layer_map, "n_batches": self.n_batches,
                "time_s": self.time_s, "timings": self.timings, "peak_rss_mb": self.peak_rss_mb,
                "source_norm": self.source_norms.get("total"),
                "target_norm": self.task_vector.norm(), "layers": self.layers(),
                "parameters": [{"name": k, "shape": list(v.shape), "norm": float(v.double().norm())}
                               for k, v in self.task_vector.items()]}


def pair_points(source_spec: TransportSpec, target_spec: TransportSpec, layer_map: LayerMap) -> dict[str, str]:
    """``{target_point: source_point}`` for every used target point whose layer has a source.

    Raises ``ValueError`` when a target point has no counterpart of the same kind in the source.
    """
    pairs = {}
    for tp in target_spec.used_points():
        sp = layer_map.source_name(tp)
        if sp is None:
            continue
        if sp not in source_spec.points:
            raise ValueError(f"target layer {tp!r} has no counterpart {sp!r} in the source model: "
                             "the architectures do not correspond")
        if source_spec.points[sp].kind != target_spec.points[tp].kind:
            raise ValueError(f"target layer {tp!r} ({target_spec.points[tp].kind}) and source layer {sp!r} "
                             f"({source_spec.points[sp].kind}) are of different kinds")
        pairs[tp] = sp
    return pairs


def _point_norms(spec, lmap: LayerMap, pairs: Mapping[str, str], tau_a: TaskVector, tau_b: TaskVector) -> dict:
    """Frobenius norms of the source and target deltas carried by each target point's maps."""
    from ftlab.transfer.transport import fused_block

    sq: dict[str, list[float]] = {tp: [0.0, 0.0] for tp in pairs}
    for pname, rules in spec.rules.items():
        src = lmap.source_name(pname)
        for r in rules:
            if r.kind == "zero" or r.point not in sq:
                continue
            sq[r.point][1] += float(fused_block(tau_b[pname], r.part).double().pow(2).sum())
            if src is not None and src in tau_a:
                sq[r.point][0] += float(fused_block(tau_a[src], r.part).double().pow(2).sum())
    return {tp: {"source_norm": a ** 0.5, "target_norm": b ** 0.5} for tp, (a, b) in sq.items()}


def _method_with_options(method: str, options: dict):
    try:
        return get_method(method, **options)
    except TypeError as exc:
        raise ValueError(f"invalid option for method {method!r}: {exc}") from None


def fit_transfer(source_base: nn.Module, source_finetuned: nn.Module, target_base: nn.Module,
                 batches: Iterable | None = None, loss: Callable | None = None, *, method: str = "bico",
                 depth_map: str = "nearest_relative", source_batches: Iterable | None = None,
                 target_batches: Iterable | None = None, seq_align: str = "identity", n_prefix: int | None = None,
                 padding_mask="auto", seq_first: bool = False, zero_params: Iterable[str] = DEFAULT_ZERO,
                 source_overrides: Mapping | None = None, target_overrides: Mapping | None = None,
                 diagnostics: bool = False, batch_dtype: torch.dtype | None = None, cka_batches: int = 4,
                 source_stats: str = "base", train_mode: bool = False, loss_reduction: str = "mean",
                 **method_options) -> TransferResult:
    """Like :func:`transfer`, but returns a :class:`TransferResult` with per-layer diagnostics.

    ``diagnostics=True`` also streams ``A^T A`` and ``B^T B`` so that CKA and alignment residuals
    are reported (more memory and time).
    """
    t0 = time.perf_counter()
    check_choice("depth_map", depth_map, DEPTH_RULES)
    check_choice("seq_align", seq_align, SEQ_ALIGN)
    check_int("cka_batches", cka_batches, 1)
    check_choice("source_stats", source_stats, ("base", "finetuned"))
    check_choice("loss_reduction", loss_reduction, ("mean", "sum"))
    for name, m in (("source_base", source_base), ("source_finetuned", source_finetuned), ("target_base", target_base)):
        if not isinstance(m, nn.Module):
            raise ValueError(f"{name} must be a torch.nn.Module, got {type(m).__name__}")
    if loss is not None and len(inspect.signature(loss).parameters) < 2:
        raise ValueError("loss must be a function loss(model, batch) -> scalar tensor")
    tau_a = TaskVector.from_models(source_base, source_finetuned)
    bad = [k for k, v in tau_a.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"the source task vector is not finite at {bad[0]!r}")
    m = _method_with_options(method, method_options)
    target_shapes = {k: tuple(p.shape) for k, p in target_base.named_parameters()}
    cka = None
    if depth_map == "cka":
        if loss is None:
            raise ValueError("depth_map='cka' needs calibration batches and a loss")
        for b in (batches, source_batches, target_batches):
            if b is not None and iter(b) is b:
                raise ValueError("depth_map='cka' needs re-iterable batches (a list or a DataLoader), "
                                 "not a one-shot iterator")
        pairs_iter, _ = paired_batches(batches, source_batches, target_batches)
        head, _ = peek(pairs_iter, cka_batches)
        stacks = [p for p in find_stacks(target_base) if p in find_stacks(source_base)]
        cka = layer_cka_scores(source_base, target_base, stacks, head, loss)
    lmap: LayerMap = build_layer_map(source_base, target_base, depth_map, cka_scores=cka)
    if hasattr(m, "check"):
        m.check(tau_a, TransferProblem(lmap, target_shapes))
    stats = None
    pairs: dict[str, str] = {}
    n_batches = 0
    t_cal = time.perf_counter()
    if m.calibration == "maps":
        if loss is None:
            raise ValueError(f"method {method!r} needs calibration batches and a loss(model, batch)")
        spec_a = infer_spec(source_base, zero_params=zero_params, overrides=source_overrides)
        spec_b = infer_spec(target_base, zero_params=zero_params, overrides=target_overrides)
        pairs = pair_points(spec_a, spec_b, lmap)
        problem = TransferProblem(lmap, target_shapes, spec_a, spec_b, pairs)
        reqs = {tp: m.requirements(spec_b.points[tp]) for tp in pairs}
        pairs_iter, total = paired_batches(batches, source_batches, target_batches)
        stats, n_batches = collect_maps_stats(
            source_base if source_stats == "base" else source_finetuned, target_base, pairs=pairs,
            source_spec=spec_a, target_spec=spec_b, requirements=reqs,
            pairs_iter=pairs_iter, total=total, loss=loss, seq_align=seq_align, n_prefix=n_prefix,
            padding_mask=padding_mask, seq_first=seq_first, second=diagnostics or m.needs_second_moments,
            batch_dtype=batch_dtype, train_mode=train_mode, loss_reduction=loss_reduction)
    elif m.calibration == "target_grads":
        if loss is None:
            raise ValueError(f"method {method!r} needs calibration batches and a loss(model, batch)")
        tb = target_batches if target_batches is not None else batches
        if tb is None:
            raise ValueError("batches is None: the method needs calibration batches")
        problem = TransferProblem(lmap, target_shapes)
        stats = collect_target_grads(target_base, tb, loss, total=len(tb) if hasattr(tb, "__len__") else None)
        n_batches = stats["n_batches"]
    else:
        problem = TransferProblem(lmap, target_shapes)
    t_fit = time.perf_counter()
    m.prepare(problem, stats)
    t_apply = time.perf_counter()
    tau_b = m.apply(tau_a)
    timings = {"calibration_s": t_fit - t_cal, "fit_s": t_apply - t_fit, "apply_s": time.perf_counter() - t_apply}
    fits = dict(getattr(m, "fits", {}))
    point_norms = _point_norms(problem.target_spec, lmap, pairs, tau_a, tau_b) if pairs else {}
    options = {"depth_map": depth_map, "seq_align": seq_align, "n_prefix": n_prefix, "seq_first": seq_first,
               "zero_params": list(zero_params), "diagnostics": diagnostics, "batch_dtype": str(batch_dtype),
               "source_stats": source_stats, "train_mode": train_mode, "loss_reduction": loss_reduction,
               **{k: v for k, v in method_options.items() if isinstance(v, (int, float, str, bool, type(None)))}}
    return TransferResult(task_vector=tau_b, method=method, options=options, layer_map=lmap.as_dict(), pairs=pairs,
                          fits=fits, n_batches=n_batches, time_s=time.perf_counter() - t0, peak_rss_mb=_peak_rss_mb(),
                          source_norms={"total": tau_a.norm()}, timings=timings, point_norms=point_norms)


def transfer(source_base: nn.Module, source_finetuned: nn.Module, target_base: nn.Module,
             batches: Iterable | None = None, loss: Callable | None = None, *, method: str = "bico",
             depth_map: str = "nearest_relative", **options) -> TaskVector:
    """The target's task vector ``tau_B``, transported from ``tau_A = source_finetuned - source_base``.

    Parameters
    ----------
    source_base, source_finetuned, target_base:
        Three ``nn.Module`` s (not modified). ``source_finetuned`` must have ``source_base``'s
        names and shapes.
    batches:
        Iterable of calibration batches, each fed to both base models (``loss(model, batch)``).
        Give ``source_batches``/``target_batches`` instead when A and B need different
        preprocessing (zipped pairwise; the same samples, in the same order).
    loss:
        ``loss(model, batch) -> scalar tensor``; gradients are taken at the *base* models.
    method:
        A short name from :func:`~ftlab.transfer.list_methods`: ``bico`` (default),
        ``activation_only``, ``gradient_only``, ``naive``, ``identity``, ``gradfix``.
    depth_map:
        ``nearest_relative`` (default), ``proportional``, ``prefix`` or ``cka``.
    options:
        ``seq_align`` (``identity`` | ``interpolate`` | ``interpolate2d`` | ``mean`` | ``cls``),
        ``n_prefix``, ``padding_mask`` (``"auto"`` = ``batch["attention_mask"]``, a key, a
        callable or None), ``seq_first``, ``zero_params``, ``source_overrides``/``target_overrides``
        (hand-written rules), ``diagnostics``, ``batch_dtype``, ``cka_batches``, ``source_stats``
        (``"base"``: statistics of A at its base weights, default [U]; ``"finetuned"``: at the
        fine-tuned weights), ``train_mode`` (calibrate in train mode; default eval [U]),
        ``loss_reduction`` (``"mean"``, default: ``loss`` averages over a batch's samples, so captured
        gradients are multiplied by the batch's sample count and every calibration sample weighs the
        same however the samples are batched; ``"sum"``: gradients are used as they are); method options
        ``in_map``/``out_map``, ``center``, ``whiten_p``, ``eps``, ``depth_scale`` (Procrustes
        methods), ``naive_mode`` (naive), ``vote``/``mode`` (gradfix).

    Returns
    -------
    TaskVector
        Keyed by the target's parameter names; apply with ``tau_B.apply(target_base, alpha)``.

    Examples
    --------
    >>> tau_b = transfer(vit_b16, vit_b16_ft, vit_b16_plus, loader, clip_ce_loss)   # doctest: +SKIP
    >>> model = tau_b.apply(vit_b16_plus, alpha=1.0)
    """
    return fit_transfer(source_base, source_finetuned, target_base, batches, loss, method=method,
                        depth_map=depth_map, **options).task_vector

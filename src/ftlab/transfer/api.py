"""``transfer(...)``: carry a task vector from source base A to target base B without training.

Steps (BiCo, Son et al. 2026, arXiv:2605.28444):

1. ``tau_A = theta_A^ft - theta_A^pre`` (strict: same names and shapes).
2. Transport specs of A and B (:func:`~ftlab.transfer.spec.infer_spec`) and the depth map
   (:mod:`~ftlab.transfer.layer_map`), pairing every target capture point with a source point.
3. One forward-backward pass of both frozen *base* models over the calibration batches (forward
   only for methods fitted on activations alone), streaming row statistics into float64
   cross-covariances (:mod:`~ftlab.transfer.calibrate`).
4. The method fits its maps (``prepare``) and maps ``tau_A`` onto B's parameters (``apply``).

The models are never modified (training flags and ``requires_grad`` are restored).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ftlab.core.progress import stage
from ftlab.core.usercode import check_model
from ftlab.core.validate import peak_rss_mb
from ftlab.transfer.align import MapFit
from ftlab.transfer.automap import automatic_options
from ftlab.transfer.batches import CalibrationData
from ftlab.transfer.calibrate import block_output_shapes, collect_map_statistics, collect_target_grads, layer_cka_scores
from ftlab.transfer.heads import NewHeads, find_new_heads, head_params, installed, prepare_heads
from ftlab.transfer.kinds import kind_for_module
from ftlab.transfer.kinds.embedding import vocab_maps
from ftlab.transfer.layer_map import LayerMap, build_layer_map, paired_stacks
from ftlab.transfer.methods import Bases, FittedTransfer, Method, Statistics, get_method, method_info, reads_batches
from ftlab.transfer.options import TransferOptions
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.repair import StatisticsRepair, fit_repair
from ftlab.transfer.spec import TransportSpec, infer_spec
from ftlab.transfer.task_vector import TaskVector
from ftlab.transfer.transport import carried_points, fused_block

__all__ = ["Fitting", "TransferResult", "fit_maps", "fit_transfer", "layer_records", "pair_points", "split_options",
           "target_entries", "transfer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TransferResult:
    """The target task vector and how it was obtained.

    ``fits[target_point] = (fit_in, fit_out)`` (:class:`~ftlab.transfer.align.MapFit` or None),
    ``pairs[target_point] = source_point``; ``layer_map`` per stack (``layer_stages``: the stages
    ``stage_relative`` used, ``{path: [source ids, target ids]}``); ``time_s`` wall time, split
    in ``timings`` (``calibration_s``: the forward-backward pass with capture and statistics;
    ``fit_s``: all map solves; ``apply_s``: transport); ``peak_rss_mb`` the process's peak resident
    memory so far (``VmHWM``); ``fitted`` the method's fitted transfer (``fitted.apply(tau)`` carries
    another task vector of the same source base with the same maps, no new calibration); ``copy_weights`` the
    weight of each target entry under ``options.copies`` (:meth:`~ftlab.transfer.layer_map.LayerMap.copy_weights`);
    ``repair`` base B's calibration statistics when ``options.repair`` asks for a statistics repair (None
    otherwise, or when B has no norm layer with running statistics); ``skipped`` the paired target points whose
    maps were neither calibrated nor fitted (no nonzero block of ``tau_A`` passes through them; ``options.all_maps``
    fits them too). :meth:`model` builds ``B + alpha tau_B``
    with the repair applied; :meth:`with_copies` gives ``tau_B`` under another copy rule without a new fit.
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
    layer_stages: dict = field(default_factory=dict)
    fitted: FittedTransfer | None = None
    copy_weights: dict = field(default_factory=dict, repr=False)
    repair: StatisticsRepair | None = field(default=None, repr=False)
    source_task_vector: TaskVector | None = field(default=None, repr=False)
    layer_map_object: LayerMap | None = field(default=None, repr=False)
    heads: NewHeads | None = field(default=None, repr=False)
    notes: tuple[str, ...] = ()
    skipped: frozenset[str] = frozenset()

    def with_copies(self, copies: str) -> TaskVector:
        """``tau_B`` with a source layer that feeds several target layers shared by rule ``copies`` (``sum``,
        ``split``, ``first``) instead of the fit's own, from the same fitted maps (no new calibration)."""
        if self.fitted is None or self.source_task_vector is None or self.layer_map_object is None:
            raise RuntimeError("this result keeps no fitted transfer to re-weight")
        raw = self.fitted.apply(self.source_task_vector)
        return _weighted(raw, self.layer_map_object.copy_weights(list(raw), copies))

    def model(self, target_base: nn.Module, alpha: float = 1.0, *, task_vector: TaskVector | None = None,
              repair: bool = True) -> nn.Module:
        """``B + alpha tau_B`` as a new model (``target_base`` untouched), its norm statistics re-pinned when the
        options asked for a repair (``repair=False``: not), and B's new head installed when the transfer found
        heads new in both bases (:mod:`ftlab.transfer.heads`; ``refit`` fits it on this model's features).
        ``task_vector`` replaces ``tau_B`` (e.g. :meth:`with_copies`)."""
        out = (task_vector if task_vector is not None else self.task_vector).apply(target_base, alpha)
        if repair and self.repair is not None:
            self.repair.apply_(out)
        if self.heads is not None:
            self.heads.apply_(out)
        return out

    def layers(self) -> list[dict]:
        """One record per target capture point: map shapes, CKA, alignment residuals, delta norms (:func:`layer_records`)."""
        return layer_records(self.pairs, self.fits, self.point_norms, self.skipped)

    def report(self) -> dict:
        """A JSON-ready summary (the CLI writes it)."""
        return {"method": self.method, "options": self.options, "layer_map": self.layer_map,
                "layer_stages": self.layer_stages, "n_batches": self.n_batches,
                "time_s": self.time_s, "timings": self.timings, "peak_rss_mb": self.peak_rss_mb,
                "source_norm": self.source_norms.get("total"),
                "target_norm": self.task_vector.norm(), "layers": self.layers(),
                "heads": self.heads.report() if self.heads is not None else None, "notes": list(self.notes),
                "solves": getattr(self.fitted, "n_solves", None), "skipped": sorted(self.skipped),
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
        pa, pb = source_spec.points[sp], target_spec.points[tp]
        if not pa.layer_kind.pairs_with(pb.layer_kind):
            raise ValueError(f"target layer {tp!r} ({pb.kind}) and source layer {sp!r} ({pa.kind}) are of different "
                             "kinds")
        pairs[tp] = sp
    return pairs


def layer_records(pairs: Mapping[str, str], fits: Mapping, point_norms: Mapping[str, dict],
                  skipped: frozenset[str] = frozenset()) -> list[dict]:
    """One record per paired target point (``pairs[target] = source``): the shapes, ranks, similarities, CKA and
    residuals of its fitted maps (``fits[target] = (fit_in, fit_out)``; keys ``in_*``/``out_*``, absent for a side
    without a fitted map), its delta norms (``point_norms``), and ``skipped`` True for a point whose maps were not
    fitted because no nonzero block of ``tau_A`` passes through it."""
    rows = []
    for tp, sp in pairs.items():
        rec: dict = {"target": tp, "source": sp}
        if tp in skipped:
            rec["skipped"] = True
        for side, fit in zip(("in", "out"), fits.get(tp, (None, None))):
            if isinstance(fit, MapFit):
                rec.update({f"{side}_map": list(fit.R.shape), f"{side}_source": fit.source, f"{side}_rows": fit.n_rows,
                            f"{side}_rank": fit.rank, f"{side}_dims": fit.dims,
                            f"{side}_completed": [list(c) for c in fit.completed],
                            f"{side}_precision": fit.precision, f"{side}_similarity": fit.similarity,
                            f"{side}_cka": fit.cka, f"{side}_cka_naive": fit.cka_naive,
                            f"{side}_cka_fit": fit.cka_fit,
                            f"{side}_residual_naive": fit.residual_naive, f"{side}_residual_fit": fit.residual})
        rec.update(point_norms.get(tp, {}))
        rows.append(rec)
    return rows


def _point_norms(spec, lmap: LayerMap, pairs: Mapping[str, str], tau_a: TaskVector, tau_b: TaskVector | None
                 ) -> dict:
    """Frobenius norms of the source and target deltas carried by each target point's maps (``source_norm``, and
    ``target_norm`` when ``tau_b`` is given)."""
    sq: dict[str, list[float]] = {tp: [0.0, 0.0] for tp in pairs}
    for pname, rules in spec.rules.items():
        src = lmap.source_name(pname)
        for r in rules:
            if not r.carries or r.point not in sq:
                continue
            if tau_b is not None:
                sq[r.point][1] += float(fused_block(tau_b[pname], r.part).double().pow(2).sum())
            if src is not None and src in tau_a:
                sq[r.point][0] += float(fused_block(tau_a[src], r.part).double().pow(2).sum())
    if tau_b is None:
        return {tp: {"source_norm": a ** 0.5} for tp, (a, _) in sq.items()}
    return {tp: {"source_norm": a ** 0.5, "target_norm": b ** 0.5} for tp, (a, b) in sq.items()}


def _zeroed_norm(spec: TransportSpec, lmap: LayerMap, tau_a: TaskVector) -> float:
    """Norm of the part of ``tau_A`` that B's zeroed parameters would receive (not carried)."""
    sq = 0.0
    for pname, rules in spec.rules.items():
        if rules and not any(r.carries for r in rules):
            src = lmap.source_name(pname)
            if src is not None and src in tau_a:
                sq += float(tau_a[src].double().pow(2).sum())
    return sq ** 0.5


def _resolve_method(method: str | Method) -> Method:
    if isinstance(method, str):
        return get_method(method)
    if not isinstance(method, Method):
        raise TypeError(f"method={method!r} is invalid: give a registered name or an object implementing "
                        "ftlab.transfer.methods.Method")
    return method


def _method_record(m: Method) -> dict:
    opts = m.options
    own = dataclasses.asdict(opts) if dataclasses.is_dataclass(opts) and not isinstance(opts, type) else {}
    return {"name": m.name, **own}


def _check_inputs(models: Mapping[str, nn.Module], loss: Callable | None, options: TransferOptions | None
                  ) -> TransferOptions:
    opts = options if options is not None else TransferOptions()
    if not isinstance(opts, TransferOptions):
        raise TypeError(f"options must be a TransferOptions, got {type(opts).__name__}")
    for name, mod in models.items():
        check_model(name, mod)  # a TypeError for another object, a ValueError for a model on the meta device
    if loss is not None and (not callable(loss) or len(inspect.signature(loss).parameters) < 2):
        raise TypeError("loss must be a function loss(model, batch) -> scalar tensor")
    return opts


SourceFinetuned = nn.Module | TaskVector | str | os.PathLike


def _source_task_vector(base: nn.Module, finetuned: SourceFinetuned) -> TaskVector:
    """``tau_A`` from a fine-tuned model, a task vector, or a PEFT LoRA adapter folder (read against ``base``)."""
    if isinstance(finetuned, nn.Module):
        tau_a = TaskVector.from_models(base, finetuned)
    elif isinstance(finetuned, TaskVector):
        state = {k: v for k, v in base.state_dict().items() if v.is_floating_point()}
        for k, v in finetuned.items():
            if k not in state or tuple(v.shape) != tuple(state[k].shape):
                why = "is not an entry of the source base" if k not in state else \
                    f"has shape {tuple(v.shape)}, the source base's {tuple(state[k].shape)}"
                raise ValueError(f"source_finetuned: task vector entry {k!r} {why}")
        tau_a = TaskVector({k: finetuned[k] if k in finetuned else torch.zeros_like(v.detach().cpu())
                            for k, v in state.items()})
    elif isinstance(finetuned, (str, os.PathLike)):
        from ftlab.transfer.lora import is_adapter_folder, read_lora

        if not is_adapter_folder(finetuned):
            raise ValueError(f"source_finetuned={str(finetuned)!r} is not a PEFT adapter folder (no adapter_config.json)")
        tau_a = read_lora(finetuned, base).task_vector
    else:
        raise TypeError(f"source_finetuned must be a torch.nn.Module, a TaskVector or a PEFT adapter folder, got "
                        f"{type(finetuned).__name__}")
    bad = [k for k, v in tau_a.items() if not torch.isfinite(v).all()]
    if bad:
        raise ValueError(f"the source task vector is not finite at {bad[0]!r}")
    return tau_a


def _calibration_data(m: Method, opts: TransferOptions, batches, source_batches, target_batches
                      ) -> CalibrationData | None:
    """The paired calibration batches, or None when neither the method nor the depth map reads data."""
    if all(b is None for b in (batches, source_batches, target_batches)):
        if reads_batches(m):
            raise ValueError(f"batches is None: method {m.name!r} needs calibration batches")
        if opts.depth_map == "cka":
            raise ValueError("depth_map='cka' needs calibration batches")
        return None
    return CalibrationData(batches, source_batches, target_batches)


def _layer_map(source: nn.Module, target: nn.Module, opts: TransferOptions, data: CalibrationData | None,
               loss: Callable | None) -> LayerMap:
    """The depth map; ``stage_relative`` probes block output shapes and ``cka`` block similarity on the first batches."""
    cka = shapes = None
    if data is not None and opts.depth_map in ("cka", "stage_relative"):
        stacks = paired_stacks(source, target, opts.name_map)
        head = data.head(opts.cka_batches if opts.depth_map == "cka" else 1)
        with stage("depth map"):
            if opts.depth_map == "cka":
                cka = layer_cka_scores(source, target, stacks, head, loss)
            elif head and stacks:
                shapes = block_output_shapes(source, target, stacks, head[0], loss)
    return build_layer_map(source, target, opts.depth_map, cka_scores=cka, block_shapes=shapes, stages=opts.stages,
                           name_map=opts.name_map)


def _problem(m: Method, source: nn.Module, target: nn.Module, lmap: LayerMap, opts: TransferOptions,
             tau_a: TaskVector) -> TransferProblem:
    """The transfer problem; with transport specs and point pairs for methods that fit maps, and (unless
    ``opts.all_maps``) the paired points that carry no nonzero block of ``tau_a`` marked to be skipped."""
    shapes = target_entries(target)
    vocab = vocab_maps(opts.vocab_map, source, target, lmap.source_name)
    if m.calibration != "maps":
        return TransferProblem(lmap, shapes, vocab_maps=vocab, zero_params=tuple(opts.zero_params))
    specs = [infer_spec(mod, zero_params=opts.zero_params, overrides=ov, norm_gain=opts.norm_gain)
             for mod, ov in ((source, opts.source_overrides), (target, opts.target_overrides))]
    pairs = pair_points(specs[0], specs[1], lmap)
    skip = frozenset() if opts.all_maps else frozenset(pairs) - carried_points(specs[1], lmap, tau_a)
    return TransferProblem(lmap, shapes, specs[0], specs[1], pairs, vocab_maps=vocab, skip=skip,
                           zero_params=tuple(opts.zero_params))


def _statistics(m: Method, problem: TransferProblem, models: tuple[nn.Module, nn.Module], data: CalibrationData | None,
                loss: Callable | None, opts: TransferOptions, bases: Bases) -> tuple[Statistics, int]:
    """What the method declares it reads (:attr:`~ftlab.transfer.methods.Method.calibration`), collected for it, and
    the number of batches read. ``models``: the models the statistics are taken on (the source base, or the
    fine-tuned source with ``source_stats="finetuned"``, and the target base); ``bases``: the two base models."""
    if m.calibration is None:
        return None, 0
    if m.calibration == "bases":
        return bases, 0
    assert data is not None
    if m.calibration == "maps":
        if m.needs_loss and loss is None:
            raise ValueError(f"method {m.name!r} fits maps on gradients and needs a loss(model, batch) (and labels or "
                             "another training signal); activation_only runs forward passes only")
        assert problem.pairs is not None and problem.target_spec is not None
        reqs = {tp: m.requirements(problem.target_spec.points[tp]) for tp in problem.pairs if tp not in problem.skip}
        return collect_map_statistics(problem, reqs, models[0], models[1], data, loss, opts,
                                      second=m.needs_second_moments)
    if loss is None:
        raise ValueError(f"method {m.name!r} needs calibration batches and a loss(model, batch)")
    grads = collect_target_grads(models[1], (bb for _, bb in data), loss, total=data.total)
    return grads, grads.n_batches


@dataclass(frozen=True)
class Fitting:
    """A transfer fitted but not yet carried out (:func:`fit_maps`): the method and options, the problem, the
    depth map, the fitted transfer, ``tau_A`` (heads that the transfer refits zeroed), the number of calibration
    batches, ``timings`` (``calibration_s``, ``fit_s``), the new heads and the notes of the automatic options.
    ``data``/``kept``: the calibration batches and the target batches kept for the statistics repair (None
    unless asked for); ``target``: the target base the statistics were taken on (a copy when it was also the
    source); ``t0``: when the fit started (``time.perf_counter``)."""

    method: Method
    options: TransferOptions
    problem: TransferProblem
    layer_map: LayerMap
    fitted: FittedTransfer
    tau_a: TaskVector
    n_batches: int
    timings: dict
    heads: NewHeads | None
    notes: tuple[str, ...]
    data: CalibrationData | None
    kept: list | None
    target: nn.Module
    t0: float

    @property
    def record(self) -> dict:
        """The run record of the options: ``{"transfer": ..., "method": ...}``."""
        return {"transfer": self.options.record(), "method": _method_record(self.method)}

    def source_norms(self) -> dict:
        """``total``: ``||tau_A||``; ``zeroed``: the norm of the part of it that B's zeroed parameters would receive."""
        out = {"total": self.tau_a.norm()}
        if self.problem.target_spec is not None:
            out["zeroed"] = _zeroed_norm(self.problem.target_spec, self.layer_map, self.tau_a)
        return out

    def point_norms(self, tau_b: TaskVector | None = None) -> dict:
        """Per paired target point, the norm of the source delta its maps carry (and of ``tau_b``'s, when given)."""
        pairs = dict(self.problem.pairs or {})
        if not pairs:
            return {}
        return _point_norms(self.problem.target_spec, self.layer_map, pairs, self.tau_a, tau_b)


def fit_maps(source_base: nn.Module, source_finetuned: SourceFinetuned, target_base: nn.Module,
             batches: Iterable | None = None, loss: Callable | None = None, *, method: str | Method = "bico",
             options: TransferOptions | None = None, source_batches: Iterable | None = None,
             target_batches: Iterable | None = None, repair: bool = True,
             head_batches: Iterable | None = None) -> Fitting:
    """The steps of :func:`fit_transfer` up to the method's fit (``prepare``), without carrying ``tau_A`` over: what
    :func:`ftlab.transfer.diagnose.diagnose` reads. ``repair=False``: the target batches are not kept for the
    statistics repair (nothing will be written). ``head_batches``: see :func:`fit_transfer`."""
    t0 = time.perf_counter()
    opts = _check_inputs({"source_base": source_base, "target_base": target_base}, loss, options)
    if target_base is source_base or target_base is source_finetuned:
        target_base = copy.deepcopy(target_base)  # the two models are captured separately
    tau_a = _source_task_vector(source_base, source_finetuned)
    m = _resolve_method(method)
    data = _calibration_data(m, opts, batches, source_batches, target_batches)
    opts, notes = automatic_options(opts, source_base, target_base)  # name map, relative biases the source lacks
    lmap = _layer_map(source_base, target_base, opts, data, loss)
    heads, installs = _new_heads(opts, source_base, target_base, source_finetuned, tau_a, lmap, data, head_batches)
    if heads is not None:
        tau_a = TaskVector({k: torch.zeros_like(v) if k in installs[0] else v for k, v in tau_a.items()})
    problem = _problem(m, source_base, target_base, lmap, _without_heads(opts, target_base, heads), tau_a)
    m.check(tau_a, problem)
    keep = repair and data is not None and opts.repair != "none" and reads_batches(m)
    kept = data.keep_targets() if keep and data is not None else None
    t_cal = time.perf_counter()
    source = source_base if opts.source_stats == "base" else \
        (source_finetuned if isinstance(source_finetuned, nn.Module) else tau_a.apply(source_base))
    with installed(source, installs[0]), installed(target_base, installs[1]):  # heads of the task in place
        stats, n_batches = _statistics(m, problem, (source, target_base), data, loss, opts,
                                       Bases(source_base, target_base))
    box: list[Statistics] = [stats]
    del stats  # not held here: the method may free each statistic once its solves are done
    t_fit = time.perf_counter()
    fitted = m.prepare(problem, box.pop())
    timings = {"calibration_s": t_fit - t_cal, "fit_s": time.perf_counter() - t_fit}
    return Fitting(m, opts, problem, lmap, fitted, tau_a, n_batches, timings, heads, tuple(notes), data, kept,
                   target_base, t0)


def fit_transfer(source_base: nn.Module, source_finetuned: SourceFinetuned, target_base: nn.Module,
                 batches: Iterable | None = None, loss: Callable | None = None, *, method: str | Method = "bico",
                 options: TransferOptions | None = None, source_batches: Iterable | None = None,
                 target_batches: Iterable | None = None, head_batches: Iterable | None = None) -> TransferResult:
    """Like :func:`transfer`, but takes one :class:`~ftlab.transfer.options.TransferOptions` and a method
    (a registered name or a configured :class:`~ftlab.transfer.methods.Method`, e.g.
    ``get_method("bico", center=True)``), and returns a :class:`TransferResult` with per-layer
    diagnostics and the full run record.

    Steps (:func:`fit_maps`): check the inputs; ``tau_A``; the depth map (probing the first calibration batch); the
    transfer problem (specs and point pairs; points through which no nonzero block of ``tau_A`` passes are skipped
    unless ``options.all_maps``); the method's statistics (for map methods: plan, stream,
    resolve; for methods reading both bases, the two base models); ``method.prepare`` (the solves) gives a fitted
    transfer; then its ``apply`` gives ``tau_B``. Every method goes through these steps: what it reads is what it declares
    (:attr:`~ftlab.transfer.methods.Method.calibration`), never something the caller prepares for it by its name.
    ``options.diagnostics=True`` also streams ``A^T A`` and ``B^T B`` so that CKA and alignment
    residuals are reported (more memory and time).

    ``head_batches``: labelled batches for B alone (its own preprocessing) on which a task head new in both bases
    is refitted (``options.heads="refit"``, :mod:`ftlab.transfer.heads`) instead of the calibration batches, e.g.
    the task's training set: each costs one forward pass of B, and none enters the maps' statistics.
    """
    f = fit_maps(source_base, source_finetuned, target_base, batches, loss, method=method, options=options,
                 source_batches=source_batches, target_batches=target_batches, head_batches=head_batches)
    t_apply = time.perf_counter()
    with stage("transport"):
        weights = f.layer_map.copy_weights(list(target_entries(f.target)), f.options.copies)
        tau_b = _weighted(f.fitted.apply(f.tau_a), weights)
    t_repair = time.perf_counter()
    repair = _repair(f.options, f.target, f.data, f.kept)
    timings = {**f.timings, "apply_s": t_repair - t_apply, "repair_s": time.perf_counter() - t_repair}
    return TransferResult(
        task_vector=tau_b, method=f.method.name, options=f.record, layer_map=f.layer_map.as_dict(),
        pairs=dict(f.problem.pairs or {}), fits=dict(f.fitted.fits), n_batches=f.n_batches,
        time_s=time.perf_counter() - f.t0, peak_rss_mb=peak_rss_mb(), source_norms=f.source_norms(), timings=timings,
        point_norms=f.point_norms(tau_b), layer_stages=f.layer_map.describe()["stages"], fitted=f.fitted,
        copy_weights={k: w for k, w in weights.items() if w != 1.0}, repair=repair, source_task_vector=f.tau_a,
        layer_map_object=f.layer_map, heads=f.heads, notes=f.notes, skipped=f.problem.skip)


def _new_heads(opts: TransferOptions, source: nn.Module, target: nn.Module, source_finetuned: SourceFinetuned,
               tau_a: TaskVector, lmap: LayerMap, data: CalibrationData | None, head_batches: Iterable | None = None
               ) -> tuple[NewHeads | None, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]:
    """Heads new in both bases (:mod:`ftlab.transfer.heads`), and the values installed while calibrating:
    A's trained head, B's head fitted on base B's rows. None (and nothing installed) with ``heads="delta"``, no
    new head, or no calibration data."""
    none: tuple[dict, dict] = ({}, {})
    if opts.heads == "delta" or not opts.new_heads:
        return None, none
    layers = find_new_heads(source, target, source_finetuned, opts.new_heads, lmap.source_name)
    if not layers[0]:
        return None, none
    if data is None:
        log.warning("new heads %s: no calibration batches to fit them, so they are transported as deltas",
                    layers[0])
        return None, none
    with stage("new heads"):
        heads, src_vals, tgt_vals = prepare_heads(opts.heads, source, target, tau_a, layers, data.head(2 ** 62),
                                                  list(head_batches) if head_batches is not None else None)
    return heads, (src_vals, tgt_vals)


def _without_heads(opts: TransferOptions, target: nn.Module, heads: NewHeads | None) -> TransferOptions:
    """``opts`` with the target head's parameters among the zeroed ones (the head is not transported)."""
    if heads is None:
        return opts
    return dataclasses.replace(opts, zero_params=opts.zero_params + tuple(head_params(target, heads.target)))


def _weighted(tau: TaskVector, weights: Mapping[str, float]) -> TaskVector:
    """``tau`` with each entry multiplied by its weight (entries of weight 1 are kept as they are)."""
    if all(weights.get(k, 1.0) == 1.0 for k in tau):
        return tau
    return TaskVector({k: v * weights.get(k, 1.0) if weights.get(k, 1.0) != 1.0 else v for k, v in tau.items()})


def _repair(opts: TransferOptions, target: nn.Module, data: CalibrationData | None, kept: list | None
            ) -> StatisticsRepair | None:
    """Base B's statistics for the repair, from the target batches the calibration pass kept (or read here)."""
    from ftlab.transfer.repair import running_norms

    if opts.repair == "none" or not running_norms(target):
        return None
    if data is None:
        log.warning("repair=%r: no calibration batches, so B's norm statistics are left as they are", opts.repair)
        return None
    batches = kept if kept else [bb for _, bb in data]
    with stage("statistics repair"):
        return fit_repair(target, batches, mode=opts.repair)


def target_entries(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Shapes of the target entries a transfer may change: parameters and the running statistics of norm layers."""
    out = {k: tuple(p.shape) for k, p in model.named_parameters()}
    for name, mod in model.named_modules():
        kind = kind_for_module(mod)
        if kind is not None:
            out.update(kind.entries(name, mod))
    return out


def split_options(method: str, options: Mapping) -> tuple[TransferOptions, Method]:
    """Split flat keyword options into :class:`TransferOptions` fields and ``method``'s own options.

    An option that belongs to neither raises ``ValueError`` naming it and the valid choices.
    """
    names = set(TransferOptions.field_names())
    general = {k: v for k, v in options.items() if k in names}
    own = {k: v for k, v in options.items() if k not in names}
    info = method_info(method)
    own_names = {f.name for f in dataclasses.fields(info.options_type)}
    unknown = [k for k in own if k not in own_names]
    if unknown:
        raise ValueError(f"invalid option {unknown[0]!r} for method {method!r}: valid options are "
                         f"{', '.join(sorted(own_names | names))}")
    return TransferOptions(**general), get_method(method, **own)


def transfer(source_base: nn.Module, source_finetuned: SourceFinetuned, target_base: nn.Module,
             batches: Iterable | None = None, loss: Callable | None = None, *, method: str = "bico",
             source_batches: Iterable | None = None, target_batches: Iterable | None = None,
             head_batches: Iterable | None = None, **options) -> TaskVector:
    """The target's task vector ``tau_B``, transported from ``tau_A = source_finetuned - source_base``.

    Parameters
    ----------
    source_base, source_finetuned, target_base:
        Models (not modified). ``source_finetuned`` may also be the source task vector itself (a
        :class:`TaskVector`) or a PEFT LoRA adapter folder for ``source_base`` (:mod:`ftlab.transfer.lora`).
        A fine-tuned model must have ``source_base``'s
        names and shapes.
    batches:
        Iterable of calibration batches, each fed to both base models (``loss(model, batch)``).
        Give ``source_batches``/``target_batches`` instead when A and B need different
        preprocessing (zipped pairwise; the same samples, in the same order).
    head_batches:
        Labelled batches for B alone on which a task head new in both bases is refitted (default: the
        calibration batches); see :func:`fit_transfer`.
    loss:
        ``loss(model, batch) -> scalar tensor``; gradients are taken at the *base* models.
    method:
        A short name from :func:`~ftlab.transfer.list_methods`: ``bico`` (default), its ablations
        ``bico_input_only`` / ``bico_output_only``, ``activation_only``, ``gradient_only``,
        ``naive``, ``identity``, ``gradfix``, ``transfusion``.
    options:
        Any field of :class:`~ftlab.transfer.options.TransferOptions` (``depth_map``, ``seq_align``,
        ``padding_mask``, ``zero_params``, ``diagnostics``, ``batch_dtype``, ``source_stats``,
        ``loss_reduction``, ...) and any option of the chosen method (e.g. ``center``, ``whiten_p``,
        ``in_map``/``out_map`` for the Procrustes methods; ``naive_mode``; ``vote``/``mode`` for
        gradfix; see :func:`~ftlab.transfer.list_methods`). An unknown option is an error naming it.

    Returns
    -------
    TaskVector
        Keyed by the target's parameter names; apply with ``tau_B.apply(target_base, alpha)``.

    Examples
    --------
    >>> tau_b = transfer(vit_b16, vit_b16_ft, vit_b16_plus, loader, clip_ce_loss)   # doctest: +SKIP
    >>> model = tau_b.apply(vit_b16_plus, alpha=1.0)
    """
    opts, m = split_options(method, options)
    return fit_transfer(source_base, source_finetuned, target_base, batches, loss, method=m, options=opts,
                        source_batches=source_batches, target_batches=target_batches,
                        head_batches=head_batches).task_vector

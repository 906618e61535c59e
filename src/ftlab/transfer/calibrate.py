"""The calibration pass: stream the planned statistics over the batches, then resolve every request.

Steps (see :mod:`ftlab.transfer.plan` for the first):

1. **plan** -- :func:`ftlab.transfer.plan.plan_calibration` (pure): requests, derived requests;
2. **stream** -- :func:`stream`: one forward(-backward) of both frozen base models per calibration
   batch (or per piece of one, when its captures would exceed ``TransferOptions.capture_budget``);
   captured tensors become rows that are added to float64
   :class:`~ftlab.core.stats.CrossMoments` and dropped, so memory does not grow with the calibration
   size. On the first batch the requests whose rows are the same tensors are given one accumulator
   (:func:`ftlab.transfer.plan.share_rows`) and the accumulators' size is checked against the
   memory available before they are allocated;
3. **resolve** -- :func:`resolve`: every request answered by its accumulator, a shared one, or an
   exact derivation (:class:`~ftlab.transfer.align.AffineMoments`).

Models run in eval mode (or train mode with ``TransferOptions.train_mode``); gradient statistics
switch ``requires_grad`` on; every module's flag is restored afterwards, also on error. A pass with
activations only runs forward passes under ``torch.no_grad()`` and needs no loss (``loss`` may still
be given to run the model; without it :func:`~ftlab.transfer.batches.default_forward` runs it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ftlab.core.hooks import Captured, capture, param_uses
from ftlab.core.modes import module_mode, requires_grad
from ftlab.core.progress import progress
from ftlab.core.stats import CrossMoments, RowMoments, cross_moments_nbytes
from ftlab.core.usercode import UserCodeError, blame
from ftlab.core.validate import available_memory, trim_memory
from ftlab.transfer.align import AffineMoments, align_tokens
from ftlab.transfer.batches import CalibrationData, batch_slice, default_forward, padding_mask, samples_in
from ftlab.transfer.factored import FACTORED_MIN_WIDTH
from ftlab.transfer.kinds import AffineMap, Point, token_rows
from ftlab.transfer.options import TransferOptions
from ftlab.transfer.plan import (
    CalibrationPlan,
    Key,
    Request,
    aliased,
    collected,
    plan_calibration,
    share_rows,
)
from ftlab.transfer.problem import TransferProblem

__all__ = ["AffineMap", "Streamed", "TargetGradients", "affine_maps", "block_output_shapes", "calibration_mode",
           "collect_map_statistics", "collect_target_grads", "layer_cka_scores", "resolve", "stream"]

@contextlib.contextmanager
def calibration_mode(model: nn.Module, *, train: bool = False, grad: bool = True):
    """Eval mode (or train mode) and, with ``grad``, ``requires_grad=True`` inside; every flag restored on exit."""
    with module_mode(model, train=train), (requires_grad(model) if grad else contextlib.nullcontext()):
        yield model


# --- affine points: output activations derived from input activations -----------------------------------


def affine_maps(source: nn.Module, target: nn.Module, pairs: Mapping[str, str], source_points: Mapping[str, Point],
                target_points: Mapping[str, Point]) -> dict[str, tuple[AffineMap, AffineMap]]:
    """``{target point: (source map, target map)}`` for the pairs whose output is affine in their input in both models.

    Each point's kind says whether it is affine (:meth:`~ftlab.transfer.kinds.LayerKind.affine`). Call with
    the models in the mode they calibrate in (a BatchNorm is affine in eval mode only).
    """
    out = {}
    with torch.no_grad():
        for tp, sp in pairs.items():
            pa, pb = source_points[sp], target_points[tp]
            mb = pb.layer_kind.affine(target, pb)
            ma = pa.layer_kind.affine(source, pa) if mb is not None else None
            if ma is not None and mb is not None:
                out[tp] = (ma, mb)
    return out


# --- stream -------------------------------------------------------------------------------------------


def _module_names(model: nn.Module, points: Iterable[Point]) -> tuple[list[str], list[str]]:
    """Module names to hook and bare parameters to watch, for capture points ``points`` (where their kinds say)."""
    mods = dict(model.named_modules())
    params = dict(model.named_parameters())
    out: list[str] = []
    bare: list[str] = []
    for p in points:
        name, is_param = p.layer_kind.hooked(p)
        if (name in params) if is_param else (name in mods):
            (bare if is_param else out).append(name)
        else:
            raise RuntimeError(f"capture point {p.name!r} is not a {'parameter' if is_param else 'module'} of the model")
    return list(dict.fromkeys(out)), list(dict.fromkeys(bare))


def _run(model: nn.Module, cap: Captured, batch, loss: Callable | None, who: str, k: int, *, backward: bool,
         input_grads: bool) -> None:
    """One forward (and backward) pass; an error raised by the user's model, data or loss names the model and batch
    (:class:`~ftlab.core.usercode.UserCodeError`)."""
    cap.clear()
    where = f"{who} model, calibration batch {k}"
    if not backward:
        with torch.no_grad(), blame(where):
            (loss if loss is not None else default_forward)(model, batch)
        return
    if loss is None:
        raise ValueError("gradient statistics need a loss(model, batch)")
    with torch.enable_grad():
        with blame(where):
            value = loss(model, batch)
        try:
            with blame(where):
                cap.backward(value, input_grads=input_grads)
        except UserCodeError:
            raise  # names the model and batch already
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


@dataclass
class Streamed:
    """What :func:`stream` collected: ``owners[key]`` (see :func:`~ftlab.transfer.plan.share_rows`), one
    accumulator per owner that streams rows, and the number of batches."""

    owners: dict[Key, Key]
    accumulators: dict[Key, CrossMoments | RowMoments]
    n_batches: int


def _tensors(r: Request, ca: Captured, cb: Captured) -> tuple[list, list]:
    la, lb = getattr(ca, r.captured).get(r.sp, []), getattr(cb, r.captured).get(r.tp, [])
    if len(la) != len(lb):
        raise ValueError(f"point {r.sp!r} ran {len(la)} times in the source but {r.tp!r} ran {len(lb)} times in the "
                         "target: the architectures do not correspond")
    return la, lb


def _laid_out(x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, bool]:
    """``x`` cast to ``dtype`` and made contiguous in one copy where it is a strided view (else as it is), and whether
    the result is a fresh copy (which may then be scaled in place)."""
    if dtype is None or x.is_contiguous():
        return x, False
    return x.to(dtype, memory_format=torch.contiguous_format), True


class _Pass:
    """The state of one streaming pass: captures of both models, owners and accumulators (set on batch 0)."""

    def __init__(self, plan: CalibrationPlan, ca: Captured, cb: Captured, opts: TransferOptions):
        self.plan, self.ca, self.cb, self.opts = plan, ca, cb, opts
        self.by_key = plan.by_key
        self.owners: dict[Key, Key] = {}
        self.accumulators: dict[Key, CrossMoments | RowMoments] = {}
        self.check_keys: list[Key] = []
        self.caps: dict[Key, int] = {}

    def signatures(self, keys: Iterable[Key]) -> dict[Key, tuple]:
        out = {}
        for key in keys:
            la, lb = _tensors(self.by_key[key], self.ca, self.cb)
            if la:
                out[key] = self.by_key[key].signature(tuple(map(id, la)), tuple(map(id, lb)))
        return out

    def first_batch(self, bare: tuple[list[str], list[str]], batch_a, batch_b, scale: float) -> None:
        """Decide shared rows, check bare parameters were used, choose each accumulator's storage (rows or sums),
        check memory, then add the first batch (or its first piece). ``scale``: the rows expected in all, per row of
        this batch."""
        for who, names, cap in (("source", bare[0], self.ca), ("target", bare[1], self.cb)):
            unused = [p for p in names if param_uses(cap, p) == 0]
            if unused:
                raise ValueError(f"parameter {unused[0]!r} of the {who} model belongs to no layer ftlab knows and was not "
                                 "used as a projection x @ P; give a rule (source_overrides/target_overrides) or zero it "
                                 "(zero_params)")
        self.owners = share_rows(self.plan, self.signatures(self.by_key))
        keys = collected(self.plan, self.owners)
        expected = {}
        for k in keys:  # rows are counted one request at a time (holding them all would double the batch's memory)
            got = self.rows(self.by_key[k], batch_a, batch_b)
            expected[k] = int((0 if got is None else got[0].shape[0]) * scale)
            del got
        self.caps = self._row_caps(keys)
        kept = {k for k in keys if expected[k] < self.caps[k]}
        derived = {k: (self.by_key[k].dims, self.owners.get(base, base)) for k, base in self.plan.derived.items()}
        _check_memory({k: self.by_key[k].dims for k in keys}, derived, kept=kept, rows=expected,
                      second=self.plan.second, batch_dtype=self.opts.torch_batch_dtype, limit=self.opts.memory_limit)
        self.accumulators = {k: self._new(self.by_key[k].dims, k in kept) for k in keys}
        self.check_keys = aliased(self.owners)
        self.add(batch_a, batch_b, 0)

    def _row_caps(self, keys: list[Key]) -> dict[Key, int]:
        """Per accumulator, the number of rows below which it keeps them: the width of the widest map that reads
        them (its own, or that of an output derived from them) when that is at least 256 wide, else 0."""
        def wide(dims: tuple[int, int]) -> int:
            return min(dims) if min(dims) >= FACTORED_MIN_WIDTH else 0

        caps = {k: wide(self.by_key[k].dims) if self.opts.statistics == "auto" else 0 for k in keys}
        if self.opts.statistics == "auto":
            for key, base in self.plan.derived.items():
                own = self.owners.get(base, base)
                if own in caps:
                    caps[own] = max(caps[own], wide(self.by_key[key].dims))
        return caps

    def _new(self, dims: tuple[int, int], rows: bool) -> CrossMoments | RowMoments:
        if rows:
            return RowMoments(*dims, second=self.plan.second)
        return CrossMoments(*dims, second=self.plan.second, batch_dtype=self.opts.torch_batch_dtype)

    def _update(self, key: Key, got: tuple[torch.Tensor, torch.Tensor], k: int) -> None:
        acc = self.accumulators[key]
        r = self.by_key[key]
        if isinstance(acc, RowMoments) and acc.n + got[0].shape[0] >= self.caps[key]:  # more rows than width: sums
            acc = self.accumulators[key] = acc.to_dense(self.opts.torch_batch_dtype)
        acc.update(*got)
        # a NaN/inf row makes the running column sum non-finite: an O(width) check per batch
        for who, mom, name in (("source", acc.a, r.sp), ("target", acc.b, r.tp)):
            if not torch.isfinite(mom.sum).all():
                what = "gradient" if r.is_gradient else "activation"
                raise ValueError(f"non-finite {what} at {name!r} of the {who} model (calibration batch {k})")

    def check_aliases(self) -> None:
        """Rows shared on the first batch must stay shared (a graph that changes per batch is refused)."""
        sig = self.signatures(self.check_keys)
        for key in self.check_keys:
            own = self.owners[key]
            if own != key and own in sig and sig.get(key) != sig[own]:
                r = self.by_key[key]
                raise ValueError(f"the rows of {r.tp!r} ({r.side}, {r.stat}) changed their source between calibration "
                                 "batches (a model whose graph varies per batch is not supported)")

    def rows(self, r: Request, batch_a, batch_b, dtype: torch.dtype | None = None
             ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Row-aligned ``(N, d_A)``, ``(N, d_B)`` of one request on the current batch (None: no rows).

        ``dtype``: the dtype the rows' products will be formed in. A strided view of the captured tensor (the
        ``(B, positions, C)`` rows of a convolution) is then cast and laid out in one copy, instead of a copy
        to lay it out and another to cast it (the values are the same: the cast is exact)."""
        o = self.opts
        masks = (padding_mask(batch_a, o.padding_mask), padding_mask(batch_b, o.padding_mask))
        n_samples = samples_in(batch_a)
        tok = r.pb.tokens and r.pa.tokens
        rows_a, rows_b = [], []
        for xa, xb in zip(*_tensors(r, self.ca, self.cb)):
            if xa is None or xb is None:  # no input gradient (the input is data)
                continue
            A, ga = r.pa.layer_kind.rows(xa, r.pa, r.side, seq_first=o.seq_first and not self.ca.meta.get(r.sp, {}).get(
                "batch_first", False))
            B, gb = r.pb.layer_kind.rows(xb, r.pb, r.side, seq_first=o.seq_first and not self.cb.meta.get(r.tp, {}).get(
                "batch_first", False))
            A, own_a = _laid_out(A, dtype)
            B, own_b = _laid_out(B, dtype)
            if o.loss_reduction == "mean" and r.is_gradient:
                b = n_samples if n_samples is not None else A.shape[0]
                A = A.mul_(b) if own_a else A * b
                B = B.mul_(b) if own_b else B * b
            ra, rb = align_tokens(A, B, o.seq_align, mask_a=masks[0] if tok else None, mask_b=masks[1] if tok else None,
                                  grid_a=ga, grid_b=gb, n_prefix=o.n_prefix)
            rows_a.append(ra)
            rows_b.append(rb)
        if not rows_a:
            return None
        if len(rows_a) == 1:
            return rows_a[0], rows_b[0]
        return torch.cat(rows_a), torch.cat(rows_b)

    def add(self, batch_a, batch_b, k: int) -> None:
        for key in list(self.accumulators):
            acc = self.accumulators[key]
            dtype = acc.product_dtype if isinstance(acc, CrossMoments) else None
            got = self.rows(self.by_key[key], batch_a, batch_b, dtype)
            if got is not None:
                self._update(key, got, k)


#: Samples in the first piece of a batch that runs in pieces: the bytes its captures take size the other pieces.
_PROBE = 2


def _captured_bytes(*caps: Captured) -> int:
    """Bytes of the distinct tensor storages the captures hold (inputs, outputs and their gradients)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for cap in caps for t in cap.tensors()}
    return sum(storages.values())


def _per_sample(samples: int, *caps: Captured) -> bool:
    """Whether every tensor the captures hold has ``samples`` as its first axis (rows that belong to samples)."""
    return all(t.ndim and t.shape[0] == samples for cap in caps for t in cap.tensors())


class _Pieces:
    """The pieces of samples each calibration batch runs in, so that one pass's captures stay near ``budget`` bytes
    (``TransferOptions.capture_budget``; None: every batch whole).

    The first piece of the first batch that can be split holds :data:`_PROBE` samples; the bytes per sample its
    captures took (the largest seen so far, updated by :meth:`measured`) size the rest: at most ``budget`` bytes per
    piece, the samples left spread evenly over as few pieces as that allows, at least one sample each."""

    def __init__(self, budget: float | None):
        self.budget = budget
        self.per_sample: float | None = None

    def spans(self, n: int | None) -> Iterator[tuple[int, int] | None]:
        """``(start, stop)`` of each piece of a batch of ``n`` samples; one ``None`` for the whole batch (no budget,
        or a batch that cannot be split)."""
        if n is None or self.budget is None:
            yield None
            return
        start = 0
        while start < n:
            left = n - start
            if self.per_sample is None:
                m = min(left, _PROBE)
            elif self.per_sample <= 0:
                m = left
            else:
                most = max(1, int(self.budget // self.per_sample))
                m = -(-left // -(-left // most))  # ceil(left / pieces), pieces = ceil(left / most)
            yield start, start + m
            start += m

    def measured(self, nbytes: int, samples: int) -> None:
        per = nbytes / max(1, samples)
        self.per_sample = per if self.per_sample is None else max(self.per_sample, per)


def _splittable(batch_a, batch_b, options: TransferOptions) -> int | None:
    """The samples of a batch pair that may run in pieces: both sides hold the same count along their first axis,
    the models are in eval mode (train-mode BatchNorm couples a batch's samples), and tensors are batch-first
    (``seq_first``: the first axis of an input may be its sequence). None otherwise."""
    if options.train_mode or options.seq_first:
        return None
    n = samples_in(batch_a)
    return n if n is not None and n > 0 and samples_in(batch_b) == n else None


def stream(plan: CalibrationPlan, source: nn.Module, target: nn.Module, data: Iterable, loss: Callable | None,
           options: TransferOptions, quiet: tuple[Iterable[Point], Iterable[Point]] = ((), ())) -> Streamed:
    """Run both models over ``data`` (pairs ``(batch_A, batch_B)``) and accumulate the planned statistics.

    ``quiet``: points of the source and the target that are not collected but whose modules compute as if they
    were captured (:func:`ftlab.core.hooks.capture`), so that the statistics equal those of a pass that collects
    them too (a skipped ``nn.MultiheadAttention`` still runs the decomposed forward).

    With ``options.loss_reduction="mean"`` the gradient rows of a batch of ``b`` samples are multiplied
    by ``b``: a mean loss scales each sample's gradient by ``1/b``, which would otherwise let a short
    last batch dominate the gradient moments. ``options.memory_limit`` (bytes; default: the memory
    available) bounds the accumulators' size. A batch whose captured tensors would take more than
    ``options.capture_budget`` bytes runs in pieces of fewer samples (:class:`_Pieces`): the statistics are sums over
    rows, so this changes them only by rounding when each sample's gradient is its own (a mean or a sum of
    per-sample losses, eval mode).
    """
    if plan.backward and loss is None:
        raise ValueError("gradient statistics need a loss(model, batch)")
    points_a = {r.sp: r.pa for r in plan.requests}
    points_b = {r.tp: r.pb for r in plan.requests}
    hooks_a, hooks_b = _module_names(source, points_a.values()), _module_names(target, points_b.values())
    quiet_a, quiet_b = _module_names(source, quiet[0])[0], _module_names(target, quiet[1])[0]
    total = data.total if isinstance(data, CalibrationData) else None
    train, grad = options.train_mode, plan.backward
    n = 0
    with calibration_mode(source, train=train, grad=grad), calibration_mode(target, train=train, grad=grad), \
            capture(source, hooks_a[0], params=hooks_a[1], quiet=quiet_a) as ca, \
            capture(target, hooks_b[0], params=hooks_b[1], quiet=quiet_b) as cb:
        state = _Pass(plan, ca, cb, options)
        pieces = _Pieces(options.capture_budget)

        def passes(pa, pb, k: int) -> None:
            _run(source, ca, pa, loss, "source", k, backward=grad, input_grads=plan.input_grads)
            _run(target, cb, pb, loss, "target", k, backward=grad, input_grads=plan.input_grads)

        for k, (ba, bb) in enumerate(progress(data, desc="calibration", total=total)):
            size = _splittable(ba, bb, options)
            for span in pieces.spans(size):
                pa, pb, share = ba, bb, 1.0
                if span is not None and size is not None:
                    pa, pb = batch_slice(ba, *span, size), batch_slice(bb, *span, size)
                    share = size / (span[1] - span[0])
                passes(pa, pb, k)
                if span is not None and pieces.per_sample is None and span[1] - span[0] < _PROBE:
                    span = None  # a batch of 1 sample cannot tell per-sample rows from per-pass ones: no probe yet
                elif span is not None and pieces.per_sample is None and not _per_sample(span[1] - span[0], ca, cb):
                    # a captured tensor is not one per sample (a class token's or a position table's rows are one
                    # per pass, their gradients summed over it): pieces would change the statistics, so this
                    # probe is dropped and every batch runs whole
                    pieces.budget, span, pa, pb, share = None, None, ba, bb, 1.0
                    passes(pa, pb, k)
                if span is not None:
                    pieces.measured(_captured_bytes(ca, cb), span[1] - span[0])
                if k == 0 and (span is None or span[0] == 0):
                    state.first_batch((hooks_a[1], hooks_b[1]), pa, pb, share * (total or 1))
                else:
                    state.check_aliases()
                    state.add(pa, pb, k)
                ca.clear()
                cb.clear()
                if span is None:
                    break  # the batch ran whole
            trim_memory()  # the batch's temporaries are freed: give their memory back (bounds the peak)
            n += 1
    if n == 0:
        raise ValueError("the calibration data yielded no batches")
    return Streamed(state.owners, state.accumulators, n)


# --- resolve ------------------------------------------------------------------------------------------


def resolve(plan: CalibrationPlan, streamed: Streamed, affine: Mapping[str, tuple[AffineMap, AffineMap]]) -> dict:
    """``{(target point, side, statistic): statistics}`` for every request handed to the method.

    A request is answered by its own accumulator, by the one it shares rows with, or, when derived,
    by an :class:`~ftlab.transfer.align.AffineMoments` over its base (``affine[target point]`` gives
    the two models' maps).
    """
    by_key = plan.by_key
    out: dict[Key, Any] = {}

    def get(key: Key):
        if key not in out:
            own = streamed.owners.get(key, key)
            if own != key:
                out[key] = get(own)
            elif key in plan.derived:
                out[key] = AffineMoments(get(plan.derived[key]), *affine[key[0]])
            else:
                acc = streamed.accumulators.get(key)
                if acc is None:  # planned but never reached (no rows on any batch)
                    acc = CrossMoments(*by_key[key].dims, second=plan.second)
                out[key] = acc
        return out[key]

    return {key: get(key) for key in plan.answered()}


def collect_map_statistics(problem: TransferProblem, requirements: Mapping[str, Mapping[str, tuple[str, ...]]],
                           source: nn.Module, target: nn.Module, data: Iterable, loss: Callable | None,
                           options: TransferOptions, *, second: bool = False) -> tuple[dict, int]:
    """plan -> stream -> resolve for the point pairs of ``problem``; ``(statistics, number of batches)``.

    ``requirements[target point]``: what to collect on each side (a method's
    :meth:`~ftlab.transfer.methods.Method.requirements`); pairs without requirements (the points a fit skips:
    :attr:`~ftlab.transfer.problem.TransferProblem.skip`) are neither hooked nor accumulated. ``second``: also
    second moments (on anyway with ``options.diagnostics``).
    """
    if problem.pairs is None or problem.source_spec is None or problem.target_spec is None:
        raise RuntimeError("collect_map_statistics needs a problem with transport specs and point pairs")
    pts_a, pts_b = problem.source_spec.points, problem.target_spec.points
    pairs = {tp: sp for tp, sp in problem.pairs.items() if tp in requirements}
    affine = {} if options.train_mode else affine_maps(source, target, pairs, pts_a, pts_b)
    plan = plan_calibration(pairs, pts_a, pts_b, requirements, affine=affine, second=second or options.diagnostics)
    skipped = {tp: sp for tp, sp in problem.pairs.items() if tp not in pairs}
    quiet = ([pts_a[sp] for sp in skipped.values()], [pts_b[tp] for tp in skipped])
    streamed = stream(plan, source, target, data, loss, options, quiet)
    return resolve(plan, streamed, affine), streamed.n_batches


def _check_memory(collected: Mapping[Key, tuple[int, int]], derived: Mapping[Key, tuple[tuple[int, int], Key]], *,
                  kept: set, rows: Mapping[Key, int], second: bool, batch_dtype: torch.dtype | None,
                  limit: float | None) -> None:
    """Refuse statistics that cannot fit: accumulators plus the largest solve's workspace vs. the memory available.

    Kept rows count ``8 (d_A + d_B)`` bytes per expected row (read in float64); sums count their
    float64 matrices; a solve needs about six dense ``d_A x d_B`` float64 matrices, or ten copies of the
    rows for a factored one.
    """
    need, work = 0.0, 0.0
    for key, (a, b) in collected.items():
        if key in kept:
            need += 8.0 * (a + b) * rows[key]
            work = max(work, 10 * 8.0 * (a + b) * rows[key])
        else:
            need += cross_moments_nbytes(a, b, second=second, batch_dtype=batch_dtype)
            work = max(work, 6 * 8.0 * a * b)
    for (a, b), base in derived.values():  # derived from kept rows: mapped rows; else a dense d_A x d_B matrix
        work = max(work, 10 * 8.0 * (a + b) * rows[base] if base in kept else 6 * 8.0 * a * b)
    need += work
    avail = available_memory() if limit is None else float(limit)
    if need > avail:
        dense = [d for k, d in collected.items() if k not in kept]
        big = max(dense, key=lambda d: d[0] * d[1]) if dense else (0, 0)
        raise ValueError(f"the transfer statistics need about {need / 2**30:.2f} GB ({len(collected)} statistics, "
                         f"{len(kept)} of them as rows; the largest float64 sums {big[0]} x {big[1]}"
                         f"{', with second moments' if second else ''}) but only {avail / 2**30:.2f} GB of memory is "
                         "available; transfer fewer layers (zero_params), switch off diagnostics, or use a machine with "
                         "more memory")


# --- other calibration passes ------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetGradients:
    """Per-parameter sums over calibration batches of the target's loss gradients and of their signs (GradFix)."""

    grad_sum: Mapping[str, torch.Tensor]
    sign_votes: Mapping[str, torch.Tensor]
    n_batches: int


def collect_target_grads(target: nn.Module, data: Iterable, loss: Callable, *, total: int | None = None
                         ) -> TargetGradients:
    """Sum of per-batch parameter gradients and of their signs (for GradFix); ``.grad`` is not touched.

    ``data`` yields target batches.
    """
    names, params = zip(*target.named_parameters())
    grad_sum = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in zip(names, params)}
    votes = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in zip(names, params)}
    n = 0
    with calibration_mode(target), torch.enable_grad():
        for k, batch in enumerate(progress(data, desc="target gradients", total=total)):
            with blame(f"target model, calibration batch {k}"):
                value = loss(target, batch)
            if not isinstance(value, torch.Tensor) or value.numel() != 1 or not torch.isfinite(value.detach()).all():
                raise ValueError(f"target model, calibration batch {k}: loss is not a finite scalar tensor")
            grads = torch.autograd.grad(value, params, allow_unused=True)
            for name, g in zip(names, grads):
                if g is None:
                    continue
                if not torch.isfinite(g).all():
                    raise ValueError(f"non-finite gradient for {name!r} of the target model (calibration batch {k})")
                grad_sum[name] += g.double()
                votes[name] += torch.sign(-g).double()
            n += 1
    if n == 0:
        raise ValueError("the calibration data yielded no batches")
    return TargetGradients(grad_sum, votes, n)


def _block_names(model: nn.Module, stacks: Mapping[str, Any]) -> dict[str, list[str]]:
    return {s: [st.block_name(i) for i in range(st.depth)] for s, st in stacks.items()}


def block_output_shapes(source: nn.Module, target: nn.Module, stacks: Mapping[str, tuple[Any, Any]], pair,
                        loss: Callable | None) -> dict[str, tuple[list[tuple], list[tuple]]]:
    """Output shape (without the batch axis) of every block of each stack, from one forward pass of each model.

    ``stacks[target path] = (source Stack, target Stack)`` (:class:`~ftlab.transfer.layer_map.Stack`);
    ``pair`` is one ``(batch_A, batch_B)``.
    """
    run = loss if loss is not None else default_forward
    shapes = []
    for side, (model, batch) in enumerate(((source, pair[0]), (target, pair[1]))):
        names = {p: [st[side].block_name(i) for i in range(st[side].depth)] for p, st in stacks.items()}
        with calibration_mode(model, grad=False), torch.no_grad(), \
                capture(model, [n for ns in names.values() for n in ns], inputs=False) as cap, \
                blame(f"{('source', 'target')[side]} model, first calibration batch"):
            run(model, batch)
            shapes.append({p: [tuple(cap.outputs[n][0].shape[1:]) if cap.outputs.get(n) else () for n in ns]
                           for p, ns in names.items()})
    return {p: (shapes[0][p], shapes[1][p]) for p in stacks}


def layer_cka_scores(source: nn.Module, target: nn.Module, stacks: Mapping[str, tuple[Any, Any]], head_pairs: list,
                     loss: Callable | None) -> dict[str, np.ndarray]:
    """``(L_B, L_A)`` linear-CKA matrices between the block outputs of each stack (mean over tokens).

    ``stacks`` as in :func:`block_output_shapes`. Forward passes only (``loss`` runs each model), over
    the ``(batch_A, batch_B)`` pairs in ``head_pairs``.
    """
    from ftlab.core.geometry import linear_cka

    names_a = {p: [st[0].block_name(i) for i in range(st[0].depth)] for p, st in stacks.items()}
    names_b = {p: [st[1].block_name(i) for i in range(st[1].depth)] for p, st in stacks.items()}
    feats: list[dict[str, list[torch.Tensor]]] = [{}, {}]
    run = loss if loss is not None else default_forward
    with calibration_mode(source, grad=False), calibration_mode(target, grad=False), torch.no_grad(), \
            capture(source, [n for ns in names_a.values() for n in ns], inputs=False) as ca, \
            capture(target, [n for ns in names_b.values() for n in ns], inputs=False) as cb:
        for ba, bb in head_pairs:
            for who, model, cap, batch, f in (("source", source, ca, ba, feats[0]), ("target", target, cb, bb, feats[1])):
                cap.clear()
                with blame(f"{who} model, calibration batch used for the depth map"):
                    run(model, batch)
                for n, ts in cap.outputs.items():
                    f.setdefault(n, []).append(token_rows(ts[0])[0].mean(1).double())
    out = {}
    for p in stacks:
        M = np.zeros((len(names_b[p]), len(names_a[p])))
        for j, nb in enumerate(names_b[p]):
            Y = torch.cat(feats[1][nb]).numpy()
            for i, na in enumerate(names_a[p]):
                value = linear_cka(torch.cat(feats[0][na]).numpy(), Y)
                M[j, i] = 0.0 if np.isnan(value) else value  # a constant block output aligns with nothing
        out[p] = M
    return out

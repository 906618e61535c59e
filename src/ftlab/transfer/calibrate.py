"""The calibration pass: one forward-backward of both frozen base models per calibration batch.

For every paired capture point (target point ``tp`` <- source point ``sp``) the needed row
statistics stream into float64 :class:`~ftlab.core.stats.CrossMoments`; captured tensors are dropped
after each batch, so memory does not grow with the calibration size. Models run in eval mode
with ``requires_grad`` switched on; both are restored afterwards, also on error.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import numpy as np
import torch
from torch import nn

from ftlab.core.hooks import Captured, capture
from ftlab.core.progress import progress
from ftlab.core.stats import CrossMoments
from ftlab.transfer.align import SeqAlign, align_tokens, to_tokens
from ftlab.transfer.spec import TransportSpec

__all__ = ["calibration_mode", "collect_maps_stats", "collect_target_grads", "layer_cka_scores", "paired_batches", "peek"]

_SOURCES = {("in", "act"): "inputs", ("in", "grad_in"): "input_grads",
            ("out", "act"): "outputs", ("out", "grad"): "output_grads"}


@contextlib.contextmanager
def calibration_mode(model: nn.Module, *, train: bool = False):
    """Eval mode (or train mode) and ``requires_grad=True`` inside; the previous flags restored on exit."""
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        model.train(train)
        for p, _ in flags:
            p.requires_grad_(True)
        yield model
    finally:
        for m, t in modes:
            m.training = t
        for p, r in flags:
            p.requires_grad_(r)


def paired_batches(batches, source_batches, target_batches) -> tuple[Iterable, int | None]:
    """``(batch_A, batch_B)`` pairs: the same batch twice, or the two given streams zipped."""
    if source_batches is None and target_batches is None:
        if batches is None:
            raise ValueError("batches is None: the method needs calibration batches")
        total = len(batches) if hasattr(batches, "__len__") else None
        return ((b, b) for b in batches), total
    sa = source_batches if source_batches is not None else batches
    sb = target_batches if target_batches is not None else batches
    if sa is None or sb is None:
        raise ValueError("give both source_batches and target_batches (or batches for the missing one)")
    total = None
    if hasattr(sa, "__len__") and hasattr(sb, "__len__"):
        if len(sa) != len(sb):
            raise ValueError(f"source_batches has {len(sa)} batches but target_batches has {len(sb)}: "
                             "they must pair the same samples")
        total = len(sa)
    return zip(sa, sb), total


def _mask(batch, padding_mask) -> torch.Tensor | None:
    if padding_mask is None:
        return None
    if callable(padding_mask):
        return padding_mask(batch)
    if isinstance(batch, Mapping) and padding_mask in batch:
        return batch[padding_mask].bool()
    if padding_mask == "auto" and isinstance(batch, Mapping) and "attention_mask" in batch:
        return batch["attention_mask"].bool()
    return None


def _module_names(model: nn.Module, points: Iterable[str]) -> list[str]:
    mods = dict(model.named_modules())
    out = []
    for p in points:
        head, _, tail = p.rpartition(".")
        if tail in ("q", "k", "v", "out_proj") and isinstance(mods.get(head), nn.MultiheadAttention):
            p = head
        if p not in mods:
            raise ValueError(f"capture point {p!r} is not a module of the model")
        out.append(p)
    return list(dict.fromkeys(out))


def _run(model: nn.Module, cap: Captured, batch, loss: Callable, who: str, k: int, input_grads: bool) -> None:
    cap.clear()
    with torch.enable_grad():
        value = loss(model, batch)
        try:
            cap.backward(value, input_grads=input_grads)
        except ValueError as exc:
            raise ValueError(f"{who} model, calibration batch {k}: {exc}") from None


def collect_maps_stats(source: nn.Module, target: nn.Module, *, pairs: Mapping[str, str], source_spec: TransportSpec,
                       target_spec: TransportSpec, requirements: Mapping[str, dict], pairs_iter: Iterable,
                       total: int | None, loss: Callable, seq_align: SeqAlign = "identity", n_prefix: int | None = None,
                       padding_mask="auto", seq_first: bool = False, second: bool = False,
                       batch_dtype: torch.dtype | None = None, train_mode: bool = False,
                       loss_reduction: Literal["mean", "sum"] = "mean") -> tuple[dict, int]:
    """Stream the cross-covariances ``stats[(tp, side)]`` over all calibration batches; returns ``(stats, n_batches)``.

    With ``loss_reduction="mean"`` the gradient rows of a batch of ``b`` samples are multiplied by
    ``b``: a mean loss scales each sample's gradient by ``1/b``, which would otherwise let a short last
    batch (e.g. 4 of 100 samples in batches of 32) dominate the gradient moments.
    """
    stats: dict[tuple[str, str], CrossMoments] = {}
    for tp, sp in pairs.items():
        pa, pb = source_spec.points[sp], target_spec.points[tp]
        for side in ("in", "out"):
            if requirements[tp][side] is not None:
                da, db = (pa.in_dim, pb.in_dim) if side == "in" else (pa.out_dim, pb.out_dim)
                stats[(tp, side)] = CrossMoments(da, db, second=second, batch_dtype=batch_dtype)
    input_grads = any(r["in"] == "grad_in" for r in requirements.values())
    sel_a = _module_names(source, pairs.values())
    sel_b = _module_names(target, pairs.keys())
    n_batches = 0
    with calibration_mode(source, train=train_mode), calibration_mode(target, train=train_mode), \
            capture(source, sel_a) as ca, capture(target, sel_b) as cb:
        for k, (ba, bb) in enumerate(progress(pairs_iter, desc="calibration", total=total)):
            _run(source, ca, ba, loss, "source", k, input_grads)
            _run(target, cb, bb, loss, "target", k, input_grads)
            mask_a, mask_b = _mask(ba, padding_mask), _mask(bb, padding_mask)
            for tp, sp in pairs.items():
                pa, pb = source_spec.points[sp], target_spec.points[tp]
                for side, src in requirements[tp].items():
                    if src is None:
                        continue
                    attr = _SOURCES[(side, src)]
                    la, lb = getattr(ca, attr).get(sp, []), getattr(cb, attr).get(tp, [])
                    if len(la) != len(lb):
                        raise ValueError(f"point {sp!r} ran {len(la)} times in the source but {tp!r} ran {len(lb)} "
                                         "times in the target: the architectures do not correspond")
                    rows_a, rows_b = [], []
                    for xa, xb in zip(la, lb):
                        if xa is None or xb is None:  # no input gradient (the input is data)
                            continue
                        A, ga = to_tokens(xa, pa.kind, side=side, conv=pa.conv,
                                          seq_first=seq_first and not ca.meta[sp].get("batch_first", False))
                        B, gb = to_tokens(xb, pb.kind, side=side, conv=pb.conv,
                                          seq_first=seq_first and not cb.meta[tp].get("batch_first", False))
                        if loss_reduction == "mean" and "grad" in attr:
                            A, B = A * A.shape[0], B * B.shape[0]
                        ra, rb = align_tokens(A, B, seq_align, mask_a=mask_a, mask_b=mask_b, grid_a=ga, grid_b=gb,
                                              n_prefix=n_prefix)
                        rows_a.append(ra)
                        rows_b.append(rb)
                    if rows_a:
                        st = stats[(tp, side)]
                        if len(rows_a) == 1:
                            st.update(rows_a[0], rows_b[0])
                        else:
                            st.update(torch.cat(rows_a), torch.cat(rows_b))
                        # a NaN/inf row makes the running column sum non-finite: an O(width) check per batch
                        for who, mom, name in (("source", st.a, sp), ("target", st.b, tp)):
                            if not torch.isfinite(mom.sum).all():
                                what = "gradient" if "grad" in attr else "activation"
                                raise ValueError(f"non-finite {what} at {name!r} of the {who} model (calibration batch {k})")
            ca.clear()
            cb.clear()
            n_batches += 1
    if n_batches == 0:
        raise ValueError("the calibration data yielded no batches")
    return stats, n_batches


def collect_target_grads(target: nn.Module, batches: Iterable, loss: Callable, *, total: int | None = None) -> dict:
    """Sum of per-batch parameter gradients and of their signs (for GradFix); ``.grad`` is not touched."""
    names, params = zip(*target.named_parameters())
    grad_sum = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in zip(names, params)}
    votes = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in zip(names, params)}
    n = 0
    with calibration_mode(target), torch.enable_grad():
        for k, batch in enumerate(progress(batches, desc="target gradients", total=total)):
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
    return {"grad_sum": grad_sum, "sign_votes": votes, "n_batches": n}


def peek(batches, k: int):
    """The first ``k`` items and an iterable that still yields all of them (works for one-shot iterators)."""
    if batches is None:
        return [], None
    it = iter(batches)
    if it is batches:
        head = list(itertools.islice(it, k))
        return head, itertools.chain(head, it)
    return list(itertools.islice(it, k)), batches


def layer_cka_scores(source: nn.Module, target: nn.Module, stacks: Iterable[str], head_pairs: list,
                     loss: Callable) -> dict[str, np.ndarray]:
    """``(L_B, L_A)`` linear-CKA matrices between the block outputs of each stack (mean over tokens).

    Forward passes only (``loss`` runs each model), over the ``(batch_A, batch_B)`` pairs in ``head_pairs``.
    """
    from ftlab.core.geometry import linear_cka

    stacks = list(stacks)
    mods_a, mods_b = dict(source.named_modules()), dict(target.named_modules())
    blocks_a = {s: [f"{s}.{i}" for i in range(len(mods_a[s]))] for s in stacks}
    blocks_b = {s: [f"{s}.{i}" for i in range(len(mods_b[s]))] for s in stacks}
    feats_a: dict[str, list] = {n: [] for s in stacks for n in blocks_a[s]}
    feats_b: dict[str, list] = {n: [] for s in stacks for n in blocks_b[s]}
    sel_a = [n for s in stacks for n in blocks_a[s]]
    sel_b = [n for s in stacks for n in blocks_b[s]]
    with calibration_mode(source), calibration_mode(target), torch.no_grad():
        with capture(source, sel_a, inputs=False) as ca, capture(target, sel_b, inputs=False) as cb:
            for ba, bb in head_pairs:
                ca.clear()
                cb.clear()
                loss(source, ba)
                loss(target, bb)
                for cap, feats in ((ca, feats_a), (cb, feats_b)):
                    for n in feats:
                        t = cap.outputs[n][0]
                        t, _ = to_tokens(t, "linear", side="out")
                        feats[n].append(t.mean(1).double())
    out = {}
    for s in stacks:
        la, lb = blocks_a[s], blocks_b[s]
        M = np.zeros((len(lb), len(la)))
        for j, nb in enumerate(lb):
            Y = torch.cat(feats_b[nb]).numpy()
            for i, na in enumerate(la):
                X = torch.cat(feats_a[na]).numpy()
                value = linear_cka(X, Y)
                M[j, i] = 0.0 if np.isnan(value) else value  # a constant block output aligns with nothing
        out[s] = M
    return out

"""The calibration pass: one forward(-backward) of both frozen base models per calibration batch.

For every paired capture point (target point ``tp`` <- source point ``sp``) the statistics a method
asks for stream into float64 :class:`~ftlab.core.stats.CrossMoments`; captured tensors are dropped
after each batch, so memory does not grow with the calibration size. Models run in eval mode;
gradient-based statistics switch ``requires_grad`` on; both are restored afterwards, also on error.
Methods whose statistics are all activations run forward passes only, under ``torch.no_grad()``,
and need no loss (``loss`` may still be given to run the model; without it the model is called on
the batch: ``model(**batch)`` without its ``labels``, ``model(batch[0])`` for a tuple, ``model(batch)``).

Requests are ``(target point, side, statistic)`` with statistic ``act`` (input activations on the
``in`` side, output activations on the ``out`` side), ``grad`` (output gradients) or ``grad_in``
(input gradients). Work is shared where the rows are the same:

* requests whose rows come from the same captured tensors in both models (the LayerNorm output that
  is also the input of q, k and v) share one accumulator;
* output activations of an affine point (linear, convolution, attention projection, bare ``x @ P``,
  BatchNorm in eval mode) whose input activations are collected are *derived* exactly from them
  (:class:`~ftlab.transfer.align.AffineMoments`), at no cost during the pass, and only when a
  fit asks for them.

Before the statistics are allocated, their size (float64 cross-covariances at the widths found,
plus the largest solve's workspace) is checked against the memory available; a transfer that
cannot fit is refused with the estimate in the message.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from ftlab.core.hooks import Captured, capture, param_uses
from ftlab.core.progress import progress
from ftlab.core.stats import CrossMoments, cross_moments_nbytes
from ftlab.core.validate import available_memory
from ftlab.transfer.align import AffineMoments, SeqAlign, align_tokens, to_tokens
from ftlab.transfer.spec import Point, TransportSpec

__all__ = ["block_output_shapes", "calibration_mode", "collect_maps_stats", "collect_target_grads",
           "default_forward", "layer_cka_scores", "paired_batches", "peek"]

_SOURCES = {("in", "act"): "inputs", ("in", "grad_in"): "input_grads",
            ("out", "act"): "outputs", ("out", "grad"): "output_grads"}
_AFFINE_KINDS = ("linear", "conv2d", "param")


@contextlib.contextmanager
def calibration_mode(model: nn.Module, *, train: bool = False, grad: bool = True):
    """Eval mode (or train mode) and, with ``grad``, ``requires_grad=True`` inside; the previous flags restored on exit."""
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        model.train(train)
        if grad:
            for p, _ in flags:
                p.requires_grad_(True)
        yield model
    finally:
        for m, t in modes:
            m.training = t
        for p, r in flags:
            p.requires_grad_(r)


def default_forward(model: nn.Module, batch) -> Any:
    """Run ``model`` on a batch without a loss.

    ``model(**batch)`` without its ``labels`` for a mapping, ``model(batch[0])`` for a tuple or list,
    ``model(batch)`` otherwise.
    """
    if isinstance(batch, Mapping):
        return model(**{k: v for k, v in batch.items() if k != "labels"})
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    return model(batch)


def _batch_size(batch) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        for v in batch:
            if isinstance(v, torch.Tensor) and v.ndim:
                return int(v.shape[0])
    return None


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


def _module_names(model: nn.Module, points: Iterable[str]) -> tuple[list[str], list[str]]:
    """Module names to hook and bare parameters to watch, for capture points ``points``."""
    mods = dict(model.named_modules())
    params = dict(model.named_parameters())
    out, bare = [], []
    for p in points:
        head, _, tail = p.rpartition(".")
        if tail in ("q", "k", "v", "out_proj") and isinstance(mods.get(head), nn.MultiheadAttention):
            p = head
        if p in mods:
            out.append(p)
        elif p in params:
            bare.append(p)
        else:
            raise ValueError(f"capture point {p!r} is not a module of the model")
    return list(dict.fromkeys(out)), list(dict.fromkeys(bare))


def _run(model: nn.Module, cap: Captured, batch, loss: Callable | None, who: str, k: int, *, backward: bool,
         input_grads: bool) -> None:
    cap.clear()
    if not backward:
        with torch.no_grad():
            (loss if loss is not None else default_forward)(model, batch)
        return
    if loss is None:
        raise ValueError("gradient statistics need a loss(model, batch)")
    with torch.enable_grad():
        value = loss(model, batch)
        try:
            cap.backward(value, input_grads=input_grads)
        except ValueError as exc:
            raise ValueError(f"{who} model, calibration batch {k}: {exc}") from None


@dataclass
class _Req:
    """One requested statistic of a point pair."""

    tp: str
    sp: str
    side: str
    src: str
    pa: Point
    pb: Point
    internal: bool = False
    primary: bool = False

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.tp, self.side, self.src)

    @property
    def attr(self) -> str:
        return _SOURCES[(self.side, self.src)]

    @property
    def dims(self) -> tuple[int, int]:
        if self.side == "in":
            return (self.pa.in_dim, self.pb.in_dim)
        return (self.pa.out_dim, self.pb.out_dim)

    def fmt(self, p: Point) -> tuple:
        """How a captured tensor becomes rows (two requests share rows only with the same format)."""
        if p.kind == "conv2d" and self.side == "in":
            return ("unfold", p.conv)
        if p.kind in ("conv2d", "depthwise", "norm2d"):
            return ("channels",)
        return ("last",)


def _affine(model: nn.Module, point: Point) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(M, c)`` with ``output = M input + c`` for an affine point (None if it is not one)."""
    mods = dict(model.named_modules())
    with torch.no_grad():
        if point.kind == "param":
            P = dict(model.named_parameters()).get(point.name)
            return None if P is None else (P.detach().T, None)
        mod = mods.get(point.name)
        head, _, tail = point.name.rpartition(".")
        mha = mods.get(head)
        if mod is None and isinstance(mha, nn.MultiheadAttention):
            if tail == "out_proj":
                return mha.out_proj.weight.detach(), None if mha.out_proj.bias is None else mha.out_proj.bias.detach()
            i = "qkv".index(tail)
            if mha._qkv_same_embed_dim:
                W = mha.in_proj_weight.detach().chunk(3)[i]
            else:
                W = getattr(mha, f"{tail}_proj_weight").detach()
            b = None if mha.in_proj_bias is None else mha.in_proj_bias.detach().chunk(3)[i]
            return W, b
        if isinstance(mod, nn.Linear):
            return mod.weight.detach(), None if mod.bias is None else mod.bias.detach()
        if mod is not None and type(mod).__name__ == "Conv1D" and point.kind == "linear":
            return mod.weight.detach().T, None if getattr(mod, "bias", None) is None else mod.bias.detach()
        if isinstance(mod, nn.Conv2d) and point.kind == "conv2d":
            W = mod.weight.detach()
            if mod.groups > 1:
                from ftlab.transfer.transport import _grouped_dense

                W = _grouped_dense(W, mod.groups)
            return W.reshape(W.shape[0], -1), None if mod.bias is None else mod.bias.detach()
        if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)) and not mod.training and mod.running_var is not None:
            assert mod.running_mean is not None
            a = torch.rsqrt(mod.running_var.detach().double() + mod.eps)
            if mod.weight is not None:
                a = a * mod.weight.detach().double()
            c = -a * mod.running_mean.detach().double()
            if mod.bias is not None:
                c = c + mod.bias.detach().double()
            return a, c
    return None


def collect_maps_stats(source: nn.Module, target: nn.Module, *, pairs: Mapping[str, str], source_spec: TransportSpec,
                       target_spec: TransportSpec, requirements: Mapping[str, Mapping], pairs_iter: Iterable,
                       total: int | None, loss: Callable | None, seq_align: SeqAlign = "identity",
                       n_prefix: int | None = None, padding_mask="auto", seq_first: bool = False, second: bool = False,
                       batch_dtype: torch.dtype | None = torch.float64, train_mode: bool = False,
                       loss_reduction: Literal["mean", "sum"] = "mean", memory_limit: float | None = None,
                       ) -> tuple[dict, int]:
    """Stream the requested statistics over all calibration batches; returns ``(stats, n_batches)``.

    ``requirements[tp] = {"in": (statistic, ...), "out": (statistic, ...)}`` (a single name or None
    is accepted too). ``stats[(tp, side, statistic)]`` is a :class:`~ftlab.core.stats.CrossMoments`
    (possibly shared by several requests) or a derived
    :class:`~ftlab.transfer.align.AffineMoments`. With ``loss_reduction="mean"`` the gradient rows
    of a batch of ``b`` samples are multiplied by ``b``: a mean loss scales each sample's gradient by
    ``1/b``, which would otherwise let a short last batch dominate the gradient moments.
    ``memory_limit`` (bytes; default: the memory available) bounds the statistics' size.
    """
    reqs: list[_Req] = []
    for tp, sp in pairs.items():
        pa, pb = source_spec.points[sp], target_spec.points[tp]
        for side in ("in", "out"):
            got = requirements[tp].get(side)
            for i, src in enumerate((got,) if isinstance(got, str) else tuple(got or ())):
                if (side, src) not in _SOURCES:
                    raise ValueError(f"unknown statistic {src!r} on the {side} side of {tp!r}")
                reqs.append(_Req(tp, sp, side, src, pa, pb, primary=i == 0))
    by_key = {r.key: r for r in reqs}
    backward = any(r.src in ("grad", "grad_in") for r in reqs)
    if backward and loss is None:
        raise ValueError("gradient statistics need a loss(model, batch)")
    # output activations of affine points whose input activations are collected are derived, not collected
    derived: dict[tuple, tuple[tuple, Any, Any]] = {}
    for r in list(reqs):
        if r.side != "out" or r.src != "act" or train_mode:
            continue
        base = (r.tp, "in", "act")
        if r.pb.kind in _AFFINE_KINDS and base in by_key:
            ma, mb = _affine(source, r.pa), _affine(target, r.pb)
            if ma is not None and mb is not None:
                derived[r.key] = (base, ma, mb)
        elif r.pb.kind == "norm2d":  # BatchNorm in eval mode: per-channel affine of its input
            ma, mb = _affine(source, r.pa), _affine(target, r.pb)
            if ma is not None and mb is not None:
                if base not in by_key:
                    extra = _Req(r.tp, r.sp, "in", "act", r.pa, r.pb, internal=True)
                    reqs.append(extra)
                    by_key[extra.key] = extra
                derived[r.key] = (base, ma, mb)
    input_grads = any(r.src == "grad_in" for r in reqs)
    mods_a, bare_a = _module_names(source, dict.fromkeys(r.sp for r in reqs))
    mods_b, bare_b = _module_names(target, dict.fromkeys(r.tp for r in reqs))
    owners: dict[tuple, tuple] = {}  # request key -> key of the request whose accumulator serves it
    streams: dict[tuple, CrossMoments] = {}
    aliased: list[_Req] = []  # requests served by another's accumulator, and those owners (checked every batch)
    n_batches = 0
    with calibration_mode(source, train=train_mode, grad=backward), \
            calibration_mode(target, train=train_mode, grad=backward), \
            capture(source, mods_a, params=bare_a) as ca, capture(target, mods_b, params=bare_b) as cb:
        for k, (ba, bb) in enumerate(progress(pairs_iter, desc="calibration", total=total)):
            _run(source, ca, ba, loss, "source", k, backward=backward, input_grads=input_grads)
            _run(target, cb, bb, loss, "target", k, backward=backward, input_grads=input_grads)
            mask_a, mask_b = _mask(ba, padding_mask), _mask(bb, padding_mask)
            n_samples = _batch_size(ba)
            # the first batch decides which requests share rows; later batches only check the shared ones
            check = reqs if k == 0 else aliased
            tensors: dict[tuple, tuple[list, list]] = {}
            for r in check:
                la, lb = getattr(ca, r.attr).get(r.sp, []), getattr(cb, r.attr).get(r.tp, [])
                if len(la) != len(lb):
                    raise ValueError(f"point {r.sp!r} ran {len(la)} times in the source but {r.tp!r} ran {len(lb)} "
                                     "times in the target: the architectures do not correspond")
                tensors[r.key] = (la, lb)
            ident = {key: (tuple(id(x) for x in la), tuple(id(x) for x in lb), by_key[key].fmt(by_key[key].pa),
                           by_key[key].fmt(by_key[key].pb), by_key[key].dims)
                     for key, (la, lb) in tensors.items() if la}
            if k == 0:
                for who, bare, cap in (("source", bare_a, ca), ("target", bare_b, cb)):
                    unused = [p for p in bare if param_uses(cap, p) == 0]
                    if unused:
                        raise ValueError(f"parameter {unused[0]!r} of the {who} model belongs to no layer ftlab knows and "
                                         "was not used as a projection x @ P; give a rule (source_overrides/"
                                         "target_overrides) or zero it (zero_params)")
                # fitted statistics own their rows first (real accumulators, with second moments when asked), then
                # the derived ones (free), then the rest
                first: dict[tuple, tuple] = {}
                order = ([r.key for r in reqs if r.primary and r.key not in derived] + list(derived)
                         + [r.key for r in reqs if not r.primary and r.key not in derived])
                for key in order:
                    if key not in ident:
                        continue
                    owner = first.setdefault(ident[key], key)
                    owners[key] = owner
                for r in reqs:
                    if r.key not in owners:
                        owners[r.key] = r.key  # no rows (e.g. no input gradient): its own, empty accumulator
                collected = [key for key, own in owners.items() if own == key and key not in derived]
                for key in collected:
                    r = by_key[key]
                    streams[key] = CrossMoments(*r.dims, second=second, batch_dtype=batch_dtype)
                _check_memory([by_key[key].dims for key in collected],
                              [by_key[key].dims for key in derived], second=second, batch_dtype=batch_dtype,
                              limit=memory_limit)
                shared = [k2 for key, own in owners.items() if own != key for k2 in (key, own)]
                aliased = [by_key[key] for key in dict.fromkeys(shared)]
            else:
                for r in aliased:
                    own = owners[r.key]
                    if own != r.key and own in ident and ident.get(r.key) != ident[own]:
                        raise ValueError(f"the rows of {r.tp!r} ({r.side}, {r.src}) changed their source between "
                                         "calibration batches (a model whose graph varies per batch is not supported)")
            for key, st in streams.items():
                r = by_key[key]
                if key in tensors:
                    la, lb = tensors[key]
                else:
                    la, lb = getattr(ca, r.attr).get(r.sp, []), getattr(cb, r.attr).get(r.tp, [])
                if len(la) != len(lb):
                    raise ValueError(f"point {r.sp!r} ran {len(la)} times in the source but {r.tp!r} ran {len(lb)} "
                                     "times in the target: the architectures do not correspond")
                rows_a, rows_b = [], []
                for xa, xb in zip(la, lb):
                    if xa is None or xb is None:  # no input gradient (the input is data)
                        continue
                    A, ga = to_tokens(xa, r.pa.kind, side=r.side, conv=r.pa.conv,
                                      seq_first=seq_first and not ca.meta.get(r.sp, {}).get("batch_first", False))
                    B, gb = to_tokens(xb, r.pb.kind, side=r.side, conv=r.pb.conv,
                                      seq_first=seq_first and not cb.meta.get(r.tp, {}).get("batch_first", False))
                    if loss_reduction == "mean" and "grad" in r.attr:
                        b = n_samples if n_samples is not None else A.shape[0]
                        A, B = A * b, B * b
                    tok = r.pb.tokens and r.pa.tokens
                    ra, rb = align_tokens(A, B, seq_align, mask_a=mask_a if tok else None,
                                          mask_b=mask_b if tok else None, grid_a=ga, grid_b=gb, n_prefix=n_prefix)
                    rows_a.append(ra)
                    rows_b.append(rb)
                if rows_a:
                    if len(rows_a) == 1:
                        st.update(rows_a[0], rows_b[0])
                    else:
                        st.update(torch.cat(rows_a), torch.cat(rows_b))
                    # a NaN/inf row makes the running column sum non-finite: an O(width) check per batch
                    for who, mom, name in (("source", st.a, r.sp), ("target", st.b, r.tp)):
                        if not torch.isfinite(mom.sum).all():
                            what = "gradient" if "grad" in r.attr else "activation"
                            raise ValueError(f"non-finite {what} at {name!r} of the {who} model (calibration batch {k})")
            ca.clear()
            cb.clear()
            n_batches += 1
    if n_batches == 0:
        raise ValueError("the calibration data yielded no batches")
    out: dict[tuple, Any] = {}

    def resolve(key: tuple):
        if key in out:
            return out[key]
        own = owners.get(key, key)
        if own != key:
            val = resolve(own)
        elif key in derived:
            base, ma, mb = derived[key]
            val = AffineMoments(resolve(base), ma, mb)
        else:
            val = streams.get(key)
            if val is None:  # never produced rows
                r = by_key[key]
                val = streams[key] = CrossMoments(*r.dims, second=second, batch_dtype=batch_dtype)
        out[key] = val
        return val

    for r in reqs:
        if not r.internal:
            resolve(r.key)
    return {k: v for k, v in out.items() if not by_key[k].internal}, n_batches


def _check_memory(collected: list[tuple[int, int]], derived: list[tuple[int, int]], *, second: bool,
                  batch_dtype: torch.dtype | None, limit: float | None) -> None:
    """Refuse statistics that cannot fit: accumulators plus the largest solve's workspace vs. the memory available."""
    need = sum(cross_moments_nbytes(a, b, second=second, batch_dtype=batch_dtype) for a, b in collected)
    widest = max([a * b for a, b in collected + derived] or [0])
    need += 6 * 8 * widest  # one derived statistic and the SVD's factors and workspace at a time
    avail = available_memory() if limit is None else float(limit)
    if need > avail:
        big = max(collected, key=lambda d: d[0] * d[1]) if collected else (0, 0)
        raise ValueError(f"the transfer statistics need about {need / 2**30:.2f} GB ({len(collected)} float64 "
                         f"cross-covariances, the largest {big[0]} x {big[1]}{', with second moments' if second else ''}) "
                         f"but only {avail / 2**30:.2f} GB of memory is available; transfer fewer layers (zero_params), "
                         "switch off diagnostics, or use a machine with more memory")


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


def block_output_shapes(source: nn.Module, target: nn.Module, stacks: Iterable[str], pair,
                        loss: Callable | None) -> dict[str, tuple[list[tuple], list[tuple]]]:
    """Output shape (without the batch axis) of every block of each stack, from one forward pass of each model.

    ``pair`` is one ``(batch_A, batch_B)``; ``stacks`` are paths present in both models.
    """
    stacks = list(stacks)
    out: dict[str, tuple[list[tuple], list[tuple]]] = {}
    run = loss if loss is not None else default_forward
    shapes = []
    for model, batch in ((source, pair[0]), (target, pair[1])):
        mods = dict(model.named_modules())
        names = {s: [f"{s}.{i}" for i in range(len(mods[s]))] for s in stacks}
        with calibration_mode(model, grad=False), torch.no_grad(), \
                capture(model, [n for s in stacks for n in names[s]], inputs=False) as cap:
            run(model, batch)
            shapes.append({s: [tuple(cap.outputs[n][0].shape[1:]) if cap.outputs.get(n) else () for n in names[s]]
                           for s in stacks})
    for s in stacks:
        out[s] = (shapes[0][s], shapes[1][s])
    return out


def layer_cka_scores(source: nn.Module, target: nn.Module, stacks: Iterable[str], head_pairs: list,
                     loss: Callable | None) -> dict[str, np.ndarray]:
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
    run = loss if loss is not None else default_forward
    with calibration_mode(source, grad=False), calibration_mode(target, grad=False), torch.no_grad():
        with capture(source, sel_a, inputs=False) as ca, capture(target, sel_b, inputs=False) as cb:
            for ba, bb in head_pairs:
                ca.clear()
                cb.clear()
                run(source, ba)
                run(target, bb)
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

"""Statistics repair: re-pin the running statistics of norm layers after a task vector is applied.

A transferred task vector changes the inputs of every BatchNorm-like layer of the target (a layer
that normalises with stored ``running_mean`` / ``running_var``), but the stored statistics stay those
of the untouched target: a shift of channel means that nothing absorbs piles up through the depth of
the network, and a frozen read-out turns it into a collapse onto a few classes. REPAIR (Jordan,
Sedghi, Saukh, Entezari, Neyshabur, *REPAIR: REnormalizing Permuted Activations for Interpolation
Repair*, ICLR 2023, arXiv 2211.08403; code ``KellerJordan/REPAIR``) corrects such drift after
interpolating two networks by matching each channel's statistics to the endpoints'. ftlab's variant
for a transfer (ftlab's own, not part of the BiCo paper) re-pins the target's statistics after
``B + alpha tau_B``:

* one forward pass of base B on the calibration inputs records, per norm layer with running
  statistics, the per-channel mean (and spread) of its *output*;
* one forward pass of the transferred model, in which each norm layer, just before it runs, sets its
  ``running_mean`` (``mode="mean"``) -- and its ``running_var`` too (``mode="mean_std"``) -- so that
  each channel's output mean (and standard deviation) over the calibration inputs equals base B's.
  Layers are repaired in the order they run, so each one sees inputs already repaired upstream.

The affine parameters (gain, bias) are left as the transfer set them; the stored statistics absorb the
difference. At ``tau = 0`` the repair is an exact no-op (the same inputs give the same means). Norm
layers without running statistics (LayerNorm, RMSNorm, GroupNorm) need no repair and are left alone.
The first pass reads the target's calibration batches one at a time and merges their moments (Chan, Golub and
LeVeque's pairwise update), so it holds no more than one batch's activations; the second reads them as one batch
(their samples concatenated), since each layer's pin needs the moments of all inputs after the layers above it
were pinned. The pinned statistics are exact for the whole calibration set.

``mode="none"`` turns it off. The default of :class:`~ftlab.transfer.options.TransferOptions` is
documented there (chosen on validation data of design pairs, docs/transfer.md).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import nn

from ftlab.core.modes import module_mode
from ftlab.core.validate import check_choice

__all__ = ["REPAIR_MODES", "RepairMode", "StatisticsRepair", "concat_batches", "fit_repair", "running_norms"]

RepairMode = Literal["none", "mean", "mean_std"]
REPAIR_MODES: tuple[str, ...] = get_args(RepairMode)
#: Channels whose gain is smaller than this (in absolute value) keep their statistics: a mean cannot be moved there.
_TINY_GAIN = 1e-12


def running_norms(model: nn.Module) -> dict[str, Any]:
    """The norm layers of ``model`` that normalise with stored running statistics, by module name."""
    out: dict[str, Any] = {}
    for name, mod in model.named_modules():
        rm, rv = getattr(mod, "running_mean", None), getattr(mod, "running_var", None)
        if isinstance(mod, nn.modules.batchnorm._NormBase) and isinstance(rm, torch.Tensor) \
                and isinstance(rv, torch.Tensor):
            out[name] = mod
    return out


def concat_batches(batches: Iterable[Any]) -> Any:
    """The batches as one: tensors concatenated on their first axis, mappings / tuples / lists entry by entry.

    Entries that are not tensors must be equal in every batch. Raises ``ValueError`` naming the entry whose
    batches cannot be joined (e.g. token tensors of different lengths).
    """
    items = list(batches)
    if not items:
        raise ValueError("no calibration batches to repair the statistics with")

    def join(parts: list, where: str) -> Any:
        first = parts[0]
        if isinstance(first, torch.Tensor):
            try:
                return torch.cat(parts, 0) if first.ndim else first
            except RuntimeError:
                shapes = sorted({tuple(p.shape) for p in parts})
                raise ValueError(f"calibration batches cannot be joined at {where or 'the batch'}: shapes {shapes[:3]} "
                                 "differ beyond the first axis (give batches of one shape to repair statistics)") from None
        if isinstance(first, Mapping):
            return {k: join([p[k] for p in parts], f"{where}[{k!r}]") for k in first}
        if isinstance(first, (tuple, list)):
            return type(first)(join([p[i] for p in parts], f"{where}[{i}]") for i in range(len(first)))
        return first

    return join(items, "")


#: Elements of ``x`` converted to float64 at a time by :func:`_channel_moments` (16 MB).
_CHUNK = 2 ** 21


def _channel_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation (``1/N`` variance) of ``(N, C, ...)`` or ``(N, C)`` in float64.

    Two passes (the mean, then the centred squares) over slices of the first axis converted to float64 one at a
    time (about ``_CHUNK`` elements each), so no float64 copy of a whole activation is made; the result equals the
    one-shot float64 computation up to summation order."""
    x = x.detach()
    dims = [0, *range(2, x.ndim)]
    n = x.numel() // x.shape[1] if x.numel() else 0
    if n == 0:
        nan = torch.full((x.shape[1],), float("nan"), dtype=torch.float64, device=x.device)
        return nan, nan
    step = max(1, _CHUNK // max(1, x[0].numel()))

    def slices():
        return (x[i:i + step].double() for i in range(0, x.shape[0], step))

    total = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device)
    for c in slices():
        total += c.sum(dim=dims)
    mean = total / n
    centre = mean.view([1, -1] + [1] * (x.ndim - 2))
    sq = torch.zeros_like(total)
    for c in slices():
        sq += (c - centre).square().sum(dim=dims)
    return mean, (sq / n).clamp_min(0).sqrt()


def _affine(mod: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's gain and bias in float64 (ones and zeros for a layer without affine parameters)."""
    rm = mod.running_mean
    w = mod.weight if getattr(mod, "weight", None) is not None else torch.ones_like(rm)
    b = mod.bias if getattr(mod, "bias", None) is not None else torch.zeros_like(rm)
    return w.detach().double(), b.detach().double()


@dataclass(frozen=True)
class _Reference:
    """Base B's side of one norm layer: its stored statistics, affine terms, and the moments of its input."""

    running_mean: torch.Tensor
    running_var: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    in_mean: torch.Tensor
    in_std: torch.Tensor
    eps: float


@contextlib.contextmanager
def _pre_hooks(norms: Mapping[str, nn.Module], fn: Callable[[str, nn.Module, torch.Tensor], None]) -> Iterator[None]:
    handles = [mod.register_forward_pre_hook(lambda m, args, name=name: fn(name, m, args[0]))
               for name, mod in norms.items()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@dataclass(frozen=True)
class StatisticsRepair:
    """Base B's per-channel statistics on the calibration inputs, ready to re-pin a changed copy of B.

    ``mode``: ``"mean"`` or ``"mean_std"``; ``inputs``: the calibration inputs as one batch;
    ``forward(model, batch)`` runs a model on it. :meth:`apply_` changes a model in place and returns
    a record per norm layer (the input drift it absorbed, in units of base B's channel standard
    deviations).
    """

    mode: str
    inputs: Any = field(repr=False)
    forward: Callable[[nn.Module, Any], Any] = field(repr=False)
    reference: Mapping[str, _Reference] = field(repr=False)
    #: the calibration batches as given (the record pass and :meth:`drift` read them one at a time)
    batches: tuple = field(default=(), repr=False)

    def apply_(self, model: nn.Module) -> dict[str, dict[str, float]]:
        """Re-pin the running statistics of ``model`` (B with a task vector applied) in place; a record per layer.

        ``model`` must have base B's module names. Each layer's record: ``drift`` (RMS over channels of the
        shift of its input mean, before repair, in base B's channel standard deviations), ``moved`` (channels
        whose statistics changed).
        """
        norms = running_norms(model)
        missing = sorted(set(self.reference) - set(norms))
        if missing:
            raise ValueError(f"the model has no norm layer {missing[0]!r} of the base it was repaired against")
        log: dict[str, dict[str, float]] = {}

        def pin(name: str, mod: Any, x: torch.Tensor) -> None:
            ref = self.reference[name]
            mean, std = _channel_moments(x)
            w, b = _affine(mod)
            rm0 = mod.running_mean.detach().double()
            rv0 = mod.running_var.detach().double()
            s_ref = (ref.running_var + ref.eps).sqrt()
            s_now = (rv0 + mod.eps).sqrt()
            keep = w.abs() < _TINY_GAIN
            rv = rv0
            if self.mode == "mean_std":
                # the output spread |w| std / s must equal base B's |w_B| std_B / s_B
                num, den = w.abs() * std * s_ref, ref.weight.abs() * ref.in_std * s_now
                ratio = torch.where((den > 0) & ~keep, num / den.clamp_min(1e-300), torch.ones_like(num))
                s_new = s_now * ratio
                ok = (ratio != 1) & (s_new.square() > mod.eps)
                rv = torch.where(ok, s_new.square() - mod.eps, rv0)
            s_new = (rv + mod.eps).sqrt()
            same = (w == ref.weight) & (b == ref.bias) & (rv == ref.running_var) & (rm0 == ref.running_mean)
            # the output mean w (mean - rm) / s + b must equal base B's w_B (mean_B - rm_B) / s_B + b_B
            target = ref.weight * (ref.in_mean - ref.running_mean) / s_ref + ref.bias
            affine_term = (ref.in_mean - rm0) - (target - b) * s_new / torch.where(keep, 1.0, w)
            rm = rm0 + (mean - ref.in_mean) + torch.where(same, torch.zeros_like(rm0), affine_term)
            rm = torch.where(keep, rm0, rm)
            drift = ((mean - ref.in_mean) / ref.in_std.clamp_min(1e-12)).square().mean().sqrt()
            log[name] = {"drift": float(drift), "moved": int(((rm != rm0) | (rv != rv0)).sum())}
            with torch.no_grad():
                mod.running_mean.copy_(rm.to(mod.running_mean.dtype))
                mod.running_var.copy_(rv.to(mod.running_var.dtype))

        with torch.no_grad(), module_mode(model, train=False), _pre_hooks({n: norms[n] for n in self.reference}, pin):
            self.forward(model, self.inputs)
        return log

    def drift(self, model: nn.Module) -> dict[str, float]:
        """Per norm layer, the RMS over channels of the shift of its input mean from base B's on the calibration
        inputs, in base B's channel standard deviations, with nothing repaired (``model`` is not changed)."""
        norms = running_norms(model)
        got = _merged_moments(model, {n: norms[n] for n in self.reference if n in norms},
                              self.batches or (self.inputs,), self.forward)
        return {name: float(((mean - self.reference[name].in_mean) / self.reference[name].in_std.clamp_min(1e-12))
                            .square().mean().sqrt()) for name, (mean, _) in got.items()}

    def apply(self, model: nn.Module) -> nn.Module:
        """A repaired copy of ``model`` (the model itself is untouched)."""
        out = copy.deepcopy(model)
        self.apply_(out)
        return out


def fit_repair(target_base: nn.Module, batches: Iterable[Any], *, mode: str = "mean",
               forward: Callable[[nn.Module, Any], Any] | None = None) -> StatisticsRepair | None:
    """Record base B's statistics on the calibration ``batches`` (one forward pass); ``None`` when there is nothing
    to repair (``mode="none"``, or no norm layer with running statistics).

    ``batches``: the target's calibration batches (joined into one, :func:`concat_batches`); ``forward``:
    ``forward(model, batch)`` (default :func:`ftlab.transfer.batches.default_forward`).
    """
    from ftlab.transfer.batches import default_forward

    check_choice("repair", mode, REPAIR_MODES)
    norms = running_norms(target_base)
    if mode == "none" or not norms:
        return None
    fwd = forward or default_forward
    items = tuple(batches)
    inputs = concat_batches(items)  # checks the batches join (the pin pass reads them as one) before any forward
    ref: dict[str, _Reference] = {}
    for name, (mean, std) in _merged_moments(target_base, norms, items, fwd).items():
        mod = norms[name]
        w, b = _affine(mod)
        ref[name] = _Reference(mod.running_mean.detach().double().clone(), mod.running_var.detach().double().clone(),
                               w.clone(), b.clone(), mean, std, float(mod.eps))
    return StatisticsRepair(mode, inputs, fwd, {n: ref[n] for n in norms if n in ref}, items) if ref else None


def _merged_moments(model: nn.Module, norms: Mapping[str, nn.Module], batches: Iterable[Any],
                    forward: Callable[[nn.Module, Any], Any]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per norm layer of ``norms``, the per-channel mean and standard deviation of its input over all ``batches``
    (eval mode, no gradients), one batch at a time: each batch's moments merged by the pairwise update of Chan,
    Golub & LeVeque (1979), equal to one computation over the joined batches up to rounding. Layers that saw no
    rows are left out."""
    moments: dict[str, tuple[int, torch.Tensor, torch.Tensor]] = {}  # name -> (rows per channel, mean, sum of squares)

    def record(name: str, mod: Any, x: torch.Tensor) -> None:
        n = x.numel() // x.shape[1] if x.numel() else 0
        if n == 0:
            return
        mean, std = _channel_moments(x)
        m2 = std.square() * n
        if name in moments:
            n0, mean0, m20 = moments[name]
            delta = mean - mean0
            total = n0 + n
            mean, m2, n = mean0 + delta * (n / total), m20 + m2 + delta.square() * (n0 * n / total), total
        moments[name] = (n, mean, m2)

    with torch.no_grad(), module_mode(model, train=False), _pre_hooks(norms, record):
        for batch in batches:
            forward(model, batch)
    return {name: (mean, (m2 / n).clamp_min(0).sqrt()) for name, (n, mean, m2) in moments.items()}

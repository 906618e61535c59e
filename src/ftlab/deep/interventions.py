"""Initialization-scale interventions for PyTorch models, named like ``torch.nn.init`` functions.

The deep-network analogues of the knobs of the diagonal-network theory (Anguita et al. 2026, arXiv
2602.20062). How the knobs map onto deep networks is not given by the paper's available text, so
every definition below is ftlab's documented choice (docs/deep.md):

* relative scale kappa (analogue of lambda_PT): :func:`ftlab.deep.rebalance_` (its own module), an
  exact function-preserving move of weight norm between early layers and the readout;
* :func:`absolute_scale_` -- absolute scale s (analogue of c_PT): multiply every parameter by ``s``
  (the "weight rescaling" of Lippl & Lindsey 2024, arXiv 2310.02396);
* :func:`reinit_readout_` -- a fresh readout of scale gamma (analogue of gamma_FT);
* :func:`balancedness` / :func:`set_balancedness_` -- the balance of a LayerNorm-free Transformer
  between its input embeddings and its readout (after the conserved quantity of Kunin et al. 2024,
  "Get rich quick", arXiv 2406.06158), set by :func:`rescale_stream_`, an exact function-preserving
  rescale of the residual stream;
* :func:`recalibrate_batchnorm_` -- recompute BatchNorm running statistics on given inputs.

Functions ending in ``_`` mutate the model in place and return a frozen record of what changed.
:func:`absolute_scale_` refuses to multiply the same parameters twice with no change in between
(calling the same line twice by mistake, as mup refuses a double ``set_base_shapes``);
``allow_repeat=True`` overrides it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ftlab.core.usercode import check_model
from ftlab.core.validate import check_choice, check_finite, check_nonnegative, check_positive, check_range

ReadoutMode = Literal["normal", "zero", "constant"]

__all__ = ["BalanceRecord", "ReadoutRecord", "RescaleRecord", "absolute_scale_", "balancedness", "find_readout",
           "recalibrate_batchnorm_", "reinit_readout_", "rescale_stream_", "set_balancedness_"]

_READOUT_NAMES = ("fc", "head", "classifier", "readout", "unembed", "lm_head", "out")
_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)
_GUARD_ATTR = "_ftlab_rescales"


@dataclass(frozen=True)
class RescaleRecord:
    """What a rescale changed: which parameters, by which factor, and the squared norm before/after."""

    kind: str
    factors: tuple[tuple[str, float], ...]  # (parameter name, factor)
    sq_norm_before: float
    sq_norm_after: float

    @property
    def params(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.factors)


@dataclass(frozen=True)
class ReadoutRecord:
    """A readout re-initialization: the module name, its new shape ``(out, in)``, mode, gamma, norm."""

    name: str
    shape: tuple[int, int]
    mode: str
    gamma: float
    weight_norm: float


@dataclass(frozen=True)
class BalanceRecord:
    """A balancedness change: the stream factor ``a`` (input embeddings x a, readout weight x 1/a) and
    the balancedness before and after."""

    factor: float
    before: float
    after: float


def _get(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError as exc:
        raise ValueError(f"model has no submodule {name!r}") from exc


def find_readout(model: nn.Module, readout: str | None = None) -> tuple[str, nn.Linear]:
    """The readout ``(name, nn.Linear)``: ``readout`` if given, else ``model.ftlab_readout``, else a
    top-level ``nn.Linear`` named fc/head/classifier/readout/unembed/lm_head/out, else the last
    top-level ``nn.Linear``. Raises ``ValueError`` if none is found."""
    check_model("model", model)
    name = readout or getattr(model, "ftlab_readout", None)
    if name is None:
        children = dict(model.named_children())
        for cand in _READOUT_NAMES:
            if isinstance(children.get(cand), nn.Linear):
                name = cand
                break
        else:
            linears = [n for n, m in children.items() if isinstance(m, nn.Linear)]
            if not linears:
                raise ValueError(f"{type(model).__name__} has no recognizable readout (no top-level nn.Linear); "
                                 "pass readout='<module name>'")
            name = linears[-1]
    mod = _get(model, name)
    if not isinstance(mod, nn.Linear):
        raise ValueError(f"readout {name!r} is a {type(mod).__name__}, not an nn.Linear")
    return name, mod


# ------------------------------------------------------------------------------ absolute scale
def _sq_norm(params: dict[str, torch.Tensor], names) -> float:
    return float(sum(float(params[n].detach().double().pow(2).sum()) for n in names))


def absolute_scale_(model: nn.Module, s: float, *, include_readout: bool = True, include_norm: bool = True,
                    include_bias: bool = True, allow_repeat: bool = False) -> RescaleRecord:
    """Absolute scale s: multiply every parameter (optionally not the readout, normalization affine
    parameters or biases) by ``s`` in place, as the weight rescaling of Lippl & Lindsey (2024, arXiv 2310.02396); the
    analogue of c_PT. Buffers (BatchNorm running statistics) are not touched."""
    check_model("model", model)
    check_positive("s", s)
    norm = {f"{mn}.{pn}" if mn else pn for mn, m in model.named_modules() if isinstance(m, _NORM_TYPES)
            for pn, _ in m.named_parameters(recurse=False)}
    ro = find_readout(model)[0] + "." if not include_readout else None
    names = [n for n, _ in model.named_parameters()
             if (include_norm or n not in norm) and (include_bias or n.rsplit(".", 1)[-1] != "bias")
             and (ro is None or not n.startswith(ro))]
    if not names:
        raise ValueError(f"absolute scale selects no parameters of {type(model).__name__}")
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    key = ("absolute", tuple(names))
    seen = model.__dict__.setdefault(_GUARD_ATTR, {})
    prev = seen.get(key)
    if prev is not None and not allow_repeat and all(params[n]._version == v for n, v in prev.items()):
        raise ValueError(f"absolute_scale_ was already applied to these {len(names)} parameters and they have not "
                         "changed since; pass allow_repeat=True to multiply them again")
    before = _sq_norm(params, names)
    with torch.no_grad():
        for n in names:
            params[n].mul_(float(s))
    seen[key] = {n: params[n]._version for n in names}
    return RescaleRecord("absolute", tuple((n, float(s)) for n in names), before, _sq_norm(params, names))


# ------------------------------------------------------------------------------- readout re-init
def reinit_readout_(model: nn.Module, *, gamma: float, mode: ReadoutMode = "normal", out_features: int | None = None,
                    readout: str | None = None, seed: int | None = None) -> ReadoutRecord:
    """Replace the readout by a fresh ``nn.Linear`` with scale ``gamma`` (the analogue of gamma_FT).

    mode : ``"normal"`` weights ~ N(0, gamma^2 / fan_in) (gamma = 1 is a LeCun-normal init);
        ``"zero"`` all weights 0 (gamma must be 0); ``"constant"`` every weight equals ``gamma``.
        Biases (kept only if the old readout had one) start at 0.
    out_features : new number of outputs (a new task's classes); default keeps the old one.
    seed : seeds the normal draw (``torch.Generator``); the global RNG is not touched. The same seed
        gives the same draw up to its scale for every gamma.
    The new layer has the old one's dtype and device. Raises ``ValueError`` if no readout is found.
    """
    check_model("model", model)
    check_choice("mode", mode, ("normal", "zero", "constant"))
    check_finite("gamma", gamma)
    if mode == "normal":
        check_nonnegative("gamma", gamma)
    if mode == "zero" and gamma != 0:
        raise ValueError(f"gamma={gamma!r} is invalid for mode='zero': must be 0")
    name, old = find_readout(model, readout)
    out_f = old.out_features if out_features is None else int(out_features)
    if out_f < 1:
        raise ValueError(f"out_features={out_features} is out of range: must be an integer >= 1")
    new = nn.Linear(old.in_features, out_f, bias=old.bias is not None, device=old.weight.device, dtype=old.weight.dtype)
    with torch.no_grad():
        if mode == "normal":
            gen = torch.Generator(device="cpu")
            gen.manual_seed(0 if seed is None else int(seed))
            w = torch.randn(new.weight.shape, generator=gen, dtype=torch.float64) * (gamma / math.sqrt(old.in_features))
            new.weight.copy_(w.to(new.weight.dtype))
        else:
            new.weight.fill_(float(gamma))
        if new.bias is not None:
            new.bias.zero_()
    parent_name, _, attr = name.rpartition(".")
    setattr(_get(model, parent_name) if parent_name else model, attr, new)
    return ReadoutRecord(name, (out_f, old.in_features), mode, float(gamma), float(new.weight.detach().double().norm()))


# ---------------------------------------------------------------------------------- balancedness
def _stream_parts(model: nn.Module) -> tuple[list[torch.Tensor], nn.Linear, list[nn.MultiheadAttention], list[nn.Linear]]:
    """Input embeddings, readout, attention modules and inner linear layers of a LayerNorm-free
    Transformer (``ftlab_embedding``, optional ``ftlab_positional``, ``ftlab_readout``)."""
    name = type(model).__name__
    ename = getattr(model, "ftlab_embedding", None)
    if ename is None:
        raise ValueError(f"{name} declares no ftlab_embedding: balancedness needs a Transformer that names its "
                         "token embedding (ftlab_embedding) and readout (ftlab_readout)")
    emb = _get(model, ename)
    if not isinstance(emb, nn.Embedding):
        raise ValueError(f"embedding {ename!r} is a {type(emb).__name__}, not an nn.Embedding")
    inputs: list[torch.Tensor] = [emb.weight]
    pname = getattr(model, "ftlab_positional", None)
    if pname is not None:
        pos = dict(model.named_parameters()).get(pname)
        if pos is None:
            raise ValueError(f"{name}.ftlab_positional={pname!r} is not a parameter of the model")
        inputs.append(pos)
    rname, readout = find_readout(model)
    attn, inner = [], []
    for mn, m in model.named_modules():
        if mn in ("", ename, rname) or isinstance(m, (nn.ModuleList, nn.Sequential, nn.ReLU, nn.Identity, nn.Dropout)):
            continue
        if isinstance(m, nn.MultiheadAttention):
            if not m._qkv_same_embed_dim:
                raise ValueError(f"{mn}: attention with separate key/value dimensions is not supported")
            attn.append(m)
        elif isinstance(m, nn.Linear):
            if not any(mn.startswith(a + ".") for a, x in model.named_modules() if isinstance(x, nn.MultiheadAttention)):
                inner.append(m)
        elif isinstance(m, _NORM_TYPES):
            raise ValueError(f"{name}: {mn} is a {type(m).__name__}; a normalization layer divides out the stream's "
                             "scale, so balancedness cannot be set by a function-preserving rescale")
        elif any(True for _ in m.parameters(recurse=False)) or type(m).__module__.startswith("torch.nn"):
            raise ValueError(f"{name}: {mn} ({type(m).__name__}) is not supported by the stream rescale (it knows "
                             "embeddings, nn.MultiheadAttention, nn.Linear and ReLU)")
    return inputs, readout, attn, inner


def balancedness(model: nn.Module) -> float:
    """``(||W_in||^2 - ||W_U||^2) / (||W_in||^2 + ||W_U||^2)`` in [-1, 1], where ``||W_in||^2`` sums
    the squared norms of the input embeddings (token and positional) and ``W_U`` is the readout
    weight: Kunin et al.'s (2024) per-neuron conserved quantity, summed and normalized; -1 = all the
    scale in the readout ("upstream")."""
    check_model("model", model)
    inputs, readout, _, _ = _stream_parts(model)
    a = float(sum(float(p.detach().double().pow(2).sum()) for p in inputs))
    b = float(readout.weight.detach().double().pow(2).sum())
    if a + b == 0:
        raise ValueError("embeddings and readout are all zero: balancedness is undefined")
    return (a - b) / (a + b)


def rescale_stream_(model: nn.Module, a: float) -> float:
    """Multiply the residual stream of a LayerNorm-free ReLU Transformer by ``a`` without changing its
    function: input embeddings (token and positional) x ``a``; query and key projections x ``1/a``
    (attention scores unchanged); value bias and every bias written into the stream x ``a`` (a ReLU
    MLP then scales with its input); the readout weight x ``1/a`` (its bias unchanged). Refuses
    (``ValueError``) models with normalization layers or modules it does not know. Returns ``a``."""
    check_model("model", model)
    check_positive("a", a)
    inputs, readout, attn, inner = _stream_parts(model)
    with torch.no_grad():
        for p in inputs:
            p.mul_(a)
        for m in attn:
            d = m.embed_dim
            m.in_proj_weight[: 2 * d].mul_(1.0 / a)
            if m.in_proj_bias is not None:
                m.in_proj_bias[2 * d:].mul_(a)
            if m.out_proj.bias is not None:
                m.out_proj.bias.mul_(a)
        for lin in inner:
            if lin.bias is not None:
                lin.bias.mul_(a)
        readout.weight.mul_(1.0 / a)
    return float(a)


def set_balancedness_(model: nn.Module, target: float) -> BalanceRecord:
    """Set :func:`balancedness` to ``target`` in (-1, 1) by :func:`rescale_stream_` (function preserved).

    With ``E = ||W_in||^2`` and ``U = ||W_U||^2`` the stream factor is
    ``a = (U (1 + target) / (E (1 - target)))^(1/4)``."""
    check_model("model", model)
    check_range("target", target, -1.0, 1.0, lo_open=True, hi_open=True)
    inputs, readout, _, _ = _stream_parts(model)
    E = float(sum(float(p.detach().double().pow(2).sum()) for p in inputs))
    U = float(readout.weight.detach().double().pow(2).sum())
    if E == 0 or U == 0:
        raise ValueError(f"{'embeddings' if E == 0 else 'readout weight'} are zero: balancedness cannot be set by "
                         "scaling")
    before = (E - U) / (E + U)
    a = (U * (1 + target) / (E * (1 - target))) ** 0.25
    rescale_stream_(model, a)
    return BalanceRecord(a, before, balancedness(model))


@torch.no_grad()
def recalibrate_batchnorm_(model: nn.Module, X: torch.Tensor, *, batch_size: int | None = None) -> int:
    """Reset every BatchNorm layer's running mean/variance and recompute them on ``X``.

    ``batch_size=None`` (default) uses one pass over all of ``X`` (the exact statistics of ``X``);
    otherwise the per-batch statistics are averaged with equal weights (PyTorch's cumulative
    average, ``momentum=None``). Leaves the model in eval mode; returns the number of BatchNorm
    layers recalibrated.
    """
    check_model("model", model)
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    try:
        model.train()
        n = int(X.shape[0])
        bs = n if batch_size is None else int(batch_size)
        if bs < 1:
            raise ValueError(f"batch_size={batch_size!r} is out of range: must be an integer >= 1")
        for i in range(0, n, bs):
            model(X[i:i + bs])
    finally:
        for m, mom in zip(bns, saved):
            m.momentum = mom
        model.eval()
    return len(bns)

"""Initialization-scale interventions for any PyTorch model, named like ``torch.nn.init`` functions.

The deep-network analogues of the three knobs of the diagonal-network theory (Anguita et al. 2026,
arXiv 2602.20062; spec theory.md Section 7.4, where the mapping is marked unconfirmed, so every
choice below is ftlab's documented default, not the paper's):

* :func:`relative_scale_` -- relative scale kappa (analogue of lambda_PT): multiply the *early*
  group by ``kappa`` and the *late* group by ``1/kappa`` (``mode="both"``, default) or the early
  group only (``mode="early"``). ``kappa < 1`` <-> lambda < 0 (earlier layers smaller).
* :func:`absolute_scale_` -- absolute scale s (analogue of c_PT): multiply every parameter by ``s``
  (the "weight rescaling" of Lippl & Lindsey 2024).
* :func:`reinit_readout_` -- readout re-initialization with scale gamma (analogue of gamma_FT):
  ``normal`` (weights ~ N(0, gamma^2 / fan_in)), ``zero`` or ``constant`` (every weight = gamma).
* :func:`set_balancedness_` -- balancedness of a Transformer, ``(||W_in||^2 - ||W_out||^2) /
  (||W_in||^2 + ||W_out||^2)`` between the token embedding and the readout (unembedding), after the
  conserved quantity of Kunin et al. 2024 ("Get rich quick"); negative = upstream (embedding small).
* :func:`rescale_` -- the primitive: multiply a :class:`Selection` by a factor.
* :func:`recalibrate_batchnorm_` -- recompute BatchNorm running statistics after a rescale.

Group selection (:func:`select`): a model's *depth units* are ``model.ftlab_blocks`` when the model
defines it (ftlab's ResNet and Transformer do), otherwise its top-level children in registration
order with ``nn.Sequential``/``nn.ModuleList`` children expanded one level (so a torchvision-style
ResNet's ``layer1`` becomes ``layer1.0, layer1.1``); the readout is excluded. Unit ``i`` of ``n``
has depth fraction ``(i + 0.5) / n``; *early* is the fraction below ``split`` (0.5), *late* the rest.
Select by depth range, by a regular expression on parameter names, or by a predicate
``(name, module) -> bool`` on modules.

Every function mutates the model in place (names end in ``_``) and returns a frozen record of what
it changed. Multiplying the same selection twice without any change of those parameters in between
(e.g. calling the same line twice by mistake) raises :class:`ValueError`, like mup's guard against a
double ``set_base_shapes``; rescaling again after training is allowed, and ``allow_repeat=True``
overrides the guard.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from ftlab.core.validate import check_choice, check_finite, check_nonnegative, check_positive, check_range

ReadoutMode = Literal["normal", "zero", "constant"]
Preserve = Literal["product", "total"]
KappaMode = Literal["both", "early"]

__all__ = [
    "Selection",
    "RescaleRecord",
    "ReadoutRecord",
    "BalanceRecord",
    "depth_units",
    "find_readout",
    "select",
    "early_late",
    "rescale_",
    "relative_scale_",
    "absolute_scale_",
    "reinit_readout_",
    "balancedness",
    "set_balancedness_",
    "recalibrate_batchnorm_",
]

_READOUT_NAMES = ("fc", "head", "classifier", "readout", "unembed", "lm_head", "out")
_EMBED_NAMES = ("embed", "embedding", "tok_embed", "token_embedding", "wte", "embeddings")
_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)
_GUARD_ATTR = "_ftlab_rescales"


@dataclass(frozen=True)
class Selection:
    """A named group of parameters of one model (full dotted names, in model order)."""

    name: str
    params: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.params)


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
    """A balancedness change: the two weights, their scale factors and the value before/after."""

    embedding: str
    readout: str
    factor_in: float
    factor_out: float
    before: float
    after: float


# ------------------------------------------------------------------------------------- selection
def _get(model: nn.Module, name: str) -> nn.Module:
    try:
        return model.get_submodule(name)
    except AttributeError as exc:
        raise ValueError(f"model has no submodule {name!r}") from exc


def find_readout(model: nn.Module, readout: str | None = None) -> tuple[str, nn.Linear]:
    """The readout ``(name, nn.Linear)``: ``readout`` if given, else ``model.ftlab_readout``, else a
    top-level ``nn.Linear`` named fc/head/classifier/readout/unembed/lm_head/out, else the last
    top-level ``nn.Linear``. Raises ``ValueError`` if none is found."""
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


def depth_units(model: nn.Module) -> list[str]:
    """Names of the model's depth units in forward order, readout excluded (see module docs)."""
    names = getattr(model, "ftlab_blocks", None)
    if names is not None:
        return list(names)
    try:
        ro = find_readout(model)[0]
    except ValueError:
        ro = None
    units = []
    for n, m in model.named_children():
        if n == ro or not any(True for _ in m.parameters()):
            continue
        if isinstance(m, (nn.Sequential, nn.ModuleList)):
            units += [f"{n}.{c}" for c, sub in m.named_children() if any(True for _ in sub.parameters())]
        else:
            units.append(n)
    if not units:
        raise ValueError(f"{type(model).__name__} has no parameterized modules besides its readout")
    return units


def _norm_params(model: nn.Module) -> set[str]:
    return {f"{mn}.{pn}" if mn else pn for mn, m in model.named_modules() if isinstance(m, _NORM_TYPES)
            for pn, _ in m.named_parameters(recurse=False)}


def _params_of(model: nn.Module, module_names: list[str], *, include_norm: bool, include_bias: bool) -> list[str]:
    """Full names of the parameters under ``module_names`` ("" = whole model), filtered."""
    skip = set() if include_norm else _norm_params(model)
    out: list[str] = []
    for mn in module_names:
        for pn, _ in _get(model, mn).named_parameters():
            full = f"{mn}.{pn}" if mn else pn
            if full in skip or (not include_bias and pn.rsplit(".", 1)[-1] == "bias") or full in out:
                continue
            out.append(full)
    return out


def select(
    model: nn.Module,
    *,
    depth: tuple[float, float] | None = None,
    pattern: str | None = None,
    predicate: Callable[[str, nn.Module], bool] | None = None,
    include_readout: bool = False,
    include_norm: bool = True,
    include_bias: bool = True,
    name: str | None = None,
) -> Selection:
    """Select a group of parameters by exactly one of:

    depth : ``(lo, hi)`` fractions in [0, 1]: depth units whose fraction ``(i + 0.5)/n`` lies in
        ``[lo, hi)`` (``hi = 1`` is inclusive).
    pattern : regular expression searched in full parameter names (``re.search``).
    predicate : ``f(module_name, module) -> bool`` over ``model.named_modules()``; every parameter of
        a matching module (recursively) is selected.

    ``include_readout`` adds the readout for ``depth`` selections (pattern and predicate selections
    take what they match); ``include_norm=False`` skips normalization-layer affine parameters,
    ``include_bias=False`` skips biases. Raises ``ValueError`` if nothing matches.
    """
    given = [x is not None for x in (depth, pattern, predicate)]
    if sum(given) != 1:
        raise ValueError("select needs exactly one of depth=(lo, hi), pattern='regex' or predicate=f(name, module)")
    if depth is not None:
        lo, hi = depth
        check_range("depth[0]", lo, 0.0, 1.0)
        check_range("depth[1]", hi, lo, 1.0)
        units = depth_units(model)
        n = len(units)
        chosen = [u for i, u in enumerate(units) if lo <= (i + 0.5) / n < hi or (hi == 1.0 and (i + 0.5) / n >= lo)]
        if include_readout:
            chosen.append(find_readout(model)[0])
        params = _params_of(model, chosen, include_norm=include_norm, include_bias=include_bias)
        label = name or f"depth[{lo:g},{hi:g})"
    elif pattern is not None:
        rx = re.compile(pattern)
        params = [p for p in _params_of(model, [""], include_norm=include_norm, include_bias=include_bias) if rx.search(p)]
        label = name or f"pattern:{pattern}"
    else:
        assert predicate is not None
        chosen = [n for n, m in model.named_modules() if n and predicate(n, m)]
        params = _params_of(model, chosen, include_norm=include_norm, include_bias=include_bias)
        label = name or f"predicate:{getattr(predicate, '__name__', 'fn')}"
    if not params:
        raise ValueError(f"selection {label!r} matches no parameters of {type(model).__name__}")
    order = {n: i for i, (n, _) in enumerate(model.named_parameters())}
    return Selection(label, tuple(sorted(set(params), key=order.__getitem__)))


def early_late(model: nn.Module, *, split: float = 0.5, include_norm: bool = True, include_bias: bool = True,
               include_readout_in_late: bool = False) -> tuple[Selection, Selection]:
    """The ``early`` (depth fraction < ``split``) and ``late`` (>= ``split``) groups of a model."""
    check_range("split", split, 0.0, 1.0, lo_open=True, hi_open=True)
    early = select(model, depth=(0.0, split), name="early", include_norm=include_norm, include_bias=include_bias)
    late = select(model, depth=(split, 1.0), name="late", include_readout=include_readout_in_late,
                  include_norm=include_norm, include_bias=include_bias)
    return early, late


# ------------------------------------------------------------------------------------- rescaling
def _sq_norm(params: dict[str, torch.Tensor], names) -> float:
    return float(sum(float(params[n].detach().double().pow(2).sum()) for n in names))


def _guard(model: nn.Module, kind: str, factors: dict[str, float], allow_repeat: bool) -> None:
    params = dict(model.named_parameters())
    key = (kind, tuple(sorted(factors)))
    seen = model.__dict__.get(_GUARD_ATTR, {})
    prev = seen.get(key)
    if prev is not None and not allow_repeat:
        unchanged = all(params[n]._version == v for n, v in prev.items())
        if unchanged:
            raise ValueError(
                f"{kind} was already applied to these {len(factors)} parameters and they have not changed since; "
                "pass allow_repeat=True to multiply them again"
            )


def _remember(model: nn.Module, kind: str, factors: dict[str, float]) -> None:
    params = dict(model.named_parameters())
    seen = model.__dict__.setdefault(_GUARD_ATTR, {})
    seen[(kind, tuple(sorted(factors)))] = {n: params[n]._version for n in factors}


def _apply_factors(model: nn.Module, kind: str, factors: dict[str, float], allow_repeat: bool) -> RescaleRecord:
    for n, f in factors.items():
        check_positive(f"factor for {n}", f)
    _guard(model, kind, factors, allow_repeat)
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    before = _sq_norm(params, factors)
    with torch.no_grad():
        for n, f in factors.items():
            params[n].mul_(f)
    _remember(model, kind, factors)
    return RescaleRecord(kind, tuple(factors.items()), before, _sq_norm(params, factors))


def rescale_(model: nn.Module, selection: Selection, factor: float, *, allow_repeat: bool = False) -> RescaleRecord:
    """Multiply every parameter of ``selection`` by ``factor`` (> 0) in place; nothing else changes.

    Buffers (e.g. BatchNorm running statistics) are not touched. Returns a :class:`RescaleRecord`.
    """
    check_positive("factor", factor)
    return _apply_factors(model, f"rescale:{selection.name}", {n: float(factor) for n in selection.params}, allow_repeat)


def relative_scale_(model: nn.Module, kappa: float, *, mode: KappaMode = "both", split: float = 0.5,
                    include_norm: bool = True, include_bias: bool = True, allow_repeat: bool = False,
                    groups: tuple[Selection, Selection] | None = None) -> RescaleRecord:
    """Relative scale kappa: early group x ``kappa``, late group x ``1/kappa`` (``mode="both"``) or
    early only (``mode="early"``). ``kappa < 1`` makes earlier layers small relative to later ones
    (the analogue of lambda_PT < 0). ``groups=(early, late)`` overrides :func:`early_late`."""
    check_positive("kappa", kappa)
    check_choice("mode", mode, ("both", "early"))
    early, late = groups if groups is not None else early_late(
        model, split=split, include_norm=include_norm, include_bias=include_bias)
    factors = {n: float(kappa) for n in early.params}
    if mode == "both":
        overlap = set(early.params) & set(late.params)
        if overlap:
            raise ValueError(f"early and late groups overlap in {len(overlap)} parameters (e.g. {sorted(overlap)[0]})")
        factors.update({n: 1.0 / float(kappa) for n in late.params})
    return _apply_factors(model, f"relative:{mode}", factors, allow_repeat)


def absolute_scale_(model: nn.Module, s: float, *, include_readout: bool = True, include_norm: bool = True,
                    include_bias: bool = True, allow_repeat: bool = False) -> RescaleRecord:
    """Absolute scale s: multiply every parameter (optionally not the readout / norm affine / biases)
    by ``s``, as in the weight rescaling of Lippl & Lindsey (2024); the analogue of c_PT."""
    check_positive("s", s)
    names = _params_of(model, [""], include_norm=include_norm, include_bias=include_bias)
    if not include_readout:
        ro = find_readout(model)[0]
        names = [n for n in names if not n.startswith(ro + ".")]
    if not names:
        raise ValueError(f"absolute scale selects no parameters of {type(model).__name__}")
    sel = Selection("all", tuple(names))
    return _apply_factors(model, "absolute", {n: float(s) for n in sel.params}, allow_repeat)


# ------------------------------------------------------------------------------- readout re-init
def reinit_readout_(model: nn.Module, *, gamma: float, mode: ReadoutMode = "normal", out_features: int | None = None,
                    readout: str | None = None, seed: int | None = None) -> ReadoutRecord:
    """Replace the readout by a fresh ``nn.Linear`` with scale ``gamma`` (the analogue of gamma_FT).

    mode : ``"normal"`` weights ~ N(0, gamma^2 / fan_in) (gamma = 1 is a LeCun-normal init);
        ``"zero"`` all weights 0 (gamma must be 0); ``"constant"`` every weight equals ``gamma``.
        Biases start at 0 in every mode.
    out_features : new number of outputs (a new task's classes); default keeps the old one.
    seed : seeds the normal draw (``torch.Generator``); the global RNG is not touched.
    The new layer has the old one's dtype and device. Raises ``ValueError`` if no readout is found.
    """
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
def _embedding(model: nn.Module, embedding: str | None) -> tuple[str, nn.Parameter]:
    name = embedding or getattr(model, "ftlab_embedding", None)
    if name is None:
        children = dict(model.named_children())
        for cand in _EMBED_NAMES:
            if isinstance(children.get(cand), (nn.Embedding, nn.Linear)):
                name = cand
                break
        else:
            raise ValueError(f"{type(model).__name__} has no recognizable embedding; pass embedding='<module name>'")
    mod = _get(model, name)
    if not isinstance(mod, (nn.Embedding, nn.Linear)):
        raise ValueError(f"embedding {name!r} is a {type(mod).__name__}, not nn.Embedding or nn.Linear")
    weight = mod.weight
    assert isinstance(weight, nn.Parameter)
    return name, weight


def balancedness(model: nn.Module, *, embedding: str | None = None, readout: str | None = None) -> float:
    """``(||W_in||_F^2 - ||W_out||_F^2) / (||W_in||_F^2 + ||W_out||_F^2)`` in [-1, 1]: token embedding
    ``W_in`` vs readout ``W_out`` (Kunin et al. 2024's conserved quantity, normalized; -1 = all the
    scale in the readout, "upstream")."""
    _, w_in = _embedding(model, embedding)
    _, ro = find_readout(model, readout)
    a = float(w_in.detach().double().pow(2).sum())
    b = float(ro.weight.detach().double().pow(2).sum())
    if a + b == 0:
        raise ValueError("embedding and readout are both zero: balancedness is undefined")
    return (a - b) / (a + b)


def set_balancedness_(model: nn.Module, target: float, *, preserve: Preserve = "product", embedding: str | None = None,
                      readout: str | None = None) -> BalanceRecord:
    """Scale the embedding by ``a`` and the readout weight by ``b`` so that :func:`balancedness`
    equals ``target`` in (-1, 1).

    preserve : ``"product"`` (default) keeps ``a * b = 1`` (like :func:`relative_scale_`);
        ``"total"`` keeps ``||W_in||^2 + ||W_out||^2``. Readout bias untouched.
    """
    check_range("target", target, -1.0, 1.0, lo_open=True, hi_open=True)
    check_choice("preserve", preserve, ("product", "total"))
    ename, w_in = _embedding(model, embedding)
    rname, ro = find_readout(model, readout)
    E = float(w_in.detach().double().pow(2).sum())
    U = float(ro.weight.detach().double().pow(2).sum())
    if E == 0 or U == 0:
        raise ValueError(f"{'embedding' if E == 0 else 'readout'} weight is zero: balancedness cannot be set by scaling")
    before = (E - U) / (E + U)
    if preserve == "product":
        a = (U * (1 + target) / (E * (1 - target))) ** 0.25
        b = 1.0 / a
    else:
        T = E + U
        a = math.sqrt((1 + target) * T / (2 * E))
        b = math.sqrt((1 - target) * T / (2 * U))
    with torch.no_grad():
        w_in.mul_(a)
        ro.weight.mul_(b)
    return BalanceRecord(ename, rname, a, b, before, balancedness(model, embedding=embedding, readout=readout))


@torch.no_grad()
def recalibrate_batchnorm_(model: nn.Module, X: torch.Tensor, *, batch_size: int | None = None) -> int:
    """Reset every BatchNorm layer's running mean/variance and recompute them on ``X``.

    ``batch_size=None`` (default) uses one pass over all of ``X`` (the exact statistics of ``X``);
    otherwise the per-batch statistics are averaged with equal weights (PyTorch's cumulative
    average, ``momentum=None``). Leaves the model in eval mode; returns the number of BatchNorm
    layers recalibrated.

    Needed after rescaling a BatchNorm network: a rescale changes the activations but not the
    running statistics collected before it, and a short fine-tuning run does not refresh them, so
    eval-mode outputs would be mis-normalized.
    """
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

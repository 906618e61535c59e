"""Transport spec: which input and output space each parameter lives in.

In the spirit of git-re-basin's permutation specs and mergekit's architecture files, a
:class:`TransportSpec` is declarative: a set of capture :class:`Point` s (where a space is
observed: the input and output of a layer) and, for every parameter (and the BatchNorm running
statistics), the :class:`Rule` s telling how its task vector is carried once the maps ``R_in``
(``d_in^A x d_in^B``) and ``R_out`` (``d_out^A x d_out^B``) of its point are known (BiCo,
arXiv 2605.28444, sec. "transfer rule"):

==============  ======================================  =======================================
rule kind       parameter (target shape)                transported delta
==============  ======================================  =======================================
``weight``      ``(out, in)`` (conv: ``(out, in, k, k)``  ``R_out^T tau R_in`` (conv reshaped to
                as ``out x in*k*k``)                     ``out x in*k*k`` and back; grouped convs
                                                         expanded to their dense block-diagonal
                                                         form and projected back onto B's groups)
``weight_t``    ``(in, out)`` (HF ``Conv1D``, bare      ``R_in^T tau R_out``
                ``x @ P`` projections)
``embedding``   ``(vocab, d)`` (a lookup)               ``tau R_out`` (rows through a vocabulary
                                                         index map when the vocabularies differ)
``out_vector``  ``(out,)`` biases, norm biases,         ``R_out^T tau``
                BatchNorm running means
``diagonal``    ``(c, ...)`` a per-channel operator:     ``tau_B[c] = sum_a R[a, c]^2 tau_A[a]``,
                depthwise kernels, BatchNorm running     the diagonal of ``R^T diag(tau_A) R`` (exact
                variances, norm gains (``norm_gain=       for permutations; the Frobenius projection
                "diagonal"``)                            onto per-channel operators otherwise)
``zero``        anything                                zero (the target keeps its base value)
==============  ======================================  =======================================

A rule may cover one block of a fused parameter (``part=(i, n)``: block ``i`` of ``n`` equal
blocks along dim 0), e.g. the q/k/v thirds of ``nn.MultiheadAttention.in_proj_weight``.

:func:`infer_spec` builds the spec for ``nn.Linear``, ``nn.Conv2d`` (any ``groups``; a depthwise
convolution, ``groups == in == out``, is one :class:`Point` of kind ``depthwise`` whose single
channel map acts on its input and output, so the transported kernel stays depthwise),
``nn.Embedding`` (also relative-position bias tables: ``num_buckets x heads``, mapped on the head
axis), ``nn.MultiheadAttention``, LayerNorm/RMSNorm/BatchNorm/GroupNorm (BatchNorm's running mean
and variance too) and HF ``Conv1D``, which covers Hugging Face BERT, ViT, CLIP, T5, MPNet and
GPT-2. A 2-D parameter that belongs to no supported layer (OpenCLIP's ``visual.proj``,
``text_projection``) is a bare projection ``x @ P`` (a point named after the parameter, captured
where it is multiplied). Parameters whose names match :data:`DEFAULT_ZERO` (class/positional
embeddings, logit scale, mask/register tokens) get a zero delta, as in the public third-party BiCo
reimplementation in github.com/apanariello4/merge-and-rebase (not the BiCo authors' code); this
default is not confirmed by the BiCo paper [U]. Any other parameter of an
unknown module is an error naming it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from ftlab.core.hooks import is_hf_conv1d, is_norm, mha_points

__all__ = ["DEFAULT_ZERO", "RELATIVE_BIAS", "NormGain", "Point", "Rule", "TransportSpec", "infer_spec"]

#: Parameter-name globs that get a zero delta by default ([U]: follows the reference code, not the paper).
DEFAULT_ZERO: tuple[str, ...] = (
    "*cls_token", "*class_embedding", "*position_embedding*", "*positional_embedding*", "*pos_embed*",
    "*logit_scale", "*mask_token", "*register_tokens",
)

#: Module-name globs of embeddings indexed by relative-position buckets rather than by the batch's tokens
#: (T5, MPNet): their rows are ``(query, key)`` position pairs, so no padding mask applies to them.
RELATIVE_BIAS: tuple[str, ...] = ("*relative_attention_bias*",)

RULE_KINDS = ("weight", "weight_t", "embedding", "out_vector", "diagonal", "zero")
POINT_KINDS = ("linear", "conv2d", "depthwise", "embedding", "norm", "norm2d", "param")
NormGain = Literal["vector", "diagonal"]


@dataclass(frozen=True)
class Point:
    """A capture point: a module (or MHA part) whose input and output spaces define maps.

    ``kind`` decides how captured tensors become rows: ``linear`` (``(..., d)``), ``conv2d``
    (inputs unfolded to ``in*k*k`` patches, outputs ``(B, H*W, C)``; ``groups`` > 1 for a grouped
    convolution, whose unfolded input is dense), ``depthwise`` (inputs and outputs as channel rows
    per pixel; one shared channel map), ``embedding`` (input space = the vocabulary, mapped by
    identity or an index map), ``norm`` (last axis), ``norm2d`` (channel axis 1), ``param`` (a bare
    ``x @ P`` projection named after its parameter; last axis). ``tokens`` is False for points
    whose rows are not the batch's tokens (relative-position bias tables), so no padding mask
    applies.
    """

    name: str
    kind: str
    in_dim: int
    out_dim: int
    conv: tuple | None = None  # (kernel_size, stride, padding, dilation) for conv2d / depthwise
    groups: int = 1
    tokens: bool = True

    def __post_init__(self):
        if self.kind not in POINT_KINDS:
            raise ValueError(f"point kind={self.kind!r} is invalid: must be one of {', '.join(POINT_KINDS)}")


@dataclass(frozen=True)
class Rule:
    """How one parameter (or one block of it, ``part=(i, n)``) is transported with its point's maps."""

    param: str
    kind: str
    point: str | None = None
    part: tuple[int, int] = (0, 1)

    def __post_init__(self):
        if self.kind not in RULE_KINDS:
            raise ValueError(f"rule kind={self.kind!r} is invalid: must be one of {', '.join(RULE_KINDS)}")
        if self.kind != "zero" and self.point is None:
            raise ValueError(f"rule for {self.param!r} of kind {self.kind!r} needs a point")


@dataclass(frozen=True)
class TransportSpec:
    """Points and per-parameter rules of one model (see the module docstring)."""

    points: Mapping[str, Point] = field(default_factory=dict)
    rules: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)

    def used_points(self) -> list[str]:
        """Points referenced by at least one non-zero rule, in spec order."""
        seen = dict.fromkeys(r.point for rs in self.rules.values() for r in rs if r.kind != "zero")
        return [p for p in self.points if p in seen]


def _j(name: str, attr: str) -> str:
    return f"{name}.{attr}" if name else attr


def _linear_rules(name: str, mod: nn.Module, weight_kind: str = "weight") -> tuple[Point, dict]:
    w = mod.weight
    assert isinstance(w, torch.Tensor)
    d_out, d_in = (w.shape[1], w.shape[0]) if weight_kind == "weight_t" else (w.shape[0], w.shape[1])
    pt = Point(name, "linear", int(d_in), int(d_out))
    rules = {_j(name, "weight"): (Rule(_j(name, "weight"), weight_kind, name),)}
    if getattr(mod, "bias", None) is not None:
        rules[_j(name, "bias")] = (Rule(_j(name, "bias"), "out_vector", name),)
    return pt, rules


def _conv_padding(name: str, mod: nn.Conv2d) -> tuple[int, int]:
    padding = mod.padding
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        total = [d * (k - 1) for d, k in zip(mod.dilation, mod.kernel_size)]
        if any(t % 2 for t in total):
            raise ValueError(f"module {name!r} uses padding='same' with an even kernel (asymmetric padding): "
                             "give a hand-written spec")
        return (total[0] // 2, total[1] // 2)
    assert isinstance(padding, tuple)
    return (int(padding[0]), int(padding[1]))


def _norm_rules(name: str, mod: nn.Module, norm_gain: NormGain) -> tuple[list[Point], dict]:
    own = dict(mod.named_parameters(recurse=False))
    bufs = dict(mod.named_buffers(recurse=False))
    first = next(iter(own.values())) if own else next(v for v in bufs.values() if v.is_floating_point())
    d = int(first.shape[0])
    kind = "norm2d" if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm)) else "norm"
    pt = Point(name, kind, d, d)
    rules = {}
    for p in own:
        k = "diagonal" if (p == "weight" and norm_gain == "diagonal") else "out_vector"
        rules[_j(name, p)] = (Rule(_j(name, p), k, name),)
    # BatchNorm's running statistics (buffers): the mean is a vector of the channel space, the variance a
    # per-channel quantity (diagonal rule, so it stays a variance under permutations)
    for b, kind_b in (("running_mean", "out_vector"), ("running_var", "diagonal")):
        t = bufs.get(b)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.ndim == 1:
            rules[_j(name, b)] = (Rule(_j(name, b), kind_b, name),)
    return [pt], rules


def _module_spec(name: str, mod: nn.Module, norm_gain: NormGain = "vector") -> tuple[list[Point], dict] | None:
    """Points and rules for one supported module, or None if the module type is unknown."""
    if isinstance(mod, nn.Linear):
        pt, rules = _linear_rules(name, mod)
        return [pt], rules
    if is_hf_conv1d(mod):
        pt, rules = _linear_rules(name, mod, "weight_t")
        return [pt], rules
    if isinstance(mod, nn.Conv2d):
        padding = _conv_padding(name, mod)
        if mod.padding_mode != "zeros":
            raise ValueError(f"module {name!r} uses padding_mode={mod.padding_mode!r}: only zero padding is supported")
        c_out, c_in_g, kh, kw = mod.weight.shape
        g = int(mod.groups)
        c_in = c_in_g * g
        conv = (tuple(mod.kernel_size), tuple(mod.stride), tuple(padding), tuple(mod.dilation))
        rules = {}
        if g > 1 and g == c_in == c_out:  # depthwise: one channel map on both sides keeps it depthwise
            pt = Point(name, "depthwise", int(c_in), int(c_out), conv, groups=g)
            rules[_j(name, "weight")] = (Rule(_j(name, "weight"), "diagonal", name),)
        else:
            pt = Point(name, "conv2d", int(c_in * kh * kw), int(c_out), conv, groups=g)
            rules[_j(name, "weight")] = (Rule(_j(name, "weight"), "weight", name),)
        if mod.bias is not None:
            rules[_j(name, "bias")] = (Rule(_j(name, "bias"), "out_vector", name),)
        return [pt], rules
    if isinstance(mod, nn.Embedding):
        tokens = not any(fnmatch.fnmatchcase(name, pat) for pat in RELATIVE_BIAS)
        pt = Point(name, "embedding", int(mod.num_embeddings), int(mod.embedding_dim), tokens=tokens)
        return [pt], {_j(name, "weight"): (Rule(_j(name, "weight"), "embedding", name),)}
    if isinstance(mod, nn.MultiheadAttention):
        if mod.bias_k is not None or mod.add_zero_attn:
            raise ValueError(f"module {name!r} (MultiheadAttention with add_bias_kv/add_zero_attn) is not supported")
        E = mod.embed_dim
        q, k, v, o = mha_points(name)
        pts = [Point(q, "linear", E, E), Point(k, "linear", mod.kdim, E),
               Point(v, "linear", mod.vdim, E), Point(o, "linear", E, E)]
        rules = {}
        if mod._qkv_same_embed_dim:
            rules[_j(name, "in_proj_weight")] = tuple(Rule(_j(name, "in_proj_weight"), "weight", p, (i, 3))
                                                    for i, p in enumerate((q, k, v)))
        else:
            for p, attr in ((q, "q_proj_weight"), (k, "k_proj_weight"), (v, "v_proj_weight")):
                rules[_j(name, attr)] = (Rule(_j(name, attr), "weight", p),)
        if mod.in_proj_bias is not None:
            rules[_j(name, "in_proj_bias")] = tuple(Rule(_j(name, "in_proj_bias"), "out_vector", p, (i, 3))
                                                  for i, p in enumerate((q, k, v)))
        rules[_j(name, "out_proj.weight")] = (Rule(_j(name, "out_proj.weight"), "weight", o),)
        if mod.out_proj.bias is not None:
            rules[_j(name, "out_proj.bias")] = (Rule(_j(name, "out_proj.bias"), "out_vector", o),)
        return pts, rules
    if is_norm(mod):
        return _norm_rules(name, mod, norm_gain)
    return None


def infer_spec(model: nn.Module, *, zero_params: Iterable[str] = DEFAULT_ZERO,
               overrides: Mapping[str, Iterable[Rule]] | None = None,
               extra_points: Iterable[Point] = (), norm_gain: NormGain = "vector") -> TransportSpec:
    """Infer the transport spec of ``model``.

    Parameters
    ----------
    zero_params:
        Parameter-name globs whose delta is set to zero (default :data:`DEFAULT_ZERO`, [U]).
    overrides:
        Hand-written rules for parameters of modules ftlab does not understand (or to replace
        inferred ones), ``{param_name: [Rule, ...]}``; their points come from ``extra_points`` or
        from the inferred points.
    extra_points:
        Additional capture points (module names) referenced by ``overrides``.
    norm_gain:
        Rule for norm gains: ``"vector"`` (``R_out^T tau``, as github.com/apanariello4/merge-and-rebase does) or
        ``"diagonal"`` (the diagonal of ``R^T diag(tau) R``: a gain is a per-channel scale).

    A module ftlab does not know whose remaining parameters (not zeroed, not overridden) are all
    2-D is read as bare projections ``x @ P`` (one point per parameter, captured where it is
    multiplied; calibration fails naming it if it is used otherwise). Raises ``ValueError`` naming
    the first parameter that no rule covers.
    """
    if norm_gain not in ("vector", "diagonal"):
        raise ValueError(f"norm_gain={norm_gain!r} is invalid: must be 'vector' or 'diagonal'")
    zero_params = tuple(zero_params)
    overrides = dict(overrides or {})
    points: dict[str, Point] = {p.name: p for p in extra_points}
    rules: dict[str, tuple[Rule, ...]] = {}
    mha_names = [n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]

    def zeroed(f: str) -> bool:
        return any(fnmatch.fnmatchcase(f, z) for z in zero_params)

    for name, mod in model.named_modules():
        own = dict(mod.named_parameters(recurse=False))
        if not own or any(name.startswith(h + ".") for h in mha_names):
            continue
        full = {_j(name, p): t for p, t in own.items()}
        if all(zeroed(f) or f in overrides for f in full):
            continue  # every parameter handled below without needing the module type
        res = _module_spec(name, mod, norm_gain)
        if res is None:
            uncovered = {f: t for f, t in full.items() if f not in overrides and not zeroed(f)}
            bad = [f for f, t in uncovered.items() if t.ndim != 2]
            if bad:
                raise ValueError(f"module {name!r} ({type(mod).__name__}) is not understood by the transfer: its "
                                 f"parameter {bad[0]!r} (shape {tuple(uncovered[bad[0]].shape)}) has no transport "
                                 "rule; pass overrides=/zero_params= or a hand-written spec")
            for f, t in uncovered.items():  # bare projections x @ P, P stored (in, out)
                points[f] = Point(f, "param", int(t.shape[0]), int(t.shape[1]))
                rules[f] = (Rule(f, "weight_t", f),)
            continue
        pts, rs = res
        for p in pts:
            points[p.name] = p
        rules.update(rs)
    for pname, _ in model.named_parameters():
        if zeroed(pname):
            rules[pname] = (Rule(pname, "zero"),)
    for pname, given in overrides.items():
        written = tuple(given)
        for r in written:
            if r.point is not None and r.point not in points:
                raise ValueError(f"override for {pname!r} refers to unknown point {r.point!r}")
        rules[pname] = written
    params = dict(model.named_parameters())
    buffers = {k: v for k, v in model.named_buffers() if v.is_floating_point()}
    # a tied weight (e.g. an LM head sharing the embedding table) is listed once by named_parameters;
    # its other owners' rules are dropped, so the shared tensor is transported once, by its first owner
    rules = {p: rs for p, rs in rules.items() if p in params or p in buffers or p in overrides}
    missing = [p for p in params if p not in rules]
    if missing:
        raise ValueError(f"parameter {missing[0]!r} has no transport rule")
    extra = [p for p in rules if p not in params and p not in buffers]
    if extra:
        raise ValueError(f"transport rule for {extra[0]!r}, which is not a parameter of the model")
    return TransportSpec(points=points, rules=rules)

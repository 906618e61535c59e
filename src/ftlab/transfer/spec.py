"""Transport spec: which input and output space each parameter lives in.

In the spirit of git-re-basin's permutation specs and mergekit's architecture files, a
:class:`TransportSpec` is declarative: a set of capture :class:`Point` s (where a space is
observed: the input and output of a layer) and, for every parameter (and the BatchNorm running
statistics), the :class:`Rule` s telling how its task vector is carried once the maps ``R_in``
(``d_in^A x d_in^B``) and ``R_out`` (``d_out^A x d_out^B``) of its point are known (BiCo,
arXiv 2605.28444, sec. "transfer rule"; the rules are listed in :mod:`ftlab.transfer.kinds.rules`).
A rule may cover one block of a fused parameter (``part=(i, n)``: block ``i`` of ``n`` equal
blocks along dim 0), e.g. the q/k/v thirds of ``nn.MultiheadAttention.in_proj_weight``.

:func:`infer_spec` asks the layer kinds (:mod:`ftlab.transfer.kinds`, e.g. ``nn.Linear``, convolutions,
``nn.Embedding``, ``nn.MultiheadAttention``, norm layers, HF ``Conv1D``) for the points and rules of
every module they recognise, which covers Hugging Face BERT, ViT, CLIP, T5, MPNet, GPT-2 and Llama. A 2-D
parameter that belongs to no supported layer (OpenCLIP's ``visual.proj``, ``text_projection``) is a bare
projection ``x @ P`` (a point named after the parameter, captured where it is multiplied). Parameters
whose names match :data:`DEFAULT_ZERO` (class/positional embeddings, logit scale, mask/register tokens)
get a zero delta, as in the public third-party BiCo reimplementation in
github.com/apanariello4/merge-and-rebase (not the BiCo authors' code); this default is not confirmed by
the BiCo paper [U]. Any other parameter of an unknown module is an error naming it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from ftlab.transfer.kinds import NormGain, Point, Rule, SpecContext, kind_for_module
from ftlab.transfer.kinds.base import joined
from ftlab.transfer.kinds.embedding import RELATIVE_BIAS
from ftlab.transfer.kinds.param import bare_projection

__all__ = ["DEFAULT_ZERO", "RELATIVE_BIAS", "NormGain", "Point", "Rule", "TransportSpec", "infer_spec"]

#: Parameter-name globs that get a zero delta by default ([U]: follows the reference code, not the paper).
DEFAULT_ZERO: tuple[str, ...] = (
    "*cls_token", "*class_embedding", "*position_embedding*", "*positional_embedding*", "*pos_embed*",
    "*logit_scale", "*mask_token", "*register_tokens",
)

Rules = dict[str, tuple[Rule, ...]]


@dataclass(frozen=True)
class TransportSpec:
    """Points and per-parameter rules of one model (see the module docstring)."""

    points: Mapping[str, Point] = field(default_factory=dict)
    rules: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict)

    def used_points(self) -> list[str]:
        """Points referenced by at least one rule that carries a delta, in spec order."""
        seen = dict.fromkeys(r.point for rs in self.rules.values() for r in rs if r.carries)
        return [p for p in self.points if p in seen]


def _unknown_module(name: str, mod: nn.Module, uncovered: Mapping[str, torch.Tensor]) -> tuple[list[Point], Rules]:
    """A module no kind knows: its remaining parameters must all be 2-D, read as bare projections ``x @ P``."""
    bad = [f for f, t in uncovered.items() if t.ndim != 2]
    if bad:
        raise ValueError(f"module {name!r} ({type(mod).__name__}) is not understood by the transfer: its "
                         f"parameter {bad[0]!r} (shape {tuple(uncovered[bad[0]].shape)}) has no transport "
                         "rule; pass overrides=/zero_params= or a hand-written spec")
    points, rules = [], {}
    for f, t in uncovered.items():
        pt, rs = bare_projection(f, t)
        points.append(pt)
        rules[f] = rs
    return points, rules


def _module_rules(model: nn.Module, ctx: SpecContext, handled) -> tuple[dict[str, Point], Rules]:
    """Points and rules of every module with parameters, by its kind (children of a kind that owns them skipped);
    ``handled(full parameter name)`` is True for parameters zeroed or overridden (they need no kind)."""
    points: dict[str, Point] = {}
    rules: Rules = {}
    owners = [n for n, m in model.named_modules() if (k := kind_for_module(m)) is not None and k.owns_children]
    for name, mod in model.named_modules():
        own = dict(mod.named_parameters(recurse=False))
        if not own or any(name.startswith(h + ".") for h in owners):
            continue
        full = {joined(name, p): t for p, t in own.items()}
        if all(handled(f) for f in full):
            continue  # every parameter handled without needing the module type
        kind = kind_for_module(mod)
        if kind is None:
            pts, rs = _unknown_module(name, mod, {f: t for f, t in full.items() if not handled(f)})
        else:
            pts, rs = kind.spec(name, mod, ctx)
        points.update((p.name, p) for p in pts)
        rules.update(rs)
    return points, rules


def _check_rules(model: nn.Module, rules: Rules, overrides: Mapping) -> Rules:
    """Drop the rules of tied weights' other owners; every parameter needs a rule and every rule a parameter."""
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
    return rules


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

    def zeroed(f: str) -> bool:
        return any(fnmatch.fnmatchcase(f, z) for z in zero_params)

    found, rules = _module_rules(model, SpecContext(norm_gain), lambda f: zeroed(f) or f in overrides)
    points: dict[str, Point] = {p.name: p for p in extra_points}
    points.update(found)
    for pname, _ in model.named_parameters():
        if zeroed(pname):
            rules[pname] = (Rule(pname, "zero"),)
    for pname, given in overrides.items():
        written = tuple(given)
        for r in written:
            if r.point is not None and r.point not in points:
                raise ValueError(f"override for {pname!r} refers to unknown point {r.point!r}")
        rules[pname] = written
    return TransportSpec(points=points, rules=_check_rules(model, rules, overrides))

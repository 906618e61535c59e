"""TransFusion: re-basin of a task vector by weight matching of the two bases (equal architectures).

TransFusion (Rinaldi, Panariello, Salici, Liu, Ciccone, Porrello, Calderara, *Update Your Transformer to the Latest
Release: Re-Basin of Task Vectors*, ICML 2025, arXiv 2505.22697; public code ``aimagelab/TransFusion``) carries a
task vector between two models of the **same architecture** pretrained differently. It reads no data: it matches the
*weights* of the two bases ``theta_A`` and ``theta_B`` by permutations of their hidden units, then permutes ``tau_A``
the same way. ftlab's implementation (written from the paper's description and the public code's behaviour):

1. **Spaces** (:class:`PermutationSpec`). Every axis of every parameter lives in a named space (a residual stream,
   the hidden units of an MLP, the query/key or value dimensions of one attention layer) or in none (inputs of the
   first layer, classes of the last); a permutation of a space renames its coordinates in every parameter at once,
   which leaves the function unchanged. :func:`infer_permutation_spec` builds the spec of plain ``nn.Sequential``
   stacks and of pre-norm ViTs shaped like :class:`ftlab.models.vit.ViT`; other models take a hand-written spec.
2. **Heads first.** The spaces of one attention layer are split into ``heads`` blocks that move together. Heads are
   matched by a spectral cost, the distance between the singular values of their weight blocks (summed over the
   layer's q, k, v and output weights), which no permutation inside a head or of the residual stream changes; one
   linear assignment per attention layer (minimising the cost) pairs B's heads with A's.
3. **Then units**, by the iterative weight matching of Git Re-Basin (Ainsworth, Hayase, Srinivasa, arXiv
   2209.04836): one space at a time (in an order drawn from ``seed``), the permutation maximising ``sum <W_B,
   P(W_A)>`` over the parameters that touch it, given the other spaces' current permutations, is a linear
   assignment; the sweep repeats until no permutation changes (at most ``max_iter`` sweeps). Inside a head-split
   space the assignment runs within each matched head pair.
4. ``tau_B = P(tau_A)``: every axis of every entry of ``tau_A`` permuted by its space.

Choices that are ftlab's [U]: the query/key and the value dimensions of a head get separate within-head
permutations (the public code uses one for q, k and v; separate ones also recover a copy permuted that way, and one
shared permutation is a special case); one residual-stream permutation for the whole network (the public code lets
each sub-layer's residual carry its own, through explicit shortcut matrices, which a plain residual network does not
have); spectral head costs use every singular value.

The method reads both bases' weights (``calibration="bases"``): :func:`ftlab.transfer.fit_transfer` hands them to
it like any other method's statistics. :meth:`TransFusion.bind` fixes the bases (and a hand-written
:class:`PermutationSpec`) ahead, for models whose spec cannot be inferred. It fits no Procrustes maps (``fits`` is
empty).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ftlab.core.validate import check_int
from ftlab.transfer.align import MapFit
from ftlab.transfer.methods.registry import Bases, Calibration, Requirements, Statistics, register
from ftlab.transfer.problem import TransferProblem
from ftlab.transfer.spec import Point
from ftlab.transfer.task_vector import TaskVector

__all__ = ["FittedPermutation", "PermutationSpec", "TransFusion", "TransFusionOptions", "infer_permutation_spec",
           "match_weights", "permute"]


@dataclass(frozen=True)
class PermutationSpec:
    """Which space each axis of each entry lives in.

    ``axes[name]``: one space name (or None: not permuted) per axis of entry ``name`` (a parameter or a floating
    buffer such as BatchNorm's running mean). ``heads[space] = (group, n)``: the space is split into ``n`` equal
    head blocks, and the spaces of one ``group`` (the q/k and v spaces of one attention layer) share the head
    assignment.
    """

    axes: Mapping[str, tuple[str | None, ...]]
    heads: Mapping[str, tuple[str, int]] = field(default_factory=dict)

    def spaces(self) -> dict[str, list[tuple[str, int]]]:
        """``{space: [(entry, axis), ...]}`` in first-seen order."""
        out: dict[str, list[tuple[str, int]]] = {}
        for name, ax in self.axes.items():
            for i, s in enumerate(ax):
                if s is not None:
                    out.setdefault(s, []).append((name, i))
        return out

    def sizes(self, entries: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """``{space: size}``, checking every axis of a space has the same length in ``entries``."""
        out: dict[str, int] = {}
        for s, uses in self.spaces().items():
            for name, ax in uses:
                if name not in entries:
                    raise ValueError(f"permutation spec names {name!r}, which the model does not have")
                n = int(entries[name].shape[ax])
                if out.setdefault(s, n) != n:
                    raise ValueError(f"space {s!r} has length {out[s]} and {n} (axis {ax} of {name!r})")
        for s, (_, h) in self.heads.items():
            if s in out and out[s] % h:
                raise ValueError(f"space {s!r} of length {out[s]} cannot be split into {h} heads")
        return out


# ------------------------------------------------------------------------------------------ specs
def _entries(model: nn.Module) -> dict[str, torch.Tensor]:
    out = {k: v.detach() for k, v in model.named_parameters()}
    for k, v in model.named_buffers():
        if v.is_floating_point() and k.rsplit(".", 1)[-1] in ("running_mean", "running_var"):
            out[k] = v.detach()
    return out


def _j(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _sequential_spec(model: nn.Sequential, prefix: str = "") -> dict[str, tuple[str | None, ...]]:
    """A plain stack: each Linear's output is a new hidden space, except the last (its classes are kept)."""
    linears = [i for i, m in enumerate(model) if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the sequential model has no nn.Linear layer")
    axes: dict[str, tuple[str | None, ...]] = {}
    space: str | None = None
    for i, m in enumerate(model):
        own = dict(m.named_parameters(recurse=False))
        if isinstance(m, nn.Linear):
            out = None if i == linears[-1] else _j(prefix, f"h{i}")
            axes[_j(prefix, f"{i}.weight")] = (out, space)
            if m.bias is not None:
                axes[_j(prefix, f"{i}.bias")] = (out,)
            space = out
        elif isinstance(m, (nn.LayerNorm, nn.BatchNorm1d)):
            names = [*own, *(b for b in ("running_mean", "running_var") if getattr(m, b, None) is not None)]
            for p in names:
                axes[_j(prefix, f"{i}.{p}")] = (space,)
        elif own or any(True for _ in m.parameters()):
            raise ValueError(f"module {_j(prefix, str(i))!r} ({type(m).__name__}) has parameters: transfusion infers "
                             "specs of stacks of Linear, LayerNorm, BatchNorm1d and parameter-free layers only")
    return axes


def _blocks(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, nn.ModuleList) else []


def _is_vit(model: nn.Module) -> bool:
    need = ("patch_embed", "cls_token", "pos_embed", "blocks", "ln_final", "head")
    if not all(hasattr(model, a) for a in need) or not isinstance(model.blocks, nn.ModuleList):
        return False
    for blk in _blocks(model):
        attn, mlp = getattr(blk, "attn", None), getattr(blk, "mlp", None)
        if attn is None or mlp is None or not isinstance(getattr(attn, "heads", None), int):
            return False
        if not all(isinstance(getattr(attn, p, None), nn.Linear) for p in ("q", "k", "v", "out")):
            return False
        if not all(isinstance(getattr(mlp, p, None), nn.Linear) for p in ("fc1", "fc2")):
            return False
    return True


def _vit_spec(model: nn.Module) -> tuple[dict[str, tuple[str | None, ...]], dict[str, tuple[str, int]]]:
    """A pre-norm ViT: one residual space ``res``; per block ``b<i>.qk`` / ``b<i>.v`` (head-split, one head group)
    and ``b<i>.mlp``."""
    r = "res"
    axes: dict[str, tuple[str | None, ...]] = {"patch_embed.weight": (r, None), "patch_embed.bias": (r,),
                                               "cls_token.weight": (None, r), "pos_embed.weight": (None, r),
                                               "ln_final.weight": (r,), "ln_final.bias": (r,),
                                               "head.weight": (None, r), "head.bias": (None,)}
    heads: dict[str, tuple[str, int]] = {}
    for i, blk in enumerate(_blocks(model)):
        b, qk, v, mlp = f"blocks.{i}", f"b{i}.qk", f"b{i}.v", f"b{i}.mlp"
        attn: Any = blk.get_submodule("attn")
        heads[qk] = heads[v] = (f"b{i}.heads", int(attn.heads))
        for ln in ("ln1", "ln2"):
            axes.update({f"{b}.{ln}.weight": (r,), f"{b}.{ln}.bias": (r,)})
        for p, s in (("q", qk), ("k", qk), ("v", v)):
            axes.update({f"{b}.attn.{p}.weight": (s, r), f"{b}.attn.{p}.bias": (s,)})
        axes.update({f"{b}.attn.out.weight": (r, v), f"{b}.attn.out.bias": (r,),
                     f"{b}.mlp.fc1.weight": (mlp, r), f"{b}.mlp.fc1.bias": (mlp,),
                     f"{b}.mlp.fc2.weight": (r, mlp), f"{b}.mlp.fc2.bias": (r,)})
    return axes, heads


def infer_permutation_spec(model: nn.Module) -> PermutationSpec:
    """The permutation spec of ``model``: a plain ``nn.Sequential`` stack (Linear, LayerNorm, BatchNorm1d and
    parameter-free layers), or a pre-norm ViT with ``patch_embed``, ``cls_token``, ``pos_embed``, ``blocks[i].{ln1,
    attn.{q,k,v,out}, ln2, mlp.{fc1,fc2}}``, ``ln_final`` and ``head`` (:class:`ftlab.models.vit.ViT`). Every
    parameter must be covered; anything else is a ``ValueError`` naming the model type (write a
    :class:`PermutationSpec` by hand)."""
    if isinstance(model, nn.Sequential):
        spec = PermutationSpec(_sequential_spec(model))
    elif _is_vit(model):
        spec = PermutationSpec(*_vit_spec(model))
    else:
        raise ValueError(f"transfusion cannot infer the permutation spec of a {type(model).__name__}: it knows "
                         "nn.Sequential stacks and pre-norm ViTs; give a PermutationSpec by hand")
    missing = [k for k in _entries(model) if k not in spec.axes]
    if missing:
        raise ValueError(f"the permutation spec does not cover {missing[0]!r} of the {type(model).__name__}")
    return spec


# -------------------------------------------------------------------------------------- matching
def _assign(score: np.ndarray, *, maximize: bool) -> np.ndarray:
    """``col[row]`` of the linear assignment of a square score matrix."""
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(score, maximize=maximize)
    out = np.empty(score.shape[0], dtype=np.int64)
    out[rows] = cols
    return out


def permute(t: torch.Tensor, spaces: tuple[str | None, ...], perms: Mapping[str, torch.Tensor],
            skip: int | None = None) -> torch.Tensor:
    """``t`` with every axis whose space has a permutation in ``perms`` re-indexed (``t[perm]`` on that axis: B's
    coordinate ``b`` takes A's coordinate ``perm[b]``); axis ``skip`` is left as it is."""
    for ax, s in enumerate(spaces):
        if s is not None and ax != skip and s in perms:
            t = t.index_select(ax, perms[s])
    return t


def _head_blocks(t: torch.Tensor, ax: int, n: int) -> torch.Tensor:
    """``t`` as ``n`` head blocks along axis ``ax``: shape ``(n, t.shape[ax] / n, rest)``, float64."""
    m = t.movedim(ax, 0).reshape(t.shape[ax], -1).double()
    return m.reshape(n, m.shape[0] // n, -1)


def _head_costs(spec: PermutationSpec, group: str, a: Mapping[str, torch.Tensor],
                b: Mapping[str, torch.Tensor]) -> np.ndarray:
    """``cost[h_b, h_a]``: summed distance of the singular values of the heads' weight blocks (matrices only)."""
    cost = None
    spaces = spec.spaces()
    for s, (g, n) in spec.heads.items():
        if g != group:
            continue
        for name, ax in spaces[s]:
            if a[name].ndim < 2:
                continue
            sa = torch.linalg.svdvals(_head_blocks(a[name], ax, n))
            sb = torch.linalg.svdvals(_head_blocks(b[name], ax, n))
            c = torch.cdist(sb, sa).numpy()
            cost = c if cost is None else cost + c
    if cost is None:
        raise ValueError(f"head group {group!r} has no weight matrix to match heads on")
    return cost


def _similarity(spec: PermutationSpec, space: str, a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor],
                perms: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``S[i_b, i_a] = sum <row i_b of W_B, row i_a of P(W_A)>`` over the axes of ``space`` (others permuted)."""
    total = None
    for name, ax in spec.spaces()[space]:
        wa = permute(a[name], spec.axes[name], perms, skip=ax).movedim(ax, 0)
        wb = b[name].movedim(ax, 0)
        s = wb.reshape(wb.shape[0], -1).double() @ wa.reshape(wa.shape[0], -1).double().T
        total = s if total is None else total + s
    assert total is not None
    return total


def _update(spec: PermutationSpec, space: str, a, b, perms: dict[str, torch.Tensor],
            head_map: Mapping[str, np.ndarray]) -> bool:
    """Re-solve ``space``'s permutation given the others; whether it changed."""
    S = _similarity(spec, space, a, b, perms).numpy()
    if space in spec.heads:
        group, n = spec.heads[space]
        dh = S.shape[0] // n
        new = np.empty(S.shape[0], dtype=np.int64)
        for hb, ha in enumerate(head_map[group]):
            block = S[hb * dh:(hb + 1) * dh, ha * dh:(ha + 1) * dh]
            new[hb * dh:(hb + 1) * dh] = ha * dh + _assign(block, maximize=True)
    else:
        new = _assign(S, maximize=True)
    old = perms[space].numpy()
    if np.array_equal(new, old):
        return False
    if S[np.arange(len(new)), new].sum() <= S[np.arange(len(old)), old].sum() + 1e-12 * np.abs(S).sum():
        return False  # a tie: keep the current permutation (no cycling)
    perms[space] = torch.from_numpy(new)
    return True


def match_weights(spec: PermutationSpec, source: Mapping[str, torch.Tensor], target: Mapping[str, torch.Tensor], *,
                  max_iter: int = 100, seed: int = 0) -> tuple[dict[str, torch.Tensor], int]:
    """Permutations ``{space: perm}`` (``perm[b]`` = A's coordinate matched to B's ``b``) aligning ``source`` (A's
    weights) to ``target`` (B's): heads by spectral costs, then iterative weight matching (module docstring).
    Returns the permutations and the number of sweeps run."""
    source = {k: v.detach().cpu() for k, v in source.items()}
    target = {k: v.detach().cpu() for k, v in target.items()}
    sizes = _check_equal_sizes(spec, source, target)
    perms = {s: torch.arange(n) for s, n in sizes.items()}
    groups = dict.fromkeys(g for g, _ in spec.heads.values())
    head_map = {g: _assign(_head_costs(spec, g, source, target), maximize=False) for g in groups}
    for s, (g, n) in spec.heads.items():  # start from the matched heads, identity inside each
        dh = sizes[s] // n
        perms[s] = torch.from_numpy(np.concatenate([ha * dh + np.arange(dh) for ha in head_map[g]]))
    order = list(sizes)
    rng = np.random.default_rng(seed)
    sweeps = 0
    while sweeps < max_iter:
        sweeps += 1
        changed = False
        for i in rng.permutation(len(order)):
            changed |= _update(spec, order[i], source, target, perms, head_map)
        if not changed:
            break
    return perms, sweeps


def _check_equal_sizes(spec: PermutationSpec, source: Mapping[str, torch.Tensor],
                      target: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """``{space: size}`` of two models of equal architecture under ``spec``; otherwise a one-line ``ValueError``
    naming the first space (with an entry holding it) or entry whose sizes differ."""
    sizes, other = spec.sizes(source), spec.sizes(target)
    for s, n in sizes.items():
        if other[s] != n:
            name, ax = spec.spaces()[s][0]
            raise ValueError(f"transfusion needs equal architectures, but space {s!r} (axis {ax} of {name!r}) has "
                             f"{other[s]} coordinates in the target and {n} in the source")
    for k in source:
        if k in target and tuple(source[k].shape) != tuple(target[k].shape):
            raise ValueError(f"transfusion needs equal architectures, but {k!r} is {tuple(target[k].shape)} in the "
                             f"target and {tuple(source[k].shape)} in the source")
    return sizes


def _check_same_spec(source: PermutationSpec, target: PermutationSpec) -> None:
    """The specs inferred from the two bases must name the same entries and split the same spaces into the same
    number of heads; otherwise a one-line ``ValueError`` naming the first difference."""
    for mine, theirs, where in ((source, target, "target"), (target, source, "source")):
        missing = next((k for k in mine.axes if k not in theirs.axes), None)
        if missing is not None:
            raise ValueError(f"transfusion needs equal architectures, but the {where} has no {missing!r}")
    for s, (_, n) in source.heads.items():
        m = target.heads.get(s, ("", 1))[1]
        if m != n:
            raise ValueError(f"transfusion needs equal architectures, but space {s!r} is split into {n} heads in the "
                             f"source and {m} in the target")


# ---------------------------------------------------------------------------------------- method
@dataclass(frozen=True)
class TransFusionOptions:
    """Settings of TransFusion."""

    max_iter: int = field(default=100, metadata={"help": "at most this many sweeps of weight matching"})
    seed: int = field(default=0, metadata={"help": "seed of the order in which spaces are matched in a sweep"})
    zero: tuple[str, ...] = field(default=(), metadata={
        "help": "parameter-name globs whose delta is zeroed (default none: TransFusion permutes every entry)"})

    def __post_init__(self) -> None:
        check_int("max_iter", self.max_iter, 1)
        check_int("seed", self.seed, 0)
        if isinstance(self.zero, str) or not all(isinstance(z, str) for z in self.zero):
            raise ValueError(f"zero={self.zero!r} is invalid: give a tuple of name globs")


@dataclass(frozen=True)
class FittedPermutation:
    """The matched permutations; :meth:`apply` permutes a source task vector onto the target's coordinates."""

    spec: PermutationSpec
    perms: Mapping[str, torch.Tensor]
    names: tuple[str, ...]
    zero: tuple[str, ...] = ()
    sweeps: int = 0
    fits: Mapping[str, tuple[MapFit | None, MapFit | None]] = field(default_factory=dict)

    def apply(self, tau_a: TaskVector) -> TaskVector:
        out = {}
        for k in self.names:
            if k not in tau_a:
                raise ValueError(f"target entry {k!r} is missing from the source task vector")
            t = tau_a[k]
            if any(fnmatch.fnmatchcase(k, z) for z in self.zero):
                out[k] = torch.zeros_like(t)
            else:
                out[k] = permute(t, self.spec.axes.get(k, ()), self.perms).clone()
        return TaskVector(out)


class TransFusion:
    """Weight matching of the two bases, then the task vector permuted (module docstring).

    Built unbound by the registry: it reads the bases :func:`~ftlab.transfer.fit_transfer` gives it
    (``calibration="bases"``); :meth:`bind` fixes them (and a spec) ahead instead.
    """

    calibration: Calibration = "bases"
    needs_loss = False
    needs_second_moments = False

    def __init__(self, options: TransFusionOptions | None = None, *, name: str = "transfusion",
                 weights: tuple[dict, dict] | None = None, spec: PermutationSpec | None = None):
        self.options = options if options is not None else TransFusionOptions()
        self.name = name
        self._weights = weights
        self._spec = spec

    def bind(self, source_base: nn.Module, target_base: nn.Module, spec: PermutationSpec | None = None) -> TransFusion:
        """A copy of this method holding both bases' weights (and ``spec``, inferred from the source by default).

        Unequal architectures (entries, head counts or sizes that differ) are a one-line ``ValueError`` naming the
        first difference."""
        for what, m in (("source_base", source_base), ("target_base", target_base)):
            if not isinstance(m, nn.Module):
                raise TypeError(f"{what} must be a torch.nn.Module, got {type(m).__name__}")
        if spec is None:
            spec = infer_permutation_spec(source_base)
            _check_same_spec(spec, infer_permutation_spec(target_base))
        if not isinstance(spec, PermutationSpec):
            raise TypeError(f"spec must be a PermutationSpec, got {type(spec).__name__}")
        a = {k: v.detach().cpu().clone() for k, v in _entries(source_base).items()}
        b = {k: v.detach().cpu().clone() for k, v in _entries(target_base).items()}
        _check_equal_sizes(spec, a, b)
        return TransFusion(self.options, name=self.name, weights=(a, b), spec=spec)

    def requirements(self, point: Point) -> Requirements:
        return {"in": (), "out": ()}

    def check(self, tau_a: TaskVector, problem: TransferProblem) -> None:
        """Shapes that differ: ``ValueError`` before any work."""
        for k, shape in problem.target_shapes.items():
            if k in tau_a and tuple(tau_a[k].shape) != tuple(shape):
                raise ValueError(f"method {self.name!r} needs equal architectures, but {k!r} is {tuple(shape)} in the "
                                 f"target and {tuple(tau_a[k].shape)} in the source")

    def prepare(self, problem: TransferProblem, stats: Statistics = None) -> FittedPermutation:
        """Match the bases' weights: the bound ones, else ``stats`` (the :class:`~ftlab.transfer.methods.Bases`
        :func:`~ftlab.transfer.fit_transfer` collects for this method)."""
        bound = self
        if self._weights is None:
            if not isinstance(stats, Bases):
                raise TypeError(f"{self.name}: prepare needs the two base models (Bases), got {type(stats).__name__}")
            bound = self.bind(stats.source, stats.target)
        assert bound._weights is not None and bound._spec is not None
        a, b = bound._weights
        perms, sweeps = match_weights(bound._spec, a, b, max_iter=self.options.max_iter, seed=self.options.seed)
        return FittedPermutation(bound._spec, perms, tuple(problem.target_shapes), tuple(self.options.zero), sweeps)


register("transfusion", human_name="TransFusion (weight-matching re-basin)",
         description="permutations of heads and units matching the two bases' weights, applied to the task vector "
                     "(equal architectures; data-free)",
         reference="Rinaldi et al. Update Your Transformer to the Latest Release: Re-Basin of Task Vectors. ICML 2025, "
                   "arXiv:2505.22697 (code: github.com/aimagelab/TransFusion)",
         needs="both bases' weights and equal architectures", options=TransFusionOptions)(TransFusion)

"""Depth maps: which source layer feeds each target layer.

*Layers* are the repeated blocks of a model: the children of an ``nn.ModuleList`` /
``nn.Sequential`` that has at least two children, all of one class (``encoder.layer.3``,
``blocks.7``, ``_blocks.12``). A model may hold several stacks (T5: encoder and decoder); each
target stack is paired with the source stack at the same path. A stack nested inside the blocks of
another (hierarchical models: ``layers.2.blocks.5``, a stage of blocks inside a stack of stages) is
mapped inside the block it belongs to: target block ``j`` of the outer stack takes source block
``i(j)``, and the nested stack of that target block is paired with the nested stack of source block
``i(j)`` by the same rule (``stage_relative`` and ``cka`` use ``nearest_relative`` there).

Rules (``L_A`` source layers, ``L_B`` target layers, 0-based ``j``):

* ``stage_relative`` (default): pairs blocks *within corresponding stages*. A stage is a maximal run
  of consecutive blocks whose outputs have one shape (channels and resolution, or tokens and
  width), probed with one forward pass of each model on the first calibration batch (without
  calibration data: runs of blocks whose last parameter has one length). Stage ``k`` of B takes its
  blocks from stage ``k`` of A (the stage counts must agree); inside a stage, target blocks take
  the source block nearest in relative depth, except that a stage's first block, when it is a
  transition block (its parameter shapes differ from the stage's next block, in both models: the
  block that strides or changes width), pairs with the source stage's first block. For stacks of
  one stage (transformers) it is ``nearest_relative``.
* ``nearest_relative`` (the paper's nearest-index rule [U]):
  ``i(j) = floor(j (L_A - 1) / (L_B - 1) + 1/2)``, the source layer nearest in relative depth
  (ties go to the deeper layer), over the whole stack. It pairs blocks across stages of different
  width or resolution when stage lengths differ.
* ``proportional``: ``i(j) = floor(j L_A / L_B)``.
* ``prefix``: ``i(j) = j`` for ``j < L_A``; deeper target layers get no source (zero delta).
* ``cka``: the order-respecting assignment maximising the summed linear CKA between source and
  target layer outputs (dynamic programming over non-decreasing ``i(j)``).

Every map covers every target layer and is non-decreasing in ``j``.

Layer names: a target name maps to the same relative name in its source block. Architectures
whose layers are named differently (MPNet's ``attention.attn.q`` for BERT's
``attention.self.query``) take a ``name_map``: dotted name pieces of the target replaced by those
of the source, applied after the depth map (or a callable ``target name -> source name``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from torch import nn

from ftlab.core.validate import check_choice, check_int

__all__ = ["DEPTH_RULES", "DepthRule", "LayerMap", "Stack", "block_signatures", "build_layer_map", "depth_map",
           "find_stacks", "monotone_assignment", "stage_depth_map", "stage_ids"]

DepthRule = Literal["stage_relative", "nearest_relative", "proportional", "prefix", "cka"]
DEPTH_RULES: tuple[str, ...] = get_args(DepthRule)
NameMap = Mapping[str, str] | Callable[[str], str] | None


@dataclass(frozen=True)
class Stack:
    """A stack of repeated blocks at ``path`` (e.g. ``encoder.layer``) with ``depth`` blocks."""

    path: str
    depth: int


def _is_stack(mod: nn.Module) -> bool:
    if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(mod) < 2:
        return False
    kids = list(mod.children())
    return len(kids) == len(mod) and len({type(k) for k in kids}) == 1 and any(True for _ in kids[0].parameters())


def find_stacks(model: nn.Module, *, nested: bool = False) -> dict[str, Stack]:
    """The outermost stacks of repeated blocks of ``model``, keyed by path.

    With ``nested=True``, also the stacks inside the blocks of those stacks (recursively), keyed by
    their full paths (``layers.2.blocks``).
    """
    found: dict[str, Stack] = {}
    outer: list[str] = []
    for name, mod in model.named_modules():
        if not _is_stack(mod):
            continue
        inside = [p for p in outer if name.startswith(p + ".")]
        if inside and not nested:
            continue
        if inside:
            # only stacks directly inside a block of an enclosing stack (not inside a nested stack's block twice)
            pass
        found[name] = Stack(name, len(mod))
        outer.append(name)
    return found


def depth_map(n_source: int, n_target: int, rule: DepthRule = "nearest_relative") -> list[int | None]:
    """``[i(0), ..., i(L_B - 1)]`` for the rules that need no data (``stage_relative``: one stage)."""
    check_int("n_source", n_source, 1)
    check_int("n_target", n_target, 1)
    check_choice("depth_map", rule, [r for r in DEPTH_RULES if r != "cka"])
    if rule in ("nearest_relative", "stage_relative"):
        if n_target == 1:
            return [n_source - 1]
        return [min(n_source - 1, math.floor(j * (n_source - 1) / (n_target - 1) + 0.5)) for j in range(n_target)]
    if rule == "proportional":
        return [j * n_source // n_target for j in range(n_target)]
    return [j if j < n_source else None for j in range(n_target)]


def stage_ids(signatures: Sequence) -> list[int]:
    """Stage index of each block: a new stage starts wherever the signature (e.g. output shape) changes."""
    out: list[int] = []
    for j, s in enumerate(signatures):
        out.append(0 if j == 0 else out[-1] + (s != signatures[j - 1]))
    return out


def block_signatures(model: nn.Module, path: str) -> list[tuple]:
    """Parameter shapes of each block of the stack at ``path`` (tells transition blocks from the others)."""
    mod = dict(model.named_modules())[path]
    return [tuple(tuple(p.shape) for p in blk.parameters()) for blk in mod.children()]


def _static_shapes(model: nn.Module, path: str) -> list[tuple]:
    """Fallback stage signature without data: the length of each block's last parameter."""
    mod = dict(model.named_modules())[path]
    out = []
    for blk in mod.children():
        ps = [p for p in blk.parameters() if p.ndim >= 1]
        out.append((int(ps[-1].shape[0]),) if ps else ())
    return out


def stage_depth_map(stages_a: Sequence[int], stages_b: Sequence[int], *, sig_a: Sequence | None = None,
                    sig_b: Sequence | None = None, path: str = "") -> list[int | None]:
    """``i(j)`` pairing blocks within corresponding stages (see the module docstring, ``stage_relative``)."""
    def groups(st: Sequence[int]) -> list[list[int]]:
        out: list[list[int]] = []
        for j, s in enumerate(st):
            if j == 0 or s != st[j - 1]:
                out.append([])
            out[-1].append(j)
        return out

    ga, gb = groups(stages_a), groups(stages_b)
    if len(ga) != len(gb):
        raise ValueError(f"depth_map='stage_relative': stack {path!r} has {len(ga)} stages in the source but {len(gb)} "
                         "in the target; use depth_map='nearest_relative' or give stages=")
    out: list[int | None] = [None] * len(stages_b)
    for sa, sb in zip(ga, gb):
        def transition(sig, st):
            return sig is not None and len(st) >= 2 and sig[st[0]] != sig[st[1]]

        if len(sb) == 1:
            out[sb[0]] = sa[0]
        elif len(sa) >= 2 and transition(sig_a, sa) and transition(sig_b, sb):
            out[sb[0]] = sa[0]
            for j, i in zip(sb[1:], depth_map(len(sa) - 1, len(sb) - 1, "nearest_relative")):
                out[j] = sa[1 + i] if i is not None else None
        else:
            for j, i in zip(sb, depth_map(len(sa), len(sb), "nearest_relative")):
                out[j] = sa[i] if i is not None else None
    return out


def monotone_assignment(score: np.ndarray) -> list[int]:
    """Non-decreasing ``i(j)`` maximising ``sum_j score[j, i(j)]`` (``score``: ``L_B x L_A``)."""
    score = np.asarray(score, dtype=float)
    if score.ndim != 2 or not np.all(np.isfinite(score)):
        raise ValueError("score must be a finite (n_target, n_source) matrix")
    nb, na = score.shape
    best = np.empty((nb, na))
    arg = np.zeros((nb, na), dtype=int)
    best[0] = score[0]
    for j in range(1, nb):
        # best over i' <= i of best[j-1, i']
        run_idx = np.zeros(na, dtype=int)
        run_val = np.empty(na)
        m, mi = -np.inf, 0
        for i in range(na):
            if best[j - 1, i] > m:
                m, mi = best[j - 1, i], i
            run_val[i], run_idx[i] = m, mi
        best[j] = score[j] + run_val
        arg[j] = run_idx
    out = [int(np.argmax(best[-1]))]
    for j in range(nb - 1, 0, -1):
        out.append(int(arg[j, out[-1]]))
    return out[::-1]


def _rename_fn(name_map: NameMap) -> Callable[[str], str] | None:
    if name_map is None:
        return None
    if callable(name_map):
        return name_map
    if not isinstance(name_map, Mapping):
        raise ValueError(f"name_map={name_map!r} is invalid: give a mapping of dotted name pieces or a callable")
    pats = [(re.compile(r"(?<![^.])" + re.escape(k) + r"(?![^.])"), v) for k, v in name_map.items()]

    def rename(name: str) -> str:
        for pat, rep in pats:
            name = pat.sub(rep, name)
        return name

    return rename


class LayerMap:
    """Maps target names (parameters or capture points) to source names.

    ``maps[path]`` is the depth map of the target stack at ``path`` (a full target path, also for
    nested stacks); ``sources[path]`` the source stack it draws from (default: the same path). A name
    inside target stack ``path`` block ``j`` maps to the same relative name in source block
    ``i(j)`` of ``sources[path]`` (the innermost stack decides); names outside every stack map to
    themselves. ``None`` means "no source" (zero delta). ``rename`` (a name map) is applied last.
    """

    def __init__(self, maps: dict[str, list[int | None]], sources: Mapping[str, str] | None = None, *,
                 rename: NameMap = None, stages: Mapping[str, tuple[list[int], list[int]]] | None = None):
        self.maps = {p: list(m) for p, m in maps.items()}
        self.sources = {p: (sources or {}).get(p, p) for p in self.maps}
        self.stages = dict(stages or {})
        self._rename = _rename_fn(rename)
        # longest paths first: the innermost stack holding a name decides its source
        paths = sorted(self.maps, key=len, reverse=True)
        self._patterns = [(p, re.compile(re.escape(p) + r"\.(\d+)(\..*)?$")) for p in paths]

    def source_name(self, target_name: str) -> str | None:
        out: str | None = target_name
        for path, pat in self._patterns:
            m = pat.match(target_name)
            if m:
                j = int(m.group(1))
                src = self.maps[path][j] if j < len(self.maps[path]) else None
                out = None if src is None else f"{self.sources[path]}.{src}{m.group(2) or ''}"
                break
        if out is not None and self._rename is not None:
            out = self._rename(out)
        return out

    def as_dict(self) -> dict[str, list[int | None]]:
        return {p: list(m) for p, m in self.maps.items()}

    def describe(self) -> dict:
        """Depth maps, the source stack of each target stack, and the stages used (for the run record)."""
        return {"maps": self.as_dict(), "sources": dict(self.sources),
                "stages": {p: [list(a), list(b)] for p, (a, b) in self.stages.items()}}


def build_layer_map(source: nn.Module, target: nn.Module, rule: DepthRule = "nearest_relative", *,
                    cka_scores: dict[str, np.ndarray] | None = None,
                    block_shapes: Mapping[str, tuple[Sequence, Sequence]] | None = None,
                    stages: Mapping[str, tuple[Sequence[int], Sequence[int]]] | None = None,
                    name_map: NameMap = None) -> LayerMap:
    """Pair the stacks of ``target`` with those of ``source`` and apply ``rule`` to each.

    ``cka_scores[path]`` (rule ``cka``): the ``(L_B, L_A)`` CKA matrix of that stack.
    ``block_shapes[path] = (source shapes, target shapes)`` (rule ``stage_relative``): each block's
    output shape (from a forward pass); without it, the static fallback of the module docstring.
    ``stages[path] = (source stage ids, target stage ids)`` overrides the stages of a stack.
    Raises ``ValueError`` when a target stack has no counterpart in the source.
    """
    check_choice("depth_map", rule, DEPTH_RULES)
    rename = _rename_fn(name_map)
    s_all, t_all = find_stacks(source, nested=True), find_stacks(target, nested=True)
    s_top, t_top = find_stacks(source), find_stacks(target)
    maps: dict[str, list[int | None]] = {}
    sources: dict[str, str] = {}
    used_stages: dict[str, tuple[list[int], list[int]]] = {}

    def pair(t_path: str, s_path: str, top: bool) -> None:
        st, ss = t_all[t_path], s_all[s_path]
        if rule == "cka" and top:
            if cka_scores is None or t_path not in cka_scores:
                raise ValueError(f"depth_map='cka' needs CKA scores for stack {t_path!r}")
            maps[t_path] = list(monotone_assignment(cka_scores[t_path]))
        elif rule == "stage_relative" and top:
            if stages is not None and t_path in stages:
                sa, sb = (list(x) for x in stages[t_path])
                if len(sa) != ss.depth or len(sb) != st.depth:
                    raise ValueError(f"stages[{t_path!r}] must give {ss.depth} source and {st.depth} target stage ids")
            else:
                shapes = (block_shapes or {}).get(t_path)
                sh_a, sh_b = shapes if shapes is not None else (_static_shapes(source, s_path),
                                                                 _static_shapes(target, t_path))
                sa, sb = stage_ids(list(sh_a)), stage_ids(list(sh_b))
            used_stages[t_path] = (sa, sb)
            maps[t_path] = stage_depth_map(sa, sb, sig_a=block_signatures(source, s_path),
                                           sig_b=block_signatures(target, t_path), path=t_path)
        else:
            inner_rule = "nearest_relative" if rule in ("cka", "stage_relative") else rule
            maps[t_path] = depth_map(ss.depth, st.depth, inner_rule)
        sources[t_path] = s_path
        # nested stacks inside each target block, paired with those of its source block
        for sub in t_all:
            for j, i in enumerate(maps[t_path]):
                prefix = f"{t_path}.{j}."
                if not sub.startswith(prefix) or i is None:
                    continue
                rest = sub[len(prefix):]
                if any(o != sub and o.startswith(prefix) and sub.startswith(o + ".") for o in t_all):
                    continue  # deeper than the next level: handled by its own parent
                s_sub = f"{s_path}.{i}.{rest}"
                if s_sub in s_all:
                    pair(sub, s_sub, False)

    for path, st in t_top.items():
        s_path = rename(path) if rename is not None else path
        if s_path not in s_top:
            raise ValueError(f"target stack {path!r} ({st.depth} blocks) has no counterpart in the source model "
                             f"(source stacks: {sorted(s_top) or 'none'})")
        pair(path, s_path, True)
    return LayerMap(maps, sources, rename=name_map, stages=used_stages)


def stack_blocks(model: nn.Module, paths: Sequence[str]) -> dict[str, list[nn.Module]]:
    """The block modules of each stack path."""
    mods = dict(model.named_modules())
    return {p: list(mods[p].children()) for p in paths}

"""Depth maps: which source layer feeds each target layer.

*Layers* are the repeated blocks of a model: the children of an ``nn.ModuleList`` /
``nn.Sequential`` (the model itself included) that have parameters, when there are at least two and
all are of one class (``encoder.layer.3``, ``blocks.7``, ``_blocks.12``; the ``nn.Linear`` layers
``0``, ``2``, ``4`` of ``nn.Sequential(Linear, ReLU, Linear, ReLU, Linear)``: parameter-free
children such as activations are skipped). A model may hold several stacks (T5: encoder and
decoder); each target stack is paired with the source stack at the same path. A container holding
a single block with parameters (and no stack inside it) is a stack of depth 1 -- a one-layer
encoder's ``encoder.layer`` -- where the other model holds a stack of two or more blocks at the paired
path (in either direction); a one-block container facing nothing, or another one-block container,
stays outside the map (its names map to themselves, as before). A stack nested inside the blocks of
another (hierarchical models: ``layers.2.blocks.5``, a stage of blocks inside a stack of stages) is
mapped inside the block it belongs to: target block ``j`` of the outer stack takes source block
``i(j)``, and the nested stack of that target block is paired with the nested stack of source block
``i(j)`` by the same rule (``stage_relative`` and ``cka`` use ``nearest_relative`` there).

Rules (``L_A`` source layers, ``L_B`` target layers, 0-based ``j``):

* ``stage_relative`` (default): pairs blocks *within corresponding stages*. A stage is a maximal run
  of consecutive blocks whose outputs have one shape (channels and resolution, or tokens and
  width), probed with one forward pass of each model on the first calibration batch (without
  calibration data: runs of blocks whose last parameter has one length). Stage ``k`` of B takes its
  blocks from stage ``k`` of A; inside a stage, target blocks take
  the source block nearest in relative depth, except that a stage's first block, when it is a
  transition block (its parameter shapes differ from the stage's next block, in both models: the
  block that strides or changes width), pairs with the source stage's first block. For stacks of
  one stage (transformers) it is ``nearest_relative``. Where the two stacks have different numbers
  of stages (plain MLPs whose every layer has its own width), the stack falls back to
  ``nearest_relative``; the run record says so (``LayerMap.describe()["fallback"]``).
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

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from torch import nn

from ftlab.core.validate import check_choice, check_int

__all__ = ["COPY_MODES", "CopyMode", "DEFAULT_DEPTH_RULE", "DEPTH_RULES", "DepthRule", "LayerMap", "Stack",
           "block_signatures", "build_layer_map", "depth_map", "find_stacks", "join", "monotone_assignment",
           "paired_stacks", "stage_depth_map", "stage_ids"]

DepthRule = Literal["stage_relative", "nearest_relative", "proportional", "prefix", "cka"]
DEPTH_RULES: tuple[str, ...] = get_args(DepthRule)
#: How a source layer that feeds several target layers is shared among them (:meth:`LayerMap.copy_weights`):
#: ``sum`` every copy at full strength, ``split`` each of the ``k`` copies at ``1/k``, ``first`` only the first.
CopyMode = Literal["sum", "split", "first"]
COPY_MODES: tuple[str, ...] = get_args(CopyMode)
NameMap = Mapping[str, str] | Callable[[str], str] | None

log = logging.getLogger(__name__)


#: The depth map a transfer uses unless told otherwise (:class:`~ftlab.transfer.options.TransferOptions`).
DEFAULT_DEPTH_RULE: DepthRule = "stage_relative"


def join(path: str, name: str) -> str:
    """``path.name``, or ``name`` alone for the model's own path ``""``."""
    return f"{path}.{name}" if path else name


@dataclass(frozen=True)
class Stack:
    """A stack of repeated blocks at ``path`` (``""``: the model itself); ``blocks`` are their child names."""

    path: str
    blocks: tuple[str, ...]

    @property
    def depth(self) -> int:
        return len(self.blocks)

    def block_name(self, i: int) -> str:
        """The full module name of block ``i``."""
        return join(self.path, self.blocks[i])


def _stack_blocks(mod: nn.Module) -> tuple[str, ...] | None:
    """Child names of the repeated blocks of a ModuleList/Sequential (None if it is not a stack)."""
    if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
        return None
    kids = [(n, k) for n, k in mod.named_children() if any(True for _ in k.parameters())]
    if len(kids) < 2 or len({type(k) for _, k in kids}) != 1:
        return None
    return tuple(n for n, _ in kids)


def find_stacks(model: nn.Module, *, nested: bool = False) -> dict[str, Stack]:
    """The outermost stacks of repeated blocks of ``model`` (the model itself may be one, path ``""``), by path.

    With ``nested=True``, also the stacks inside the blocks of those stacks (recursively), keyed by
    their full paths (``layers.2.blocks``).
    """
    found: dict[str, Stack] = {}
    for name, mod in model.named_modules():
        blocks = _stack_blocks(mod)
        if blocks is None:
            continue
        if not nested and any(name.startswith(p + ".") or (p == "" and name) for p in found):
            continue
        found[name] = Stack(name, blocks)
    return found


def _one_block_stacks(model: nn.Module, *, nested: bool) -> dict[str, Stack]:
    """Containers (``nn.ModuleList`` / ``nn.Sequential``) with exactly one child that has parameters and holds no
    stack, as stacks of depth 1, by path; with ``nested=False`` only those outside every outermost stack."""
    stacks = find_stacks(model, nested=True)
    tops = find_stacks(model)
    found: dict[str, Stack] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        kids = [n for n, k in mod.named_children() if any(True for _ in k.parameters())]
        if len(kids) != 1:
            continue
        block = join(name, kids[0])
        if any(p == block or p.startswith(block + ".") for p in stacks):
            continue  # a wrapper around a stack, not a stack of one block
        if not nested and any(t == "" or name.startswith(t + ".") for t in tops):
            continue
        found[name] = Stack(name, (kids[0],))
    return found


def _stack_pairs(source: nn.Module, target: nn.Module, name_map: NameMap
                 ) -> tuple[dict[str, tuple[Stack, Stack]], dict[str, Stack]]:
    """``({target path: (source stack, target stack)}, {target path: stack without a source counterpart})`` for
    the outermost stacks, one-block stacks included where they face a deeper stack (the module docstring)."""
    rename = _rename_fn(name_map) or (lambda n: n)
    s_top, t_top = find_stacks(source), find_stacks(target)
    s_one, t_one = _one_block_stacks(source, nested=False), _one_block_stacks(target, nested=False)
    pairs: dict[str, tuple[Stack, Stack]] = {}
    unpaired: dict[str, Stack] = {}
    for path, st in t_top.items():
        ss = s_top.get(rename(path)) or s_one.get(rename(path))
        if ss is None:
            unpaired[path] = st
        else:
            pairs[path] = (ss, st)
    for path, st in t_one.items():
        if rename(path) in s_top:
            pairs[path] = (s_top[rename(path)], st)
    return pairs, unpaired


def depth_map(n_source: int, n_target: int, rule: DepthRule = DEFAULT_DEPTH_RULE) -> list[int | None]:
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


def _blocks(model: nn.Module, stack: Stack) -> list[nn.Module]:
    mods = dict(model.named_modules())
    return [mods[stack.block_name(i)] for i in range(stack.depth)]


def block_signatures(model: nn.Module, stack: Stack) -> list[tuple]:
    """Parameter shapes of each block of ``stack`` (tells transition blocks from the others)."""
    return [tuple(tuple(p.shape) for p in blk.parameters()) for blk in _blocks(model, stack)]


def _static_shapes(model: nn.Module, stack: Stack) -> list[tuple]:
    """Stage signature without data: the length of each block's last parameter."""
    out = []
    for blk in _blocks(model, stack):
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

        if len(sb) == 1 and len(gb) > 1:  # a one-block stage of several (a stack of one stage: nearest_relative)
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
    nested stacks; ``""`` for a model that is itself a stack); ``sources[path]`` the source stack it
    draws from (default: the same path); ``blocks[path] = (source block names, target block names)``
    (default: ``"0"``, ``"1"``, ...). A name inside block ``j`` of target stack ``path`` maps to the
    same relative name in source block ``i(j)`` of ``sources[path]`` (the innermost stack decides);
    names outside every stack map to themselves. ``None`` means "no source" (zero delta). ``rename``
    (a name map) is applied last. ``fallback[path]`` names the rule a stack fell back to.
    """

    def __init__(self, maps: Mapping[str, Sequence[int | None]], sources: Mapping[str, str] | None = None, *,
                 rename: NameMap = None, stages: Mapping[str, tuple[list[int], list[int]]] | None = None,
                 blocks: Mapping[str, tuple[Sequence[str], Sequence[str]]] | None = None,
                 fallback: Mapping[str, str] | None = None):
        self.maps = {p: list(m) for p, m in maps.items()}
        self.sources = {p: (sources or {}).get(p, p) for p in self.maps}
        self.stages = dict(stages or {})
        self.fallback = dict(fallback or {})
        self.blocks = {p: (tuple((blocks or {})[p][0]), tuple((blocks or {})[p][1])) if p in (blocks or {})
                       else (tuple(str(i) for i in range(max([i for i in m if i is not None], default=-1) + 1)),
                             tuple(str(j) for j in range(len(m))))
                       for p, m in self.maps.items()}
        self._rename = _rename_fn(rename)
        self._paths = sorted(self.maps, key=len, reverse=True)  # the innermost stack holding a name decides

    def _in_stack(self, name: str) -> tuple[str, int, str] | None:
        """``(stack path, target block index, rest of the name)`` of the innermost stack holding ``name``."""
        for path in self._paths:
            if path and not name.startswith(path + "."):
                continue
            child, _, rest = name[len(path) + 1 if path else 0:].partition(".")
            targets = self.blocks[path][1]
            if child in targets:
                return path, targets.index(child), rest
        return None

    def source_name(self, target_name: str) -> str | None:
        out: str | None = target_name
        hit = self._in_stack(target_name)
        if hit is not None:
            path, j, rest = hit
            i = self.maps[path][j] if j < len(self.maps[path]) else None
            if i is None:
                out = None
            else:
                src_blocks = self.blocks[path][0]
                block = join(self.sources[path], src_blocks[i] if i < len(src_blocks) else str(i))
                out = f"{block}.{rest}" if rest else block
        if out is not None and self._rename is not None:
            out = self._rename(out)
        return out

    def as_dict(self) -> dict[str, list[int | None]]:
        return {p: list(m) for p, m in self.maps.items()}

    def copy_weights(self, target_names: Sequence[str], mode: str) -> dict[str, float]:
        """The weight of each target name's delta when several target names draw from one source name.

        Target names (in model order) that map to the same source name are *copies* of it: ``sum`` keeps every
        copy at weight 1 (a source block feeding two target blocks adds its update twice), ``split`` gives each
        of ``k`` copies ``1/k`` (the copies add up to one source update), ``first`` keeps the first copy and
        gives the others 0. Names without a source, or the only one drawing from theirs, weigh 1.
        """
        check_choice("copies", mode, COPY_MODES)
        groups: dict[str, list[str]] = {}
        for name in target_names:
            src = self.source_name(name)
            if src is not None:
                groups.setdefault(src, []).append(name)
        out = {name: 1.0 for name in target_names}
        if mode == "sum":
            return out
        for names in groups.values():
            for i, name in enumerate(names):
                out[name] = 1.0 / len(names) if mode == "split" else float(i == 0)
        return out

    def describe(self) -> dict:
        """Depth maps, the source stack of each target stack, the stages used and any fallback (for the run record)."""
        return {"maps": self.as_dict(), "sources": dict(self.sources),
                "stages": {p: [list(a), list(b)] for p, (a, b) in self.stages.items()},
                "fallback": dict(self.fallback)}


class _Builder:
    """Pairs target stacks with source stacks (outer ones by path, nested ones inside paired blocks)."""

    def __init__(self, source: nn.Module, target: nn.Module, rule: str, cka_scores, block_shapes, stages):
        self.source, self.target, self.rule = source, target, rule
        self.cka_scores, self.block_shapes, self.stages = cka_scores, block_shapes, stages
        self.s_all, self.t_all = find_stacks(source, nested=True), find_stacks(target, nested=True)
        self.s_one, self.t_one = _one_block_stacks(source, nested=True), _one_block_stacks(target, nested=True)
        self.maps: dict[str, list[int | None]] = {}
        self.sources: dict[str, str] = {}
        self.blocks: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        self.used_stages: dict[str, tuple[list[int], list[int]]] = {}
        self.fallback: dict[str, str] = {}

    def _stage_map(self, t_path: str, ss: Stack, st: Stack) -> list[int | None]:
        if self.stages is not None and t_path in self.stages:
            sa, sb = (list(x) for x in self.stages[t_path])
            if len(sa) != ss.depth or len(sb) != st.depth:
                raise ValueError(f"stages[{t_path!r}] must give {ss.depth} source and {st.depth} target stage ids")
        else:
            shapes = (self.block_shapes or {}).get(t_path)
            sh_a, sh_b = shapes if shapes is not None else (_static_shapes(self.source, ss),
                                                             _static_shapes(self.target, st))
            sa, sb = stage_ids(list(sh_a)), stage_ids(list(sh_b))
        self.used_stages[t_path] = (sa, sb)
        if len(set(sa)) != len(set(sb)) and not (self.stages is not None and t_path in self.stages):
            self.fallback[t_path] = "nearest_relative"
            log.info("depth map: stack %r has %d stages in the source but %d in the target; using nearest_relative",
                     t_path, len(set(sa)), len(set(sb)))
            return depth_map(ss.depth, st.depth, "nearest_relative")
        return stage_depth_map(sa, sb, sig_a=block_signatures(self.source, ss), sig_b=block_signatures(self.target, st),
                               path=t_path)

    def _top_map(self, t_path: str, ss: Stack, st: Stack) -> list[int | None]:
        if self.rule == "cka":
            if self.cka_scores is None or t_path not in self.cka_scores:
                raise ValueError(f"depth_map='cka' needs CKA scores for stack {t_path!r}")
            return list(monotone_assignment(self.cka_scores[t_path]))
        if self.rule == "stage_relative":
            return self._stage_map(t_path, ss, st)
        return depth_map(ss.depth, st.depth, self.rule)  # type: ignore[arg-type]

    def pair(self, st: Stack, ss: Stack, top: bool) -> None:
        t_path, s_path = st.path, ss.path
        if top:
            self.maps[t_path] = self._top_map(t_path, ss, st)
        else:
            inner = "nearest_relative" if self.rule in ("cka", "stage_relative") else self.rule
            self.maps[t_path] = depth_map(ss.depth, st.depth, inner)  # type: ignore[arg-type]
        self.sources[t_path] = s_path
        self.blocks[t_path] = (ss.blocks, st.blocks)
        # nested stacks inside each target block, paired with those of its source block
        for j, i in enumerate(self.maps[t_path]):
            if i is None:
                continue
            prefix = st.block_name(j) + "."
            t_cand = {**self.t_one, **self.t_all}
            for sub, t_sub in t_cand.items():
                if not sub.startswith(prefix):
                    continue
                if any(o != sub and o.startswith(prefix) and sub.startswith(o + ".") for o in t_cand):
                    continue  # deeper than the next level: handled by its own parent
                s_path_sub = f"{ss.block_name(i)}.{sub[len(prefix):]}"
                s_sub = self.s_all.get(s_path_sub) or self.s_one.get(s_path_sub)
                if s_sub is not None and max(s_sub.depth, t_sub.depth) > 1:
                    self.pair(t_sub, s_sub, False)


def build_layer_map(source: nn.Module, target: nn.Module, rule: DepthRule = DEFAULT_DEPTH_RULE, *,
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
    b = _Builder(source, target, rule, cka_scores, block_shapes, stages)
    pairs, unpaired = _stack_pairs(source, target, name_map)
    if unpaired:
        path, st = next(iter(unpaired.items()))
        raise ValueError(f"target stack {path!r} ({st.depth} blocks) has no counterpart in the source model "
                         f"(source stacks: {sorted(find_stacks(source)) or 'none'})")
    for ss, st in pairs.values():
        b.pair(st, ss, True)
    return LayerMap(b.maps, b.sources, rename=name_map, stages=b.used_stages, blocks=b.blocks, fallback=b.fallback)


def paired_stacks(source: nn.Module, target: nn.Module, name_map: NameMap = None) -> dict[str, tuple[Stack, Stack]]:
    """``{target path: (source stack, target stack)}`` for the outermost target stacks that have a source counterpart
    (a one-block stack facing a deeper one included, see the module docstring)."""
    return _stack_pairs(source, target, name_map)[0]

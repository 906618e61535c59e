"""Depth maps: which source layer feeds each target layer.

*Layers* are the repeated blocks of a model: the children of an ``nn.ModuleList`` /
``nn.Sequential`` that has at least two children, all of one class (``encoder.layer.3``,
``blocks.7``, ``encoder.block.11``); nested stacks inside a block are part of the block. A model
may hold several stacks (T5: encoder and decoder); each target stack is paired with the source
stack at the same path.

Rules (``L_A`` source layers, ``L_B`` target layers, 0-based ``j``):

* ``nearest_relative`` (default; the rule the BiCo paper is reported to use, per the project brief):
  ``i(j) = floor(j (L_A - 1) / (L_B - 1) + 1/2)``, the source layer nearest in relative depth
  (ties go to the deeper layer).
* ``proportional``: ``i(j) = floor(j L_A / L_B)``.
* ``prefix``: ``i(j) = j`` for ``j < L_A``; deeper target layers get no source (zero delta).
* ``cka``: the order-respecting assignment maximising the summed linear CKA between source and
  target layer outputs (dynamic programming over non-decreasing ``i(j)``).

Every map covers every target layer and is non-decreasing in ``j``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from torch import nn

from ftlab.core.validate import check_choice, check_int

__all__ = ["DEPTH_RULES", "DepthRule", "LayerMap", "Stack", "build_layer_map", "depth_map", "find_stacks",
           "monotone_assignment"]

DepthRule = Literal["nearest_relative", "proportional", "prefix", "cka"]
DEPTH_RULES: tuple[str, ...] = get_args(DepthRule)


@dataclass(frozen=True)
class Stack:
    """A stack of repeated blocks at ``path`` (e.g. ``encoder.layer``) with ``depth`` blocks."""

    path: str
    depth: int


def find_stacks(model: nn.Module) -> dict[str, Stack]:
    """The outermost stacks of repeated blocks of ``model``, keyed by path."""
    found: dict[str, Stack] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)) or len(mod) < 2:
            continue
        kids = list(mod.children())
        if len(kids) != len(mod) or len({type(k) for k in kids}) != 1 or not any(True for _ in kids[0].parameters()):
            continue
        if any(name.startswith(p + ".") for p in found):
            continue  # nested inside a block of an outer stack
        found[name] = Stack(name, len(kids))
    return found


def depth_map(n_source: int, n_target: int, rule: DepthRule = "nearest_relative") -> list[int | None]:
    """``[i(0), ..., i(L_B - 1)]`` for the non-data-driven rules (see the module docstring)."""
    check_int("n_source", n_source, 1)
    check_int("n_target", n_target, 1)
    check_choice("depth_map", rule, [r for r in DEPTH_RULES if r != "cka"])
    if rule == "nearest_relative":
        if n_target == 1:
            return [n_source - 1]
        return [min(n_source - 1, math.floor(j * (n_source - 1) / (n_target - 1) + 0.5)) for j in range(n_target)]
    if rule == "proportional":
        return [j * n_source // n_target for j in range(n_target)]
    return [j if j < n_source else None for j in range(n_target)]


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


class LayerMap:
    """Maps target names (parameters or capture points) to source names.

    Names inside target stack ``path`` block ``j`` map to the same relative name in source block
    ``i(j)``; names outside every stack map to themselves. ``None`` means "no source" (zero delta).
    """

    def __init__(self, maps: dict[str, list[int | None]]):
        self.maps = {p: list(m) for p, m in maps.items()}
        # longest paths first so nested-looking prefixes resolve correctly
        paths = sorted(self.maps, key=len, reverse=True)
        self._patterns = [(p, re.compile(re.escape(p) + r"\.(\d+)(\..*)?$")) for p in paths]

    def source_name(self, target_name: str) -> str | None:
        for path, pat in self._patterns:
            m = pat.match(target_name)
            if m:
                src = self.maps[path][int(m.group(1))]
                return None if src is None else f"{path}.{src}{m.group(2) or ''}"
        return target_name

    def as_dict(self) -> dict[str, list[int | None]]:
        return {p: list(m) for p, m in self.maps.items()}


def build_layer_map(source: nn.Module, target: nn.Module, rule: DepthRule = "nearest_relative", *,
                    cka_scores: dict[str, np.ndarray] | None = None) -> LayerMap:
    """Pair the stacks of ``target`` with those of ``source`` and apply ``rule`` to each.

    For ``rule="cka"``, ``cka_scores[path]`` is the ``(L_B, L_A)`` CKA matrix of that stack.
    Raises ``ValueError`` when a target stack has no counterpart in the source.
    """
    check_choice("depth_map", rule, DEPTH_RULES)
    s_stacks, t_stacks = find_stacks(source), find_stacks(target)
    maps: dict[str, list[int | None]] = {}
    for path, st in t_stacks.items():
        if path not in s_stacks:
            raise ValueError(f"target stack {path!r} ({st.depth} blocks) has no counterpart in the source model "
                             f"(source stacks: {sorted(s_stacks) or 'none'})")
        ss = s_stacks[path]
        if rule == "cka":
            if cka_scores is None or path not in cka_scores:
                raise ValueError(f"depth_map='cka' needs CKA scores for stack {path!r}")
            maps[path] = list(monotone_assignment(cka_scores[path]))
        else:
            maps[path] = depth_map(ss.depth, st.depth, rule)
    return LayerMap(maps)


def stack_blocks(model: nn.Module, paths: Sequence[str]) -> dict[str, list[nn.Module]]:
    """The block modules of each stack path."""
    mods = dict(model.named_modules())
    return {p: list(mods[p].children()) for p in paths}

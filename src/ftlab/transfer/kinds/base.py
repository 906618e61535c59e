"""The layer-kind interface, the two registries (layer kinds, transport rules) and what every kind shares.

A :class:`LayerKind` is everything the transfer knows about one kind of layer: which modules it
recognises (:meth:`~LayerKind.matches`), the capture :class:`Point` s and transport :class:`Rule` s of
such a module (:meth:`~LayerKind.spec`), where its rows are captured (:meth:`~LayerKind.hooked`) and how a
captured tensor becomes rows (:meth:`~LayerKind.rows`, :meth:`~LayerKind.row_format`), whether its output
is an affine function of its input (:meth:`~LayerKind.affine`: then its output statistics are derived),
which maps it has (:attr:`~LayerKind.has_input_map`, :attr:`~LayerKind.one_channel_map`), how a block of
a task vector is carried by them (:meth:`~LayerKind.transport`) and how a LoRA factor of its weight is
written and read (:meth:`~LayerKind.lora_matrix`, :meth:`~LayerKind.lora_tensors`,
:meth:`~LayerKind.lora_delta`). A :class:`Point` names its kind (``Point.kind``); everything else asks
the kind (``point.layer_kind``), never compares the name.

Transport rules (:class:`RuleKind`) say how one parameter is carried once the maps ``R_in``
(``d_in^A x d_in^B``) and ``R_out`` (``d_out^A x d_out^B``) of its point are known; the generic ones
(``weight``, ``weight_t``, ``out_vector``, ``diagonal``, ``zero``) live in
:mod:`ftlab.transfer.kinds.rules`, a kind's own (``embedding``) in its unit, and a kind may refine a
generic rule for its layers (grouped convolutions refine ``weight``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from torch import nn

__all__ = ["AffineMap", "Carry", "LayerKind", "NormGain", "Point", "Rule", "RuleKind", "SpecContext", "channel_rows",
           "joined", "kind_for_module", "layer_kinds", "plain_lora_delta", "register_kind",
           "register_rule", "rule_kinds", "token_rows"]

NormGain = Literal["vector", "diagonal"]

#: ``(M, c)`` with ``output = M input + c`` (``M`` a matrix ``(d_out, d_in)`` or a per-channel vector).
AffineMap = tuple[torch.Tensor, torch.Tensor | None]

_KINDS: dict[str, LayerKind] = {}
_RULES: dict[str, RuleKind] = {}


def joined(name: str, attr: str) -> str:
    """``name.attr`` (just ``attr`` for the root module, whose name is empty)."""
    return f"{name}.{attr}" if name else attr


@dataclass(frozen=True)
class SpecContext:
    """Settings of spec inference a kind may read: ``norm_gain`` (how norm gains are carried)."""

    norm_gain: NormGain = "vector"


@dataclass(frozen=True)
class Point:
    """A capture point: a module (or a part of one) whose input and output spaces define maps.

    ``kind`` names its :class:`LayerKind` (``point.layer_kind``), which decides how captured tensors
    become rows. ``conv`` is ``(kernel_size, stride, padding, dilation)`` of a convolution (tuples, one
    entry per spatial axis), ``groups`` its groups. ``tokens`` is False for points whose rows are not
    the batch's tokens (relative-position bias tables), so no padding mask applies.
    """

    name: str
    kind: str
    in_dim: int
    out_dim: int
    conv: tuple | None = None
    groups: int = 1
    tokens: bool = True

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ValueError(f"point kind={self.kind!r} is invalid: must be one of {', '.join(_KINDS)}")

    @property
    def layer_kind(self) -> LayerKind:
        """The registered :class:`LayerKind` named by ``kind``."""
        return _KINDS[self.kind]


@dataclass(frozen=True)
class Rule:
    """How one parameter (or one block of it, ``part=(i, n)``: block ``i`` of ``n`` equal blocks along dim 0)
    is transported with its point's maps; ``kind`` names a registered :class:`RuleKind`."""

    param: str
    kind: str
    point: str | None = None
    part: tuple[int, int] = (0, 1)

    def __post_init__(self):
        if self.kind not in _RULES:
            raise ValueError(f"rule kind={self.kind!r} is invalid: must be one of {', '.join(_RULES)}")
        if self.carries and self.point is None:
            raise ValueError(f"rule for {self.param!r} of kind {self.kind!r} needs a point")

    @property
    def carries(self) -> bool:
        """Whether the rule carries the source's delta (False: the target keeps its base value)."""
        return _RULES[self.kind].carries


@dataclass(frozen=True)
class Carry:
    """What one transported block is: ``src`` the source parameter (named in errors), ``vocab`` an index map of
    an embedding table's rows (``(V_B,)``, -1 none) or None."""

    src: str
    vocab: torch.Tensor | None = None


@dataclass(frozen=True)
class RuleKind:
    """A transport rule: ``apply(rule, tau, shape, R_in, R_out, carry)`` gives the target block (float64) from the
    source block ``tau``; ``carries`` False for the rule that keeps the target's base value. ``apply`` is linear in
    ``tau``: a zero block is carried as zeros without calling it (and the maps of a point that carries only zero
    blocks are not fitted: :func:`ftlab.transfer.transport.carried_points`)."""

    name: str
    apply: Callable[..., torch.Tensor]
    carries: bool = True


def register_rule(rule: RuleKind) -> RuleKind:
    """Add a transport rule (a name already taken raises ``ValueError``)."""
    if rule.name in _RULES:
        raise ValueError(f"transport rule {rule.name!r} is already registered")
    _RULES[rule.name] = rule
    return rule


def rule_kinds() -> tuple[str, ...]:
    """Names of the registered transport rules."""
    return tuple(_RULES)


def token_rows(t: torch.Tensor, *, seq_first: bool = False) -> tuple[torch.Tensor, None]:
    """``(B, T, d)`` rows over the last axis: ``(d,)`` is one row, ``(B, d)`` one row per sample, and
    ``(B, ..., d)`` (``(T, B, d)`` with ``seq_first``) every position a row."""
    t = t.detach()
    if t.ndim == 1:
        return t.reshape(1, 1, -1), None
    if t.ndim == 2:
        return t.unsqueeze(1), None
    if seq_first:
        t = t.transpose(0, 1)
    return t.reshape(t.shape[0], -1, t.shape[-1]), None


def channel_rows(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int] | None]:
    """``(B, positions, C)`` rows of a channels-first ``(B, C, ...)`` tensor, and its ``(H, W)`` grid (4-D only)."""
    t = t.detach()
    grid = (t.shape[2], t.shape[3]) if t.ndim == 4 else None
    return t.flatten(2).transpose(1, 2), grid


def plain_lora_delta(A: torch.Tensor, B: torch.Tensor, fan_in_fan_out: bool) -> torch.Tensor:
    """``B @ A`` (transposed for layers stored ``(in, out)``): the update of a LoRA on a matrix weight."""
    d = B @ A
    return d.T if fan_in_fan_out else d


class LayerKind:
    """One kind of layer (see the module docstring); subclasses override what differs from a plain ``x W^T``.

    ``name`` is the :attr:`Point.kind` of its points; points of kinds with the same ``family`` pair with
    each other (their rows and maps mean the same); ``has_input_map`` False for layers whose rules read
    ``R_out`` only (vocabularies, per-channel layers); ``one_channel_map`` True for a layer with one map
    acting on input and output (depthwise convolutions); ``owns_children`` True when the kind's spec
    covers its sub-modules (they get no spec of their own); ``lora_name`` how a LoRA report names the
    layout (None: no LoRA can hold the layer); ``fan_in_fan_out`` whether its LoRA is stored ``(in, out)``.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    has_input_map: ClassVar[bool] = True
    one_channel_map: ClassVar[bool] = False
    owns_children: ClassVar[bool] = False
    lora_name: ClassVar[str | None] = None
    fan_in_fan_out: ClassVar[bool] = False

    def pairs_with(self, other: LayerKind) -> bool:
        """Whether a point of this kind may be paired with one of ``other`` (the same family)."""
        return (self.family or self.name) == (other.family or other.name)

    # --- recognition and spec ------------------------------------------------------------------------
    def matches(self, module: nn.Module) -> bool:
        """Whether ``module`` is a layer of this kind."""
        return False

    def spec(self, name: str, module: nn.Module, ctx: SpecContext) -> tuple[list[Point], dict[str, tuple[Rule, ...]]]:
        """Capture points and ``{parameter (or buffer) name: rules}`` of the module ``name``."""
        raise NotImplementedError(f"layer kind {self.name!r} infers no spec")

    def entries(self, name: str, module: nn.Module) -> dict[str, tuple[int, ...]]:
        """Shapes of the buffers of ``module`` a transfer carries besides parameters (none by default)."""
        return {}

    # --- capture and rows ----------------------------------------------------------------------------
    def hooked(self, point: Point) -> tuple[str, bool]:
        """Where the point is captured: ``(module name, False)``, or ``(parameter name, True)`` for a bare ``x @ P``."""
        return point.name, False

    def rows(self, t: torch.Tensor, point: Point, side: str, *, seq_first: bool = False
             ) -> tuple[torch.Tensor, tuple[int, int] | None]:
        """``(B, T, d)`` rows of a tensor captured on ``side`` (``"in"``/``"out"``) and, for grids, ``(H, W)``.
        ``seq_first`` marks ``(T, B, d)`` tensors (``batch_first=False`` models)."""
        return token_rows(t, seq_first=seq_first)

    def row_format(self, point: Point, side: str) -> tuple:
        """How a captured tensor becomes rows; two requests share rows only with the same format."""
        return ("last",)

    # --- calibration -----------------------------------------------------------------------------------
    def affine(self, model: nn.Module, point: Point) -> AffineMap | None:
        """``(M, c)`` with ``output = M input + c`` for the point in ``model`` (None: not affine)."""
        return None

    # --- transport -------------------------------------------------------------------------------------
    def transport(self, rule: Rule, tau: torch.Tensor, shape: tuple[int, ...], maps: tuple[Any, Any], carry: Carry
                  ) -> torch.Tensor:
        """The target block of ``shape`` carried from the source block ``tau`` by ``maps = (R_in, R_out)``."""
        return _RULES[rule.kind].apply(rule, tau.to(torch.float64), shape, maps[0], maps[1], carry)

    # --- LoRA ------------------------------------------------------------------------------------------
    def lora_matrix(self, module: nn.Module, delta: torch.Tensor) -> torch.Tensor | None:
        """The ``out x in`` matrix a LoRA factors for the weight delta of ``module`` (None: no LoRA holds it)."""
        return None

    def lora_tensors(self, key: str, B: torch.Tensor, A: torch.Tensor, module: nn.Module) -> dict[str, torch.Tensor]:
        """The PEFT tensors of the factors ``B @ A`` (of :meth:`lora_matrix`) under the prefix ``key``."""
        return {f"{key}.lora_A.weight": A, f"{key}.lora_B.weight": B}

    def lora_delta(self, module: nn.Module, A: torch.Tensor, B: torch.Tensor, fan_in_fan_out: bool,
                   where: str) -> torch.Tensor:
        """The weight delta (the base weight's layout) of the LoRA factors ``A``, ``B``; ``where`` names it in errors."""
        return plain_lora_delta(A, B, fan_in_fan_out)


def register_kind(kind: LayerKind) -> LayerKind:
    """Add a layer kind (a name already taken raises ``ValueError``); kinds are tried in registration order."""
    if not kind.name or kind.name in _KINDS:
        raise ValueError(f"layer kind {kind.name!r} is {'already registered' if kind.name else 'unnamed'}")
    _KINDS[kind.name] = kind
    return kind


def layer_kinds() -> Mapping[str, LayerKind]:
    """The registered layer kinds by name, in registration order."""
    return dict(_KINDS)


def kind_for_module(module: nn.Module) -> LayerKind | None:
    """The first registered kind that recognises ``module``, or None for a module no kind knows."""
    return next((k for k in _KINDS.values() if k.matches(module)), None)

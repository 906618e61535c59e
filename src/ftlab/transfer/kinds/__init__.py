"""Layer kinds: everything the transfer knows about one kind of layer, in one module per kind.

A kind (:class:`~ftlab.transfer.kinds.base.LayerKind`) recognises its modules, infers their capture
points and transport rules, says where and how rows are captured, whether its output is affine in its
input, which maps it has, how a task vector block is carried, and how a LoRA factor of its weight is
written and read (see :mod:`ftlab.transfer.kinds.base`). The registry is filled by this folder: every
module in it is imported when the package is, in name order, and registers its kinds, so adding a layer
kind is adding one module here (and its test); each module's docstring describes its layers, and
:func:`layer_kinds` lists what is registered. The generic transport rules are in
:mod:`ftlab.transfer.kinds.rules`.
"""

from ftlab.core.discover import import_submodules
from ftlab.transfer.kinds import rules  # noqa: F401  (the generic rules first: their names lead every listing)
from ftlab.transfer.kinds.base import (
    AffineMap,
    Carry,
    LayerKind,
    NormGain,
    Point,
    Rule,
    RuleKind,
    SpecContext,
    kind_for_module,
    layer_kinds,
    register_kind,
    register_rule,
    rule_kinds,
    token_rows,
)

import_submodules(__name__, __path__)

__all__ = ["AffineMap", "Carry", "LayerKind", "NormGain", "Point", "Rule", "RuleKind", "SpecContext", "kind_for_module",
           "layer_kinds", "register_kind", "register_rule", "rule_kinds", "token_rows"]

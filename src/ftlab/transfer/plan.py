"""The calibration plan: which statistics a transfer collects, which it derives, which rows are shared.

Calibration runs in three steps (:mod:`ftlab.transfer.calibrate`): **plan** (here: pure functions of
the two transport specs, the point pairs and the method's requirements, no model is run), **stream**
(one forward(-backward) of both models per calibration batch, rows added to accumulators) and
**resolve** (every request answered by its accumulator or derived from another).

A *request* is one statistic of one paired capture point, keyed ``(target point, side, statistic)``:

=============  ==========  ==================================================================
statistic      side        rows
=============  ==========  ==================================================================
``act``        ``in``      the point's input activations
``act``        ``out``     the point's output activations
``grad``       ``out``     gradients of the loss at the point's output
``grad_in``    ``in``      gradients of the loss at the point's input
=============  ==========  ==================================================================

The plan decides, before any batch runs:

* **requests**: the method's statistics per side, the fitted one first (``primary``), then those
  its completion rule reads;
* **derived** requests: output activations of an *affine* point (its kind says so:
  :meth:`ftlab.transfer.kinds.LayerKind.affine`; linear, convolution, attention projection, bare
  ``x @ P``, BatchNorm in eval mode) whose input activations are collected are computed exactly from
  those (``Y_A^T Y_B = M_A X_A^T X_B M_B^T`` plus bias terms), so they cost nothing during the pass.
  The input activations of an affine point without an input map (a BatchNorm) are added as an
  *internal* request for this purpose (collected, never handed to the method);
* **row sharing** (:func:`share_rows`, from the first batch): requests whose rows are the same
  captured tensors in both models, formed the same way (the LayerNorm output that is the input of
  q, k and v), share one accumulator. Which tensors are the same is a fact of the models' graphs,
  seen on the first batch; the rule that turns it into owners is pure and lives here.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from ftlab.transfer.spec import Point

__all__ = ["CAPTURED", "CalibrationPlan", "Request", "Side", "Statistic", "aliased", "collected",
           "plan_calibration", "share_rows"]

Side = Literal["in", "out"]
Statistic = Literal["act", "grad", "grad_in"]
Key = tuple[str, str, str]

#: Which captured tensors feed each ``(side, statistic)`` (attribute names of :class:`ftlab.core.hooks.Captured`).
CAPTURED: Mapping[tuple[str, str], str] = {("in", "act"): "inputs", ("in", "grad_in"): "input_grads",
                                           ("out", "act"): "outputs", ("out", "grad"): "output_grads"}

@dataclass(frozen=True)
class Request:
    """One requested statistic of a point pair (target point ``tp`` paired with source point ``sp``).

    ``primary``: the statistic a map is fitted on (others feed its completion rule); ``internal``:
    collected only to derive another request, never handed to the method.
    """

    tp: str
    sp: str
    side: str
    stat: str
    pa: Point
    pb: Point
    primary: bool = False
    internal: bool = False

    @property
    def key(self) -> Key:
        return (self.tp, self.side, self.stat)

    @property
    def captured(self) -> str:
        """The :class:`~ftlab.core.hooks.Captured` field holding this request's tensors."""
        return CAPTURED[(self.side, self.stat)]

    @property
    def is_gradient(self) -> bool:
        return self.stat in ("grad", "grad_in")

    @property
    def dims(self) -> tuple[int, int]:
        """Row widths ``(d_A, d_B)``."""
        if self.side == "in":
            return (self.pa.in_dim, self.pb.in_dim)
        return (self.pa.out_dim, self.pb.out_dim)

    def row_format(self, p: Point) -> tuple:
        """How a captured tensor of point ``p`` becomes rows; two requests share rows only with the same format."""
        return p.layer_kind.row_format(p, self.side)

    def signature(self, ids_a: tuple[int, ...], ids_b: tuple[int, ...]) -> tuple:
        """What makes two requests' rows identical: the same tensors in both models, formed the same way."""
        return (ids_a, ids_b, self.row_format(self.pa), self.row_format(self.pb), self.dims)


@dataclass(frozen=True)
class CalibrationPlan:
    """What one calibration pass collects (see the module docstring).

    ``requests``: every request, internal ones included; ``derived[key] = base key`` for requests
    computed from another's statistics; ``backward``: whether a backward pass is needed;
    ``input_grads``: whether gradients at layer inputs are needed; ``second``: whether accumulators
    also hold second moments (``A^T A``, ``B^T B``: diagnostics, whitening).
    """

    requests: tuple[Request, ...]
    derived: Mapping[Key, Key] = field(default_factory=dict)
    backward: bool = False
    input_grads: bool = False
    second: bool = False

    @property
    def by_key(self) -> dict[Key, Request]:
        return {r.key: r for r in self.requests}

    def source_points(self) -> list[str]:
        """Source capture points to record, in request order."""
        return list(dict.fromkeys(r.sp for r in self.requests))

    def target_points(self) -> list[str]:
        """Target capture points to record, in request order."""
        return list(dict.fromkeys(r.tp for r in self.requests))

    def answered(self) -> list[Key]:
        """Keys of the requests handed to the method (all but the internal ones)."""
        return [r.key for r in self.requests if not r.internal]

    def sharing_order(self) -> list[Key]:
        """The order in which requests claim rows: fitted statistics first, then derived ones (free), then the rest."""
        prim = [r.key for r in self.requests if r.primary and r.key not in self.derived]
        rest = [r.key for r in self.requests if not r.primary and r.key not in self.derived]
        return prim + list(self.derived) + rest


def _as_tuple(got) -> tuple[str, ...]:
    if got is None:
        return ()
    return (got,) if isinstance(got, str) else tuple(got)


def plan_calibration(pairs: Mapping[str, str], source_points: Mapping[str, Point], target_points: Mapping[str, Point],
                     requirements: Mapping[str, Mapping[str, tuple[str, ...]]], *, affine: Collection[str] = (),
                     second: bool = False) -> CalibrationPlan:
    """The calibration plan for paired points ``pairs[target point] = source point``.

    ``requirements[tp] = {"in": (statistic, ...), "out": (statistic, ...)}``: what the method reads on
    each side, the fitted statistic first (:meth:`ftlab.transfer.methods.Method.requirements`).
    ``affine``: target points whose output activations are an affine function of their inputs in
    both models (their output activations are derived); pass nothing to collect every statistic.
    ``second``: accumulate second moments. Raises ``ValueError`` for an unknown statistic.
    """
    reqs: list[Request] = []
    for tp, sp in pairs.items():
        pa, pb = source_points[sp], target_points[tp]
        for side in ("in", "out"):
            for i, stat in enumerate(_as_tuple(requirements[tp].get(side))):
                if (side, stat) not in CAPTURED:
                    raise ValueError(f"unknown statistic {stat!r} on the {side} side of {tp!r}: must be one of "
                                     f"{', '.join(s for sd, s in CAPTURED if sd == side)}")
                reqs.append(Request(tp, sp, side, stat, pa, pb, primary=i == 0))
    keys = {r.key for r in reqs}
    derived: dict[Key, Key] = {}
    for r in list(reqs):
        if r.side != "out" or r.stat != "act" or r.tp not in affine:
            continue
        base = (r.tp, "in", "act")
        if not r.pb.layer_kind.has_input_map and base not in keys:  # BatchNorm: its input only to derive its output
            reqs.append(Request(r.tp, r.sp, "in", "act", r.pa, r.pb, internal=True))
            keys.add(base)
        if base in keys:
            derived[r.key] = base
    backward = any(r.is_gradient for r in reqs)
    input_grads = any(r.stat == "grad_in" for r in reqs)
    return CalibrationPlan(tuple(reqs), derived, backward, input_grads, second)


def share_rows(plan: CalibrationPlan, signatures: Mapping[Key, Hashable]) -> dict[Key, Key]:
    """``owners[key]``: the request whose accumulator serves ``key`` (itself when it owns one).

    ``signatures[key]`` (from the first batch, :meth:`Request.signature`) is equal for requests whose
    rows are identical; requests without rows (absent: e.g. no gradient reaches a data input) own
    an empty accumulator. Requests claim rows in :meth:`CalibrationPlan.sharing_order`.
    """
    first: dict[Hashable, Key] = {}
    owners: dict[Key, Key] = {}
    for key in plan.sharing_order():
        if key in signatures:
            owners[key] = first.setdefault(signatures[key], key)
    for r in plan.requests:
        owners.setdefault(r.key, r.key)
    return owners


def collected(plan: CalibrationPlan, owners: Mapping[Key, Key]) -> list[Key]:
    """Keys that own a streamed accumulator: owners of their own rows that are not derived."""
    return [key for key, own in owners.items() if own == key and key not in plan.derived]


def aliased(owners: Mapping[Key, Key]) -> list[Key]:
    """Keys that share an accumulator with another (both sides of every alias), checked on every batch."""
    return list(dict.fromkeys(k for key, own in owners.items() if own != key for k in (key, own)))

"""The frozen description of one transfer problem, handed to a method's ``prepare``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ftlab.transfer.layer_map import LayerMap
from ftlab.transfer.spec import TransportSpec

__all__ = ["TransferProblem"]


@dataclass(frozen=True)
class TransferProblem:
    """Specs of both models, the depth map and the target shapes.

    ``pairs[target_point] = source_point`` for every target capture point that has a source
    (points of target layers without a source are absent). ``target_shapes`` holds the shape of
    every target parameter (and of the floating-point buffers a spec transports, e.g. BatchNorm
    running statistics). ``source_spec``/``target_spec`` are ``None`` for methods that need no
    spec (naive, identity, gradfix). ``vocab_maps[param]``: validated vocabulary index maps of
    embedding tables (target row -> source row, -1 none). ``skip``: paired target points through
    which no nonzero block of the source task vector is carried (:func:`~ftlab.transfer.transport.carried_points`);
    their maps are neither calibrated nor fitted (ftlab's; exact: ``tau_B`` is zero there either way).
    ``zero_params``: the option's globs; a target parameter they name whose source counterpart is absent gets a
    zero delta from the copy methods (MPNet's relative attention bias against a BERT source).
    """

    layer_map: LayerMap
    target_shapes: Mapping[str, tuple[int, ...]]
    source_spec: TransportSpec | None = None
    target_spec: TransportSpec | None = None
    pairs: Mapping[str, str] | None = None
    vocab_maps: Mapping[str, torch.Tensor] | None = None
    skip: frozenset[str] = frozenset()
    zero_params: tuple[str, ...] = ()

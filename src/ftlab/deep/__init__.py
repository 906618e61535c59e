"""Initialization-scale interventions on deep networks (the analogues of the theory's c, lambda, gamma).

* :func:`rebalance_` -- relative scale kappa: an exact, function-preserving move of weight norm
  between the early layers and the readout of any positively homogeneous network (ReLU, no
  normalization), or, with ``normalization="absorb"``, of the scale-invariant weights of a
  normalized one (then only their effective learning rates change); :mod:`ftlab.deep.rebalance`.
* :func:`absolute_scale_` -- absolute scale s: every parameter times ``s``.
* :func:`reinit_readout_` -- a fresh readout of scale gamma.
* :func:`balancedness`, :func:`set_balancedness_`, :func:`rescale_stream_` -- the embedding/readout
  balance of a LayerNorm-free Transformer, set by a function-preserving rescale of its stream.
* :func:`recalibrate_batchnorm_` -- recompute BatchNorm running statistics.

Functions ending in ``_`` mutate the model in place and return a record. Geometry (PR, ENSD, CKA):
:mod:`ftlab.core.geometry`. Models: :mod:`ftlab.models`. The experiments that use this package (it
never imports them): :mod:`ftlab.experiments.deep_claims`. See docs/deep.md.
"""

from ftlab.deep.interventions import (
    BalanceRecord,
    ReadoutRecord,
    RescaleRecord,
    absolute_scale_,
    balancedness,
    find_readout,
    recalibrate_batchnorm_,
    reinit_readout_,
    rescale_stream_,
    set_balancedness_,
)
from ftlab.deep.rebalance import RebalanceRecord, UnitFactor, rebalance_

__all__ = [
    "BalanceRecord",
    "ReadoutRecord",
    "RebalanceRecord",
    "RescaleRecord",
    "UnitFactor",
    "absolute_scale_",
    "balancedness",
    "find_readout",
    "rebalance_",
    "recalibrate_batchnorm_",
    "reinit_readout_",
    "rescale_stream_",
    "set_balancedness_",
]

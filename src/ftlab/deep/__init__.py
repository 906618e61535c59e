"""Initialization-scale interventions and representation geometry on deep networks.

Interventions (named like ``torch.nn.init``; the ones ending in ``_`` mutate the model in place and
return a record of what changed): :func:`select`, :func:`early_late`, :func:`rescale_`,
:func:`relative_scale_` (kappa), :func:`absolute_scale_` (s), :func:`reinit_readout_` (gamma),
:func:`balancedness` / :func:`set_balancedness_`, :func:`recalibrate_batchnorm_`. Geometry:
:mod:`ftlab.core.geometry`. Models: :mod:`ftlab.models`. Experiments (which use this package; it never
imports them): :mod:`ftlab.experiments.deep_claims`. See docs/deep.md.
"""

from ftlab.deep.interventions import (
    BalanceRecord,
    ReadoutRecord,
    RescaleRecord,
    Selection,
    absolute_scale_,
    balancedness,
    depth_units,
    early_late,
    find_readout,
    recalibrate_batchnorm_,
    reinit_readout_,
    relative_scale_,
    rescale_,
    select,
    set_balancedness_,
)

__all__ = [
    "BalanceRecord",
    "ReadoutRecord",
    "RescaleRecord",
    "Selection",
    "absolute_scale_",
    "balancedness",
    "depth_units",
    "early_late",
    "find_readout",
    "recalibrate_batchnorm_",
    "reinit_readout_",
    "relative_scale_",
    "rescale_",
    "select",
    "set_balancedness_",
]

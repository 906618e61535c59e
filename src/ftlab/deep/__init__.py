"""Initialization-scale interventions and representation geometry on deep networks.

Interventions (named like ``torch.nn.init``; the ones ending in ``_`` mutate the model in place and
return a record of what changed): :func:`select`, :func:`early_late`, :func:`rescale_`,
:func:`relative_scale_` (kappa), :func:`absolute_scale_` (s), :func:`reinit_readout_` (gamma),
:func:`balancedness` / :func:`set_balancedness_`. Geometry: :mod:`ftlab.metrics`. Models:
:mod:`ftlab.deep.models`. Experiments: :mod:`ftlab.deep.experiments`. See docs/deep.md.
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
    "reinit_readout_",
    "relative_scale_",
    "rescale_",
    "select",
    "set_balancedness_",
]

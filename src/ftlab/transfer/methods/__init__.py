"""Transfer methods: one declared interface, one registry, the built-in methods registered on import.

See :mod:`ftlab.transfer.methods.registry` for the interface (:class:`Method`, :class:`FittedTransfer`)
and the registry; :mod:`~ftlab.transfer.methods.procrustes` for BiCo and its relatives;
:mod:`~ftlab.transfer.methods.baselines` for naive, identity and GradFix; :mod:`~ftlab.transfer.methods.transfusion`
for TransFusion. ``docs/transfer.md``
("Writing a method") shows a user's own method end to end.
"""

from ftlab.core.discover import import_submodules
from ftlab.transfer.methods.registry import (
    Bases,
    Calibration,
    FittedTransfer,
    Method,
    MethodInfo,
    Requirements,
    Statistics,
    get_method,
    list_methods,
    method_info,
    method_names,
    option_help,
    reads_batches,
    register,
)

import_submodules(__name__, __path__)  # every module of this folder registers its built-in methods

__all__ = ["Bases", "Calibration", "FittedTransfer", "Method", "MethodInfo", "Requirements", "Statistics", "get_method",
           "list_methods", "method_info", "method_names", "option_help", "reads_batches", "register"]

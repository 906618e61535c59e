"""Transfer methods: one declared interface, one registry, the built-in methods registered on import.

See :mod:`ftlab.transfer.methods.registry` for the interface (:class:`Method`, :class:`FittedTransfer`)
and the registry; :mod:`~ftlab.transfer.methods.procrustes` for BiCo and its relatives;
:mod:`~ftlab.transfer.methods.baselines` for naive, identity and GradFix. ``docs/transfer.md``
("Writing a method") shows a user's own method end to end.
"""

from ftlab.transfer.methods import baselines, procrustes, transfusion  # noqa: F401  (registers the built-in methods)
from ftlab.transfer.methods.registry import (
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
    register,
)

__all__ = ["Calibration", "FittedTransfer", "Method", "MethodInfo", "Requirements", "Statistics", "get_method",
           "list_methods", "method_info", "method_names", "option_help", "register"]

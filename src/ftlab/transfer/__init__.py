"""Training-free transfer of task vectors between base models (BiCo and baselines).

A user has a base model A, its fine-tuned version, and a new base model B that is wider,
narrower, deeper, shallower or pretrained on other data. :func:`transfer` builds B's task vector
from A's without training B. The default method, BiCo (Son, Jung, Park, Baik, arXiv:2605.28444),
fits per layer an orthogonal Procrustes map on input activations (``R_in``) and one on output
gradients (``R_out``) from one forward-backward pass of both frozen base models over a small
calibration set, and maps ``tau_B = R_out^T tau_A R_in``. Baselines: activation-only
(Theseus-like, arXiv:2602.12952), gradient-only, naive pad/truncate, identity, GradFix
(arXiv:2510.09658). Task vectors follow Ilharco et al. (arXiv:2212.04089).

Stable public API::

    from ftlab.transfer import transfer, fit_transfer, TransferOptions, get_method, TaskVector, list_methods, search_alpha
    from ftlab.transfer import diagnose   # before trusting a transfer: alignment per layer, estimated carried share

Methods implement :class:`~ftlab.transfer.methods.Method`; the registry
(:func:`~ftlab.transfer.list_methods`) is the one list of methods and their options.
"""

from ftlab.transfer.api import TransferResult, fit_transfer, split_options, transfer
from ftlab.transfer.diagnose import Diagnosis, diagnose
from ftlab.transfer.evaluate import DEFAULT_GRID, search_alpha
from ftlab.transfer.methods import Method, MethodInfo, get_method, list_methods
from ftlab.transfer.options import TransferOptions
from ftlab.transfer.spec import DEFAULT_ZERO, Point, Rule, TransportSpec, infer_spec
from ftlab.transfer.task_vector import TaskVector

__all__ = [
    "DEFAULT_GRID", "DEFAULT_ZERO", "Diagnosis", "Method", "MethodInfo", "Point", "Rule", "TaskVector", "TransferOptions",
    "TransferResult", "TransportSpec", "diagnose", "fit_transfer", "get_method", "infer_spec", "list_methods",
    "search_alpha", "split_options", "transfer",
]

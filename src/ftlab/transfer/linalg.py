"""Linear algebra the two Procrustes solvers share (:mod:`ftlab.transfer.align`, :mod:`ftlab.transfer.factored`).

* :func:`svd`: ``torch.linalg.svd`` with LAPACK's ``gesvd`` driver as the fallback where the
  divide-and-conquer driver does not converge;
* :func:`naive_map`: the pad/truncate map ``I_{d_A x d_B}``; :func:`pad_rows` applies its transpose;
* :func:`rank_rtol`: the relative singular-value tolerance below which a direction of a statistic is
  rounding, not signal (see the module docstring of :mod:`ftlab.transfer.align`);
* :data:`UNMAPPED`: the label of the directions no link of a completion chain decides (the map is zero
  there).
"""

from __future__ import annotations

import math

import torch

from ftlab.core.stats import EPS64

__all__ = ["SQRT_EPS64", "UNMAPPED", "naive_map", "pad_rows", "rank_rtol", "svd"]

#: The floor of the rank tolerance: every direction kept is mapped to about this accuracy.
SQRT_EPS64 = math.sqrt(EPS64)
#: ``MapFit.completed`` label of the directions the completion chain leaves undecided (mapped to zero).
UNMAPPED = "unmapped"


def svd(M: torch.Tensor, full_matrices: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.linalg.svd``; where its divide-and-conquer driver fails to converge (it does on some
    ill-conditioned float64 cross-covariances of real pretrained pairs), LAPACK's slower, more robust
    ``gesvd`` driver (through SciPy) on the same matrix."""
    try:
        return torch.linalg.svd(M, full_matrices=full_matrices)
    except torch.linalg.LinAlgError:
        import scipy.linalg

        u, s, vh = scipy.linalg.svd(M.detach().cpu().numpy(), full_matrices=full_matrices, lapack_driver="gesvd")
        return tuple(torch.from_numpy(x).to(device=M.device, dtype=M.dtype) for x in (u, s, vh))  # type: ignore[return-value]


def naive_map(d_a: int, d_b: int) -> torch.Tensor:
    """The pad/truncate "map" ``N = I_{d_A x d_B}``: ``N^T tau N`` zero-pads or truncates to the top-left block."""
    return torch.eye(d_a, d_b, dtype=torch.float64)


def pad_rows(X: torch.Tensor, d: int) -> torch.Tensor:
    """``N^T X`` for ``X`` with ``d_A`` rows and ``N = I_{d_A x d}``: the first ``min(d_A, d)`` rows kept, zero rows
    appended up to ``d``."""
    if X.shape[0] >= d:
        return X[:d]
    return torch.cat([X, X.new_zeros(d - X.shape[0], X.shape[1])])


def rank_rtol(eps: float, d_a: int, d_b: int, override: float | None = None) -> float:
    """Relative singular-value tolerance of a ``d_A x d_B`` statistic whose sums have precision ``eps``
    (machine epsilon; 0 = float64's): ``max(sqrt(eps_64), max(d_A, d_B) eps)``, or ``override``."""
    if override is not None:
        return float(override)
    return max(SQRT_EPS64, max(d_a, d_b) * (eps or EPS64))

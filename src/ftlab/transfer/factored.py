"""Procrustes maps in the cost of their rank: factored statistics, factored solves, factored maps.

A map fitted from ``n`` rows on widths ``d_A, d_B`` has a cross-covariance ``C = F_A^T F_B`` of rank
at most ``n``. When ``n`` is below the widths (wide layers, few calibration rows) everything the
completion rule of :mod:`ftlab.transfer.align` computes follows from ``n``-dimensional problems:

* **the determined part**: QR factors ``F_A^T = Q_A R_A``, ``F_B^T = Q_B R_B`` and the SVD of the
  small ``R_A R_B^T = u s v^T`` give ``C = (Q_A u) s (Q_B v)^T`` in ``O(d n^2)``, not ``O(d^3)``;
* **each statistic of the completion chain**: its rows projected onto the still undetermined
  subspaces (``F_2 (I - W W^T)``, ``W`` the directions fixed so far) and solved the same way;
* **the pad/truncate step**, which closes the chain: with ``W_A``, ``W_B`` the ``k`` directions fixed
  so far, ``Z = N W_B`` (``N = I_{d_A x d_B}``, ``d_A <= d_B``) and the eigen-decomposition
  ``Z^T (I - W_A W_A^T) Z = E S^2 E^T`` (``k x k``), the polar factor of the pad/truncate map on the
  undetermined subspaces is ``(P_A + G F G^T) N P_B`` with ``P = I - W W^T``,
  ``G = (I - W_A W_A^T) Z E S^-1`` and ``F = (1 - S^2)^-1/2 - 1`` -- the constrained Procrustes
  solution of the module docstring of :mod:`ftlab.transfer.align`, in closed form (a narrower
  target solves the transposed problem).

The map is kept as ``R = N + L M^T`` (:class:`LowRankMap`, ``O((d_A + d_B) k)`` numbers) and applied
in factored form: ``R_out^T tau R_in`` costs ``O(d_out d_in k)``, never a dense ``d x d`` map.
When the closed form would divide by a singular value below ``1e-5`` (the pad/truncate map nearly
orthogonal to what is left), the solver returns ``None`` and the caller uses the dense path, which
handles that case by the SVD's arbitrary pairing (as it always did).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["FACTORED_MIN_WIDTH", "LowRankMap", "as_dense", "factored_solve", "factors_of", "left_t", "right"]

#: Narrower maps are solved densely (a dense SVD of a few hundred columns is already cheap).
FACTORED_MIN_WIDTH = 256
_SAFE_SIGMA = 1e-5
_EPS64 = torch.finfo(torch.float64).eps


def _pad_rows(X: torch.Tensor, d: int) -> torch.Tensor:
    """``N^T X`` for ``X`` with ``d_A`` rows: the first ``min`` rows kept, zero rows appended up to ``d``."""
    if X.shape[0] >= d:
        return X[:d]
    return torch.cat([X, X.new_zeros(d - X.shape[0], X.shape[1])])


@dataclass(frozen=True)
class LowRankMap:
    """``R = N + left @ right^T``: the pad/truncate map ``N = I_{d_A x d_B}`` plus a rank-``k`` correction.

    ``left`` is ``(d_A, k)``, ``right`` ``(d_B, k)`` (float64, on the statistics' device).
    """

    left: torch.Tensor
    right: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.left.shape[0]), int(self.right.shape[0]))

    @property
    def device(self) -> torch.device:
        return self.left.device

    @property
    def rank(self) -> int:
        """Columns of the correction (an upper bound of its rank)."""
        return int(self.left.shape[1])

    def dense(self) -> torch.Tensor:
        """The ``(d_A, d_B)`` matrix."""
        d_a, d_b = self.shape
        return torch.eye(d_a, d_b, dtype=torch.float64, device=self.device) + self.left @ self.right.T

    def rmul(self, X: torch.Tensor) -> torch.Tensor:
        """``X @ R`` for ``X`` of shape ``(m, d_A)``."""
        d_a, d_b = self.shape
        XN = _pad_rows(X.T, d_b).T  # X @ N
        return XN + (X @ self.left) @ self.right.T

    def lmul_t(self, X: torch.Tensor) -> torch.Tensor:
        """``R^T @ X`` for ``X`` of shape ``(d_A, m)``."""
        return _pad_rows(X, self.shape[1]) + self.right @ (self.left.T @ X)

    def transpose(self) -> LowRankMap:
        return LowRankMap(self.right, self.left)


def as_dense(R) -> torch.Tensor:
    """A map as a dense float64 tensor."""
    return R.dense() if isinstance(R, LowRankMap) else R


def right(X: torch.Tensor, R) -> torch.Tensor:
    """``X @ R`` for a dense or low-rank map (``X`` moved to the map's device)."""
    if isinstance(R, LowRankMap):
        return R.rmul(X.to(R.device))
    return X.to(R.device) @ R


def left_t(R, X: torch.Tensor) -> torch.Tensor:
    """``R^T @ X`` for a dense or low-rank map."""
    if isinstance(R, LowRankMap):
        return R.lmul_t(X.to(R.device))
    return R.T @ X.to(R.device)


# --- factored statistics ---------------------------------------------------------------------------------


def factors_of(stats, *, center: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(F_A, F_B)`` with ``stats.covariance(center) = F_A^T F_B``, or None when the statistics are dense sums.

    Row statistics (:class:`~ftlab.core.stats.RowMoments`) give their rows; an affine derivation of
    them (:class:`~ftlab.transfer.align.AffineMoments`) gives the mapped rows ``X M^T + c``; a sum of
    normalised parts (:class:`~ftlab.transfer.align.SumMoments`) stacks its parts' rows, each scaled by
    the inverse norm of its cross-covariance.
    """
    own = getattr(stats, "factors", None)
    if own is None:
        return None
    return own(center=center)


def _fro_cross(F_A: torch.Tensor, F_B: torch.Tensor) -> float:
    """``||F_A^T F_B||_F`` from the ``n x n`` Gram matrices (``O(n^2 d)``)."""
    return math.sqrt(max(float(((F_A @ F_A.T) * (F_B @ F_B.T)).sum()), 0.0))


def _svd_of_factors(F_A: torch.Tensor, F_B: torch.Tensor):
    """Thin SVD of ``F_A^T F_B``: ``(U, s, V)`` with ``U (d_A, m)``, ``V (d_B, m)``, ``m <= n``."""
    from ftlab.transfer.align import svd

    Q_A, R_A = torch.linalg.qr(F_A.T)
    Q_B, R_B = torch.linalg.qr(F_B.T)
    u, s, vh = svd(R_A @ R_B.T)
    return Q_A @ u, s, Q_B @ vh.T


def _project_out(F: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Rows of ``F`` projected onto the orthogonal complement of ``span(W)``."""
    return F if W.shape[1] == 0 else F - (F @ W) @ W.T


def _naive_step(W_A: torch.Tensor, W_B: torch.Tensor, tol: float) -> tuple[LowRankMap, int] | None:
    """``R = W_A W_B^T + polar(P_A N P_B)`` for ``d_A <= d_B`` (see the module docstring); None if ill-posed."""
    d_a, d_b = W_A.shape[0], W_B.shape[0]
    Z = W_B[:d_a]  # N W_B
    H = W_A.T @ Z
    PZ = Z - W_A @ H  # (I - W_A W_A^T) N W_B
    tail = W_B[d_a:]  # Z^T Z = I - tail^T tail (W_B has orthonormal columns)
    gram = torch.eye(W_B.shape[1], dtype=W_B.dtype, device=W_B.device) - tail.T @ tail - H.T @ H  # = PZ^T PZ
    lam, E = torch.linalg.eigh((gram + gram.T) / 2)
    lam = lam.clamp(0.0, 1.0)
    sigma = torch.sqrt(1.0 - lam)  # singular values of the pad/truncate map on the undetermined subspaces
    if bool((sigma < max(tol, _SAFE_SIGMA)).any()):
        return None
    keep = lam > 1e-24  # directions with s ~ 0 add F ~ s^2 / 2 ~ 0
    E, s, F = E[:, keep], torch.sqrt(lam[keep]), 1.0 / sigma[keep] - 1.0
    PZE = PZ @ E
    G = PZE / s  # orthonormal: the left singular vectors of PZ
    # R = W_A W_B^T + (P_A + G F G^T) N P_B, with G^T Z = S E^T:
    #   = N + (W_A - PZ - PZE F E^T) W_B^T - W_A (N^T W_A)^T + (G F)(N^T G)^T
    left = torch.cat([W_A - PZ - (PZE * F) @ E.T, -W_A, G * F], dim=1)
    right_ = torch.cat([W_B, _pad_rows(W_A, d_b), _pad_rows(G, d_b)], dim=1)
    return LowRankMap(left, right_), d_a - W_A.shape[1]


def factored_solve(F_A: torch.Tensor, F_B: torch.Tensor, chain: Sequence, *, rank_tol: float, n_max: int,
                   rtol_of) -> tuple[LowRankMap | torch.Tensor, int, torch.Tensor, list[tuple[str, int]]] | None:
    """The completed Procrustes map of ``C = F_A^T F_B`` in factored form.

    ``chain``: ``(label, (G_A, G_B) or None)`` -- the completion statistics' factors, ``None`` for the
    pad/truncate map (the chain must end with it); ``rank_tol``: relative singular-value tolerance of
    the primary statistic; ``n_max``: the rank cap (rows, minus one when centred); ``rtol_of(label)``:
    the relative tolerance of a chain statistic. Returns ``(R, rank, singular values, completed)``, or
    None when the dense path must decide (see the module docstring).
    """
    d_a, d_b = F_A.shape[1], F_B.shape[1]
    if d_a > d_b:  # a narrower target: solve the transposed problem
        got = factored_solve(F_B, F_A, chain=[(lab, None if f is None else (f[1], f[0])) for lab, f in chain],
                             rank_tol=rank_tol, n_max=n_max, rtol_of=rtol_of)
        if got is None:
            return None
        R_t = got[0]
        return (R_t.transpose() if isinstance(R_t, LowRankMap) else R_t.T), got[1], got[2], got[3]
    U, s, V = _svd_of_factors(F_A, F_B)
    r = int((s > s[0] * rank_tol).sum()) if s.numel() and float(s[0]) > 0 else 0
    r = min(r, n_max)
    W_A, W_B = U[:, :r], V[:, :r]
    used: list[tuple[str, int]] = []
    for label, fac in chain:
        if fac is None:
            step = _naive_step(W_A, W_B, rtol_of(None))
            if step is None:
                return None
            R, filled = step
            if filled:
                used.append((label, filled))
            if R.rank * (d_a + d_b) >= d_a * d_b:  # the correction is no smaller than the matrix: keep the matrix
                return R.dense(), r, s, used
            return R, r, s, used
        G_A, G_B = fac
        scale = _fro_cross(G_A, G_B)
        if scale == 0 or W_A.shape[1] >= d_a:
            continue
        U2, s2, V2 = _svd_of_factors(_project_out(G_A, W_A), _project_out(G_B, W_B))
        r2 = int((s2 > rtol_of(label) * scale).sum())
        r2 = min(r2, d_a - W_A.shape[1])
        if r2:
            W_A, W_B = torch.cat([W_A, U2[:, :r2]], 1), torch.cat([W_B, V2[:, :r2]], 1)
            used.append((label, r2))
    return None  # a chain without the pad/truncate map: the dense path's arbitrary completion

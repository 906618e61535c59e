"""Procrustes maps in the cost of their rank: factored statistics, factored solves, factored maps.

A map fitted from ``n`` rows on widths ``d_A, d_B`` has a cross-covariance ``C = F_A^T F_B`` of rank
at most ``n``. When ``n`` is below the widths (wide layers, few calibration rows) everything the
completion rule of :mod:`ftlab.transfer.align` computes follows from ``n``-dimensional problems, and
the factored solver returns the same map as the dense one (the rule has one answer; see there):

* **the determined part**: QR factors ``F_A^T = Q_A R_A``, ``F_B^T = Q_B R_B`` and the SVD of the
  small ``R_A R_B^T = u s v^T`` give ``C = (Q_A u) s (Q_B v)^T`` in ``O(d n^2)``, not ``O(d^3)``;
* **each statistic of the completion chain**: its rows projected onto the still undetermined
  subspaces (``F_2 (I - W W^T)``, ``W`` the directions fixed so far) and solved the same way;
* **the pad/truncate step**, which closes the chain. With ``W_A``, ``W_B`` the ``k`` directions fixed
  so far, ``P = I - W W^T`` and ``N = I_{d_A x d_B}`` (``d_A <= d_B``; a narrower target solves the
  transposed problem), the step is the partial polar factor of ``X = P_A N P_B``: the polar factor on
  its singular values above the tolerance, zero on the others. ``X X^T = P_A - (P_A Z)(P_A Z)^T`` with
  ``Z = N W_B``, so ``X`` is an isometry on the part of ``range(P_A)`` orthogonal to ``span(P_A Z)``
  (``<= k`` dimensions). With ``G`` an orthonormal basis of ``span(P_A Z)`` (an SVD of the ``d_A x k``
  ``P_A Z``) and the thin SVD ``X^T G = P_B N^T G = U S E^T`` (``d_B x k``), ``G' = G E`` carries
  ``X^T G' = U S``, and the step is

      polar_r(X) = X - G' D U^T,   D = diag(s_i - 1 where s_i > tol, s_i where s_i <= tol):

  ``G'_i`` is sent to ``U_i`` where it is decided and to zero where it is not; nothing is divided by a
  small singular value, so the singular case costs what the regular one does.

  Where more than half of A's directions are already fixed (``2k > d_A``), the same partial polar factor
  is cheaper on the complements: with orthonormal bases ``Q_A``, ``Q_B`` of ``range(P_A)``, ``range(P_B)``
  (the trailing columns of complete QR factorisations of ``W_A``, ``W_B``), ``X = Q_A (Q_A^T N Q_B) Q_B^T``,
  so one SVD of the ``(d_A - k) x (d_B - k)`` core gives it (two complete QRs and an SVD of the small core,
  against two SVDs of ``d x k`` matrices; the map is then dense, as a correction of ``N`` would be larger).
  Both ways give one map (property-tested, singular steps included): the rule, not the solver, fixes it.

The map is kept as ``R = N + L M^T`` (:class:`LowRankMap`, ``O((d_A + d_B) k)`` numbers) and applied
in factored form: ``R_out^T tau R_in`` costs ``O(d_out d_in k)``, never a dense ``d x d`` map.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ftlab.transfer.linalg import UNMAPPED, pad_rows, svd

__all__ = ["FACTORED_MIN_WIDTH", "LowRankMap", "as_dense", "cross_norm", "factored_solve", "factors_of", "left_t",
           "right"]

#: Narrower maps are solved densely (a dense SVD of a few hundred columns is already cheap).
FACTORED_MIN_WIDTH = 256
#: Directions of ``span(P_A Z)`` with a singular value of ``P_A Z`` below this have ``s >= sqrt(1 - 1e-24)``:
#: the pad/truncate map is an isometry on them to float64 precision.
_ISOMETRIC = 1e-12
#: A solved map is kept factored while its correction holds at most this multiple of the dense matrix's numbers:
#: forming the matrix costs a ``d_A x k x d_B`` product (about 1 s for a 3072-wide map of rank 1632, where both
#: forms hold the same number of floats to within 6%), and the factored form applies in the same time.
_KEEP_FACTORED = 1.25


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
        XN = pad_rows(X.T, d_b).T  # X @ N
        return XN + (X @ self.left) @ self.right.T

    def lmul_t(self, X: torch.Tensor) -> torch.Tensor:
        """``R^T @ X`` for ``X`` of shape ``(d_A, m)``."""
        return pad_rows(X, self.shape[1]) + self.right @ (self.left.T @ X)

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


def cross_norm(F_A: torch.Tensor, F_B: torch.Tensor) -> float:
    """``||F_A^T F_B||_F`` from the ``n x n`` Gram matrices (``O(n^2 d)``)."""
    return math.sqrt(max(float(((F_A @ F_A.T) * (F_B @ F_B.T)).sum()), 0.0))


def _svd_of_factors(F_A: torch.Tensor, F_B: torch.Tensor):
    """Thin SVD of ``F_A^T F_B``: ``(U, s, V)`` with ``U (d_A, m)``, ``V (d_B, m)``, ``m <= n``."""
    Q_A, R_A = torch.linalg.qr(F_A.T)
    Q_B, R_B = torch.linalg.qr(F_B.T)
    u, s, vh = svd(R_A @ R_B.T)
    return Q_A @ u, s, Q_B @ vh.T


def _project_out(F: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Rows of ``F`` projected onto the orthogonal complement of ``span(W)``."""
    return F if W.shape[1] == 0 else F - (F @ W) @ W.T


def _naive_step(W_A: torch.Tensor, W_B: torch.Tensor, tol: float) -> tuple[LowRankMap, int, int]:
    """``R = W_A W_B^T + polar_r(P_A N P_B)`` for ``d_A <= d_B`` (see the module docstring): the map, the number of
    directions the step fixes and the number it leaves unmapped."""
    d_a, d_b = W_A.shape[0], W_B.shape[0]
    Z = W_B[:d_a]  # N W_B
    PZ = Z - W_A @ (W_A.T @ Z)  # P_A N W_B
    G, g, _ = svd(PZ)
    G = G[:, g > _ISOMETRIC]
    NG = pad_rows(G, d_b)
    U, sig, Eh = svd(NG - W_B @ (W_B.T @ NG))  # X^T G = P_B N^T G (G lies in range(P_A))
    decided = sig > tol
    D = torch.where(decided, sig - 1.0, sig)
    # R = W_A W_B^T + X - G' D U^T, X = N - W_A (N^T W_A)^T - Z W_B^T + W_A (W_A^T Z) W_B^T
    left = torch.cat([W_A - PZ, -W_A, -(G @ Eh.T) * D], dim=1)
    right_ = torch.cat([W_B, pad_rows(W_A, d_b), U], dim=1)
    unmapped = int((~decided).sum())
    return LowRankMap(left, right_), d_a - W_A.shape[1] - unmapped, unmapped


def _naive_step_complement(W_A: torch.Tensor, W_B: torch.Tensor, tol: float) -> tuple[torch.Tensor, int, int]:
    """The same map as :func:`_naive_step`, computed on the complements (``d_A <= d_B``): with orthonormal bases
    ``Q_A`` of ``range(P_A)`` and ``Q_B`` of ``range(P_B)``, ``X = Q_A (Q_A^T N Q_B) Q_B^T``, so the partial polar
    factor of ``X`` is that of the ``(d_A - k) x (d_B - k)`` core, mapped back. Cheaper than :func:`_naive_step` when
    the ``k`` fixed directions are more than half the width (the map is then returned dense: a correction of
    ``N`` would hold more numbers than the matrix)."""
    d_a, k = W_A.shape
    if k >= d_a:  # every direction of A is fixed: nothing is left to complete
        return W_A @ W_B.T, 0, 0
    Q_A = torch.linalg.qr(W_A, mode="complete")[0][:, k:]  # the last d - k columns of a complete QR span the complement
    Q_B = torch.linalg.qr(W_B, mode="complete")[0][:, k:]
    u, sig, vh = svd(Q_A.T @ Q_B[:d_a])  # Q_A^T N Q_B
    decided = sig > tol
    R = W_A @ W_B.T + (Q_A @ u[:, decided]) @ (vh[decided] @ Q_B.T)
    unmapped = int((~decided).sum())  # the core has d_A - k singular values (d_A - k <= d_B - k)
    return R, d_a - k - unmapped, unmapped


def factored_solve(F_A: torch.Tensor, F_B: torch.Tensor, chain: Sequence, *, rank_tol: float, n_max: int,
                   tol_of: Callable[[str | None, float], float]
                   ) -> tuple[LowRankMap | torch.Tensor, int, torch.Tensor, list[tuple[str, int]]]:
    """The completed Procrustes map of ``C = F_A^T F_B`` in factored form.

    ``chain``: ``(label, (G_A, G_B) or None)`` -- the completion statistics' factors, ``None`` for the
    pad/truncate map (the chain must end with it); ``rank_tol``: relative singular-value tolerance of
    the primary statistic; ``n_max``: the rank cap (rows, minus one when centred); ``tol_of(label, scale)``:
    the absolute tolerance of a chain statistic whose cross-covariance has norm ``scale`` (label None:
    the pad/truncate map, scale 1). Returns ``(R, rank, singular values, completed)``.
    """
    d_a, d_b = F_A.shape[1], F_B.shape[1]
    if d_a > d_b:  # a narrower target: solve the transposed problem
        R_t, rank, sv, used_t = factored_solve(F_B, F_A, [(lab, None if f is None else (f[1], f[0])) for lab, f in chain],
                                               rank_tol=rank_tol, n_max=n_max, tol_of=tol_of)
        return (R_t.transpose() if isinstance(R_t, LowRankMap) else R_t.T), rank, sv, used_t
    U, s, V = _svd_of_factors(F_A, F_B)
    r = int((s > s[0] * rank_tol).sum()) if s.numel() and float(s[0]) > 0 else 0
    r = min(r, n_max)
    W_A, W_B = U[:, :r], V[:, :r]
    used: list[tuple[str, int]] = []
    for label, fac in chain:
        if fac is None:
            if 2 * W_A.shape[1] > d_a:  # more directions fixed than left: solve on the complements
                R_dense, filled, unmapped = _naive_step_complement(W_A, W_B, tol_of(None, 1.0))
                used += [(label, filled)] * bool(filled) + [(UNMAPPED, unmapped)] * bool(unmapped)
                return R_dense, r, s, used
            R, filled, unmapped = _naive_step(W_A, W_B, tol_of(None, 1.0))
            used += [(label, filled)] * bool(filled) + [(UNMAPPED, unmapped)] * bool(unmapped)
            if R.rank * (d_a + d_b) > _KEEP_FACTORED * d_a * d_b:  # the correction is larger: keep the matrix
                return R.dense(), r, s, used
            return R, r, s, used
        G_A, G_B = fac
        scale = cross_norm(G_A, G_B)
        if scale == 0 or W_A.shape[1] >= d_a:
            continue
        U2, s2, V2 = _svd_of_factors(_project_out(G_A, W_A), _project_out(G_B, W_B))
        r2 = min(int((s2 > tol_of(label, scale)).sum()), d_a - W_A.shape[1])
        if r2:
            W_A, W_B = torch.cat([W_A, U2[:, :r2]], 1), torch.cat([W_B, V2[:, :r2]], 1)
            used.append((label, r2))
    raise ValueError("factored_solve: the completion chain must end with the pad/truncate map (None)")

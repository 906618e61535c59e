"""Streaming float64 moment and cross-covariance accumulators (mergeable).

A *fitter* sees data batch by batch and never keeps the rows: :class:`Moments` accumulates the
count, the column sums and (optionally) the Gram matrix ``sum_n x_n x_n^T`` of one stream of rows
``x_n in R^p``; :class:`CrossMoments` does the same for two row-aligned streams ``(a_n, b_n)``,
``a_n in R^p``, ``b_n in R^q``, adding the cross-product ``sum_n a_n b_n^T`` (``p x q``).
Memory is ``O(p q)`` (plus ``O(p^2 + q^2)`` with second moments), independent of the number of
rows. Two accumulators over disjoint data merge exactly (``merge``), so statistics can be gathered
in parallel.

Sums are held in float64. Each batch product is formed in ``batch_dtype``; the default (``None``)
uses the data's own dtype, at least float32: float64 data give float64 products, so streaming equals
a one-shot float64 computation up to summation order; float32 data (a float32 model) give float32
batch products added to float64 running sums, about twice as fast on CPU as forming them in float64.
Pass ``batch_dtype=torch.float64`` to force float64 products.

Used by :mod:`ftlab.transfer` (cross-covariances for Procrustes maps; linear CKA, Kornblith et al.
2019, computed from the streamed sums).
"""

from __future__ import annotations

import math

import torch

__all__ = ["Moments", "CrossMoments"]


def _product_dtype(x: torch.Tensor, batch_dtype: torch.dtype | None) -> torch.dtype:
    if batch_dtype is not None:
        return batch_dtype
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _as_rows(x, dim: int, name: str) -> torch.Tensor:
    x = torch.as_tensor(x)
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: expected (n_rows, {dim})")
    return x.detach()


class Moments:
    """Streaming count, column sums and (optionally) Gram matrix of rows ``x_n in R^dim``.

    Parameters
    ----------
    dim:
        Number of columns ``p``.
    second:
        Also accumulate ``sum_n x_n x_n^T`` (``p x p``); needed for centering-aware Grams,
        whitening and CKA.
    batch_dtype:
        dtype in which each batch product is formed before being added to the float64 sums
        (``None``: the data's dtype, at least float32).
    """

    def __init__(self, dim: int, *, second: bool = False, batch_dtype: torch.dtype | None = None):
        if dim < 1:
            raise ValueError(f"dim={dim} is out of range: must be an integer >= 1")
        self.dim = int(dim)
        self.batch_dtype = batch_dtype
        self.n = 0
        self.sum = torch.zeros(dim, dtype=torch.float64)
        self.gram = torch.zeros(dim, dim, dtype=torch.float64) if second else None

    def update(self, x) -> Moments:
        """Add the rows of ``x`` (``(n_rows, dim)``); returns ``self``."""
        x = _as_rows(x, self.dim, "x")
        self.n += x.shape[0]
        self.sum += x.sum(0, dtype=torch.float64)
        if self.gram is not None:
            xb = x.to(_product_dtype(x, self.batch_dtype))
            self.gram += (xb.T @ xb).to(torch.float64)
        return self

    def merge(self, other: Moments) -> Moments:
        """Add the statistics of ``other`` (same ``dim``, gathered on other rows); returns ``self``."""
        if other.dim != self.dim or (other.gram is None) != (self.gram is None):
            raise ValueError("cannot merge Moments with a different dim or second-moment setting")
        self.n += other.n
        self.sum += other.sum
        if self.gram is not None:
            self.gram += other.gram
        return self

    @property
    def mean(self) -> torch.Tensor:
        """Column means (float64, ``(dim,)``)."""
        return self.sum / max(self.n, 1)

    def scatter(self, *, center: bool = False) -> torch.Tensor:
        """``X^T X`` or, with ``center``, ``X_c^T X_c`` (float64, ``(dim, dim)``)."""
        if self.gram is None:
            raise ValueError("second moments were not accumulated (construct with second=True)")
        if not center:
            return self.gram.clone()
        return self.gram - self.n * torch.outer(self.mean, self.mean)


class CrossMoments:
    """Streaming statistics of two row-aligned streams ``a_n in R^dim_a`` and ``b_n in R^dim_b``.

    Always holds the count, both column sums and the cross product ``A^T B`` (``dim_a x dim_b``,
    float64). With ``second=True`` it also holds ``A^T A`` and ``B^T B``, which enable partial
    whitening, the alignment residual ``||A R - B||_F`` and linear CKA.
    """

    def __init__(self, dim_a: int, dim_b: int, *, second: bool = False, batch_dtype: torch.dtype | None = None):
        self.a = Moments(dim_a, second=second, batch_dtype=batch_dtype)
        self.b = Moments(dim_b, second=second, batch_dtype=batch_dtype)
        self.batch_dtype = batch_dtype
        self.cross = torch.zeros(dim_a, dim_b, dtype=torch.float64)

    @property
    def n(self) -> int:
        """Number of row pairs seen."""
        return self.a.n

    @property
    def second(self) -> bool:
        return self.a.gram is not None

    def update(self, a, b) -> CrossMoments:
        """Add row-aligned batches ``a`` (``(n, dim_a)``) and ``b`` (``(n, dim_b)``); returns ``self``."""
        a = _as_rows(a, self.a.dim, "a")
        b = _as_rows(b, self.b.dim, "b")
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"a has {a.shape[0]} rows but b has {b.shape[0]}: rows must be aligned one to one")
        self.a.update(a)
        self.b.update(b)
        dt = _product_dtype(a if a.dtype == torch.float64 else b, self.batch_dtype)
        self.cross += (a.to(dt).T @ b.to(dt)).to(torch.float64)
        return self

    def merge(self, other: CrossMoments) -> CrossMoments:
        """Add the statistics of ``other`` (same shapes); returns ``self``."""
        if other.cross.shape != self.cross.shape:
            raise ValueError(f"cannot merge CrossMoments of shape {tuple(other.cross.shape)} into {tuple(self.cross.shape)}")
        self.a.merge(other.a)
        self.b.merge(other.b)
        self.cross += other.cross
        return self

    def covariance(self, *, center: bool = False) -> torch.Tensor:
        """``A^T B`` or, with ``center``, ``A_c^T B_c`` (float64, ``(dim_a, dim_b)``)."""
        if not center:
            return self.cross.clone()
        return self.cross - self.n * torch.outer(self.a.mean, self.b.mean)

    def residual(self, R: torch.Tensor, *, center: bool = False) -> float:
        """Relative misfit ``||A R - B||_F / ||B||_F`` of a map ``R`` (``dim_a x dim_b``), from the sums.

        Uses ``||A R - B||^2 = tr(R^T A^T A R) - 2 tr(R^T A^T B) + tr(B^T B)``. NaN without
        second moments or when ``B`` is zero.
        """
        if not self.second:
            return math.nan
        R = R.to(torch.float64)
        saa, sbb, sab = self.a.scatter(center=center), self.b.scatter(center=center), self.covariance(center=center)
        bb = float(torch.trace(sbb))
        if bb <= 0:
            return math.nan
        sq = float(torch.sum(R * (saa @ R))) - 2.0 * float(torch.sum(R * sab)) + bb
        return math.sqrt(max(sq, 0.0) / bb)

    def linear_cka(self) -> float:
        """Linear CKA of the two streams (Kornblith et al. 2019), from the centred sums.

        ``CKA = ||A_c^T B_c||_F^2 / (||A_c^T A_c||_F ||B_c^T B_c||_F)``; NaN without second moments
        or when either side is constant.
        """
        if not self.second:
            return math.nan
        num = float(torch.linalg.matrix_norm(self.covariance(center=True)) ** 2)
        na = torch.linalg.matrix_norm(self.a.scatter(center=True))
        den = float(na * torch.linalg.matrix_norm(self.b.scatter(center=True)))
        return num / den if den > 0 else math.nan

"""Streaming float64 moment and cross-covariance accumulators (mergeable).

A *fitter* sees data batch by batch and never keeps the rows: :class:`Moments` accumulates the
count, the column sums and (optionally) the Gram matrix ``sum_n x_n x_n^T`` of one stream of rows
``x_n in R^p``; :class:`CrossMoments` does the same for two row-aligned streams ``(a_n, b_n)``,
``a_n in R^p``, ``b_n in R^q``, adding the cross-product ``sum_n a_n b_n^T`` (``p x q``).
Memory is ``O(p q)`` (plus ``O(p^2 + q^2)`` with second moments), independent of the number of
rows. Two accumulators over disjoint data merge exactly (``merge``), so statistics can be gathered
in parallel.

Sums are held in float64. How each batch product is formed (``batch_dtype``):

* ``None`` (default): float64 data are multiplied in float64 straight into the float64 sums, so
  streaming equals a one-shot float64 computation up to summation order; float32 (or lower) data
  are multiplied in float32 into a float32 buffer that is flushed into the float64 sums every
  ``flush_rows`` rows (default 8192) and before any read. This is about 3x faster on CPU than
  converting every batch product, at the cost of one float32 buffer per product and a float32
  rounding error of a single ``flush_rows``-row product.
* ``torch.float64``: rows are converted and multiplied in float64 (exact float64 streaming).

**Error bound of float32 products** (what :attr:`CrossMoments.bound` and :attr:`Moments.bound` hold). A
float32 product of ``m`` rows, ``fl(A^T B)``, in any summation order and with or without fused
multiply-adds, satisfies ``|fl(A^T B) - A^T B| <= gamma_m |A|^T |B|`` entrywise, with
``gamma_m = m u / (1 - m u)`` and ``u = 2^-24`` (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., eq. 3.13). Taking Frobenius norms and Cauchy-Schwarz,
``||fl(A^T B) - A^T B||_F <= gamma_m ||A||_F ||B||_F``. Each staged block of ``m`` rows (at most
``flush_rows``; one batch with ``batch_dtype=torch.float32``) is added into the float64 sums once, so the
sums' error is at most the sum of these block bounds; the float64 additions themselves round at
``eps_64``, far below, and are not counted. The bound is 0 for float64 products (float64 products of
float32 rows are exact; of float64 rows, rounded at float64's precision like any float64 sum).

Each batch's rows are converted once to the dtype their products are formed in; the column sums and
``sum_n |x_n|^2`` (``Moments.sq_sum``) are read off that copy (float64 reductions of float64 rows, so no
second conversion). Every accumulator also holds ``sum_n |x_n|^2`` (float64, O(rows x width) to form)
and the *precision* of its sums (:attr:`Moments.eps`, :attr:`CrossMoments.eps`): the machine epsilon
of the coarsest products it formed (float32 staging gives float32's epsilon although the totals are
float64: every staged product was rounded to float32). A rank judged from these sums must use that
epsilon: float32 rounding is not signal. Products of float32 rows formed in float64 are exact
(a float32 x float32 product fits a float64), so such sums have float64 precision; the epsilon of
the coarsest rows seen is kept apart (``row_eps``).

With ``kernel=True`` the accumulators also hold the row-norm sums that the unbiased HSIC estimator
of Song et al. (2012) needs (``sum_n |x_n|^2 x_n``, ``sum_n |x_n|^4`` and, for a
pair, ``sum_n |b_n|^2 a_n``, ``sum_n |a_n|^2 b_n``, ``sum_n |a_n|^2 |b_n|^2``).

This is ftlab's one streaming-moments implementation: cross-covariances for any caller that fits maps
between two representations, and PR, ENSD and linear CKA in :mod:`ftlab.core.geometry` from the same
sums (:class:`~ftlab.core.geometry.GeometryAccumulator`, :func:`~ftlab.core.geometry.cka_from_moments`).
"""

from __future__ import annotations

import math

import torch

__all__ = ["EPS64", "CrossMoments", "Moments", "RowMoments", "cross_moments_nbytes", "gamma32"]

#: float64's machine epsilon: the precision of float64 sums (and of float64 products of float32 rows).
EPS64 = torch.finfo(torch.float64).eps
_U32 = 2.0 ** -24  # float32's unit roundoff


def gamma32(m: int) -> float:
    """``gamma_m = m u / (1 - m u)`` for float32 (``u = 2^-24``): the relative error bound of an ``m``-term product."""
    mu = m * _U32
    return mu / (1.0 - mu) if mu < 1.0 else math.inf


def cross_moments_nbytes(dim_a: int, dim_b: int, *, second: bool = False, batch_dtype: torch.dtype | None = None) -> int:
    """Bytes a :class:`CrossMoments` of these widths holds once allocated (float64 sums plus float32 staging buffers)."""
    staged = batch_dtype is None or batch_dtype == torch.float32
    shapes = [(dim_a, dim_b)] + ([(dim_a, dim_a), (dim_b, dim_b)] if second else [])
    return sum((8 + (4 if staged else 0)) * p * q for p, q in shapes)


#: Float64 rows a product gathers before it adds them into its sums: a product of fewer rows is bound by the
#: read and write of the whole ``p x q`` sum, so small batches (a calibration batch run in pieces, a layer with few
#: positions) are joined first. The rows held cost ``8 (p + q)`` bytes each, far below the sum's ``8 p q``.
_GATHER_ROWS = 128


def _owned(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy of it where it is a view of a larger tensor (so that holding it holds no more memory)."""
    return x if x.untyped_storage().nbytes() == x.numel() * x.element_size() else x.clone()


class _Product:
    """``sum_n a_n b_n^T`` in float64, with an optional float32 staging buffer (see the module docstring).

    Buffers are allocated by the first product (no separate zero fill). Rows arrive already converted
    to :meth:`dtype_for` (the caller converts each batch once and reads its column sums off the same copy).
    Float64 batches of fewer than :data:`_GATHER_ROWS` rows are gathered (copies that own their memory) and
    multiplied together once that many have come, or when the sums are read: the same sums up to summation order.
    """

    def __init__(self, p: int, q: int, batch_dtype: torch.dtype | None, flush_rows: int):
        self.shape = (p, q)
        self.batch_dtype = batch_dtype
        self.flush_rows = flush_rows
        self._total: torch.Tensor | None = None
        self._stage: torch.Tensor | None = None
        self._staged = 0
        self._staged_sq = (0.0, 0.0)  # squared Frobenius norms of the staged rows of each side
        self._blocks = 0  # float32 blocks added into the float64 sums
        self._gathered: list[tuple[torch.Tensor, torch.Tensor]] = []  # float64 row blocks not yet multiplied
        self._gathered_rows = 0
        #: machine epsilon of the coarsest product formed so far (0 before the first product)
        self.eps = 0.0
        self._bound = 0.0

    def dtype_for(self, a: torch.Tensor, b: torch.Tensor) -> torch.dtype:
        """The dtype the product of these rows is formed in."""
        if self.batch_dtype is None:
            return torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
        return self.batch_dtype

    def _add_total(self, m: torch.Tensor) -> None:
        if self._total is None:
            self._total = m.to(torch.float64) if m.dtype != torch.float64 else m
        else:
            self._total += m

    def add(self, a: torch.Tensor, b: torch.Tensor, sq_a: float, sq_b: float) -> None:
        """Add ``a^T b`` (rows already in :meth:`dtype_for`; ``sq_a``, ``sq_b`` their squared Frobenius norms)."""
        if a.dtype == torch.float64:
            self.eps = max(self.eps, EPS64)
            if a.shape[0] >= _GATHER_ROWS and not self._gathered:
                self._add64(a, b)
                return
            self._gathered.append((_owned(a), b if b is a else _owned(b)))
            self._gathered_rows += a.shape[0]
            if self._gathered_rows >= _GATHER_ROWS:
                self._multiply_gathered()
            return
        self.eps = max(self.eps, torch.finfo(a.dtype).eps)
        if self._stage is None:
            self._stage = a.T @ b
        else:
            self._stage.addmm_(a.T, b)
        self._staged += a.shape[0]
        self._staged_sq = (self._staged_sq[0] + sq_a, self._staged_sq[1] + sq_b)
        if self.batch_dtype is not None or self._staged >= self.flush_rows:
            self.flush()

    @property
    def bound(self) -> float:
        """Bound on ``||sums - exact sums||_F`` from float32 products (module docstring; 0 for float64 products)."""
        if self._stage is not None:
            self.flush()
        return self._bound

    def _add64(self, a: torch.Tensor, b: torch.Tensor) -> None:
        if self._total is not None:
            self._total.addmm_(a.T, b)
        else:
            self._total = a.T @ b

    def _multiply_gathered(self) -> None:
        if self._gathered:
            blocks, self._gathered, self._gathered_rows = self._gathered, [], 0
            a = blocks[0][0] if len(blocks) == 1 else torch.cat([x for x, _ in blocks])
            b = blocks[0][1] if len(blocks) == 1 else torch.cat([y for _, y in blocks])
            self._add64(a, b)

    def flush(self) -> torch.Tensor:
        self._multiply_gathered()
        if self._stage is not None:
            self._add_total(self._stage)
            self._bound += gamma32(self._staged) * math.sqrt(self._staged_sq[0] * self._staged_sq[1])
            self._blocks += 1
            self._stage, self._staged, self._staged_sq = None, 0, (0.0, 0.0)
        if self._total is None:
            self._total = torch.zeros(self.shape, dtype=torch.float64)
        return self._total

    def merge(self, other: _Product) -> None:
        self.flush().add_(other.flush())
        self.eps = max(self.eps, other.eps)
        self._bound += other._bound
        self._blocks += other._blocks


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
    batch_dtype, flush_rows:
        How batch products are formed (see the module docstring).
    """

    def __init__(self, dim: int, *, second: bool = False, kernel: bool = False, batch_dtype: torch.dtype | None = None,
                 flush_rows: int = 8192, second_dtype: torch.dtype | None = None):
        if dim < 1:
            raise ValueError(f"dim={dim} is out of range: must be an integer >= 1")
        if kernel and not second:
            raise ValueError("kernel=True needs second=True (the unbiased HSIC also needs the Gram matrix)")
        self.dim = int(dim)
        self.n = 0
        self._sum: torch.Tensor | None = None  # allocated on the data's device by the first update
        gram_dtype = batch_dtype if second_dtype is None else second_dtype
        self._gram = _Product(dim, dim, gram_dtype, flush_rows) if second else None
        self.kernel = bool(kernel)
        #: ``sum_n |x_n|^2`` (float64; always accumulated)
        self.sq_sum = 0.0
        #: with ``kernel``: ``sum_n |x_n|^2 x_n`` ``(dim,)`` and ``sum_n |x_n|^4`` (float64; zeros otherwise)
        self.sq_weighted_sum = torch.zeros(self.dim, dtype=torch.float64)
        self.sq_sq_sum = 0.0
        #: machine epsilon of the coarsest rows seen (0 before the first update)
        self.row_eps = 0.0

    @property
    def sum(self) -> torch.Tensor:
        """Column sums (float64, ``(dim,)``)."""
        if self._sum is None:
            self._sum = torch.zeros(self.dim, dtype=torch.float64)
        return self._sum

    @property
    def gram(self) -> torch.Tensor | None:
        """``sum_n x_n x_n^T`` (float64) or None without second moments."""
        return None if self._gram is None else self._gram.flush()

    @property
    def bound(self) -> float:
        """Bound on the Frobenius error of :attr:`gram` from float32 products (module docstring; 0 without them)."""
        return 0.0 if self._gram is None else self._gram.bound

    def update(self, x) -> Moments:
        """Add the rows of ``x`` (``(n_rows, dim)``); returns ``self``."""
        x = _as_rows(x, self.dim, "x")
        wide = self._gram is None or self._gram.dtype_for(x, x) == torch.float64
        self._add(x, x.to(torch.float64) if wide else None)
        return self

    def _add(self, x: torch.Tensor, x64: torch.Tensor | None) -> tuple[float, torch.Tensor | None]:
        """Add checked rows ``x``, with ``x64`` their float64 copy when the caller made one (the sums are read off it:
        float64 reductions of float64 rows, no second conversion). Returns the rows' squared Frobenius norm and,
        with ``kernel`` sums, their squared row norms (float64)."""
        self.n += x.shape[0]
        if x.is_floating_point():
            self.row_eps = max(self.row_eps, torch.finfo(x.dtype).eps)
        if x64 is not None:
            s = x64.sum(0)
            sq = float(torch.linalg.vector_norm(x64)) ** 2
        else:  # float32 staging: one reduction each, accumulated in float64, without a float64 copy of the rows
            s = x.sum(0, dtype=torch.float64)
            sq = float(torch.linalg.vector_norm(x, dtype=torch.float64)) ** 2
        if self._sum is None:
            self._sum = s
        else:
            self._sum += s
        norms = None
        if self.kernel:
            xk = x64 if x64 is not None else x.to(torch.float64)
            norms = (xk * xk).sum(1)
            sq = float(norms.sum())
            self.sq_weighted_sum = self.sq_weighted_sum.to(norms.device) + norms @ xk
            self.sq_sq_sum += float(norms @ norms)
        self.sq_sum += sq
        if self._gram is not None:
            dt = self._gram.dtype_for(x, x)
            op = x64 if dt == torch.float64 and x64 is not None else x.to(dt)
            self._gram.add(op, op, sq, sq)
        return sq, norms

    def merge(self, other: Moments) -> Moments:
        """Add the statistics of ``other`` (same ``dim``, gathered on other rows); returns ``self``."""
        if other.dim != self.dim or (other._gram is None) != (self._gram is None) or other.kernel != self.kernel:
            raise ValueError("cannot merge Moments with a different dim, second-moment or kernel setting")
        self.n += other.n
        self._sum = self.sum + other.sum
        self.row_eps = max(self.row_eps, other.row_eps)
        self.sq_sum += other.sq_sum
        if self._gram is not None and other._gram is not None:
            self._gram.merge(other._gram)
        if self.kernel:
            self.sq_weighted_sum = self.sq_weighted_sum + other.sq_weighted_sum
            self.sq_sq_sum += other.sq_sq_sum
        return self

    @property
    def eps(self) -> float:
        """Machine epsilon of the precision of the Gram products (0 without second moments or updates)."""
        return self._gram.eps if self._gram is not None else 0.0

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
    whitening, the alignment residual ``||A R - B||_F`` and linear CKA
    (:func:`ftlab.core.geometry.cka_from_moments`); ``kernel=True`` adds the row-norm sums of the
    unbiased CKA (see the module docstring). ``second_dtype`` forms the second moments in another dtype
    than ``batch_dtype`` (``torch.float32``: per-batch float32 products added into float64 sums, with the
    error bound :attr:`Moments.bound`; for statistics that only report alignment, such as CKA).
    """

    def __init__(self, dim_a: int, dim_b: int, *, second: bool = False, kernel: bool = False,
                 batch_dtype: torch.dtype | None = None, flush_rows: int = 8192, second_dtype: torch.dtype | None = None):
        kw = {"second": second, "kernel": kernel, "batch_dtype": batch_dtype, "flush_rows": flush_rows,
              "second_dtype": second_dtype}
        self.a, self.b = Moments(dim_a, **kw), Moments(dim_b, **kw)  # type: ignore[arg-type]
        self._cross = _Product(dim_a, dim_b, batch_dtype, flush_rows)
        self.kernel = bool(kernel)
        #: with ``kernel``: ``sum_n |b_n|^2 a_n``, ``sum_n |a_n|^2 b_n`` and ``sum_n |a_n|^2 |b_n|^2`` (zeros otherwise)
        self.b_sq_weighted_a = torch.zeros(self.a.dim, dtype=torch.float64)
        self.a_sq_weighted_b = torch.zeros(self.b.dim, dtype=torch.float64)
        self.ab_sq_sum = 0.0

    @property
    def cross(self) -> torch.Tensor:
        """``sum_n a_n b_n^T`` (float64, ``(dim_a, dim_b)``)."""
        return self._cross.flush()

    @property
    def n(self) -> int:
        """Number of row pairs seen."""
        return self.a.n

    @property
    def second(self) -> bool:
        return self.a._gram is not None

    @property
    def product_dtype(self) -> torch.dtype | None:
        """The dtype every batch's rows are cast to before their products (``batch_dtype``), or None where it
        depends on the rows (float32 staging: float32 rows stay float32)."""
        return self._cross.batch_dtype

    def update(self, a, b) -> CrossMoments:
        """Add row-aligned batches ``a`` (``(n, dim_a)``) and ``b`` (``(n, dim_b)``); returns ``self``."""
        a = _as_rows(a, self.a.dim, "a")
        b = _as_rows(b, self.b.dim, "b")
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"a has {a.shape[0]} rows but b has {b.shape[0]}: rows must be aligned one to one")
        dt = self._cross.dtype_for(a, b)
        a64, b64 = (a.to(torch.float64), b.to(torch.float64)) if dt == torch.float64 else (None, None)
        (sa, na), (sb, nb) = self.a._add(a, a64), self.b._add(b, b64)
        self._cross.add(a64 if a64 is not None else a.to(dt), b64 if b64 is not None else b.to(dt), sa, sb)
        if self.kernel:
            assert na is not None and nb is not None
            self.b_sq_weighted_a = self.b_sq_weighted_a.to(na.device) + nb @ (a64 if a64 is not None else a.double())
            self.a_sq_weighted_b = self.a_sq_weighted_b.to(na.device) + na @ (b64 if b64 is not None else b.double())
            self.ab_sq_sum += float(na @ nb)
        return self

    def merge(self, other: CrossMoments) -> CrossMoments:
        """Add the statistics of ``other`` (same shapes); returns ``self``."""
        if other.cross.shape != self.cross.shape or other.kernel != self.kernel:
            raise ValueError(f"cannot merge CrossMoments of shape {tuple(other.cross.shape)} (kernel={other.kernel}) "
                             f"into {tuple(self.cross.shape)} (kernel={self.kernel})")
        self.a.merge(other.a)
        self.b.merge(other.b)
        self._cross.merge(other._cross)
        if self.kernel:
            self.b_sq_weighted_a = self.b_sq_weighted_a + other.b_sq_weighted_a
            self.a_sq_weighted_b = self.a_sq_weighted_b + other.a_sq_weighted_b
            self.ab_sq_sum += other.ab_sq_sum
        return self

    @property
    def eps(self) -> float:
        """Machine epsilon of the precision of the cross-covariance sums (0 before the first update).

        Float32 staging gives float32's epsilon; float32 rows multiplied in float64 give float64's
        (the products are exact): a structural zero direction then stays at float64 rounding. The
        second moments' precision is their own (:attr:`Moments.eps`).
        """
        return self._cross.eps

    @property
    def bound(self) -> float:
        """Bound on ``||cross - exact A^T B||_F`` from float32 products (module docstring; 0 for float64 products)."""
        return self._cross.bound

    def nbytes(self) -> int:
        """Bytes the accumulated matrices take once allocated (see :func:`cross_moments_nbytes`)."""
        return cross_moments_nbytes(self.a.dim, self.b.dim, second=self.second, batch_dtype=self._cross.batch_dtype)

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
        saa, sbb, sab = self.a.scatter(center=center), self.b.scatter(center=center), self.covariance(center=center)
        R = R.to(device=saa.device, dtype=torch.float64)
        bb = float(torch.trace(sbb))
        if bb <= 0:
            return math.nan
        sq = float(torch.sum(R * (saa @ R))) - 2.0 * float(torch.sum(R * sab)) + bb
        return math.sqrt(max(sq, 0.0) / bb)


class _RowSide:
    """One side of a :class:`RowMoments`: the rows themselves (read in float64), their sums and squared norms."""

    def __init__(self, dim: int, second: bool):
        self.dim = int(dim)
        self.n = 0
        self.sq_sum = 0.0
        self.row_eps = 0.0
        self._second = second
        self._blocks: list[torch.Tensor] = []
        self._sum: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        self._blocks.append(x)
        self._rows = None
        self.n += x.shape[0]
        if x.is_floating_point():
            self.row_eps = max(self.row_eps, torch.finfo(x.dtype).eps)
        x64 = x.to(torch.float64)  # transient: the rows are kept as they came (converted when read)
        s = x64.sum(0)
        self._sum = s if self._sum is None else self._sum + s
        self.sq_sum += float(torch.linalg.vector_norm(x64)) ** 2

    def rows(self) -> torch.Tensor:
        """All rows, ``(n, dim)`` float64 (on the rows' device)."""
        if self._rows is None:
            if not self._blocks:
                return torch.zeros(0, self.dim, dtype=torch.float64)
            self._rows = torch.cat([b.to(torch.float64) for b in self._blocks])
            self._blocks = [self._rows]
        return self._rows

    @property
    def sum(self) -> torch.Tensor:
        return self._sum if self._sum is not None else torch.zeros(self.dim, dtype=torch.float64)

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / max(self.n, 1)

    @property
    def eps(self) -> float:
        return EPS64 if (self._second and self.n) else 0.0

    @property
    def gram(self) -> torch.Tensor | None:
        if not self._second:
            return None
        X = self.rows()
        return X.T @ X

    def scatter(self, *, center: bool = False) -> torch.Tensor:
        """``X^T X`` or ``X_c^T X_c`` formed from the rows (float64, ``(dim, dim)``)."""
        if not self._second:
            raise ValueError("second moments were not accumulated (construct with second=True)")
        X = self.rows()
        if center:
            X = X - self.mean.to(X.device)
        return X.T @ X



class RowMoments:
    """Two row-aligned streams kept as rows: the statistics of :class:`CrossMoments` for maps fitted from few rows.

    A cross-covariance of ``n`` rows on widths ``p, q`` has rank at most ``n``: while ``n`` is below the
    widths, keeping the rows (``n (p + q)`` numbers) costs less memory than the ``p x q`` sums and lets a
    solver work in the cost of the rank (:meth:`factors`: ``C = F_A^T F_B``). Rows are stored as they
    come (no copy, no product during the stream) and read in float64, so every product formed from
    them is a float64 product (:attr:`eps` is float64's). Reads the same as :class:`CrossMoments`
    (``n``, ``a``/``b`` with ``sum``, ``mean``, ``sq_sum``, ``scatter``; ``cross``, ``covariance``,
    ``residual``); :meth:`to_dense` turns it into a :class:`CrossMoments` with the same sums.
    """

    kernel = False

    def __init__(self, dim_a: int, dim_b: int, *, second: bool = False):
        self.a = _RowSide(dim_a, second)
        self.b = _RowSide(dim_b, second)
        self._second = bool(second)

    @property
    def n(self) -> int:
        return self.a.n

    @property
    def second(self) -> bool:
        return self._second

    @property
    def eps(self) -> float:
        """Float64's machine epsilon once rows arrived (every product is formed in float64 from the rows)."""
        return EPS64 if self.n else 0.0

    def update(self, a, b) -> RowMoments:
        """Add row-aligned batches ``a`` (``(n, dim_a)``) and ``b`` (``(n, dim_b)``); returns ``self``."""
        a = _as_rows(a, self.a.dim, "a")
        b = _as_rows(b, self.b.dim, "b")
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"a has {a.shape[0]} rows but b has {b.shape[0]}: rows must be aligned one to one")
        self.a.add(a)
        self.b.add(b)
        return self

    def factors(self, *, center: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``(F_A, F_B)`` (``(n, dim_a)``, ``(n, dim_b)``, float64) with ``F_A^T F_B`` = :meth:`covariance`."""
        A, B = self.a.rows(), self.b.rows()
        if center:
            A, B = A - self.a.mean.to(A.device), B - self.b.mean.to(B.device)
        return A, B

    @property
    def cross(self) -> torch.Tensor:
        return self.covariance()

    def covariance(self, *, center: bool = False) -> torch.Tensor:
        """``A^T B`` or ``A_c^T B_c`` formed from the rows (float64, ``(dim_a, dim_b)``)."""
        A, B = self.factors(center=center)
        if A.shape[0] == 0:
            return torch.zeros(self.a.dim, self.b.dim, dtype=torch.float64)
        return A.T @ B

    def residual(self, R, *, center: bool = False) -> float:
        """Relative misfit ``||A R - B||_F / ||B||_F`` (NaN without second moments or when ``B`` is zero).

        ``R`` is a ``(dim_a, dim_b)`` tensor or any map with ``rmul(X) = X @ R``.
        """
        if not self.second:
            return math.nan
        A, B = self.factors(center=center)
        bb = float((B * B).sum())
        if bb <= 0:
            return math.nan
        AR = R.rmul(A) if hasattr(R, "rmul") else A @ R.to(device=A.device, dtype=torch.float64)
        return math.sqrt(float(((AR - B) ** 2).sum()) / bb)

    def nbytes(self) -> int:
        """Bytes the kept rows take (as stored)."""
        return sum(x.element_size() * x.numel() for side in (self.a, self.b) for x in side._blocks)

    def to_dense(self, batch_dtype: torch.dtype | None = torch.float64) -> CrossMoments:
        """A :class:`CrossMoments` holding the same statistics (the rows streamed into its sums)."""
        out = CrossMoments(self.a.dim, self.b.dim, second=self.second, batch_dtype=batch_dtype)
        if self.n:
            out.update(torch.cat(self.a._blocks), torch.cat(self.b._blocks))
        return out

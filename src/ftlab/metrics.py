"""Representation geometry: participation ratio, ENSD and linear CKA, one-shot or streamed.

All functions take ``(n_samples, n_features)`` arrays (numpy arrays or torch tensors; arrays with
more than two axes, e.g. conv feature maps ``(n, C, H, W)``, are flattened to ``(n, -1)``) and
compute in float64. Each one-shot function works in whichever of the sample space (``n x n``
Gram matrices) or the feature space (``p x p`` second moments) is smaller; the result is the same.

Definitions
-----------
With ``K = X^T X`` (features x features; columns mean-centred first when ``center=True``):

* participation ratio (Gao et al. 2017; as used by Giaffar et al. 2023)
  ``PR(X) = tr(K)^2 / tr(K^2)``, between 1 and ``min(n, p)``; it equals the dimension for isotropic
  data.
* effective number of shared dimensions (Giaffar, Rangel Buitrago, Rajan, Vidne, Kanitscheider
  2023, "The effective number of shared dimensions: a simple method for revealing shared structure
  between datasets") ``ENSD(X, Y) = tr(K1) tr(K2) tr(K1 K2) / (tr(K1^2) tr(K2^2))``; ``ENSD(X, X) =
  PR(X)`` and ``0 <= ENSD <= sqrt(PR(X) PR(Y))`` (Cauchy-Schwarz); two isotropic representations
  spanning subspaces that share k dimensions have ENSD ~ k. ``space="features"`` (default) uses
  ``K = X^T X`` as the ENSD code of Lippl & Lindsey (2024) does (X and Y need the same features, e.g. one layer before
  and after fine-tuning); ``space="samples"`` uses the Gram matrices ``K = X X^T`` of Giaffar et al.
  (X and Y need the same samples, any feature counts).
* linear CKA (Kornblith, Norouzi, Lee, Hinton 2019, "Similarity of neural network
  representations revisited") ``CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`` with
  column-centred ``Xc, Yc``; ``unbiased=True`` replaces each HSIC by the unbiased estimator of Song,
  Smola, Gretton, Bedo, Borgwardt (2012) (``n >= 4``), as recommended for CKA by Nguyen, Raghu,
  Kornblith (2021).

Streaming
---------
:class:`GeometryAccumulator` sums the first and second moments of one or two representations batch
by batch (mergeable across workers) and answers all three metrics exactly, equal to the one-shot
functions on the concatenated batches. It stores ``p x p`` (and ``p x q``) matrices, so it suits
layers with up to a few thousand features (pool conv maps first).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ftlab.validate import check_choice, check_int

__all__ = ["participation_ratio", "ensd", "linear_cka", "GeometryAccumulator", "as_matrix"]


def as_matrix(X, name: str = "X") -> np.ndarray:
    """``X`` as a finite float64 ``(n_samples, n_features)`` numpy array (torch tensors accepted)."""
    if hasattr(X, "detach") and hasattr(X, "cpu"):  # torch.Tensor without importing torch
        X = X.detach().cpu().double().numpy()
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim < 2:
        raise ValueError(f"{name} has shape {arr.shape}: must be (n_samples, n_features)")
    if arr.ndim > 2:
        arr = arr.reshape(arr.shape[0], -1)
    if arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError(f"{name} has shape {arr.shape}: needs at least one sample and one feature")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values (NaN or inf)")
    return arr


def _center(X: np.ndarray) -> np.ndarray:
    return X - X.mean(axis=0, keepdims=True)


def _gram_traces(X: np.ndarray) -> tuple[float, float]:
    """``(tr K, tr K^2)`` for ``K = X^T X``, computed in the smaller of the two spaces."""
    n, p = X.shape
    G = X @ X.T if n <= p else X.T @ X
    return float(np.trace(G)), float(np.sum(G * G))


def _check_nonzero(tr: float, name: str) -> None:
    if not tr > 0:
        raise ValueError(f"{name} is all zeros (after centring): the metric is undefined")


def participation_ratio(X, *, center: bool = False) -> float:
    """Participation ratio ``tr(K)^2 / tr(K^2)`` of ``X`` (``(n, p)``), ``K = X^T X``.

    ``center=True`` subtracts the feature means first (the covariance PR); the default matches the
    uncentred definition of the ENSD code of Lippl & Lindsey (2024). Dimensionless, in ``[1,
    min(n, p)]``.
    """
    X = as_matrix(X)
    if center:
        X = _center(X)
    tr, tr2 = _gram_traces(X)
    _check_nonzero(tr, "X")
    return tr * tr / tr2


def ensd(X, Y, *, center: bool = False, space: str = "features") -> float:
    """Effective number of shared dimensions of two representations (Giaffar et al. 2023).

    ``ENSD = tr(K1) tr(K2) tr(K1 K2) / (tr(K1^2) tr(K2^2))``. With ``space="features"`` (default,
    ``K = X^T X``), X ``(n1, p)`` and Y ``(n2, p)`` must share features; with ``space="samples"``
    (``K = X X^T``), X ``(n, p)`` and Y ``(n, q)`` must share samples. Satisfies ``ENSD(X, X) =
    PR(X)`` and ``0 <= ENSD <= sqrt(PR(X) PR(Y))`` (Cauchy-Schwarz).
    """
    check_choice("space", space, ("features", "samples"))
    X = as_matrix(X, "X")
    Y = as_matrix(Y, "Y")
    if space == "features" and X.shape[1] != Y.shape[1]:
        raise ValueError(f"X has {X.shape[1]} features and Y {Y.shape[1]}: space='features' needs the same features")
    if space == "samples" and X.shape[0] != Y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} samples and Y {Y.shape[0]}: space='samples' needs the same samples")
    if center:
        X, Y = _center(X), _center(Y)
    trx, trx2 = _gram_traces(X)
    tr_y, tr_y2 = _gram_traces(Y)
    _check_nonzero(trx, "X")
    _check_nonzero(tr_y, "Y")
    if space == "features":  # tr(X^T X Y^T Y) = ||X Y^T||_F^2 = tr((X^T X)(Y^T Y))
        if X.shape[0] * Y.shape[0] <= X.shape[1] ** 2:
            M = X @ Y.T
            cross = float(np.sum(M * M))
        else:
            cross = float(np.sum((X.T @ X) * (Y.T @ Y)))
    else:  # tr(X X^T Y Y^T) = ||X^T Y||_F^2
        if X.shape[1] * Y.shape[1] <= X.shape[0] ** 2:
            M = X.T @ Y
            cross = float(np.sum(M * M))
        else:
            cross = float(np.sum((X @ X.T) * (Y @ Y.T)))
    return trx * tr_y * cross / (trx2 * tr_y2)


def _hsic_unbiased_gram(K: np.ndarray, L: np.ndarray) -> float:
    """Unbiased HSIC estimator of Song et al. (2012) from two ``n x n`` kernel matrices."""
    n = K.shape[0]
    Kt = K - np.diag(np.diag(K))
    Lt = L - np.diag(np.diag(L))
    term1 = float(np.sum(Kt * Lt))
    term2 = float(Kt.sum()) * float(Lt.sum()) / ((n - 1) * (n - 2))
    term3 = 2.0 / (n - 2) * float(Kt.sum(axis=0) @ Lt.sum(axis=0))
    return (term1 + term2 - term3) / (n * (n - 3))


def linear_cka(X, Y, *, unbiased: bool = False) -> float:
    """Linear centred kernel alignment of X ``(n, p)`` and Y ``(n, q)`` (Kornblith et al. 2019).

    Invariant to orthogonal transforms and isotropic scaling of either input, 1 for identical
    inputs, in ``[0, 1]`` for the biased estimator. ``unbiased=True`` uses the unbiased HSIC of
    Song et al. (2012) (needs ``n >= 4``; the ratio may then fall slightly below 0).
    """
    X = as_matrix(X, "X")
    Y = as_matrix(Y, "Y")
    n = X.shape[0]
    if Y.shape[0] != n:
        raise ValueError(f"X has {n} samples and Y {Y.shape[0]}: CKA needs row-aligned inputs")
    if unbiased:
        check_int("n_samples", n, minimum=4)
        K, L = X @ X.T, Y @ Y.T
        hxy = _hsic_unbiased_gram(K, L)
        hxx = _hsic_unbiased_gram(K, K)
        hyy = _hsic_unbiased_gram(L, L)
    else:
        Xc, Yc = _center(X), _center(Y)
        p, q = X.shape[1], Y.shape[1]
        if n * n <= max(p * q, p * p, q * q):
            K, L = Xc @ Xc.T, Yc @ Yc.T
            hxy, hxx, hyy = float(np.sum(K * L)), float(np.sum(K * K)), float(np.sum(L * L))
        else:
            Cxy, Cxx, Cyy = Xc.T @ Yc, Xc.T @ Xc, Yc.T @ Yc
            hxy, hxx, hyy = float(np.sum(Cxy * Cxy)), float(np.sum(Cxx * Cxx)), float(np.sum(Cyy * Cyy))
    if not (hxx > 0 and hyy > 0):
        raise ValueError("X or Y has zero variance (after centring): CKA is undefined")
    return hxy / np.sqrt(hxx * hyy)


@dataclass
class _Moments:
    """Running sums of one representation: n, sum x, sum |x|^2 x, sum |x|^2, sum |x|^4, X^T X."""

    s: np.ndarray
    G: np.ndarray
    sa_x: np.ndarray  # sum_i |x_i|^2 x_i
    sa: float = 0.0  # sum_i |x_i|^2
    sa2: float = 0.0  # sum_i |x_i|^4


class GeometryAccumulator:
    """Streaming, mergeable float64 moments of one representation X, or of a row-aligned pair (X, Y).

    ``update(X)`` or ``update(X, Y)`` adds a batch of rows; ``merge(other)`` adds another
    accumulator's sums (e.g. from another worker). Then :meth:`participation_ratio`,
    :meth:`ensd` and :meth:`linear_cka` return exactly what the one-shot functions return on the
    concatenated batches (up to float64 rounding). Memory: ``p^2 + q^2 + p q`` floats.

    Example::

        acc = GeometryAccumulator()
        for xb, yb in batches:
            acc.update(xb, yb)
        acc.linear_cka(unbiased=True), acc.ensd(center=True)
    """

    def __init__(self) -> None:
        self.n = 0
        self._x: _Moments | None = None
        self._y: _Moments | None = None
        self._Gxy: np.ndarray | None = None
        self._sb_x: np.ndarray | None = None  # sum_i |y_i|^2 x_i
        self._sa_y: np.ndarray | None = None  # sum_i |x_i|^2 y_i
        self._sab = 0.0  # sum_i |x_i|^2 |y_i|^2

    @staticmethod
    def _new(p: int) -> _Moments:
        return _Moments(s=np.zeros(p), G=np.zeros((p, p)), sa_x=np.zeros(p))

    @property
    def paired(self) -> bool:
        return self._y is not None

    def update(self, X, Y=None) -> GeometryAccumulator:
        """Add a batch ``X`` ``(b, p)`` (and the row-aligned ``Y`` ``(b, q)``); returns ``self``."""
        X = as_matrix(X, "X")
        Yb = as_matrix(Y, "Y") if Y is not None else None
        if Yb is not None and Yb.shape[0] != X.shape[0]:
            raise ValueError(f"X batch has {X.shape[0]} rows and Y batch {Yb.shape[0]}: they must be row-aligned")
        if self._x is None:
            self._x = self._new(X.shape[1])
            if Yb is not None:
                self._y = self._new(Yb.shape[1])
                self._Gxy = np.zeros((X.shape[1], Yb.shape[1]))
                self._sb_x = np.zeros(X.shape[1])
                self._sa_y = np.zeros(Yb.shape[1])
        if X.shape[1] != self._x.s.size:
            raise ValueError(f"X batch has {X.shape[1]} features, earlier batches {self._x.s.size}")
        if (Yb is None) != (self._y is None):
            raise ValueError("Y must be given for every batch or for none")
        a = np.einsum("ij,ij->i", X, X)
        self._add(self._x, X, a)
        if Yb is not None:
            if Yb.shape[1] != self._y.s.size:
                raise ValueError(f"Y batch has {Yb.shape[1]} features, earlier batches {self._y.s.size}")
            b = np.einsum("ij,ij->i", Yb, Yb)
            self._add(self._y, Yb, b)
            self._Gxy += X.T @ Yb
            self._sb_x += b @ X
            self._sa_y += a @ Yb
            self._sab += float(a @ b)
        self.n += X.shape[0]
        return self

    @staticmethod
    def _add(m: _Moments, X: np.ndarray, a: np.ndarray) -> None:
        m.s += X.sum(axis=0)
        m.G += X.T @ X
        m.sa_x += a @ X
        m.sa += float(a.sum())
        m.sa2 += float(a @ a)

    def merge(self, other: GeometryAccumulator) -> GeometryAccumulator:
        """Add the sums of ``other`` (same feature counts, both paired or both single); returns ``self``."""
        if other._x is None:
            return self
        if self._x is None:
            self.__dict__.update(copy.deepcopy(other.__dict__))
            return self
        if self.paired != other.paired or self._x.s.size != other._x.s.size or (
            self.paired and self._y.s.size != other._y.s.size
        ):
            raise ValueError("cannot merge accumulators of different shapes (feature counts or pairing differ)")
        for mine, theirs in ((self._x, other._x), (self._y, other._y)):
            if mine is None:
                continue
            mine.s += theirs.s
            mine.G += theirs.G
            mine.sa_x += theirs.sa_x
            mine.sa += theirs.sa
            mine.sa2 += theirs.sa2
        if self.paired:
            self._Gxy += other._Gxy
            self._sb_x += other._sb_x
            self._sa_y += other._sa_y
            self._sab += other._sab
        self.n += other.n
        return self

    # ----------------------------------------------------------------- derived second moments
    def _require(self, paired: bool) -> None:
        if self._x is None:
            raise ValueError("the accumulator is empty: call update() first")
        if paired and not self.paired:
            raise ValueError("this metric needs a pair: call update(X, Y)")

    def _G(self, m: _Moments, center: bool) -> np.ndarray:
        return m.G - np.outer(m.s, m.s) / self.n if center else m.G

    def _Gc_xy(self, center: bool) -> np.ndarray:
        return self._Gxy - np.outer(self._x.s, self._y.s) / self.n if center else self._Gxy

    def participation_ratio(self, *, center: bool = False, which: str = "x") -> float:
        """PR of the accumulated X (``which="x"``) or Y (``which="y"``)."""
        check_choice("which", which, ("x", "y"))
        self._require(which == "y")
        G = self._G(self._x if which == "x" else self._y, center)
        tr = float(np.trace(G))
        _check_nonzero(tr, which.upper())
        return tr * tr / float(np.sum(G * G))

    def ensd(self, *, center: bool = False, space: str = "features") -> float:
        """ENSD of the accumulated pair (see :func:`ensd`)."""
        check_choice("space", space, ("features", "samples"))
        self._require(True)
        Gx, Gy = self._G(self._x, center), self._G(self._y, center)
        if space == "features":
            if Gx.shape != Gy.shape:
                raise ValueError(f"X has {Gx.shape[0]} features and Y {Gy.shape[0]}: space='features' needs equal features")
            cross = float(np.sum(Gx * Gy))
        else:
            C = self._Gc_xy(center)
            cross = float(np.sum(C * C))
        trx, tr_y = float(np.trace(Gx)), float(np.trace(Gy))
        _check_nonzero(trx, "X")
        _check_nonzero(tr_y, "Y")
        return trx * tr_y * cross / (float(np.sum(Gx * Gx)) * float(np.sum(Gy * Gy)))

    def _hsic_u(self, which: str) -> float:
        """Unbiased HSIC from moments (Song et al. 2012, eq. 5, expanded for linear kernels)."""
        n = self.n
        x, y = self._x, self._y
        if which == "xx":
            tr_kl = float(np.sum(x.G * x.G)) - x.sa2
            sk = sl = float(x.s @ x.s) - x.sa
            kl1 = float(x.s @ x.G @ x.s) - 2 * float(x.s @ x.sa_x) + x.sa2
        elif which == "yy":
            tr_kl = float(np.sum(y.G * y.G)) - y.sa2
            sk = sl = float(y.s @ y.s) - y.sa
            kl1 = float(y.s @ y.G @ y.s) - 2 * float(y.s @ y.sa_x) + y.sa2
        else:
            tr_kl = float(np.sum(self._Gxy * self._Gxy)) - self._sab
            sk = float(x.s @ x.s) - x.sa
            sl = float(y.s @ y.s) - y.sa
            kl1 = float(x.s @ self._Gxy @ y.s) - float(x.s @ self._sb_x) - float(y.s @ self._sa_y) + self._sab
        return (tr_kl + sk * sl / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * kl1) / (n * (n - 3))

    def linear_cka(self, *, unbiased: bool = False) -> float:
        """Linear CKA of the accumulated pair (see :func:`linear_cka`)."""
        self._require(True)
        if unbiased:
            check_int("n_samples", self.n, minimum=4)
            hxy, hxx, hyy = self._hsic_u("xy"), self._hsic_u("xx"), self._hsic_u("yy")
        else:
            Cxy = self._Gc_xy(True)
            Cxx, Cyy = self._G(self._x, True), self._G(self._y, True)
            hxy, hxx, hyy = float(np.sum(Cxy * Cxy)), float(np.sum(Cxx * Cxx)), float(np.sum(Cyy * Cyy))
        if not (hxx > 0 and hyy > 0):
            raise ValueError("X or Y has zero variance (after centring): CKA is undefined")
        return hxy / np.sqrt(hxx * hyy)

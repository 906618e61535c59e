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
  ``K = X^T X``, as the ENSD of Lippl & Lindsey (2024, arXiv 2310.02396) (X and Y need the same
  features, e.g. one layer before and after fine-tuning); ``space="samples"`` uses the Gram
  matrices ``K = X X^T`` of Giaffar et al. (X and Y need the same samples, any feature counts).
* linear CKA (Kornblith, Norouzi, Lee, Hinton 2019, "Similarity of neural network
  representations revisited") ``CKA = ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`` with
  column-centred ``Xc, Yc``; ``unbiased=True`` replaces each HSIC by the unbiased estimator of Song,
  Smola, Gretton, Bedo, Borgwardt (2012) (``n >= 4``), as recommended for CKA by Nguyen, Raghu,
  Kornblith (2021).

Degenerate input
----------------
Malformed input (no rows or no features, NaN/inf, mismatched shapes) raises ``ValueError``. A
representation that is all zeros (after centring, when centring is asked for) leaves every metric
0/0: PR, ENSD and CKA then return ``nan`` -- the same rule for the one-shot functions, the
accumulator and :func:`cka_from_moments` (so a layer that no gradient reaches reads as ``nan``, not as
a number).

Streaming
---------
:class:`GeometryAccumulator` streams the first and second moments of one or two representations
(:class:`ftlab.core.stats.Moments` / :class:`~ftlab.core.stats.CrossMoments`, float64, mergeable) and
answers all three metrics exactly, equal to the one-shot functions on the concatenated batches. It
stores ``p x p`` (and ``p x q``) matrices, so it suits layers with up to a few thousand features
(pool conv maps first). :func:`cka_from_moments` gives the CKA of any ``CrossMoments`` (statistics
streamed by any caller), optionally after a map ``R``.

Every metric ends in one formula (``_pr``, ``_ensd``, ``_cka``, ``_hsic_unbiased``); the one-shot
functions only choose whether the traces are formed in the sample space (``n x n``) or from the
feature-space moments, whichever is smaller.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from ftlab.core.hooks import activations
from ftlab.core.stats import CrossMoments, Moments, RowMoments
from ftlab.core.validate import check_choice, check_int

__all__ = ["GeometryAccumulator", "as_matrix", "cka_from_moments", "ensd", "layer_geometry", "linear_cka",
           "participation_ratio"]

Space = Literal["features", "samples"]


def as_matrix(X, name: str = "X") -> np.ndarray:
    """``X`` as a finite float64 ``(n_samples, n_features)`` numpy array (torch tensors accepted)."""
    if isinstance(X, torch.Tensor):
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


# ----------------------------------------------------------------------------------- the formulas
def _pr(tr: float, tr2: float) -> float:
    """``tr(K)^2 / tr(K^2)``; nan when ``K = 0``."""
    return tr * tr / tr2 if tr > 0 and tr2 > 0 else math.nan


def _ensd(trx: float, trx2: float, tr_y: float, tr_y2: float, cross: float) -> float:
    """``tr(K1) tr(K2) tr(K1 K2) / (tr(K1^2) tr(K2^2))``; nan when either ``K`` is 0."""
    if not (trx > 0 and tr_y > 0 and trx2 > 0 and tr_y2 > 0):
        return math.nan
    return trx * tr_y * cross / (trx2 * tr_y2)


def _cka(hxy: float, hxx: float, hyy: float) -> float:
    """``HSIC(X, Y) / sqrt(HSIC(X, X) HSIC(Y, Y))``; nan when either side has zero variance."""
    return hxy / math.sqrt(hxx * hyy) if hxx > 0 and hyy > 0 else math.nan


def _hsic_unbiased(n: int, tr_kl: float, sum_k: float, sum_l: float, kl1: float) -> float:
    """Unbiased HSIC (Song et al. 2012, eq. 5) from ``tr(K~ L~)``, ``1^T K~ 1``, ``1^T L~ 1`` and
    ``1^T K~ L~ 1``, where ``K~``/``L~`` are the kernels with their diagonals set to 0."""
    return (tr_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * kl1) / (n * (n - 3))


def _hsic_unbiased_kernels(K: np.ndarray, L: np.ndarray) -> float:
    Kt = K - np.diag(np.diag(K))
    Lt = L - np.diag(np.diag(L))
    return _hsic_unbiased(K.shape[0], float(np.sum(Kt * Lt)), float(Kt.sum()), float(Lt.sum()),
                          float(Kt.sum(axis=0) @ Lt.sum(axis=0)))


def _center(X: np.ndarray) -> np.ndarray:
    return X - X.mean(axis=0, keepdims=True)


def _traces(X: np.ndarray) -> tuple[float, float]:
    """``(tr K, tr K^2)`` for ``K = X^T X``, computed in the smaller of the two spaces."""
    n, p = X.shape
    G = X @ X.T if n <= p else X.T @ X
    return float(np.trace(G)), float(np.sum(G * G))


# ----------------------------------------------------------------------------------- one-shot
def participation_ratio(X, *, center: bool = False) -> float:
    """Participation ratio ``tr(K)^2 / tr(K^2)`` of ``X`` (``(n, p)``), ``K = X^T X``.

    ``center=True`` subtracts the feature means first (the covariance PR); the default matches the
    uncentred definition of the ENSD of Lippl & Lindsey (2024, arXiv 2310.02396). Dimensionless,
    in ``[1, min(n, p)]``; nan for an all-zero ``X``.
    """
    X = as_matrix(X)
    if center:
        X = _center(X)
    return _pr(*_traces(X))


def ensd(X, Y, *, center: bool = False, space: Space = "features") -> float:
    """Effective number of shared dimensions of two representations (Giaffar et al. 2023).

    ``ENSD = tr(K1) tr(K2) tr(K1 K2) / (tr(K1^2) tr(K2^2))``. With ``space="features"`` (default,
    ``K = X^T X``), X ``(n1, p)`` and Y ``(n2, p)`` must share features; with ``space="samples"``
    (``K = X X^T``), X ``(n, p)`` and Y ``(n, q)`` must share samples. Satisfies ``ENSD(X, X) =
    PR(X)`` and ``0 <= ENSD <= sqrt(PR(X) PR(Y))`` (Cauchy-Schwarz); nan when X or Y is all zeros.
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
    if space == "features":  # tr(X^T X Y^T Y) = ||X Y^T||_F^2
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
    return _ensd(*_traces(X), *_traces(Y), cross)


def linear_cka(X, Y, *, unbiased: bool = False) -> float:
    """Linear centred kernel alignment of X ``(n, p)`` and Y ``(n, q)`` (Kornblith et al. 2019).

    Invariant to orthogonal transforms and isotropic scaling of either input, 1 for identical
    inputs, in ``[0, 1]`` for the biased estimator; nan when X or Y has zero variance.
    ``unbiased=True`` uses the unbiased HSIC of Song et al. (2012) (needs ``n >= 4``; the ratio may
    then fall slightly below 0). Computed in the sample space when ``n`` is small against the
    widths, otherwise through :class:`GeometryAccumulator` (one pass of feature-space moments).
    """
    X = as_matrix(X, "X")
    Y = as_matrix(Y, "Y")
    n = X.shape[0]
    if Y.shape[0] != n:
        raise ValueError(f"X has {n} samples and Y {Y.shape[0]}: CKA needs row-aligned inputs")
    if unbiased:
        check_int("n_samples", n, minimum=4)
    p, q = X.shape[1], Y.shape[1]
    if n * n > max(p * q, p * p, q * q):
        return GeometryAccumulator().update(X, Y).linear_cka(unbiased=unbiased)
    if unbiased:
        K, L = X @ X.T, Y @ Y.T
        return _cka(_hsic_unbiased_kernels(K, L), _hsic_unbiased_kernels(K, K), _hsic_unbiased_kernels(L, L))
    Xc, Yc = _center(X), _center(Y)
    K, L = Xc @ Xc.T, Yc @ Yc.T
    return _cka(float(np.sum(K * L)), float(np.sum(K * K)), float(np.sum(L * L)))


def cka_from_moments(cm: CrossMoments | RowMoments, R: torch.Tensor | None = None, *, unbiased: bool = False) -> float:
    """Linear CKA of the two streams of ``cm`` (biased, or unbiased with ``kernel`` sums).

    With a map ``R`` (``dim_a x dim_b``) it is the CKA of ``A R`` and ``B`` (equal to the plain CKA
    when ``R`` is orthogonal; lower when ``R`` discards directions; biased estimator only). nan when
    ``cm`` holds no second moments or either side has zero variance.
    """
    if not cm.second:
        return math.nan
    if unbiased:
        if R is not None:
            raise ValueError("cka_from_moments: a map R is supported for the biased estimator only")
        if not isinstance(cm, CrossMoments) or not cm.kernel:
            raise ValueError("the unbiased CKA needs kernel sums: accumulate with CrossMoments(..., kernel=True)")
        check_int("n_samples", cm.n, minimum=4)
        return _cka(_hsic_u_moments(cm, "ab"), _hsic_u_moments(cm, "aa"), _hsic_u_moments(cm, "bb"))
    cab, saa, sbb = cm.covariance(center=True), cm.a.scatter(center=True), cm.b.scatter(center=True)
    if R is not None:
        R = R.to(device=cab.device, dtype=torch.float64)
        cab, saa = R.T @ cab, R.T @ saa @ R
    return _cka(float(torch.sum(cab * cab)), float(torch.sum(saa * saa)), float(torch.sum(sbb * sbb)))


def _hsic_u_moments(cm: CrossMoments, which: str) -> float:
    """Unbiased HSIC from linear-kernel moments: ``K~ = X X^T - diag(|x_i|^2)``, expanded in sums."""
    a, b = cm.a, cm.b
    if which in ("aa", "bb"):
        m = a if which == "aa" else b
        G, s = m.scatter(), m.sum
        tr_kl = float(torch.sum(G * G)) - m.sq_sq_sum
        sk = sl = float(s @ s) - m.sq_sum
        kl1 = float(s @ G @ s) - 2 * float(s @ m.sq_weighted_sum) + m.sq_sq_sum
    else:
        C = cm.covariance()
        tr_kl = float(torch.sum(C * C)) - cm.ab_sq_sum
        sk = float(a.sum @ a.sum) - a.sq_sum
        sl = float(b.sum @ b.sum) - b.sq_sum
        kl1 = (float(a.sum @ C @ b.sum) - float(a.sum @ cm.b_sq_weighted_a) - float(b.sum @ cm.a_sq_weighted_b)
               + cm.ab_sq_sum)
    return _hsic_unbiased(cm.n, tr_kl, sk, sl, kl1)


# ----------------------------------------------------------------------------------- streaming
class GeometryAccumulator:
    """Streaming, mergeable float64 moments of one representation X, or of a row-aligned pair (X, Y).

    ``update(X)`` or ``update(X, Y)`` adds a batch of rows; ``merge(other)`` adds another
    accumulator's sums (e.g. from another worker). Then :meth:`participation_ratio`, :meth:`ensd`
    and :meth:`linear_cka` return exactly what the one-shot functions return on the concatenated
    batches (up to float64 rounding). Memory: ``p^2 + q^2 + p q`` floats. The sums are
    :class:`ftlab.core.stats.Moments` / :class:`~ftlab.core.stats.CrossMoments` (``kernel=True``).

    Example::

        acc = GeometryAccumulator()
        for xb, yb in batches:
            acc.update(xb, yb)
        acc.linear_cka(unbiased=True), acc.ensd(center=True)
    """

    def __init__(self) -> None:
        self._single: Moments | None = None
        self._pair: CrossMoments | None = None

    @property
    def n(self) -> int:
        """Rows seen."""
        m = self._x
        return 0 if m is None else m.n

    @property
    def paired(self) -> bool:
        return self._pair is not None

    @property
    def _x(self) -> Moments | None:
        return self._pair.a if self._pair is not None else self._single

    def update(self, X, Y=None) -> GeometryAccumulator:
        """Add a batch ``X`` ``(b, p)`` (and the row-aligned ``Y`` ``(b, q)``); returns ``self``."""
        Xb = torch.from_numpy(as_matrix(X, "X"))
        Yb = torch.from_numpy(as_matrix(Y, "Y")) if Y is not None else None
        if Yb is not None and Yb.shape[0] != Xb.shape[0]:
            raise ValueError(f"X batch has {Xb.shape[0]} rows and Y batch {Yb.shape[0]}: they must be row-aligned")
        if self._x is None:
            if Yb is None:
                self._single = Moments(Xb.shape[1], second=True, kernel=True, batch_dtype=torch.float64)
            else:
                self._pair = CrossMoments(Xb.shape[1], Yb.shape[1], second=True, kernel=True, batch_dtype=torch.float64)
        if (Yb is None) != (self._pair is None):
            raise ValueError("Y must be given for every batch or for none")
        x = self._x
        assert x is not None
        if Xb.shape[1] != x.dim:
            raise ValueError(f"X batch has {Xb.shape[1]} features, earlier batches {x.dim}")
        if self._pair is not None:
            assert Yb is not None
            if Yb.shape[1] != self._pair.b.dim:
                raise ValueError(f"Y batch has {Yb.shape[1]} features, earlier batches {self._pair.b.dim}")
            self._pair.update(Xb, Yb)
        elif self._single is not None:
            self._single.update(Xb)
        return self

    def merge(self, other: GeometryAccumulator) -> GeometryAccumulator:
        """Add the sums of ``other`` (same feature counts, both paired or both single); returns ``self``."""
        if other._x is None:
            return self
        if self._x is None:
            self._single, self._pair = other._single, other._pair
            other._single = other._pair = None  # the sums now belong to self (no aliasing)
            return self
        try:
            if self._pair is not None and other._pair is not None:
                self._pair.merge(other._pair)
            elif self._single is not None and other._single is not None:
                self._single.merge(other._single)
            else:
                raise ValueError("pairing differs")
        except ValueError:
            raise ValueError("cannot merge accumulators of different shapes (feature counts or pairing differ)") from None
        return self

    def _require(self, paired: bool) -> None:
        if self._x is None:
            raise RuntimeError("the accumulator is empty: call update() first")
        if paired and not self.paired:
            raise RuntimeError("this metric needs a pair: call update(X, Y)")

    def participation_ratio(self, *, center: bool = False, which: Literal["x", "y"] = "x") -> float:
        """PR of the accumulated X (``which="x"``) or Y (``which="y"``)."""
        check_choice("which", which, ("x", "y"))
        self._require(which == "y")
        m = self._x if which == "x" else self._pair.b  # type: ignore[union-attr]
        G = m.scatter(center=center)  # type: ignore[union-attr]
        return _pr(float(torch.trace(G)), float(torch.sum(G * G)))

    def ensd(self, *, center: bool = False, space: Space = "features") -> float:
        """ENSD of the accumulated pair (see :func:`ensd`)."""
        check_choice("space", space, ("features", "samples"))
        self._require(True)
        pair = self._pair
        assert pair is not None
        Gx, Gy = pair.a.scatter(center=center), pair.b.scatter(center=center)
        if space == "features":
            if Gx.shape != Gy.shape:
                raise ValueError(f"X has {Gx.shape[0]} features and Y {Gy.shape[0]}: space='features' needs equal features")
            cross = float(torch.sum(Gx * Gy))
        else:
            C = pair.covariance(center=center)
            cross = float(torch.sum(C * C))
        return _ensd(float(torch.trace(Gx)), float(torch.sum(Gx * Gx)), float(torch.trace(Gy)), float(torch.sum(Gy * Gy)),
                     cross)

    def linear_cka(self, *, unbiased: bool = False) -> float:
        """Linear CKA of the accumulated pair (see :func:`linear_cka`)."""
        self._require(True)
        assert self._pair is not None
        return cka_from_moments(self._pair, unbiased=unbiased)


# ----------------------------------------------------------------------------------- models
def layer_geometry(reference: torch.nn.Module | dict[str, np.ndarray], model: torch.nn.Module, X: torch.Tensor,
                   layers: Sequence[str], *, space: Space = "features", batch_size: int = 500) -> list[dict]:
    """Per layer, the geometry of ``model``'s activations against ``reference``'s on the same inputs ``X``.

    ``reference`` is a model or the dict its :func:`ftlab.core.hooks.activations` returned for ``X``
    (to reuse one reference across many models). Per layer: ``pr_pre``/``pr_post`` (uncentred PR of
    the reference / the model), ``pr_pre_c``/``pr_post_c`` (centred), ``ensd``/``ensd_c`` (uncentred /
    centred ENSD in ``space``: ``"features"`` needs the same neurons, e.g. one network before and
    after fine-tuning; ``"samples"`` compares the Gram matrices and suits two different networks)
    and ``cka`` (linear, biased). Models run in eval mode; outputs are flattened to ``(n, features)``.
    """
    check_choice("space", space, ("features", "samples"))
    a = reference if isinstance(reference, dict) else activations(reference, X, layers, batch_size=batch_size)
    b = activations(model, X, layers, batch_size=batch_size)
    missing = [n for n in layers if n not in a]
    if missing:
        raise ValueError(f"reference activations lack layer {missing[0]!r}")
    return [{"layer": n, "pr_pre": participation_ratio(a[n]), "pr_post": participation_ratio(b[n]),
             "pr_pre_c": participation_ratio(a[n], center=True), "pr_post_c": participation_ratio(b[n], center=True),
             "ensd": ensd(a[n], b[n], space=space), "ensd_c": ensd(a[n], b[n], center=True, space=space),
             "cka": linear_cka(a[n], b[n])} for n in layers]

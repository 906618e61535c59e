"""Rows, token alignment and Procrustes maps.

* :func:`to_tokens` turns a captured tensor into ``(B, T, d)`` token rows for a point kind
  (conv inputs are unfolded into ``in*k*k`` patches).
* :func:`align_tokens` pairs the token rows of A and B on the same samples (``seq_align``):
  ``identity`` (same token count; padding rows dropped with a mask), ``interpolate`` (A's token
  axis resampled linearly to B's length), ``interpolate2d`` (square patch grids resampled
  bilinearly; ``n_prefix`` leading tokens such as CLS matched one to one), ``mean`` (one row per
  sample), ``cls`` (token 0 only). The choice is an option, not the paper's confirmed rule [U].
* :func:`procrustes` solves ``argmin_R ||A R - B||_F`` over (semi-)orthogonal ``R`` from the
  cross-covariance ``A^T B = U S V^T``: ``R = U V^T`` (Schoenemann 1966). Square: orthogonal;
  wider target (``d_A < d_B``): orthonormal rows, an isometric embedding; narrower target:
  orthonormal columns, a projection.
* :func:`fit_map` adds optional centering and partial whitening
  ``C <- S_AA^{-p} C S_BB^{-p}`` (``p`` in ``[0, 1/2]``; both off by default [U]) and warns when
  the calibration rows are fewer than the width (the map is then partly arbitrary).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch.nn import functional as F

from ftlab.core.geometry import cka_from_moments
from ftlab.core.stats import CrossMoments
from ftlab.core.validate import check_choice, check_range

__all__ = ["SEQ_ALIGN", "SeqAlign", "MapFit", "RankWarning", "align_tokens", "fit_map", "naive_map", "procrustes",
           "to_tokens"]

SeqAlign = Literal["identity", "interpolate", "interpolate2d", "mean", "cls"]
SEQ_ALIGN: tuple[str, ...] = get_args(SeqAlign)


class RankWarning(UserWarning):
    """The cross-covariance behind a Procrustes map has fewer rows than the width."""


def to_tokens(t: torch.Tensor, kind: str, *, side: str, conv: tuple | None = None, seq_first: bool = False
              ) -> tuple[torch.Tensor, tuple[int, int] | None]:
    """``(B, T, d)`` rows of a captured tensor and, for conv maps, the ``(H, W)`` grid.

    ``side`` is ``"in"`` or ``"out"``; ``kind`` a :class:`~ftlab.transfer.spec.Point` kind.
    ``seq_first`` marks ``(T, B, d)`` tensors of linear/norm points (``batch_first=False`` models).
    """
    t = t.detach()
    if kind == "conv2d":
        if t.ndim != 4:
            raise ValueError(f"conv2d point got a tensor of shape {tuple(t.shape)}: expected (B, C, H, W)")
        if side == "in":
            if conv is None:
                raise ValueError("a conv2d input point needs its (kernel, stride, padding, dilation)")
            k, s, p, d = conv
            cols = F.unfold(t, k, dilation=d, padding=p, stride=s)  # (B, C*k*k, L)
            h = (t.shape[2] + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
            w = (t.shape[3] + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
            return cols.transpose(1, 2), (h, w)
        return t.flatten(2).transpose(1, 2), (t.shape[2], t.shape[3])
    if kind == "norm2d" and t.ndim >= 3:
        grid = (t.shape[2], t.shape[3]) if t.ndim == 4 else None
        return t.flatten(2).transpose(1, 2), grid
    if t.ndim == 1:
        return t.reshape(1, 1, -1), None
    if t.ndim == 2:
        return t.unsqueeze(1), None  # (B, d): one row per sample
    if seq_first:
        t = t.transpose(0, 1)
    return t.reshape(t.shape[0], -1, t.shape[-1]), None


def _interp1d(x: torch.Tensor, length: int) -> torch.Tensor:
    if x.shape[1] == length:
        return x
    return F.interpolate(x.transpose(1, 2), size=length, mode="linear", align_corners=True).transpose(1, 2)


def _interp2d(x: torch.Tensor, grid_from: tuple[int, int], grid_to: tuple[int, int]) -> torch.Tensor:
    if tuple(grid_from) == tuple(grid_to):
        return x
    B, _, d = x.shape
    img = x.transpose(1, 2).reshape(B, d, *grid_from)
    img = F.interpolate(img, size=tuple(grid_to), mode="bilinear", align_corners=True)
    return img.reshape(B, d, -1).transpose(1, 2)


def _square_grid(t: int, n_prefix: int | None) -> tuple[int, tuple[int, int]]:
    if n_prefix is None:
        side = math.isqrt(t)
        n_prefix = t - side * side
    side = math.isqrt(t - n_prefix)
    if side * side != t - n_prefix:
        raise ValueError(f"interpolate2d: {t} tokens minus {n_prefix} prefix tokens do not form a square grid")
    return n_prefix, (side, side)


def align_tokens(a: torch.Tensor, b: torch.Tensor, mode: SeqAlign = "identity", *,
                 mask_a: torch.Tensor | None = None, mask_b: torch.Tensor | None = None,
                 grid_a: tuple[int, int] | None = None, grid_b: tuple[int, int] | None = None,
                 n_prefix: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-aligned ``(N, d_A)``, ``(N, d_B)`` from token tensors ``a`` (``(B, T_A, d_A)``) and ``b``.

    ``mask_a``/``mask_b`` (``(B, T)``, true = real token) drop padding rows (``identity``: rows kept
    where both are real; ``mean``: masked mean). ``grid_a``/``grid_b`` give conv grids for
    ``interpolate2d``; otherwise the grid is the largest square after ``n_prefix`` leading tokens.
    """
    check_choice("seq_align", mode, SEQ_ALIGN)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"source and target batches hold {a.shape[0]} and {b.shape[0]} samples: they must be paired")
    ta, tb = a.shape[1], b.shape[1]
    if mask_a is not None and tuple(mask_a.shape) != (a.shape[0], ta):
        mask_a = None
    if mask_b is not None and tuple(mask_b.shape) != (b.shape[0], tb):
        mask_b = None
    if mode == "mean":
        if mask_a is not None:
            ma = mask_a.to(a.dtype).unsqueeze(-1)
            ra = (a * ma).sum(1) / ma.sum(1).clamp_min(1)
        else:
            ra = a.mean(1)
        if mask_b is not None:
            mb = mask_b.to(b.dtype).unsqueeze(-1)
            rb = (b * mb).sum(1) / mb.sum(1).clamp_min(1)
        else:
            rb = b.mean(1)
        return ra, rb
    if mode == "cls":
        return a[:, 0], b[:, 0]
    if mode == "identity":
        if ta != tb:
            raise ValueError(f"seq_align='identity' needs equal token counts, got {ta} (source) and {tb} (target); "
                             "use interpolate, interpolate2d, mean or cls")
        keep = None
        if mask_a is not None or mask_b is not None:
            keep = (mask_a.bool() if mask_a is not None else True) & (mask_b.bool() if mask_b is not None else True)
        if keep is not None:
            return a[keep], b[keep]
        return a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    if mode == "interpolate":
        a = _interp1d(a, tb)
        return a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    # interpolate2d
    if grid_a is not None and grid_b is not None:
        pa = pb = 0
        ga, gb = grid_a, grid_b
    else:
        pa, ga = _square_grid(ta, n_prefix)
        pb, gb = _square_grid(tb, n_prefix)
        if pa != pb:
            raise ValueError(f"interpolate2d: source has {pa} prefix tokens but target has {pb}; set n_prefix")
    a = torch.cat([a[:, :pa], _interp2d(a[:, pa:], ga, gb)], dim=1)
    return a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])


def procrustes(C: torch.Tensor) -> torch.Tensor:
    """Polar factor ``U V^T`` of ``C = U S V^T`` (thin SVD in float64): the Procrustes map of ``C``."""
    C = C.to(torch.float64)
    U, _, Vh = torch.linalg.svd(C, full_matrices=False)
    return U @ Vh


def naive_map(d_a: int, d_b: int) -> torch.Tensor:
    """The pad/truncate "map" ``I_{d_A x d_B}``: ``R^T tau R`` zero-pads or truncates to the top-left block."""
    return torch.eye(d_a, d_b, dtype=torch.float64)


def _inv_power(S: torch.Tensor, p: float, eps: float) -> torch.Tensor:
    w, V = torch.linalg.eigh(S)
    floor = eps * max(float(w.max()), 0.0)
    w = w.clamp_min(floor if floor > 0 else eps)
    return (V * w.pow(-p)) @ V.T


@dataclass(frozen=True)
class MapFit:
    """A fitted map and how well it aligns the calibration rows.

    ``R`` is ``d_A x d_B`` (float64). ``residual`` is ``||A R - B||_F / ||B||_F`` on the
    calibration rows (NaN without second moments), ``residual_naive`` the same for the
    pad/truncate map, ``cka`` the linear CKA of the two row sets (invariant to orthogonal maps:
    how alignable the spaces are at best), ``cka_naive``/``cka_fit`` the CKA of ``A M`` and ``B``
    for the pad/truncate map and the fitted map (they differ only when a map drops directions),
    ``rank`` the numerical rank of the cross-covariance.
    ``converged``/``n_iter`` follow the library's solver convention (a closed-form SVD: always
    ``True``/``1``; ``False`` only when the cross-covariance was zero and the naive map was used).
    """

    R: torch.Tensor
    source: str
    n_rows: int
    rank: int
    residual: float
    residual_naive: float
    cka: float
    cka_naive: float = math.nan
    cka_fit: float = math.nan
    converged: bool = True
    n_iter: int = 1


def fit_map(stats: CrossMoments, *, source: str, center: bool = False, whiten_p: float = 0.0,
            eps: float = 1e-8, name: str = "") -> MapFit:
    """Procrustes map from streamed statistics, with optional centering and partial whitening.

    Falls back to :func:`naive_map` (with a warning) when the cross-covariance is exactly zero,
    e.g. when no gradient reaches the point.
    """
    check_range("whiten_p", whiten_p, 0.0, 0.5)
    C = stats.covariance(center=center)
    da, db = C.shape
    naive = naive_map(da, db)
    res_naive = stats.residual(naive, center=center)
    cka = cka_from_moments(stats)
    if not torch.any(C != 0):
        warnings.warn(f"{name}: the {source} cross-covariance is zero (no signal reached this point); "
                      "using the pad/truncate map", RankWarning, stacklevel=2)
        cka_naive = cka_from_moments(stats, naive)
        return MapFit(naive, source, stats.n, 0, res_naive, res_naive, cka, cka_naive, cka_naive, converged=False, n_iter=0)
    if whiten_p > 0:
        if not stats.second:
            raise ValueError("whiten_p > 0 needs second moments (diagnostics/whitening statistics)")
        wa = _inv_power(stats.a.scatter(center=center), whiten_p, eps)
        C = wa @ C @ _inv_power(stats.b.scatter(center=center), whiten_p, eps)
    U, sv, Vh = torch.linalg.svd(C.to(torch.float64), full_matrices=False)
    rank = int((sv > sv[0] * max(da, db) * torch.finfo(torch.float64).eps).sum())
    # Sums of float32 batch products carry rounding noise above the float64 threshold: the exact rank of a
    # cross-covariance of n rows is at most n (n - 1 when centred), so the count is capped there.
    rank = min(rank, max(stats.n - int(center), 0))
    if stats.n < min(da, db) or rank < min(da, db):
        warnings.warn(f"{name}: the {source} map is fitted from {stats.n} rows (rank {rank}) for widths {da} -> {db}; "
                      "it is partly arbitrary (more calibration data helps unless the deficit is structural)", RankWarning,
                      stacklevel=2)
    R = (U @ Vh).cpu()  # = procrustes(C), from the same SVD (on the statistics' device)
    return MapFit(R, source, stats.n, rank, stats.residual(R, center=center), res_naive, cka,
                  cka_from_moments(stats, naive), cka_from_moments(stats, R))

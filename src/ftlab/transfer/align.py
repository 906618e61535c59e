"""Rows, token alignment and Procrustes maps.

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
  ``C <- S_AA^{-p} C S_BB^{-p}`` (``p`` in ``[0, 1/2]``; both off by default [U]), judges the rank of
  ``C`` at the precision its sums were formed at, and fills the subspace ``C`` does not determine
  by a documented completion rule (below), warning once per under-determined map with its rank.

Completion rule (ftlab's, not the paper's). With ``C = U S V^T`` and ``r`` singular values above
``tol = max(max(d_A, d_B) eps, sqrt(eps_64)) s_max`` (``eps``: machine epsilon of the products
summed: float64's by default, also for float32 models, whose row products are exact in float64;
float32's with float32 staging; ``eps_64`` float64's) -- and never below the bound on the error of
float32 products (:attr:`ftlab.core.stats.CrossMoments.bound`, 0 for float64 products) -- the map is
fixed on the determined subspace, ``U_r V_r^T``; on the rest it is the best map of the same kind
for the next statistic of a chain, restricted to the undetermined subspaces ``U_perp`` and
``V_perp``: ``R = U_r V_r^T + U_perp polar_r(U_perp^T C_2 V_perp) V_perp^T``, recursively (the
constrained Procrustes solution: the semi-orthogonal ``R`` that agrees with ``C`` where ``C``
decides and maximises ``tr(R^T C_2)`` elsewhere). ``polar_r(M)`` is the polar factor of ``M`` on its
singular values above the tolerance of its statistic (``U_r V_r^T`` of ``M``'s SVD, which does not
depend on the SVD's choice of bases, ties included); the directions it leaves go to the next link.
The chain ends with the pad/truncate map ``N`` (tolerance ``max(max(d_A, d_B) eps_64, sqrt(eps_64))``),
and the directions even ``N`` does not decide -- undetermined directions of A that ``N`` sends entirely
into B's determined subspace, so that ``N`` pairs them with nothing left in B -- are **left unmapped**:
``R`` is zero there (a partial isometry; ``MapFit.completed`` counts them as ``"unmapped"``). Any
pairing of them would be arbitrary (the dense SVD's pairing depended on its bases; on EfficientNet-Lite0
-> Lite2 such directions carried 28% of the task vector), so the rule drops that part of ``tau_A``
instead: every map it returns is a function of the statistics alone, and the dense solver and the
factored one (:mod:`ftlab.transfer.factored`) compute the same map. A model transferred to itself
returns its task vector exactly with any number of calibration rows (``N`` is then an isometry on the
undetermined subspaces, and nothing is unmapped), and an exact re-coding of the source is recovered
wherever some statistic of the chain sees it.
The first term is ``numpy.linalg.matrix_rank``'s tolerance at the precision of the sums: below
it a singular direction is rounding, and its polar factor noise. The floor ``sqrt(eps_64)`` (1.5e-8)
matters for float64 data only: a polar factor's error on a singular direction is the perturbation
of ``C`` (at least the SVD's own ``eps_64 s_max``) divided by its singular value, so every direction
kept is mapped to 1.5e-8 or better, and a model transferred to itself comes back to that accuracy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch.nn import functional as F

from ftlab.core.geometry import cka_from_moments
from ftlab.core.stats import CrossMoments, RowMoments
from ftlab.core.validate import check_choice, check_range
from ftlab.transfer.factored import FACTORED_MIN_WIDTH, as_dense, cross_norm, factored_solve, factors_of
from ftlab.transfer.linalg import UNMAPPED, naive_map, svd
from ftlab.transfer.linalg import rank_rtol as rank_rtol_of

__all__ = ["SEQ_ALIGN", "AffineMoments", "MapFit", "RankWarning", "SeqAlign", "SumMoments", "align_tokens", "fit_map",
           "naive_map", "procrustes", "procrustes_similarity"]

SeqAlign = Literal["identity", "interpolate", "interpolate2d", "mean", "cls"]
SEQ_ALIGN: tuple[str, ...] = get_args(SeqAlign)


class RankWarning(UserWarning):
    """The statistics behind a Procrustes map do not determine it on every dimension (rank < width)."""


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
    U, _, Vh = svd(C)
    return U @ Vh


def _inv_power(S: torch.Tensor, p: float, eps: float) -> torch.Tensor:
    w, V = torch.linalg.eigh(S)
    floor = eps * max(float(w.max()), 0.0)
    w = w.clamp_min(floor if floor > 0 else eps)
    return (V * w.pow(-p)) @ V.T


@dataclass(frozen=True)
class MapFit:
    """A fitted map and how well it aligns the calibration rows.

    ``R`` is the ``d_A x d_B`` map (float64): a dense tensor, or a
    :class:`~ftlab.transfer.factored.LowRankMap` (pad/truncate plus a low-rank correction) from the
    factored solver (:func:`~ftlab.transfer.factored.as_dense` gives the tensor). ``residual`` is
    ``||A R - B||_F / ||B||_F`` on the calibration rows (NaN without second moments), ``residual_naive`` the same for the
    pad/truncate map, ``cka`` the linear CKA of the two row sets (invariant to orthogonal maps:
    how alignable the spaces are at best), ``cka_naive``/``cka_fit`` the CKA of ``A M`` and ``B``
    for the pad/truncate map and the fitted map (they differ only when a map drops directions),
    ``rank`` the numerical rank of the cross-covariance at ``precision`` (``"float64"`` or
    ``"float32"``: the coarsest rows or products summed), ``dims`` the number of dimensions the map
    has to fix (``min(d_A, d_B)``), ``completed`` the ``(statistic, dimensions)`` the completion rule
    filled the other ``dims - rank`` from, in order (``"unmapped"``: dimensions no statistic of the
    chain decides, where the map is zero; ``"svd"``: the SVD's arbitrary pairing, ``completion=()``
    only). ``similarity`` is the Procrustes similarity
    ``||A^T B||_* / (||A||_F ||B||_F)`` (1 when ``B = A R`` for an isometry ``R``; nan when whitened).
    ``converged``/``n_iter`` follow the library's solver convention (a closed-form SVD: always
    ``True``/``1``; ``False`` only when the cross-covariance was zero and the map is all completion).
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
    dims: int = 0
    completed: tuple[tuple[str, int], ...] = ()
    precision: str = "float64"
    similarity: float = math.nan
    name: str = ""

    @property
    def note(self) -> str | None:
        """What the statistics left undetermined, in one line (None when they determine every dimension)."""
        if not self.converged:
            how = ", ".join(label for label, _ in self.completed) or "the SVD's arbitrary choice"
            return (f"{self.name}: the {self.source} cross-covariance is zero (no signal reached this point); completed "
                    f"with {how}")
        if self.rank >= self.dims:
            return None
        filled = ", ".join(f"{label} ({d})" for label, d in self.completed if label != UNMAPPED) or "nothing"
        left = sum(d for label, d in self.completed if label == UNMAPPED)
        return (f"{self.name}: the {self.source} map is fitted from {self.n_rows} rows (rank {self.rank} of {self.dims} at "
                f"{self.precision} precision); the other {self.dims - self.rank} dimensions are completed with {filled}"
                + (f"; {left} decided by no statistic are left unmapped (zero)" if left else ""))


class _Side:
    """Column sums of one side of a derived statistic (what centering needs)."""

    def __init__(self, total: torch.Tensor, n: int):
        self.sum, self.n, self.dim = total, n, int(total.shape[0])

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / max(self.n, 1)


def _apply_left(M: torch.Tensor, C: torch.Tensor) -> torch.Tensor:
    return M[:, None] * C if M.ndim == 1 else M @ C


class AffineMoments:
    """Cross statistics of ``y_A = M_A x_A + c_A`` and ``y_B = M_B x_B + c_B``, derived exactly from those of ``x``.

    ``base`` is a :class:`~ftlab.core.stats.CrossMoments` (or another derived statistic) of the rows
    ``x``; ``M`` is a matrix ``(d_out, d_in)`` or a vector (a per-channel scale), ``c`` a vector or
    None. Used for a layer's output activations when its input activations are collected anyway
    (``Y_A^T Y_B = M_A X_A^T X_B M_B^T`` plus the bias terms), so they cost no calibration work.
    Holds no second moments (residuals and CKA are nan).
    """

    second = False

    def __init__(self, base, map_a: tuple[torch.Tensor, torch.Tensor | None],
                 map_b: tuple[torch.Tensor, torch.Tensor | None]):
        self.base = base
        self._maps = (map_a, map_b)  # converted to float64 on first use: creating one costs nothing

    @staticmethod
    def _f64(m: tuple[torch.Tensor, torch.Tensor | None]) -> tuple[torch.Tensor, torch.Tensor | None]:
        return (m[0].detach().to(torch.float64), None if m[1] is None else m[1].detach().to(torch.float64))

    @property
    def map_a(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._f64(self._maps[0])

    @property
    def map_b(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._f64(self._maps[1])

    @property
    def a(self) -> _Side:
        return _Side(self._side_sum(self.base.a.sum, self.map_a, self.n), self.n)

    @property
    def b(self) -> _Side:
        return _Side(self._side_sum(self.base.b.sum, self.map_b, self.n), self.n)

    @staticmethod
    def _side_sum(s: torch.Tensor, m: tuple[torch.Tensor, torch.Tensor | None], n: int) -> torch.Tensor:
        M, c = m
        s = s.to(device=M.device, dtype=torch.float64)
        out = M * s if M.ndim == 1 else M @ s
        return out if c is None else out + n * c

    @property
    def n(self) -> int:
        return self.base.n

    @property
    def eps(self) -> float:
        return self.base.eps

    def covariance(self, *, center: bool = False) -> torch.Tensor:
        """``Y_A^T Y_B`` (or centred), computed on demand (not kept: derived statistics cost no memory between fits)."""
        (Ma, ca), (Mb, cb) = self.map_a, self.map_b
        C = self.base.covariance(center=center).to(device=Ma.device, dtype=torch.float64)
        out = _apply_left(Mb, _apply_left(Ma, C).T).T  # M_A C M_B^T
        if not center:
            sa = self.base.a.sum.to(device=Ma.device, dtype=torch.float64)
            sb, n = self.base.b.sum.to(device=Ma.device, dtype=torch.float64), self.n
            ya = Ma * sa if Ma.ndim == 1 else Ma @ sa
            yb = Mb * sb if Mb.ndim == 1 else Mb @ sb
            if cb is not None:
                out = out + torch.outer(ya, cb)
            if ca is not None:
                out = out + torch.outer(ca, yb)
            if ca is not None and cb is not None:
                out = out + n * torch.outer(ca, cb)
        return out

    def residual(self, R: torch.Tensor, *, center: bool = False) -> float:
        return math.nan

    def factors(self, *, center: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(Y_A, Y_B)``: the base's rows mapped (``X M^T + c``), when the base keeps its rows; else None."""
        base = factors_of(self.base, center=center)
        if base is None:
            return None
        out = []
        for X, (M, c) in zip(base, self._maps):
            M = M.detach().to(device=X.device, dtype=torch.float64)
            Y = X * M if M.ndim == 1 else X @ M.T
            if c is not None and not center:
                Y = Y + c.detach().to(device=X.device, dtype=torch.float64)
            out.append(Y)
        return out[0], out[1]


class SumMoments:
    """Several cross statistics of the same pair of spaces, each scaled to unit Frobenius norm, summed.

    A depthwise convolution's one channel map is fitted on its input activations and its output
    gradients together this way (the two have unrelated scales). No second moments.
    """

    second = False

    def __init__(self, parts):
        self.parts = list(parts)
        n = sum(p.n for p in self.parts)
        d_a, d_b = self.parts[0].a.dim, self.parts[0].b.dim
        device = self.parts[0].a.sum.device
        self.a = _Side(torch.zeros(d_a, dtype=torch.float64, device=device), n)
        self.b = _Side(torch.zeros(d_b, dtype=torch.float64, device=device), n)

    @property
    def n(self) -> int:
        return max(p.n for p in self.parts)

    @property
    def eps(self) -> float:
        return max(p.eps for p in self.parts)

    def covariance(self, *, center: bool = False) -> torch.Tensor:
        total = None
        for p in self.parts:
            C = p.covariance(center=center).to(torch.float64)
            f = float(torch.linalg.norm(C))
            if f > 0:
                total = C / f if total is None else total + C / f
        return total if total is not None else self.parts[0].covariance(center=center).to(torch.float64) * 0

    def residual(self, R: torch.Tensor, *, center: bool = False) -> float:
        return math.nan

    def factors(self, *, center: bool = False) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The parts' rows stacked, each part's source rows divided by the norm of its cross-covariance."""
        got = [factors_of(p, center=center) for p in self.parts]
        if any(f is None for f in got):
            return None
        rows_a, rows_b = [], []
        for F_A, F_B in got:  # type: ignore[misc]
            f = cross_norm(F_A, F_B)
            if f > 0:
                rows_a.append(F_A / f)
                rows_b.append(F_B)
        if not rows_a:
            F_A, F_B = got[0]  # type: ignore[misc]
            return F_A[:0], F_B[:0]
        return torch.cat(rows_a), torch.cat(rows_b)


def procrustes_similarity(stats: CrossMoments, center: bool = False) -> float:
    """Procrustes similarity ``||A^T B||_* / (||A||_F ||B||_F)`` of streamed rows (nan when a side is zero)."""
    tra, trb = stats.a.sq_sum, stats.b.sq_sum
    if center:
        tra -= stats.n * float(stats.a.mean @ stats.a.mean)
        trb -= stats.n * float(stats.b.mean @ stats.b.mean)
    if tra <= 0 or trb <= 0:
        return math.nan
    C = stats.covariance(center=center)
    try:
        sv = torch.linalg.svdvals(C)
    except torch.linalg.LinAlgError:
        sv = svd(C.to(torch.float64))[1]
    return _at_most_one(float(sv.sum()) / math.sqrt(tra * trb))


def _at_most_one(similarity: float) -> float:
    """A Procrustes similarity, at most 1 (Cauchy-Schwarz): identical rows can give 1 + eps after rounding."""
    return min(similarity, 1.0)


def _rtol(stats, da: int, db: int, rank_rtol: float | None) -> float:
    return rank_rtol_of(float(getattr(stats, "eps", 0.0)), da, db, rank_rtol)


def _bound(stats) -> float:
    """Bound on the Frobenius error of a statistic's cross-covariance from float32 products (0 for float64 ones)."""
    return float(getattr(stats, "bound", 0.0))


def _tol(stats, scale: float, da: int, db: int, rank_rtol: float | None) -> float:
    """Absolute singular-value tolerance of a statistic whose largest singular value (or norm) is ``scale``: below it
    a direction is rounding -- relative to ``scale`` at the precision of the sums, and never below the bound on the
    error of float32 products (:attr:`ftlab.core.stats.CrossMoments.bound`)."""
    return max(_rtol(stats, da, db, rank_rtol) * scale, _bound(stats))


def _precision(stats) -> str:
    eps = float(getattr(stats, "eps", 0.0))
    return "float32" if eps >= torch.finfo(torch.float32).eps else "float64"


def _complete(Up: torch.Tensor, Vp: torch.Tensor, chain, *, center: bool, da: int, db: int, rank_rtol: float | None
              ) -> tuple[torch.Tensor, list[tuple[str, int]]]:
    """The part of the map on the undetermined subspaces ``span(Up)`` (A) and ``span(Vp)`` (B), dense.

    Each link of the chain fixes the directions its statistic decides (the polar factor of
    ``Up^T C_i Vp`` on its singular values above the tolerance); what the last link leaves is unmapped.
    """
    k = min(Up.shape[1], Vp.shape[1])
    if k == 0:
        return torch.zeros(da, db, dtype=torch.float64, device=Up.device), []
    if not chain:  # the chain is exhausted: nothing decides these directions, so they are not mapped
        return torch.zeros(da, db, dtype=torch.float64, device=Up.device), [(UNMAPPED, k)]
    label, st = chain[0]
    if st is None:  # the pad/truncate map
        m = min(da, db)
        M = Up[:m].T @ Vp[:m]
        tol = _tol(None, 1.0, da, db, rank_rtol)
    else:
        C2 = st.covariance(center=center).to(device=Up.device, dtype=torch.float64)
        M = Up.T @ C2 @ Vp
        tol = _tol(st, float(torch.linalg.norm(C2)), da, db, rank_rtol)
    U2, s2, V2h = svd(M, full_matrices=True)
    r2 = int((s2 > tol).sum())
    part = (Up @ U2[:, :r2]) @ (V2h[:r2] @ Vp.T)
    rest, used = _complete(Up @ U2[:, r2:], Vp @ V2h[r2:].T, chain[1:], center=center, da=da, db=db,
                           rank_rtol=rank_rtol)
    return part + rest, ([(label, r2)] if r2 else []) + used


Solver = Literal["auto", "dense", "factored"]


def _rows_of(stats) -> int | None:
    """Rows behind a statistic that keeps them (None for dense sums)."""
    f = factors_of(stats)
    return None if f is None else int(f[0].shape[0])


def _choose_factored(stats, chain, solver: str, whiten_p: float, da: int, db: int) -> bool:
    """The factored solver where it is cheaper: kept rows fewer than the widths, wide maps, no whitening."""
    if solver == "dense" or whiten_p > 0 or not chain or chain[-1][1] is not None:
        return False
    rows = [_rows_of(stats)] + [_rows_of(st) for _, st in chain if st is not None]
    if any(r is None for r in rows):
        return False
    if solver == "factored":
        return True
    return min(da, db) >= FACTORED_MIN_WIDTH and sum(rows) < min(da, db)  # type: ignore[arg-type]


def _trace_sums(stats, center: bool) -> tuple[float, float]:
    tra, trb = stats.a.sq_sum, stats.b.sq_sum
    if center:
        tra -= stats.n * float(stats.a.mean @ stats.a.mean)
        trb -= stats.n * float(stats.b.mean @ stats.b.mean)
    return tra, trb


def _similarity(stats, sv: torch.Tensor, center: bool) -> float:
    if not isinstance(stats, (CrossMoments, RowMoments)):
        return math.nan
    tra, trb = _trace_sums(stats, center)
    return _at_most_one(float(sv.sum()) / math.sqrt(tra * trb)) if tra > 0 and trb > 0 else math.nan


def _factored(stats, chain, *, center: bool, rank_rtol: float | None, da: int, db: int):
    """The factored solve (:mod:`ftlab.transfer.factored`)."""
    F_A, F_B = factors_of(stats, center=center)  # type: ignore[misc]
    tol_stats = {label: st for label, st in chain}
    fac_chain = [(label, None if st is None else factors_of(st, center=center)) for label, st in chain]
    return factored_solve(F_A, F_B, fac_chain, rank_tol=_rtol(stats, da, db, rank_rtol),
                          n_max=max(stats.n - int(center), 0),
                          tol_of=lambda label, scale: _tol(tol_stats.get(label), scale, da, db, rank_rtol))


def _dense(stats, chain, *, center: bool, whiten_p: float, eps: float, rank_rtol: float | None):
    """The dense solve: ``(R, rank, singular values, completed)`` (``R`` a dense ``(d_A, d_B)`` tensor)."""
    C = stats.covariance(center=center).to(torch.float64)
    da, db = C.shape
    k = min(da, db)
    if not torch.any(C != 0):  # no signal: the whole map is completion (exactly N where the chain starts with it)
        none = torch.zeros(0, dtype=torch.float64)
        if not chain or chain[0][1] is None:
            return naive_map(da, db).to(C.device), 0, none, [(chain[0][0] if chain else "svd", k)]
        eye_a = torch.eye(da, dtype=torch.float64, device=C.device)
        R, used = _complete(eye_a, torch.eye(db, dtype=torch.float64, device=C.device), chain, center=center, da=da,
                            db=db, rank_rtol=rank_rtol)
        return R, 0, none, used
    if whiten_p > 0:
        if not stats.second:
            raise ValueError("whiten_p > 0 needs second moments (diagnostics/whitening statistics)")
        wa = _inv_power(stats.a.scatter(center=center), whiten_p, eps)
        C = wa @ C @ _inv_power(stats.b.scatter(center=center), whiten_p, eps)
    # the full bases at once where a completion is sure (fewer rows than dimensions) or costs little more (near-square)
    full = da != db and (stats.n < k or max(da, db) <= 1.25 * k)
    U, sv, Vh = svd(C, full_matrices=full)
    rank = min(int((sv > _tol(stats, float(sv[0]), da, db, rank_rtol)).sum()), max(stats.n - int(center), 0))
    if rank >= k:
        return U[:, :k] @ Vh[:k], rank, sv, []  # = procrustes(C), from the same SVD
    if da != db and not full:
        U, _, Vh = svd(C, full_matrices=True)
    if not chain:  # complete="none": the SVD's own pairing of the undetermined bases (arbitrary, documented as such)
        return U[:, :k] @ Vh[:k], rank, sv, [("svd", k - rank)]
    R, used = _complete(U[:, rank:], Vh[rank:].T, chain, center=center, da=da, db=db, rank_rtol=rank_rtol)
    return R + U[:, :rank] @ Vh[:rank], rank, sv, used


def _fit_diagnostics(stats, R, center: bool) -> dict:
    """Residuals and CKA of a fitted map (nan without second moments: then nothing is computed)."""
    out = {"residual": math.nan, "residual_naive": math.nan, "cka": math.nan, "cka_naive": math.nan,
           "cka_fit": math.nan}
    if not (isinstance(stats, (CrossMoments, RowMoments)) and stats.second):
        return out
    da, db = R.shape
    naive = naive_map(da, db).to(stats.a.sum.device)
    dense_R = as_dense(R)
    out.update(residual=stats.residual(R, center=center), residual_naive=stats.residual(naive, center=center),
               cka=cka_from_moments(stats), cka_naive=cka_from_moments(stats, naive),
               cka_fit=cka_from_moments(stats, dense_R))
    return out


def fit_map(stats, *, source: str, center: bool = False, whiten_p: float = 0.0, eps: float = 1e-8, name: str = "",
            completion=(("naive", None),), rank_rtol: float | None = None, solver: Solver = "auto") -> MapFit:
    """Procrustes map from streamed statistics, with optional centering and partial whitening.

    ``completion`` is the chain of ``(label, statistic)`` (``statistic`` None = the pad/truncate
    map) that fills the subspace the cross-covariance does not determine (see the module
    docstring); ``()`` keeps the SVD's arbitrary choice there. ``rank_rtol`` overrides the relative
    rank tolerance ``max(d_A, d_B) * eps``. ``solver``: ``"dense"`` (SVDs of the ``d_A x d_B``
    cross-covariances), ``"factored"`` (from kept rows, in the cost of the rank: see
    :mod:`ftlab.transfer.factored`; dense where the statistics keep no rows or the chain does not end
    with the pad/truncate map) or ``"auto"`` (factored for maps at least 256 wide whose statistics hold
    fewer rows than their width). Both compute the one map the completion rule defines (to rounding,
    unless a singular value lies within rounding of a tolerance). Where the rank is below
    ``min(d_A, d_B)``, :attr:`MapFit.note` says so in one line (methods summarise these notes in one
    :class:`RankWarning` per fit).
    """
    check_range("whiten_p", whiten_p, 0.0, 0.5)
    check_choice("solver", solver, ("auto", "dense", "factored"))
    if rank_rtol is not None:
        check_range("rank_rtol", rank_rtol, 0.0, 1.0)
    chain = tuple(completion)
    da, db = stats.a.dim, stats.b.dim
    k = min(da, db)
    if _choose_factored(stats, chain, solver, whiten_p, da, db):
        R, rank, sv, used = _factored(stats, chain, center=center, rank_rtol=rank_rtol, da=da, db=db)
    else:
        R, rank, sv, used = _dense(stats, chain, center=center, whiten_p=whiten_p, eps=eps, rank_rtol=rank_rtol)
    prec = _precision(stats)
    zero = rank == 0 and not (sv.numel() and float(sv[0]) > 0)
    diag = _fit_diagnostics(stats, R, center)
    similarity = _similarity(stats, sv, center) if whiten_p == 0 and not zero else math.nan
    if isinstance(stats, SumMoments):  # a shared map: the mean alignment of its parts (diagnostics only: extra SVDs)
        parts = [p for p in stats.parts if isinstance(p, (CrossMoments, RowMoments)) and p.second]
        if parts:
            diag["cka"] = math.fsum(cka_from_moments(p) for p in parts) / len(parts)
            similarity = math.fsum(procrustes_similarity(p, center) for p in parts) / len(parts)  # type: ignore[arg-type]
    return MapFit(R, source, stats.n, rank, diag["residual"], diag["residual_naive"], diag["cka"], diag["cka_naive"],
                  diag["cka_fit"], converged=not zero, n_iter=0 if zero else 1, dims=k, completed=tuple(used),
                  precision=prec, similarity=similarity, name=name)

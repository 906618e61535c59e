"""Teacher-student tasks for pretraining (PT) then fine-tuning (FT) a diagonal linear network.

The data model of Anguita et al. 2026 (arXiv 2602.20062; details in docs/dln.md): sparse teachers
``beta*_PT`` and ``beta*_FT`` in R^D whose supports overlap, Gaussian inputs
``X_ij ~ N(0, 1/D)`` (so the test MSE equals ``||beta_hat - beta*||^2 / D``), labels
``y = X beta* + sigma * noise``, ``N = round(alpha * D)`` samples.

Two equivalent parametrizations of the supports:

* ``(rho_pt, rho_ft, overlap)`` with ``overlap = omega = |S_PT ∩ S_FT| / |S_FT|`` (authors' code);
* ``(rho_pt, rho_shared, rho_new)`` with ``rho_shared = P(FT-active | PT-active)`` and
  ``rho_new = P(FT-active | PT-inactive)`` (paper); see :meth:`TaskSpec.from_conditional`.

Mapping: ``rho_ft = rho_pt rho_shared + (1 - rho_pt) rho_new``,
``omega = rho_pt rho_shared / rho_ft``; conversely ``rho_shared = omega rho_ft / rho_pt``,
``rho_new = (1 - omega) rho_ft / (1 - rho_pt)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ftlab.core.validate import check_choice, check_finite, check_int, check_nonnegative, check_positive, check_probability

__all__ = ["GROUPS", "TaskSpec", "Problem", "sample_teachers", "sample_design", "sample_labels", "sample_problem",
           "n_samples"]

#: The four coordinate groups, in the order of :meth:`TaskSpec.group_probabilities` (codes 0-3).
GROUPS = ("shared", "new", "pt_only", "none")


@dataclass(frozen=True)
class TaskSpec:
    """Statistics of a PT -> FT teacher pair (docs/dln.md). Validated on construction.

    rho_pt : fraction of PT-active coordinates, in [0, 1].
    rho_ft : fraction of FT-active coordinates, in [0, 1].
    overlap : omega = |S_PT ∩ S_FT| / |S_FT| in [0, 1]; feasible only if
        ``omega rho_ft <= rho_pt`` and ``rho_pt + (1 - omega) rho_ft <= 1``.
    pt_magnitude : ``"fixed"``: beta*_PT,d = ``a_pt`` on its support (the authors' code, "PT
        oracle"); ``"gaussian"``: beta*_PT,d ~ N(0, a_pt^2 / rho_pt) (Bernoulli-Gaussian slab as the
        paper's text reportedly writes it) [U: which one the paper's figures use is unconfirmed].
    a_pt : PT amplitude (> 0).
    noise : FT label-noise standard deviation sigma (>= 0).
    pt_noise : PT label-noise standard deviation (>= 0), used only when PT is simulated.
    support : ``"exact"``: supports of exact sizes round(rho D), shared part round(omega rho_ft D)
        (authors' code); ``"bernoulli"``: each coordinate's group drawn i.i.d. from
        :meth:`group_probabilities` (the replica theory's prior).

    FT values on active coordinates are N(0, 1/rho_ft), independent of the PT values
    (the authors' default; [U] for the paper), so E[beta*_FT,d^2] = 1.
    """

    rho_pt: float
    rho_ft: float
    overlap: float
    pt_magnitude: Literal["fixed", "gaussian"] = "fixed"
    a_pt: float = 1.0
    noise: float = 0.0
    pt_noise: float = 0.0
    support: Literal["exact", "bernoulli"] = "exact"

    def __post_init__(self):
        check_probability("rho_pt", self.rho_pt)
        check_probability("rho_ft", self.rho_ft)
        check_probability("overlap", self.overlap)
        check_choice("pt_magnitude", self.pt_magnitude, ("fixed", "gaussian"))
        check_positive("a_pt", self.a_pt)
        check_nonnegative("noise", self.noise)
        check_nonnegative("pt_noise", self.pt_noise)
        check_choice("support", self.support, ("exact", "bernoulli"))
        lo, hi = self.overlap_range(rho_pt=self.rho_pt, rho_ft=self.rho_ft)
        eps = 1e-12
        if not (lo - eps <= self.overlap <= hi + eps):
            raise ValueError(
                f"overlap={self.overlap!r} is out of range: must be in [{lo:g}, {hi:g}] "
                f"for rho_pt={self.rho_pt:g}, rho_ft={self.rho_ft:g}"
            )

    @staticmethod
    def overlap_range(*, rho_pt: float, rho_ft: float) -> tuple[float, float]:
        """Feasible ``[lo, hi]`` of the overlap omega for given sparsities."""
        if rho_ft <= 0:
            return 0.0, 1.0
        lo = max(0.0, 1.0 - (1.0 - rho_pt) / rho_ft)
        hi = min(1.0, rho_pt / rho_ft)
        return lo, hi

    @classmethod
    def from_conditional(cls, *, rho_pt: float, rho_shared: float, rho_new: float, **kw) -> TaskSpec:
        """Build from the paper's conditional probabilities (docs/dln.md).

        rho_shared = P(FT-active | PT-active), rho_new = P(FT-active | PT-inactive), each in [0, 1].
        Extra keywords go to the constructor.
        """
        check_probability("rho_pt", rho_pt)
        check_probability("rho_shared", rho_shared)
        check_probability("rho_new", rho_new)
        p_ov = rho_pt * rho_shared
        rho_ft = p_ov + (1.0 - rho_pt) * rho_new
        overlap = p_ov / rho_ft if rho_ft > 0 else 0.0
        return cls(rho_pt=rho_pt, rho_ft=float(rho_ft), overlap=float(min(1.0, overlap)), **kw)

    @property
    def rho_shared(self) -> float:
        """P(FT-active | PT-active) = omega rho_ft / rho_pt (0 when rho_pt = 0)."""
        return float(self.overlap * self.rho_ft / self.rho_pt) if self.rho_pt > 0 else 0.0

    @property
    def rho_new(self) -> float:
        """P(FT-active | PT-inactive) = (1 - omega) rho_ft / (1 - rho_pt) (0 when rho_pt = 1)."""
        return float((1.0 - self.overlap) * self.rho_ft / (1.0 - self.rho_pt)) if self.rho_pt < 1 else 0.0

    def group_probabilities(self) -> np.ndarray:
        """Probabilities (4,) of the coordinate groups (shared, new, pt_only, none), summing to 1."""
        p_ov = self.overlap * self.rho_ft
        p_new = (1.0 - self.overlap) * self.rho_ft
        p = np.array([p_ov, p_new, self.rho_pt - p_ov, 1.0 - self.rho_pt - p_new], dtype=np.float64)
        return np.clip(p, 0.0, 1.0)


@dataclass(frozen=True)
class Problem:
    """One sampled PT+FT problem. Shapes: betas (D,), X (N, D), y (N,). PT data may be None (oracle PT)."""

    beta_pt_star: np.ndarray
    beta_ft_star: np.ndarray
    X_ft: np.ndarray
    y_ft: np.ndarray
    X_pt: np.ndarray | None = None
    y_pt: np.ndarray | None = None


def n_samples(alpha: float, dim: int) -> int:
    """``N = round(alpha * D)``, at least 1."""
    check_positive("alpha", alpha)
    check_int("dim", dim, 1)
    return max(1, int(round(alpha * dim)))


def _group_labels(spec: TaskSpec, dim: int, rng: np.random.Generator) -> np.ndarray:
    if spec.support == "bernoulli":
        p = spec.group_probabilities()
        return rng.choice(4, size=dim, p=p / p.sum())
    n_pt = int(round(spec.rho_pt * dim))
    n_ft = int(round(spec.rho_ft * dim))
    n_ov = min(int(round(spec.overlap * spec.rho_ft * dim)), n_pt, n_ft)
    n_new = min(n_ft - n_ov, dim - n_pt)
    groups = np.full(dim, 3, dtype=np.int64)
    groups[:n_ov] = 0
    groups[n_ov:n_pt] = 2
    groups[n_pt:n_pt + n_new] = 1
    return groups[rng.permutation(dim)]


def sample_teachers(spec: TaskSpec, *, dim: int, seed: int | np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw the teachers ``(beta_pt_star, beta_ft_star)``, each float64 (D,).

    PT values: ``a_pt`` (``pt_magnitude="fixed"``) or N(0, a_pt^2/rho_pt); FT values N(0, 1/rho_ft),
    independent of the PT values. ``seed``: int or numpy Generator.
    """
    check_int("dim", dim, 1)
    rng = np.random.default_rng(seed)
    groups = _group_labels(spec, dim, rng)
    pt_active = (groups == 0) | (groups == 2)
    ft_active = (groups == 0) | (groups == 1)
    beta_pt = np.zeros(dim)
    if spec.pt_magnitude == "fixed":
        beta_pt[pt_active] = spec.a_pt
    else:
        beta_pt[pt_active] = rng.standard_normal(int(pt_active.sum())) * spec.a_pt / np.sqrt(spec.rho_pt)
    beta_ft = np.zeros(dim)
    if spec.rho_ft > 0:
        beta_ft[ft_active] = rng.standard_normal(int(ft_active.sum())) / np.sqrt(spec.rho_ft)
    return beta_pt, beta_ft


def sample_design(n: int, dim: int, *, seed: int | np.random.Generator) -> np.ndarray:
    """Gaussian design X (n, dim) with i.i.d. entries N(0, 1/dim)."""
    check_int("n", n, 1)
    check_int("dim", dim, 1)
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, dim)) / np.sqrt(dim)


def sample_labels(X: np.ndarray, beta: np.ndarray, *, noise: float, seed: int | np.random.Generator) -> np.ndarray:
    """Labels ``y = X beta + noise * N(0, 1)`` (n,)."""
    check_nonnegative("noise", noise)
    check_finite("X", X)
    y = X @ beta
    if noise > 0:
        y = y + noise * np.random.default_rng(seed).standard_normal(y.shape[0])
    return y


def sample_problem(spec: TaskSpec, *, alpha: float, dim: int, seed: int, alpha_pt: float | None = None) -> Problem:
    """Sample teachers, the FT data (N = round(alpha D)) and, if ``alpha_pt`` is given, PT data.

    Independent streams are spawned from ``seed`` for teachers, FT data and PT data, so the same
    seed gives the same teachers for every ``alpha`` (learning curves share their teachers).
    """
    check_positive("alpha", alpha)
    if alpha_pt is not None:
        check_positive("alpha_pt", alpha_pt)
    check_int("seed", seed, 0)
    s_teach, s_ft, s_ftn, s_pt, s_ptn = np.random.SeedSequence(seed).spawn(5)
    beta_pt, beta_ft = sample_teachers(spec, dim=dim, seed=np.random.default_rng(s_teach))
    X = sample_design(n_samples(alpha, dim), dim, seed=np.random.default_rng(s_ft))
    y = sample_labels(X, beta_ft, noise=spec.noise, seed=np.random.default_rng(s_ftn))
    if alpha_pt is None:
        return Problem(beta_pt, beta_ft, X, y)
    Xp = sample_design(n_samples(alpha_pt, dim), dim, seed=np.random.default_rng(s_pt))
    yp = sample_labels(Xp, beta_pt, noise=spec.pt_noise, seed=np.random.default_rng(s_ptn))
    return Problem(beta_pt, beta_ft, X, y, Xp, yp)

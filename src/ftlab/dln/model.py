"""The two-layer diagonal linear network with a +/- pathway decomposition (arXiv 2602.20062).

``beta = v+ * w+ - v- * w-`` (elementwise); ``w+-`` is the first ("earlier", feature) layer,
``v+-`` the readout. Per coordinate, gradient flow with ``g = -dL/dbeta`` reads
``dw+/dt = v+ g, dv+/dt = w+ g, dw-/dt = -v- g, dv-/dt = -w- g``: a linear system whose matrix
``g(t) [[0, 1], [1, 0]]`` commutes with itself at all times. Its exact solution is the hyperbolic
rotation by the accumulated gradient ``a = int_0^t g``:

    (w+, v+)(t) = R(a)  (w+, v+)(0),     (w-, v-)(t) = R(-a) (w-, v-)(0),
    R(a) = [[cosh a, sinh a], [sinh a, cosh a]],

which is :func:`rotate`. It preserves the three conserved quantities
``lambda_e+ = w+^2 - v+^2``, ``lambda_e- = w-^2 - v-^2`` and ``c = w+ w- + v+ v-`` exactly and gives
``beta(a) = A sinh(2a) + B cosh(2a)`` with ``A = (|(w+, v+)|^2 + |(w-, v-)|^2)/2``,
``B = w+ v+ - w- v-`` at time 0. For a balanced start (``A = c``, ``B = 0``) this is
``beta = (sqrt(k)/2) sinh(2a)``, ``k = 4 c^2``: the mirror map of :mod:`ftlab.dln.bias`.

Conventions (docs/dln.md; the authors' public code is github.com/Nico31415/toy-unlearning):

* The three scales travel together as :class:`InitScales` ``(c, lam, gamma)``.
* PT init from the absolute scale ``c > 0`` and the *normalized* relative scale ``lam in [-1, 1]``:
  ``w+- = sqrt(c (1 + lam)/2)``, ``v+- = sqrt(c (1 - lam)/2)``. The authors' code uses the
  unnormalized ``lambda_u = lam * c``; the later unlearning note uses ``lambda_u = -lam * c``.
* FT reset [U: the authors' code convention, not confirmed in the paper's text]: first layer
  re-balanced to the *sum* of the pathways, ``w+- <- w+ + w-``; readout re-initialized to
  ``v+- <- gamma / sqrt(2)``. This gives the k_d formula of the paper's implicit-bias theorem
  (:func:`ftlab.dln.bias.k_from_pt`; checked against gradient flow in ``tests/dln``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields

import numpy as np

from ftlab.core.validate import check_finite, check_nonnegative, check_positive, check_range
from ftlab.dln.bias import check_scales
from ftlab.dln.tasks import TaskSpec

__all__ = ["InitScales", "check_setting", "Weights", "init_pt", "oracle_pt", "ft_reset", "rotate", "beta_coefficients"]


@dataclass(frozen=True)
class InitScales:
    """The three initialization scales of Anguita et al. 2026 (arXiv 2602.20062), validated on construction.

    c : absolute scale of the PT initialization, in (0, 1e50]: every coordinate starts with
        ``w(0)^2 + v(0)^2 = c`` (first layer plus readout; same units as beta, since beta = v w).
    lam : relative scale of the first layer against the readout at the PT initialization,
        normalized to [-1, 1] (dimensionless): ``w(0)^2 = c (1 + lam)/2``, ``v(0)^2 = c (1 - lam)/2``;
        ``lam -> -1`` makes the first layer small, ``lam -> 1`` the readout. The authors' code uses
        the unnormalized ``lambda_u = lam * c``.
    gamma : scale of the readout re-initialization before fine-tuning, in [0, 1e50]
        (``v+- <- gamma / sqrt(2)``, same units as ``sqrt(c)``).

    ``lam = -1`` with ``gamma = 0`` is refused: the fine-tuning network would start at the zero
    saddle (:func:`ftlab.dln.bias.check_scales`). Values are stored as Python floats.
    Functions that run a task (:func:`ftlab.dln.simulate.simulate_ptft`, :mod:`ftlab.dln.replica`,
    :mod:`ftlab.dln.advisor`) take one ``InitScales``; the vectorized closed forms
    (:func:`ftlab.dln.bias.k_from_pt`, :func:`ftlab.dln.regimes.metrics`) take ``c, lam, gamma`` as
    keywords so that arrays broadcast.
    """

    c: float
    lam: float
    gamma: float

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"InitScales.{f.name} must be a real number, got {type(value).__name__}")
        check_scales(c=self.c, lam=self.lam, gamma=self.gamma)
        for f in fields(self):
            object.__setattr__(self, f.name, float(getattr(self, f.name)))


def check_setting(spec, scales) -> None:
    """``TypeError`` unless ``spec`` is a :class:`~ftlab.dln.tasks.TaskSpec` and ``scales`` an :class:`InitScales`.

    Passing loose numbers or dicts where these objects belong is a programming error, not bad input.
    """
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"spec must be a TaskSpec, got {type(spec).__name__}")
    if not isinstance(scales, InitScales):
        raise TypeError(f"scales must be an InitScales, got {type(scales).__name__}")


@dataclass(frozen=True)
class Weights:
    """The four weight vectors, each float64 (D,)."""

    w_plus: np.ndarray
    w_minus: np.ndarray
    v_plus: np.ndarray
    v_minus: np.ndarray

    def __post_init__(self):
        shapes = {np.shape(x) for x in (self.w_plus, self.w_minus, self.v_plus, self.v_minus)}
        if len(shapes) != 1 or len(next(iter(shapes))) != 1:
            raise ValueError(f"weights must be four vectors of one shape (D,), got shapes {sorted(shapes)}")
        for name in ("w_plus", "w_minus", "v_plus", "v_minus"):
            check_finite(name, getattr(self, name))

    @property
    def dim(self) -> int:
        return int(self.w_plus.shape[0])

    @property
    def beta(self) -> np.ndarray:
        """The predictor ``v+ w+ - v- w-`` (D,)."""
        return self.v_plus * self.w_plus - self.v_minus * self.w_minus

    def invariants(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Conserved quantities ``(lambda_e+, lambda_e-, c)``, each (D,)."""
        return (
            self.w_plus**2 - self.v_plus**2,
            self.w_minus**2 - self.v_minus**2,
            self.w_plus * self.w_minus + self.v_plus * self.v_minus,
        )

    @property
    def k(self) -> np.ndarray:
        """Implicit-bias geometry ``k_d = (lambda_e+ - lambda_e-)^2 + 4 c_d^2`` (D,) (Azulay et al. 2021)."""
        lp, lm, c = self.invariants()
        return (lp - lm) ** 2 + 4.0 * c**2


def init_pt(dim: int, *, c: float, lam: float) -> Weights:
    """Balanced PT initialization (beta = 0): ``w = sqrt(c(1+lam)/2)``, ``v = sqrt(c(1-lam)/2)`` everywhere."""
    check_positive("c", c)
    check_range("lam", lam, -1.0, 1.0)
    w = np.full(dim, np.sqrt(c * (1.0 + lam) / 2.0))
    v = np.full(dim, np.sqrt(c * (1.0 - lam) / 2.0))
    return Weights(w, w.copy(), v, v.copy())


def beta_coefficients(weights: Weights) -> tuple[np.ndarray, np.ndarray]:
    """``(A, B)`` with ``beta(rotate(weights, a)) = A sinh(2a) + B cosh(2a)`` per coordinate."""
    wp, wm, vp, vm = weights.w_plus, weights.w_minus, weights.v_plus, weights.v_minus
    A = 0.5 * (wp**2 + vp**2 + wm**2 + vm**2)
    B = wp * vp - wm * vm
    return A, B


def rotate(weights: Weights, a) -> Weights:
    """Exact gradient-flow map for an accumulated gradient ``a = int g dt`` (D,) (hyperbolic rotation)."""
    a = np.asarray(a, dtype=np.float64)
    ch, sh = np.cosh(a), np.sinh(a)
    wp, wm, vp, vm = weights.w_plus, weights.w_minus, weights.v_plus, weights.v_minus
    return Weights(wp * ch + vp * sh, wm * ch - vm * sh, wp * sh + vp * ch, -wm * sh + vm * ch)


def oracle_pt(beta_pt, *, c: float, lam: float) -> Weights:
    """The "infinite-PT" weights: where gradient flow from :func:`init_pt` ends when it fits ``beta_pt`` exactly.

    The flow from the balanced init only rotates each coordinate (:func:`rotate`), and
    ``beta = c sinh(2a)`` there, so the PT endpoint is the rotation by ``a_d = asinh(beta_PT,d / c)/2``.
    This equals the hyperbolic construction of the authors' public code (the "infinite-PT oracle") and keeps the invariants
    ``(c, lam)`` of the init exactly.
    """
    b = np.asarray(beta_pt, dtype=np.float64)
    check_finite("beta_pt", b)
    w0 = init_pt(b.shape[0], c=c, lam=lam)
    return rotate(w0, 0.5 * np.arcsinh(b / c))


def ft_reset(weights: Weights, *, gamma: float) -> Weights:
    """FT start: ``w+- <- w+ + w-`` (re-balanced first layer), ``v+- <- gamma/sqrt(2)`` (fresh readout).

    The function is reset (beta = 0) and the FT invariant is
    ``c_FT,d = (w+ + w-)^2 + gamma^2/2 = sqrt(k_d)/2``. [U] convention of the authors' code.
    """
    check_nonnegative("gamma", gamma)
    s = weights.w_plus + weights.w_minus
    v = np.full(weights.dim, gamma / np.sqrt(2.0))
    return Weights(s, s.copy(), v, v.copy())

"""Expectations over the prior of the replica equations: deterministic quadrature or Monte Carlo.

The prior of ``(beta*, k)`` is a finite mixture of *components* ``j`` (:class:`Mixture`): with
probability ``p_j``, ``beta* ~ N(mu_j, v_j)`` (``v_j = 0``: a point mass) and the geometry is ``k_j``.
The scalar channel observes ``z = beta* + sqrt(theta0) xi``. Within a component, Gaussian conditioning
gives ``z ~ N(mu, v + theta0)``, ``E[beta*|z] = mu + r (z - mu)`` with ``r = v/(v+theta0)``
and ``Var(beta*|z) = v theta0/(v + theta0)``, so every expectation is a 1-D integral over ``z``:

    A = E[d eta/dz],    B = E[(eta - beta*)^2] = E_z[(eta(z) - E[beta*|z])^2] + v theta0/(v + theta0).

:class:`QuadratureExpectation` integrates over ``z`` with a fixed rule for the standard normal
(probabilists' Gauss-Hermite by default); :class:`MonteCarloExpectation` averages over samples
``(beta*_i, k_i, xi_i)`` (the approach of the authors' public replica code). Both return ``A``, ``B`` and their
exact partial derivatives in ``theta0`` and ``theta`` (for Newton's method).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ftlab.dln.replica.scalar import prox_qk_derivatives

__all__ = ["Mixture", "Moments", "QuadratureExpectation", "MonteCarloExpectation", "normal_rule"]


@dataclass(frozen=True)
class Mixture:
    """Joint prior of ``(beta*_FT, k)`` as a mixture; arrays of shape (J,).

    p : component probabilities (sum 1). mu, v : mean and variance of beta* in the component.
    k : geometry of q_k in the component (> 0). labels : optional group name per component.
    """

    p: np.ndarray
    mu: np.ndarray
    v: np.ndarray
    k: np.ndarray
    labels: tuple[str, ...] = ()

    def __post_init__(self):
        n = len(self.p)
        for name in ("mu", "v", "k"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"Mixture.{name} has {len(getattr(self, name))} entries, expected {n}")
        if np.any(self.k <= 0) or not np.all(np.isfinite(self.k)):
            raise ValueError(
                "the FT geometry k is 0 (or not finite) for part of the prior: lam=-1 with gamma=0 is the "
                "pure l1 limit; use lam > -1 or gamma > 0"
            )
        if abs(float(np.sum(self.p)) - 1.0) > 1e-9 or np.any(self.p < 0):
            raise ValueError(f"mixture probabilities must be >= 0 and sum to 1 (sum={float(np.sum(self.p))!r})")

    @property
    def second_moment(self) -> float:
        """E[beta*^2]."""
        return float(np.sum(self.p * (self.mu**2 + self.v)))

    def compact(self) -> Mixture:
        """Drop zero-probability components."""
        keep = self.p > 0
        labels = tuple(lab for lab, kp in zip(self.labels, keep) if kp) if self.labels else ()
        return Mixture(self.p[keep], self.mu[keep], self.v[keep], self.k[keep], labels)


@dataclass(frozen=True)
class Moments:
    """``A = E[d eta/dz]``, ``B = E[(eta - beta*)^2]`` and their partial derivatives."""

    A: float
    B: float
    dA_dtheta0: float
    dA_dtheta: float
    dB_dtheta0: float
    dB_dtheta: float


def normal_rule(n: int, kind: str = "hermite") -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights ``(x, w)`` with ``sum w f(x) ~ E[f(X)]``, ``X ~ N(0, 1)``.

    kind : ``"hermite"`` (probabilists' Gauss-Hermite, exact for polynomials of degree 2n-1) or
        ``"legendre"`` (composite 8-point Gauss-Legendre on [-12, 12] with the normal density; robust
        for integrands with sharp kinks, used as a high-order reference).
    """
    if n < 2:
        raise ValueError(f"n_nodes={n!r} is out of range: must be >= 2")
    if kind == "hermite":
        if n > 350:
            raise ValueError(f"n_nodes={n!r} is out of range for Gauss-Hermite: must be <= 350 (use 'legendre')")
        x, w = np.polynomial.hermite_e.hermegauss(n)
        w = w / np.sqrt(2.0 * np.pi)
    elif kind == "legendre":
        per = 8
        panels = max(1, n // per)
        g, gw = np.polynomial.legendre.leggauss(per)
        edges = np.linspace(-12.0, 12.0, panels + 1)
        mid, half = 0.5 * (edges[1:] + edges[:-1]), 0.5 * (edges[1:] - edges[:-1])
        x = (mid[:, None] + half[:, None] * g[None, :]).ravel()
        w = (half[:, None] * gw[None, :]).ravel() * np.exp(-0.5 * x**2) / np.sqrt(2.0 * np.pi)
    else:
        raise ValueError(f"quadrature={kind!r} is not one of 'hermite', 'legendre'")
    return x, w / w.sum()


class QuadratureExpectation:
    """Deterministic expectations: Gaussian conditioning per component + a normal quadrature rule."""

    def __init__(self, mixture: Mixture, *, n_nodes: int = 800, kind: str = "legendre"):
        self.mixture = mixture.compact()
        x, w = normal_rule(n_nodes, kind)
        m = self.mixture
        if np.all(m.mu == 0) and np.allclose(x, -x[::-1]) and np.allclose(w, w[::-1]):
            # every integrand (A, B and their derivatives) is even in x when mu = 0: fold the rule
            keep = x >= 0
            x, w = x[keep], np.where(x[keep] > 0, 2.0 * w[keep], w[keep])
        self._x = x[None, :]
        self._pw = m.p[:, None] * w[None, :]
        self._mu, self._v, self._k = m.mu[:, None], m.v[:, None], m.k[:, None]
        self.second_moment = m.second_moment

    def __call__(self, theta0: float, theta: float) -> Moments:
        x, mu, v = self._x, self._mu, self._v
        vt = v + theta0
        s = np.sqrt(vt)
        z = mu + s * x
        r = v / vt
        pr = prox_qk_derivatives(z, theta, self._k)
        dz = x / (2.0 * s)
        e = pr.eta - (mu + r * s * x)
        dm = r * dz - s * x * v / vt**2
        pw = self._pw
        A = np.sum(pw * pr.deta_dz)
        B = np.sum(pw * (e**2 + v * theta0 / vt))
        return Moments(
            A=float(A),
            B=float(B),
            dA_dtheta0=float(np.sum(pw * pr.d2eta_dz2 * dz)),
            dA_dtheta=float(np.sum(pw * pr.ddeta_dz_dtheta)),
            dB_dtheta0=float(np.sum(pw * (2.0 * e * (pr.deta_dz * dz - dm) + (v / vt) ** 2))),
            dB_dtheta=float(np.sum(pw * 2.0 * e * pr.deta_dtheta)),
        )


class MonteCarloExpectation:
    """Sample averages over ``(beta*_i, k_i, xi_i)``, i = 1..mc (the approach of the authors' public replica code)."""

    def __init__(self, beta: np.ndarray, k: np.ndarray, xi: np.ndarray):
        if not (beta.shape == k.shape == xi.shape) or beta.ndim != 1:
            raise ValueError("beta, k and xi must be 1-D arrays of equal length")
        if np.any(k <= 0):
            raise ValueError("the FT geometry k is 0 for part of the sample: use lam > -1 or gamma > 0")
        self.beta, self.k, self.xi = beta, k, xi
        self.second_moment = float(np.mean(beta**2))

    def __call__(self, theta0: float, theta: float) -> Moments:
        st = np.sqrt(theta0)
        z = self.beta + st * self.xi
        pr = prox_qk_derivatives(z, theta, self.k)
        dz = self.xi / (2.0 * st) if st > 0 else np.zeros_like(z)
        e = pr.eta - self.beta
        return Moments(
            A=float(np.mean(pr.deta_dz)),
            B=float(np.mean(e**2)),
            dA_dtheta0=float(np.mean(pr.d2eta_dz2 * dz)),
            dA_dtheta=float(np.mean(pr.ddeta_dz_dtheta)),
            dB_dtheta0=float(np.mean(2.0 * e * pr.deta_dz * dz)),
            dB_dtheta=float(np.mean(2.0 * e * pr.deta_dtheta)),
        )

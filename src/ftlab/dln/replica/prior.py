"""Joint law of ``(beta*_FT, k)`` for the replica equations (docs/replica.md).

Each coordinate belongs to one of four groups (:meth:`TaskSpec.group_probabilities`): *shared*
(PT- and FT-active), *new* (FT-active only), *pt_only*, *none*. FT values are N(0, 1/rho_FT) on
FT-active coordinates, independent of PT values. The FT geometry is ``k_d = K(|beta_PT,d|)``
(:func:`ftlab.dln.bias.k_from_pt`), where ``beta_PT`` is

* the PT teacher itself (*oracle PT*, ``alpha_pt=None``; the authors' "infinite-PT" construction):
  ``a_pt`` on PT-active coordinates (``pt_magnitude="fixed"``) or N(0, a_pt^2/rho_pt)
  (``"gaussian"``: an extra quadrature dimension over ``beta_PT``);
* or the PT *estimate* after imperfect pretraining (``alpha_pt`` given; the construction of the
  authors' public ``ptft_replica_imperfect_pt.py`` [U]): the single-task scalar channel
  ``beta_hat_PT = eta(beta*_PT + sqrt(theta0_PT) Z'; theta_PT, 4 c^2)`` with
  ``(theta0_PT, theta_PT)`` the PT fixed point at ``alpha_pt`` and PT noise ``pt_noise``. Then every
  group (PT-inactive ones too: the PT estimate is nonzero there) gets a distribution of ``k``,
  integrated over ``z_PT ~ N(mu_PT, v_PT + theta0_PT)`` with the same normal rule.

``alpha_pt >= 1`` with ``pt_noise = 0`` is the oracle; with noise, the PT interpolator is ordinary least
squares, ``beta_hat_PT = beta*_PT + sqrt(pt_noise^2/(alpha_pt-1)) Z'`` (the ``lambda_reg -> 0`` limit;
the authors' code uses a heuristic bypass instead [U]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ftlab.core.validate import check_positive, check_range
from ftlab.dln.bias import k_from_pt
from ftlab.dln.model import InitScales, check_setting
from ftlab.dln.replica.expect import Mixture, QuadratureExpectation, normal_rule
from ftlab.dln.replica.scalar import prox_qk
from ftlab.dln.replica.solver import FixedPoint, solve_point
from ftlab.dln.tasks import GROUPS, TaskSpec

__all__ = ["PTChannel", "pt_channel", "ft_prior", "single_task_prior", "sample_prior_mc"]


@dataclass(frozen=True)
class PTChannel:
    """How the PT estimate is distributed in the PT-active and PT-inactive coordinates.

    active, inactive : ``(values, weights)`` of ``|beta_PT|`` (weights sum to 1).
    fixed_point : the PT replica solution (``None`` for oracle PT).
    """

    active: tuple[np.ndarray, np.ndarray]
    inactive: tuple[np.ndarray, np.ndarray]
    fixed_point: FixedPoint | None


def _fold(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A symmetric rule folded onto ``|x|`` (only |beta_PT| enters k): half the nodes, same integrals."""
    pos = x > 0
    ww = np.where(pos, 2.0 * w, np.where(x == 0, w, 0.0))
    keep = x >= 0
    return x[keep], ww[keep]


def _pt_teacher_component(spec) -> tuple[float, float]:
    """(mean, variance) of beta*_PT on PT-active coordinates."""
    if spec.pt_magnitude == "fixed":
        return float(spec.a_pt), 0.0
    return 0.0, float(spec.a_pt) ** 2 / spec.rho_pt


def _abs_normal_rule(sd: float, scale: float, panels: int = 36, per: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Rule for ``|X|``, ``X ~ N(0, sd^2)``: Gauss-Legendre on geometrically growing panels of [0, 12 sd].

    ``k(|beta_PT|)`` turns from ``(4c)^2`` to ``(2|beta|)^2`` around ``|beta| ~ c``: the panels resolve every
    scale from ``scale/100`` upwards (a plain Gauss-Hermite rule misses this kink near 0).
    """
    lo = min(scale * 1e-2, sd * 1e-3)
    edges = np.concatenate([[0.0], np.geomspace(lo, 12.0 * sd, panels)])
    g, gw = np.polynomial.legendre.leggauss(per)
    mid, half = 0.5 * (edges[1:] + edges[:-1]), 0.5 * (edges[1:] - edges[:-1])
    x = (mid[:, None] + half[:, None] * g[None, :]).ravel()
    w = (half[:, None] * gw[None, :]).ravel() * 2.0 * np.exp(-0.5 * (x / sd) ** 2) / (sd * np.sqrt(2.0 * np.pi))
    return x, w / w.sum()


def pt_channel(spec: TaskSpec, *, c: float, alpha_pt: float | None, n_nodes: int = 160) -> PTChannel:
    """Distribution of ``|beta_PT|`` entering ``k`` (oracle or imperfect PT, see module doc).

    Only the absolute scale ``c`` of :class:`~ftlab.dln.model.InitScales` enters: the PT implicit
    bias is ``Q_{4 c^2}`` whatever lam (docs/dln.md). n_nodes : composite Gauss-Legendre nodes over
    the PT channel's noise (imperfect PT). Oracle Gaussian-slab magnitudes use a geometric-panel
    rule for ``|beta_PT|`` (see :func:`_abs_normal_rule`).
    """
    mu_a, v_a = _pt_teacher_component(spec)
    x, w = normal_rule(n_nodes, "legendre")
    pt_noise = spec.pt_noise
    if alpha_pt is not None:
        check_positive("alpha_pt", alpha_pt)
    oracle = alpha_pt is None or (alpha_pt >= 1.0 and pt_noise == 0.0)
    if oracle or alpha_pt is None:
        active = (np.array([mu_a]), np.array([1.0])) if v_a == 0 else _abs_normal_rule(np.sqrt(v_a), c)
        return PTChannel(active, (np.array([0.0]), np.array([1.0])), None)
    if alpha_pt >= 1.0:
        if alpha_pt == 1.0:
            raise ValueError("alpha_pt=1.0 with pt_noise > 0: the PT interpolator's error is infinite")
        theta0, theta = pt_noise**2 / (alpha_pt - 1.0), 0.0
        fp = FixedPoint(alpha_pt, theta0, theta0, 0.0, True, 0, 0.0, "determined")
    else:
        if spec.rho_pt <= 0:
            raise ValueError("rho_pt=0 with imperfect pretraining: there is nothing to pretrain")
        pt_mix = Mixture(
            p=np.array([spec.rho_pt, 1.0 - spec.rho_pt]),
            mu=np.array([mu_a, 0.0]),
            v=np.array([v_a, 0.0]),
            k=np.full(2, 4.0 * c**2),
        ).compact()
        fp = solve_point(QuadratureExpectation(pt_mix), alpha=alpha_pt, noise=pt_noise)
        if not fp.converged:
            raise ValueError(
                f"the PT replica equations did not converge at alpha_pt={alpha_pt!r} (residual {fp.residual:.1e})")
        theta0, theta = fp.theta0, fp.theta
    k_pt = 4.0 * c**2

    def estimate(mu, v):
        xs, ws = _fold(x, w) if mu == 0 else (x, w)
        z = mu + np.sqrt(v + theta0) * xs
        vals = np.abs(prox_qk(z, theta, k_pt)) if theta > 0 else np.abs(z)
        return vals, ws

    return PTChannel(estimate(mu_a, v_a), estimate(0.0, 0.0), fp)


def ft_prior(spec: TaskSpec, scales: InitScales, *, alpha_pt: float | None = None) -> tuple[Mixture, PTChannel]:
    """The four-group prior of ``(beta*_FT, k)`` for a PT -> FT task (see module doc).

    spec : the task statistics. scales : the initialization scales. alpha_pt : PT sample ratio
    (``None`` = oracle PT). Returns the mixture and the PT channel used.
    """
    check_setting(spec, scales)
    ch = pt_channel(spec, c=scales.c, alpha_pt=alpha_pt)
    probs = spec.group_probabilities()
    probs = probs / probs.sum()
    v_ft = 1.0 / spec.rho_ft if spec.rho_ft > 0 else 0.0
    p, mu, v, k, labels = [], [], [], [], []
    for g, name in enumerate(GROUPS):
        pt_active = name in ("shared", "pt_only")
        ft_active = name in ("shared", "new")
        vals, wts = ch.active if pt_active else ch.inactive
        kk = k_from_pt(vals, c=scales.c, lam=scales.lam, gamma=scales.gamma)
        p.append(probs[g] * wts)
        mu.append(np.zeros_like(vals))
        v.append(np.full_like(vals, v_ft if ft_active else 0.0))
        k.append(kk)
        labels += [name] * len(vals)
    mix = Mixture(np.concatenate(p), np.concatenate(mu), np.concatenate(v), np.concatenate(k), tuple(labels))
    return mix.compact(), ch


def single_task_prior(*, rho: float, c: float) -> Mixture:
    """Training from scratch (docs/replica.md): ``k = 4 c^2``; beta* Bernoulli(rho)-Gaussian with variance 1/rho.

    The relative scale lambda does not enter: single-task gradient flow from the symmetric init has
    ``k = 4 c^2`` for every lambda (docs/dln.md).
    """
    check_range("rho", rho, 0.0, 1.0, lo_open=True)
    check_positive("c", c)
    return Mixture(np.array([rho, 1.0 - rho]), np.array([0.0, 0.0]), np.array([1.0 / rho, 0.0]),
                   np.full(2, 4.0 * c**2), ("active", "inactive")).compact()


def sample_prior_mc(spec: TaskSpec, scales: InitScales, *, mc: int, seed: int,
                    alpha_pt: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Monte-Carlo draw of ``(beta*_FT, k, xi)`` reproducing the sampler of the authors' public replica code.

    ``rng = default_rng(seed)``; groups ``rng.choice(4, size=mc, p)``; normals (sd ``1/sqrt(rho_FT)``)
    for the FT-active entries in order; then ``mc`` standard normals ``xi``. Extra draws needed by
    options the authors' oracle sampler lacks (Gaussian PT magnitudes, imperfect PT) come after.
    """
    check_setting(spec, scales)
    c = scales.c
    if int(mc) < 1:
        raise ValueError(f"mc={mc!r} is out of range: must be >= 1")
    rng = np.random.default_rng(seed)
    probs = spec.group_probabilities()
    groups = rng.choice(4, size=int(mc), p=probs / probs.sum())
    ft_active = groups <= 1
    beta = np.zeros(int(mc))
    beta[ft_active] = rng.normal(0.0, np.sqrt(1.0 / spec.rho_ft), size=int(ft_active.sum()))
    xi = rng.standard_normal(int(mc))
    pt_active = (groups == 0) | (groups == 2)
    mu_a, v_a = _pt_teacher_component(spec)
    beta_pt = np.zeros(int(mc))
    beta_pt[pt_active] = mu_a if v_a == 0 else rng.normal(0.0, np.sqrt(v_a), size=int(pt_active.sum()))
    ch = pt_channel(spec, c=c, alpha_pt=alpha_pt, n_nodes=3)
    if ch.fixed_point is not None:
        fp = ch.fixed_point
        zpt = beta_pt + np.sqrt(fp.theta0) * rng.standard_normal(int(mc))
        beta_pt = prox_qk(zpt, fp.theta, 4.0 * c**2) if fp.theta > 0 else zpt
    return beta, k_from_pt(np.abs(beta_pt), c=c, lam=scales.lam, gamma=scales.gamma), xi

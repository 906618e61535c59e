"""Replica theory: scalar prox, closed-form limits, the l1 phase transition, reference values, MC vs quadrature."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, stats

from ftlab.dln.model import InitScales
from ftlab.dln.replica.curves import ExpectationOptions, learning_curve, solve_curve
from ftlab.dln.replica.expect import MonteCarloExpectation, QuadratureExpectation
from ftlab.dln.replica.prior import ft_prior, sample_prior_mc, single_task_prior
from ftlab.dln.replica.scalar import prox_qk, prox_qk_derivatives
from ftlab.dln.replica.solver import solve_damped, solve_point
from ftlab.dln.tasks import TaskSpec

# ---------------------------------------------------------------- scalar problem


@pytest.mark.parametrize("k", [1e-17, 1e-6, 1.0, 1e4])
@pytest.mark.parametrize("theta", [1e-4, 0.3, 20.0])
def test_prox_solves_stationarity_and_is_the_minimizer(k, theta):
    z = np.linspace(-6, 6, 41)
    r = prox_qk_derivatives(z, theta, k)
    # first-order condition b - z + (theta/2) asinh(2b/sqrt k) = 0
    assert np.max(np.abs(r.eta - z + 0.5 * theta * np.arcsinh(2 * r.eta / np.sqrt(k)))) < 1e-12 * (1 + theta)
    # and a global minimizer of the (convex) objective on a fine grid around it
    from ftlab.dln.bias import q_k

    for zi, bi in zip(z[::8], r.eta[::8]):
        grid = bi + np.linspace(-1e-3, 1e-3, 201)
        obj = (grid - zi) ** 2 / (2 * theta) + q_k(grid, k)
        assert obj.min() >= (bi - zi) ** 2 / (2 * theta) + q_k(np.array([bi]), k)[0] - 1e-12


def test_prox_derivatives_match_finite_differences():
    z = np.array([-2.0, -0.3, 0.05, 0.7, 3.0])
    for k, th in [(1e-8, 0.5), (1.0, 0.2), (50.0, 3.0)]:
        r = prox_qk_derivatives(z, th, k)
        h = 1e-6
        fd_z = (prox_qk(z + h, th, k) - prox_qk(z - h, th, k)) / (2 * h)
        fd_t = (prox_qk(z, th + h, k) - prox_qk(z, th - h, k)) / (2 * h)
        assert np.allclose(r.deta_dz, fd_z, atol=1e-6)
        assert np.allclose(r.deta_dtheta, fd_t, atol=1e-6)
        # closed form d eta/dz = 1 / (1 + theta q_k''(eta))
        assert np.allclose(r.deta_dz, 1 / (1 + th / np.sqrt(k + 4 * r.eta**2)), rtol=1e-12)


def test_prox_limits_lazy_and_rich():
    z = np.linspace(-3, 3, 13)
    k, th = 1e8, 2.0  # lazy: q_k ~ b^2 / (2 sqrt k) -> linear shrinkage
    assert np.allclose(prox_qk(z, th, k), z / (1 + th / np.sqrt(k)), rtol=1e-6)
    # rich: tiny k -> shrinkage by (theta/2) log(4|b|/sqrt k); |eta| < |z| and odd
    e = prox_qk(z, 0.1, 1e-17)
    assert np.all(np.abs(e) <= np.abs(z)) and np.allclose(e, -e[::-1])


def test_prox_rejects_k_zero():
    with pytest.raises(ValueError, match="k"):
        prox_qk(1.0, 1.0, 0.0)


# ---------------------------------------------------------------- closed-form limits

ALPHAS = [0.05, 0.1, 0.2, 0.3, 0.5, 0.7]


@pytest.mark.parametrize("overlap,rho_ft,gamma,tol", [(0.0, 0.1, 10.0, 1e-3), (1.0, 0.1, 10.0, 1e-2),
                                                      (0.0, 0.1, 100.0, 1e-5), (1.0, 0.01, 100.0, 1e-4)])
def test_regime_III_is_min_l2_interpolation(overlap, rho_ft, gamma, tol):
    """Large readout re-init -> uniform huge k -> min-l2 interpolator: E_g = (1 - alpha) E[beta*^2] = 1 - alpha."""
    spec = TaskSpec(rho_pt=0.1, rho_ft=rho_ft, overlap=overlap)
    df = learning_curve(spec, InitScales(1e-3, 0.0, gamma), alphas=ALPHAS)
    assert df.converged.all()
    assert np.max(np.abs(df.error - (1 - np.array(ALPHAS)))) < tol


def test_alpha_above_one_is_exact_or_least_squares():
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5)
    assert learning_curve(spec, InitScales(1e-3, 0, 0), alphas=[1.5]).error.iloc[0] == 0.0
    # with label noise the interpolation limit is OLS, E_g = sigma^2/(alpha - 1); check it against the
    # general lambda_reg equations (an independent route) with a small explicit regularizer
    noisy = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5, noise=0.3)
    mix, _ = ft_prior(noisy, InitScales(1e-3, 0, 0))
    fp = solve_point(QuadratureExpectation(mix), alpha=1.5, noise=0.3, lambda_reg=1e-9)
    assert fp.converged and fp.error == pytest.approx(0.09 / 0.5, rel=1e-3)


def _donoho_tanner(eps: float) -> float:
    """Noiseless l1 phase transition for signed signals, delta(eps) = minimax MSE of soft thresholding
    (Donoho, Maleki & Montanari 2009, PNAS): min_tau eps(1+tau^2) + 2(1-eps)[(1+tau^2)Phi(-tau) - tau phi(tau)]."""
    def m(t):
        return eps * (1 + t * t) + 2 * (1 - eps) * ((1 + t * t) * stats.norm.cdf(-t) - t * stats.norm.pdf(t))

    return optimize.minimize_scalar(m, bounds=(0.0, 10.0), method="bounded").fun


@pytest.mark.parametrize("rho", [0.05, 0.1, 0.2])
def test_l1_corner_recovers_exactly_beyond_the_donoho_tanner_threshold(rho):
    """Single task, c -> 0 (k -> 0: the l1 corner): error vanishes just above delta_DT(rho), not below."""
    a_c = _donoho_tanner(rho)
    expect = QuadratureExpectation(single_task_prior(rho=rho, c=1e-100))
    df = solve_curve(expect, a_c * np.array([0.96, 1.04]))
    assert df.converged.all()
    below, above = df.error
    assert below > 1e-3
    assert above < 1e-6


# ---------------------------------------------------------------- reference values

# the corners of the authors' public draft figure4.py (I is their PT-weighted draft corner)
REGIMES = {"II": (0.0, 0.0), "IV": (-0.99, 0.0), "I": (-0.999999, 1e-6), "III": (0.0, 10.0)}
# E_g at alpha = 0.05/0.1/0.2/0.3/0.5 from an independent implementation of the replica equations
# (201 Gauss-Hermite nodes, lambda_reg 1e-6): a reference from a second code, not the paper's numbers
TABLE_C = {
    (0.0, 0.1): {"II": [1.563, 1.417, 0.894, 0.440, 0.021], "IV": [1.179, 1.020, 0.595, 0.213, 0.0005],
                 "I": [1.113, 0.942, 0.495, 0.120, 0.0], "III": [0.950, 0.900, 0.801, 0.701, 0.501]},
    (1.0, 0.1): {"II": [0.520, 0.135, 0.0009, 0.0001, 0], "IV": [0.685, 0.372, 0.024, 0, 0],
                 "I": [0.877, 0.608, 0.145, 0.0001, 0], "III": [0.948, 0.897, 0.794, 0.693, 0.491]},
    (1.0, 0.01): {"II": [0.196, 0.012, 0.0001, 0, 0], "IV": [0.022, 0.0001, 0, 0, 0],
                  "I": [0.012, 0, 0, 0, 0], "III": [0.948, 0.897, 0.794, 0.692, 0.489]},
}


@pytest.mark.parametrize("task", list(TABLE_C))
def test_regime_table_reference_values(task):
    """The independent reference table, with the same 201-node Gauss-Hermite rule: agreement to 1e-3."""
    overlap, rho_ft = task
    spec = TaskSpec(rho_pt=0.1, rho_ft=rho_ft, overlap=overlap)
    for name, (lam, gamma) in REGIMES.items():
        df = learning_curve(spec, InitScales(1e-3, lam, gamma), alphas=[0.05, 0.1, 0.2, 0.3, 0.5],
                            expectation=ExpectationOptions(quadrature="hermite", n_nodes=201), lambda_reg=1e-6)
        assert df.converged.all()
        assert np.allclose(df.error, TABLE_C[task][name], atol=1.1e-3), (name, df.error.tolist())


def test_quadrature_reference_curve_b():
    """A reference curve of the authors' setting (rho 0.1, omega 0.5, c 1e-3) computed independently with exact group
    probabilities and 201 Gauss-Hermite nodes: the same rule and ftlab's default rule both agree with it to 1e-3."""
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5)
    alphas = [0.0410, 0.1030, 0.2023, 0.3015]
    ref = [1.0699, 0.8288, 0.3631, 0.0889]
    for options in (ExpectationOptions(quadrature="hermite", n_nodes=201), None):
        df = learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=alphas, expectation=options)
        assert np.allclose(df.error, ref, atol=1e-3), df.error.tolist()


def test_mc_mode_reproduces_the_authors_stored_curve():
    """The authors' stored MC replica curve (EXPERIMENT1replica_ptft_curves.csv in github.com/Nico31415/toy-unlearning;
    mc = 80k, seed 0) is reproduced by the MC mode (same draw)."""
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5)
    alphas = np.linspace(0.01, 0.5, 80)[[0, 5, 15, 31, 47, 57]]
    ref = [1.0295, 1.1083, 0.8502, 0.3819, 0.1013, 0.0286]
    df = learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=alphas,
                        expectation=ExpectationOptions(kind="mc", mc=80_000, mc_seed=0),
                        lambda_reg=1e-6, continuation="forward")
    assert df.converged.all()
    assert np.allclose(df.error, ref, rtol=0, atol=1e-4), df.error.tolist()  # all stored digits


def test_quadrature_and_monte_carlo_agree_within_mc_error():
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0)
    alphas = [0.08, 0.2]
    quad = learning_curve(spec, InitScales(1e-3, -0.9, 0.0), alphas=alphas).error.to_numpy()
    runs = np.array([learning_curve(spec, InitScales(1e-3, -0.9, 0.0), alphas=alphas, continuation="forward",
                                    expectation=ExpectationOptions(kind="mc", mc=20_000, mc_seed=s)).error.to_numpy()
                     for s in range(6)])
    sem = runs.std(axis=0, ddof=1) / np.sqrt(len(runs))
    assert np.all(np.abs(runs.mean(axis=0) - quad) < 4 * sem + 1e-4)
    # and the MC scatter is real (this is not a vacuous comparison)
    assert np.all(runs.std(axis=0) > 1e-5)


def test_mc_sampler_matches_prior_moments():
    spec = TaskSpec(rho_pt=0.2, rho_ft=0.1, overlap=0.5)
    beta, k, xi = sample_prior_mc(spec, InitScales(1e-3, 0.0, 0.0), mc=200_000, seed=1)
    mix, _ = ft_prior(spec, InitScales(1e-3, 0.0, 0.0))
    assert np.mean(beta**2) == pytest.approx(mix.second_moment, rel=0.03)
    # fraction of coordinates with the PT-active geometry equals rho_pt
    assert np.mean(k > np.min(k) * 10) == pytest.approx(0.2, abs=0.005)
    assert abs(np.mean(xi)) < 0.01


def test_gaussian_slab_quadrature_matches_its_monte_carlo():
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0, pt_magnitude="gaussian")
    quad = learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=[0.15]).error.iloc[0]
    mc = [learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=[0.15],
                         expectation=ExpectationOptions(kind="mc", mc=20_000, mc_seed=s)).error.iloc[0] for s in range(5)]
    assert abs(np.mean(mc) - quad) < 4 * np.std(mc, ddof=1) / np.sqrt(5) + 1e-4


def test_imperfect_pt_tends_to_oracle_and_mc_agrees():
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0)
    oracle = learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=[0.1, 0.2]).error.to_numpy()
    # alpha_pt >= 1 noiseless is the oracle; alpha_pt = 0.95 is already close to it, 0.2 is much worse
    near = learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=[0.1, 0.2], alpha_pt=0.95).error.to_numpy()
    poor = learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=[0.1, 0.2], alpha_pt=0.2).error.to_numpy()
    assert np.all(np.abs(near - oracle) < 0.02) and np.all(poor > oracle + 0.1)
    mc = [learning_curve(spec, InitScales(1e-3, 0.0, 0.0), alphas=[0.2], alpha_pt=0.2,
                         expectation=ExpectationOptions(kind="mc", mc=20_000, mc_seed=s)).error.iloc[0] for s in range(5)]
    assert abs(np.mean(mc) - poor[1]) < 4 * np.std(mc, ddof=1) / np.sqrt(5) + 1e-4


# ---------------------------------------------------------------- robustness and bad input


def test_unconverged_points_are_flagged_not_hidden():
    mix, _ = ft_prior(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), InitScales(1e-3, 0, 0))
    fp = solve_damped(QuadratureExpectation(mix), alpha=0.2, max_iter=3)
    assert not fp.converged and fp.residual > 1e-6


def test_newton_and_damped_schemes_reach_the_same_fixed_point():
    beta, k, xi = sample_prior_mc(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), InitScales(1e-3, 0, 0), mc=5000, seed=3)
    ex = MonteCarloExpectation(beta, k, xi)
    a = solve_point(ex, alpha=0.3, lambda_reg=1e-6)
    b = solve_damped(ex, alpha=0.3, lambda_reg=1e-6, tol=1e-12, max_iter=20_000)
    assert a.converged and b.converged
    assert a.error == pytest.approx(b.error, rel=1e-5)


@pytest.mark.parametrize("kw,match", [
    ({"alphas": [0.1, -0.2]}, "alpha"),
    ({"alphas": [0.0]}, "alpha"),
    ({"alphas": [float("nan")]}, "alpha"),
    ({"alphas": [0.1, 0.1]}, "duplicate"),
    ({"alphas": []}, "empty"),
    ({"continuation": "backward"}, "continuation"),
    ({"lambda_reg": -1.0}, "lambda_reg"),
])
def test_bad_input_raises_value_error(kw, match):
    args = {"alphas": [0.1]} | kw
    with pytest.raises(ValueError, match=match):
        learning_curve(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), InitScales(1e-3, 0.0, 0.0), **args)


@pytest.mark.parametrize("kw,match", [
    ({"kind": "exact"}, "expectation"), ({"quadrature": "simpson"}, "quadrature"), ({"n_nodes": 1}, "n_nodes"),
    ({"quadrature": "hermite", "n_nodes": 400}, "350"), ({"mc": 0}, "mc="), ({"mc_seed": -1}, "mc_seed"),
])
def test_bad_expectation_options_raise_value_error(kw, match):
    with pytest.raises(ValueError, match=match):
        opts = ExpectationOptions(**kw)
        learning_curve(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), InitScales(1e-3, 0.0, 0.0), [0.1],
                       expectation=opts)


def test_infeasible_statistics_raise():
    with pytest.raises(ValueError, match="overlap"):
        TaskSpec(rho_pt=0.05, rho_ft=0.1, overlap=1.0)


class _Hysteresis:
    """A planted fixed-point problem with a fold (two stable branches for alpha in (0.3075, 0.6925)).

    A = 1/(1 + theta) fixes theta = 1/alpha - 1, so alpha(theta) = 1/(1 + theta) is known inside; then
    B = alpha theta0 exp(-h), h = x^3 - x + (2 alpha - 1), x = log theta0: fixed points are the roots of h.
    """

    second_moment = 1.0

    def __call__(self, theta0, theta):
        from ftlab.dln.replica.expect import Moments

        a = 1.0 / (1.0 + theta)
        x = np.log(theta0)
        e = np.exp(-(x**3 - x + 2 * a - 1))
        return Moments(A=a, B=a * theta0 * e, dA_dtheta0=0.0, dA_dtheta=-(a**2),
                       dB_dtheta0=a * e * (1 - (3 * x * x - 1)), dB_dtheta=theta0 * e * (-(a**2)) * (1 - 2 * a))


def test_continuation_detects_and_reports_two_branches():
    alphas = np.linspace(0.1, 0.9, 17)
    df = solve_curve(_Hysteresis(), alphas)
    assert df.converged.all()
    both = (alphas > 0.3075) & (alphas < 0.6925)  # where x^3 - x + s has three real roots
    assert np.array_equal(df.n_branches.to_numpy() == 2, both)
    # inside the fold the lower-error (lower) branch, found by the backward pass, is kept
    assert set(df.branch[both]) == {"backward"} and set(df.branch[~both]) == {"unique"}
    x = np.log(df.theta0.to_numpy())
    assert np.allclose(x**3 - x + 2 * alphas - 1, 0, atol=1e-8)
    assert np.all(x[both] < -0.5)

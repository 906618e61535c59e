"""q_k, k_from_pt and the interpolators: identities, limits, independent cross-checks."""

from __future__ import annotations

import numpy as np
import pytest

from ftlab.dln import (
    Q_k,
    TaskSpec,
    ft_reset,
    k_from_pt,
    min_l1_interpolator,
    min_l2_interpolator,
    oracle_pt,
    q_k,
    q_k_prime,
    q_k_prime_inv,
    q_k_second,
    sample_problem,
    solve_implicit_bias,
)

KS = [1e-20, 1e-12, 1e-6, 1e-2, 1.0, 1e3, 1e6]


def test_q_k_matches_high_precision_naive_formula():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    for k in KS:
        for z in [-1e4, -3.0, -1e-3, 1e-9, 0.5, 7.0, 1e6]:
            sk = mpmath.sqrt(mpmath.mpf(k))
            t = 2 * mpmath.mpf(z) / sk
            ref = sk / 4 * (1 - mpmath.sqrt(1 + t**2) + t * mpmath.asinh(t))
            got = q_k(z, k)
            assert np.isfinite(got)
            assert abs(got - float(ref)) <= 1e-13 * abs(float(ref)) + 1e-300


def test_derivatives_match_finite_differences():
    rng = np.random.default_rng(0)
    for k in KS:
        sk = np.sqrt(k)
        z = sk * rng.uniform(-30, 30, size=50)  # the scale where q_k bends
        h = 1e-6 * np.maximum(np.abs(z), sk)
        fd1 = (q_k(z + h, k) - q_k(z - h, k)) / (2 * h)
        fd2 = (q_k_prime(z + h, k) - q_k_prime(z - h, k)) / (2 * h)
        np.testing.assert_allclose(q_k_prime(z, k), fd1, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(q_k_second(z, k), fd2, rtol=1e-6)


def test_woodworth_relation():
    # Woodworth et al. 2020: q(z) = 2 - sqrt(4 + z^2) + z asinh(z / 2); q_k(z) = (sqrt(k)/8) q(4 z / sqrt(k)).
    z = np.linspace(-5, 5, 41)
    for k in [0.01, 0.3, 1.0, 4.0, 50.0]:
        s = 4 * z / np.sqrt(k)
        q = 2 - np.sqrt(4 + s**2) + s * np.arcsinh(s / 2)
        np.testing.assert_allclose(q_k(z, k), np.sqrt(k) / 8 * q, rtol=1e-10, atol=1e-14)


def test_asymptotics_lazy_and_rich():
    for k in KS:
        sk = np.sqrt(k)
        z = 1e-4 * sk
        assert q_k(z, k) == pytest.approx(z**2 / (2 * sk), rel=1e-7)
        z = 1e7 * sk
        rich = z / 2 * (np.log(4 * z / sk) - 1) + sk / 4
        assert q_k(z, k) == pytest.approx(rich, rel=1e-10)


def test_stable_inverse_and_convexity_at_extremes():
    z = np.array([-1e8, -1.0, -1e-12, 0.0, 1e-12, 1.0, 1e8])
    for k in KS:
        np.testing.assert_allclose(q_k_prime_inv(q_k_prime(z, k), k), z, rtol=1e-9, atol=1e-25)
        q = q_k(z, k)
        assert np.all(np.isfinite(q)) and np.all(q >= 0)
        assert np.all(np.diff(q[3:]) > 0) and np.all(np.diff(q[:4]) < 0)  # even, increasing in |z|
        assert np.all(q_k_second(z, k) > 0)


def test_k_from_pt_equals_k_of_reset_oracle_weights():
    # Two independent computations: the closed form (Theorem 4.1) and k = (l+ - l-)^2 + 4 c^2 of actual weights.
    rng = np.random.default_rng(1)
    for _ in range(20):
        c, lam, gamma = 10 ** rng.uniform(-4, 1), rng.uniform(-1, 1), rng.uniform(0, 2)
        b = rng.standard_normal(30) * 10 ** rng.uniform(-3, 2)
        k_weights = ft_reset(oracle_pt(b, c=c, lam=lam), gamma=gamma).k
        np.testing.assert_allclose(k_from_pt(b, c=c, lam=lam, gamma=gamma), k_weights, rtol=1e-9)


def test_k_from_pt_rejects_bad_scales():
    for kw, name in [({"c": 0.0, "lam": 0.0, "gamma": 0.0}, "c="), ({"c": 1.0, "lam": 1.5, "gamma": 0.0}, "lam="),
                     ({"c": 1.0, "lam": 0.0, "gamma": -1.0}, "gamma="), ({"c": np.nan, "lam": 0.0, "gamma": 0.0}, "c=")]:
        with pytest.raises(ValueError, match=name):
            k_from_pt(np.ones(3), **kw)
    with pytest.raises(ValueError, match="k"):
        q_k(1.0, 0.0)


def _problem(dim=120, alpha=0.4, seed=0):
    p = sample_problem(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), alpha=alpha, dim=dim, seed=seed)
    return p.X_ft, p.y_ft, p.beta_ft_star


@pytest.mark.parametrize("k", [1e-20, 1e-8, 1e-2, 1.0, 1e4])
def test_implicit_bias_solution_satisfies_kkt(k):
    # Optimality of argmin Q_k s.t. X beta = y: feasibility and grad Q_k(beta) in the row space of X.
    X, y, _ = _problem()
    kv = k * np.exp(np.random.default_rng(3).uniform(-2, 2, X.shape[1]))  # non-uniform geometry
    res = solve_implicit_bias(X, y, kv)
    assert res.converged and res.residual < 1e-10
    g = q_k_prime(res.beta, kv)
    proj = X.T @ np.linalg.lstsq(X.T, g, rcond=None)[0]
    assert np.linalg.norm(g - proj) <= 1e-7 * max(np.linalg.norm(g), 1.0)


def test_implicit_bias_with_extreme_mixed_geometry():
    # k spanning 24 decades on one problem, N close to D: the float32 Hessian path must fall back cleanly.
    X, y, _ = _problem(dim=80, alpha=0.9, seed=6)
    kv = np.where(np.arange(80) % 3 == 0, 1e4, 1e-20)
    res = solve_implicit_bias(X, y, kv)
    assert res.converged and res.residual < 1e-10
    g = q_k_prime(res.beta, kv)
    proj = X.T @ np.linalg.lstsq(X.T, g, rcond=None)[0]
    assert np.linalg.norm(g - proj) <= 1e-7 * max(np.linalg.norm(g), 1.0)


def test_the_argmin_has_the_smallest_potential_among_interpolators():
    # Q_k is minimized over {X beta = y}: the l1 and l2 interpolators and null-space moves of the argmin score higher
    X, y, _ = _problem(dim=100, alpha=0.4, seed=3)
    kv = 1e-4 * np.exp(np.random.default_rng(5).uniform(-2, 2, X.shape[1]))
    best = solve_implicit_bias(X, y, kv).beta
    assert Q_k(best, kv) == pytest.approx(float(np.sum(q_k(best, kv))), rel=1e-15)
    null = np.linalg.svd(X)[2][X.shape[0]:]  # orthonormal basis of the null space of X
    moves = [min_l1_interpolator(X, y).beta, min_l2_interpolator(X, y).beta,
             *(best + 1e-3 * v for v in null[:5]), *(best - 1e-3 * v for v in null[:5])]
    for other in moves:
        assert np.allclose(X @ other, y, atol=1e-8)
        assert Q_k(other, kv) > Q_k(best, kv)


def test_direct_newton_and_cg_newton_reach_the_same_argmin():
    # max_cg = 0 factorizes the Hessian at every step (no conjugate gradients): an independent linear-algebra path
    X, y, _ = _problem(dim=150, alpha=0.4, seed=2)
    kv = 1e-6 * np.exp(np.random.default_rng(4).uniform(-3, 3, X.shape[1]))
    cg, direct = solve_implicit_bias(X, y, kv), solve_implicit_bias(X, y, kv, max_cg=0)
    assert cg.converged and direct.converged
    np.testing.assert_allclose(cg.beta, direct.beta, rtol=1e-7, atol=1e-10)


def test_newton_step_budget_flags_an_unfinished_solve():
    X, y, _ = _problem()
    full = solve_implicit_bias(X, y, 1e-12)
    short = solve_implicit_bias(X, y, 1e-12, max_iter=2)
    assert full.converged and full.n_iter > 2
    assert not short.converged and short.n_iter == 2 and short.residual > 1e-12


def test_implicit_bias_limits_are_l1_and_l2():
    X, y, _ = _problem()
    l1, l2 = min_l1_interpolator(X, y), min_l2_interpolator(X, y)
    gaps_l1 = [np.linalg.norm(solve_implicit_bias(X, y, k).beta - l1.beta) for k in (1e-4, 1e-10, 1e-20)]
    assert gaps_l1[0] > gaps_l1[1] > gaps_l1[2] and gaps_l1[2] < 1e-3 * np.linalg.norm(l1.beta)
    gaps_l2 = [np.linalg.norm(solve_implicit_bias(X, y, k).beta - l2.beta) for k in (1e0, 1e4, 1e8)]
    assert gaps_l2[0] > gaps_l2[1] > gaps_l2[2] and gaps_l2[2] < 1e-4 * np.linalg.norm(l2.beta)


def test_min_l1_recovers_planted_sparse_teacher_and_l2_is_pseudoinverse():
    X, y, beta = _problem(dim=200, alpha=0.5, seed=4)  # 20-sparse, 100 samples: inside the l1 recovery region
    l1 = min_l1_interpolator(X, y)
    assert l1.converged and np.linalg.norm(l1.beta - beta) < 1e-6 * np.linalg.norm(beta)
    np.testing.assert_allclose(min_l2_interpolator(X, y).beta, np.linalg.pinv(X) @ y, atol=1e-10)


def test_interpolators_reject_bad_shapes():
    with pytest.raises(ValueError, match="X must be"):
        solve_implicit_bias(np.ones((3, 4)), np.ones(2), 1.0)
    with pytest.raises(ValueError, match="y"):
        min_l2_interpolator(np.ones((2, 4)), np.array([1.0, np.inf]))

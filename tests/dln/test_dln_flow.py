"""Gradient flow on the four weight vectors: invariants, trajectory, endpoint = implicit-bias argmin."""

from __future__ import annotations

import numpy as np
import pytest

from ftlab.dln import (
    TaskSpec,
    Weights,
    ft_reset,
    gradient_descent,
    gradient_flow,
    init_pt,
    k_from_pt,
    min_l1_interpolator,
    min_l2_interpolator,
    oracle_pt,
    sample_problem,
    solve_implicit_bias,
)


def _rk4_weights(w: Weights, X, y, t_end, dt):
    """Independent reference: classical RK4 on the 4D-dimensional weight ODE (mean-MSE loss)."""
    n = X.shape[0]
    s = np.stack([w.w_plus, w.w_minus, w.v_plus, w.v_minus])

    def f(s):
        wp, wm, vp, vm = s
        g = (2.0 / n) * X.T @ (y - X @ (vp * wp - vm * wm))
        return np.stack([vp * g, -vm * g, wp * g, -wm * g])

    for _ in range(int(round(t_end / dt))):
        k1 = f(s)
        k2 = f(s + dt / 2 * k1)
        k3 = f(s + dt / 2 * k2)
        k4 = f(s + dt * k3)
        s = s + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return Weights(*s)


def _generic_weights(dim, seed):
    rng = np.random.default_rng(seed)
    return Weights(*(rng.uniform(-0.8, 0.8, dim) for _ in range(4)))


def test_flow_trajectory_matches_rk4_on_the_weights_and_keeps_invariants():
    rng = np.random.default_rng(0)
    D, N = 25, 10
    X = rng.standard_normal((N, D)) / np.sqrt(D)
    y = rng.standard_normal(N)
    w0 = _generic_weights(D, 1)  # unbalanced, beta(0) != 0
    for t_end in (0.7, 3.0):
        res = gradient_flow(w0, X, y, t_max=t_end, rtol=1e-11, atol=1e-13)
        ref = _rk4_weights(w0, X, y, t_end, 1e-3)
        assert res.t_final == pytest.approx(t_end)
        for a, b in zip((res.weights.w_plus, res.weights.w_minus, res.weights.v_plus, res.weights.v_minus),
                        (ref.w_plus, ref.w_minus, ref.v_plus, ref.v_minus)):
            np.testing.assert_allclose(a, b, atol=2e-8)
        for i0, i_flow, i_rk in zip(w0.invariants(), res.weights.invariants(), ref.invariants()):
            np.testing.assert_allclose(i_flow, i0, atol=1e-12)  # exact up to rounding
            np.testing.assert_allclose(i_rk, i0, atol=1e-9)  # the reference agrees
        assert res.invariant_drift < 1e-12


def test_pt_implicit_bias_does_not_depend_on_lambda():
    c = 0.05
    p = sample_problem(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0), alpha=0.3, dim=80, seed=2, alpha_pt=0.4)
    target = solve_implicit_bias(p.X_pt, p.y_pt, 4 * c**2).beta
    for lam in (-0.9, -0.3, 0.0, 0.5, 1.0):
        w0 = init_pt(80, c=c, lam=lam)
        np.testing.assert_allclose(w0.k, 4 * c**2, rtol=1e-12)
        res = gradient_flow(w0, p.X_pt, p.y_pt)
        assert res.converged
        assert np.linalg.norm(res.beta - target) <= 1e-7 * np.linalg.norm(target)


CORNERS = {
    "I": (1e-3, -0.999999, 1e-6),
    "II": (1e-3, 1.0, 0.0),
    "III": (1e-3, 0.0, 10.0),
    "IV": (1e-3, -0.99, 0.0),
    "mid-a": (0.1, 0.3, 0.5),
    "mid-b": (1.0, -0.5, 0.0),
}


@pytest.mark.parametrize("name", list(CORNERS))
@pytest.mark.parametrize("dim, overlap", [(60, 0.0), (150, 1.0)])
def test_flow_endpoint_equals_implicit_bias_argmin(name, dim, overlap):
    c, lam, gamma = CORNERS[name]
    p = sample_problem(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=overlap, pt_magnitude="gaussian"),
                       alpha=0.35, dim=dim, seed=11)
    w_ft = ft_reset(oracle_pt(p.beta_pt_star, c=c, lam=lam), gamma=gamma)
    res = gradient_flow(w_ft, p.X_ft, p.y_ft)
    pred = solve_implicit_bias(p.X_ft, p.y_ft, k_from_pt(p.beta_pt_star, c=c, lam=lam, gamma=gamma))
    assert res.converged and pred.converged
    assert np.linalg.norm(res.beta - pred.beta) <= 1e-5 * np.linalg.norm(pred.beta)
    assert res.invariant_drift < 1e-8


def _ft_endpoint(p, c, lam, gamma):
    return gradient_flow(ft_reset(oracle_pt(p.beta_pt_star, c=c, lam=lam), gamma=gamma), p.X_ft, p.y_ft).beta


def test_rich_and_lazy_limits_of_the_flow():
    p = sample_problem(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), alpha=0.4, dim=100, seed=5)
    l1 = min_l1_interpolator(p.X_ft, p.y_ft).beta
    l2 = min_l2_interpolator(p.X_ft, p.y_ft).beta
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    # small c with lam -> -1 and gamma -> 0: minimum l1
    gaps = [rel(_ft_endpoint(p, 1e-3, lam, g), l1) for lam, g in [(-0.9, 1e-2), (-0.999, 1e-4), (-1 + 1e-9, 1e-8)]]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 2e-3
    # large c, or large gamma: minimum l2
    assert rel(_ft_endpoint(p, 1e3, 0.0, 0.0), l2) < 1e-3
    assert rel(_ft_endpoint(p, 1e-3, 0.0, 100.0), l2) < 1e-3
    assert rel(_ft_endpoint(p, 1e-3, 0.0, 0.0), l2) > 0.1  # and not for small scales


def test_gd_approaches_the_flow_as_lr_shrinks():
    p = sample_problem(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0), alpha=0.4, dim=50, seed=8)
    w = ft_reset(oracle_pt(p.beta_pt_star, c=0.1, lam=0.0), gamma=0.3)
    flow = gradient_flow(w, p.X_ft, p.y_ft).beta
    errs, drifts = [], []
    for lr in (0.4, 0.1, 0.025):
        gd = gradient_descent(w, p.X_ft, p.y_ft, lr=lr, tol=1e-16)
        assert gd.converged
        errs.append(np.linalg.norm(gd.beta - flow))
        drifts.append(gd.invariant_drift)
    assert errs[0] > errs[1] > errs[2] and errs[1] / errs[2] > 2.5  # first order in lr
    assert drifts[0] > drifts[1] > drifts[2] > 0


def test_radau_and_bdf_integrators_end_at_the_same_point():
    p = sample_problem(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5), alpha=0.3, dim=60, seed=4)
    w = ft_reset(oracle_pt(p.beta_pt_star, c=1e-2, lam=-0.5), gamma=0.1)
    bdf, radau = gradient_flow(w, p.X_ft, p.y_ft), gradient_flow(w, p.X_ft, p.y_ft, method="Radau")
    assert bdf.converged and radau.converged and (bdf.method, radau.method) == ("flow-BDF", "flow-Radau")
    np.testing.assert_allclose(radau.beta, bdf.beta, rtol=1e-6, atol=1e-9)


def test_gd_step_budget_stops_unconverged():
    p = sample_problem(TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0), alpha=0.4, dim=50, seed=8)
    w = ft_reset(oracle_pt(p.beta_pt_star, c=0.1, lam=0.0), gamma=0.3)
    gd = gradient_descent(w, p.X_ft, p.y_ft, tol=1e-16, max_steps=10)
    assert not gd.converged and gd.n_iter == 10 and gd.residual > 1e-16


def test_flow_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="X must be"):
        gradient_flow(init_pt(5, c=1.0, lam=0.0), np.ones((3, 4)), np.ones(3))
    with pytest.raises(ValueError, match="lr"):
        gradient_descent(init_pt(4, c=1.0, lam=0.0), np.ones((3, 4)), np.ones(3), lr=0.0)

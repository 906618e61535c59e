"""The PT+FT driver: agreement with the implicit bias, closed-form limits, imperfect PT."""

from __future__ import annotations

import numpy as np
import pytest

from ftlab.dln import InitScales, TaskSpec, simulate_ptft

SPEC = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0)


def test_flow_matches_prediction_and_gd_is_close():
    r = simulate_ptft(SPEC, InitScales(c=1e-3, lam=-0.99, gamma=0.0), alpha=0.2, dim=200, seed=1)
    assert r.converged and r.distance < 1e-6 and r.error == pytest.approx(r.error_pred, rel=1e-6)
    assert r.pt_error < 1e-20  # oracle PT
    g = simulate_ptft(SPEC, InitScales(c=1e-3, lam=-0.99, gamma=0.0), alpha=0.2, dim=200, seed=1, method="gd")
    assert g.converged and g.distance < 0.2  # GD stops at train MSE 1e-4, with O(lr) bias


def test_lazy_limit_error_is_one_minus_alpha():
    # Regime III (gamma large) = minimum-l2 interpolation: for an isotropic design the error is the squared
    # projection of beta* on the null space of X, E = (1 - alpha) ||beta*||^2 / D given the teacher.
    ratios = []
    for s in range(4):
        r = simulate_ptft(SPEC, InitScales(c=1e-3, lam=0.0, gamma=30.0), alpha=0.3, dim=400, seed=s)
        ratios.append(r.error / ((1 - 0.3) * np.mean(r.beta_ft_star**2)))
    assert np.mean(ratios) == pytest.approx(1.0, abs=0.08)


def test_perfect_pretraining_by_flow_equals_the_oracle():
    # With alpha_pt = 1 (noiseless, square design) PT interpolates beta*_PT exactly, so FT must match the oracle run.
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=0.5)
    a = simulate_ptft(spec, InitScales(c=0.01, lam=-0.5, gamma=0.1), alpha=0.3, dim=120, seed=3)
    b = simulate_ptft(spec, InitScales(c=0.01, lam=-0.5, gamma=0.1), alpha=0.3, dim=120, seed=3, alpha_pt=1.0)
    assert b.pt_error < 1e-12
    np.testing.assert_allclose(b.k, a.k, rtol=1e-5)
    assert b.error == pytest.approx(a.error, rel=1e-4)


def test_imperfect_pretraining_changes_k_and_the_prediction_still_holds():
    r = simulate_ptft(SPEC, InitScales(c=1e-3, lam=0.0, gamma=0.0), alpha=0.2, dim=200, seed=2, alpha_pt=0.2)
    assert r.pt_error > 1e-3 and r.converged and r.distance < 1e-6


@pytest.mark.parametrize("kw, name", [
    ({"c": 0.0}, "c="), ({"lam": 1.01}, "lam="), ({"gamma": -1.0}, "gamma="), ({"alpha": 0.0}, "alpha="),
    ({"dim": 0}, "dim="), ({"alpha": float("inf")}, "alpha="), ({"method": "sgd"}, "method="),
    ({"lam": -1.0, "gamma": 0.0}, "lam=-1"), ({"alpha_pt": -0.5}, "alpha_pt="),
])
def test_bad_input(kw, name):
    args = {"c": 1e-3, "lam": 0.0, "gamma": 0.0, "alpha": 0.2, "dim": 50, "seed": 0} | kw
    with pytest.raises(ValueError, match=name):
        scales = InitScales(c=args.pop("c"), lam=args.pop("lam"), gamma=args.pop("gamma"))
        simulate_ptft(SPEC, scales, **args)


def test_loose_numbers_instead_of_the_setting_objects_are_a_type_error():
    with pytest.raises(TypeError, match="InitScales"):
        simulate_ptft(SPEC, (1e-3, 0.0, 0.0), alpha=0.2, dim=50, seed=0)
    with pytest.raises(TypeError, match="TaskSpec"):
        simulate_ptft({"rho_pt": 0.1}, InitScales(c=1e-3, lam=0.0, gamma=0.0), alpha=0.2, dim=50, seed=0)

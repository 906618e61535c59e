"""Task statistics: the two parametrizations, feasibility, samplers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlab.dln import TaskSpec, n_samples, sample_design, sample_problem, sample_teachers


@settings(max_examples=60, deadline=None)
@given(rho_pt=st.floats(0.01, 0.99), rho_shared=st.floats(0, 1), rho_new=st.floats(0, 1))
def test_conditional_parametrization_round_trips(rho_pt, rho_shared, rho_new):
    spec = TaskSpec.from_conditional(rho_pt=rho_pt, rho_shared=rho_shared, rho_new=rho_new)
    assert spec.rho_ft == pytest.approx(rho_pt * rho_shared + (1 - rho_pt) * rho_new)
    p = spec.group_probabilities()
    assert p.sum() == pytest.approx(1.0) and np.all(p >= 0)
    # the four-group table (docs/dln.md), computed from the conditional probabilities directly
    expected = [rho_pt * rho_shared, (1 - rho_pt) * rho_new, rho_pt * (1 - rho_shared), (1 - rho_pt) * (1 - rho_new)]
    np.testing.assert_allclose(p, expected, atol=1e-12)
    if spec.rho_ft > 1e-9:
        assert spec.rho_shared == pytest.approx(rho_shared, abs=1e-9)
        assert spec.rho_new == pytest.approx(rho_new, abs=1e-9)


def test_infeasible_overlap_names_its_range():
    with pytest.raises(ValueError, match=r"overlap=0.5 is out of range: must be in \[0, 0.2\]"):
        TaskSpec(rho_pt=0.1, rho_ft=0.5, overlap=0.5)
    with pytest.raises(ValueError, match=r"overlap=0.0 is out of range: must be in \[0.5, 0.75\]"):
        TaskSpec(rho_pt=0.6, rho_ft=0.8, overlap=0.0)


@pytest.mark.parametrize("kw, name", [
    ({"rho_pt": -0.1}, "rho_pt"), ({"rho_ft": 1.2}, "rho_ft"), ({"overlap": np.nan}, "overlap"),
    ({"noise": -1.0}, "noise"), ({"pt_magnitude": "laplace"}, "pt_magnitude"), ({"support": "x"}, "support"),
    ({"a_pt": 0.0}, "a_pt"),
])
def test_bad_fields_raise_value_error_naming_them(kw, name):
    base = {"rho_pt": 0.1, "rho_ft": 0.1, "overlap": 0.5} | kw
    with pytest.raises(ValueError, match=name):
        TaskSpec(**base)


def test_exact_supports_have_the_requested_sizes():
    spec = TaskSpec(rho_pt=0.2, rho_ft=0.1, overlap=0.7)
    bpt, bft = sample_teachers(spec, dim=1000, seed=3)
    assert np.count_nonzero(bpt) == 200 and np.all(bpt[bpt != 0] == 1.0)
    assert np.count_nonzero(bft) == 100
    assert np.count_nonzero((bpt != 0) & (bft != 0)) == 70


def test_bernoulli_supports_follow_group_probabilities_and_unit_variance():
    spec = TaskSpec(rho_pt=0.3, rho_ft=0.2, overlap=0.4, support="bernoulli", pt_magnitude="gaussian")
    bpt, bft = sample_teachers(spec, dim=200_000, seed=5)
    a, b = bpt != 0, bft != 0
    freq = np.array([np.mean(a & b), np.mean(~a & b), np.mean(a & ~b), np.mean(~a & ~b)])
    np.testing.assert_allclose(freq, spec.group_probabilities(), atol=4e-3)
    assert np.mean(bft**2) == pytest.approx(1.0, rel=0.03)
    assert np.mean(bpt**2) == pytest.approx(1.0, rel=0.03)


def test_design_scaling_and_seeding():
    X = sample_design(400, 500, seed=0)
    assert X.var() == pytest.approx(1 / 500, rel=0.02)
    np.testing.assert_array_equal(X, sample_design(400, 500, seed=0))
    assert n_samples(0.3, 1000) == 300
    spec = TaskSpec(rho_pt=0.1, rho_ft=0.1, overlap=1.0, noise=0.1)
    p1 = sample_problem(spec, alpha=0.2, dim=300, seed=7)
    p2 = sample_problem(spec, alpha=0.4, dim=300, seed=7, alpha_pt=0.5)
    np.testing.assert_array_equal(p1.beta_ft_star, p2.beta_ft_star)  # same teachers along a learning curve
    assert p1.X_ft.shape == (60, 300) and p2.X_pt.shape == (150, 300)
    noise = p1.y_ft - p1.X_ft @ p1.beta_ft_star
    assert 0.05 < noise.std() < 0.15


def test_import_does_not_pull_in_torch():
    code = "import sys, ftlab.dln, ftlab.dln.simulate, ftlab.dln.regimes; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

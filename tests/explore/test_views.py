"""What the page draws equals the library's own calls (no server, no browser)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest

from ftlab.dln import REGIME_CORNERS, k_from_pt, metrics, q_k, regime
from ftlab.dln.advisor import CORNERS
from ftlab.dln.replica import learning_curve
from ftlab.dln.simulate import simulate_ptft
from ftlab.explore.knobs import Knobs, parse_knobs
from ftlab.explore.views import (
    ALPHA_GRID,
    PHASE_LAM,
    PHASE_LOG10_C,
    REGIME_ORDER,
    corner_view,
    curve_alphas,
    curve_view,
    point_view,
    sim_plan,
    simulation_view,
    to_json,
)

TOL = {"rtol": 1e-9, "atol": 1e-12}

POINTS = [Knobs(), Knobs(c=1e-5, lam=0.4, gamma=0.3, beta_pt=3.0, beta_ft=0.02),
          Knobs(c=2.0, lam=-1.0, gamma=1e-3, beta_pt=0.0, beta_ft=50.0), Knobs(c=1e-3, lam=0.0, gamma=10.0, beta_pt=-2.0)]


def num(values) -> np.ndarray:
    """JSON numbers (None for NaN) back to a float array."""
    return np.array([math.nan if v is None else v for v in values], dtype=float)


@pytest.mark.parametrize("knobs", POINTS)
def test_point_view_is_the_library_closed_forms(knobs):
    v = point_view(knobs)
    json.dumps(v, allow_nan=False)  # valid JSON
    scales = asdict(knobs.scales())
    m = metrics(beta_pt=knobs.beta_pt, beta_ft=knobs.beta_ft, **scales)
    for key in ("l_order", "pd", "m", "l_plus_pd", "k"):
        np.testing.assert_allclose(v["metrics"][key], getattr(m, key), **TOL)
    assert v["metrics"]["regime"] == m.regime
    for name, (lam, gamma) in REGIME_CORNERS.items():
        mc = metrics(beta_pt=knobs.beta_pt, beta_ft=knobs.beta_ft, c=1e-3, lam=lam, gamma=gamma)
        np.testing.assert_allclose([v["corners"][name]["l_order"], v["corners"][name]["pd"]], [mc.l_order, mc.pd], **TOL)
    lam = np.array(v["lam_path"]["lam"])
    mp = metrics(beta_pt=knobs.beta_pt, beta_ft=knobs.beta_ft, c=knobs.c, lam=lam, gamma=knobs.gamma)
    np.testing.assert_allclose(v["lam_path"]["pd"], mp.pd, **TOL)
    k1 = k_from_pt(knobs.beta_pt, **scales)
    z = np.array(v["qk"]["z"])
    np.testing.assert_allclose(v["qk"]["active"], q_k(z, k1), **TOL)
    np.testing.assert_allclose(v["qk"]["inactive"], q_k(z, k_from_pt(0.0, **scales)), **TOL)
    np.testing.assert_allclose(v["qk"]["at"]["q"], q_k(abs(knobs.beta_ft), k1), **TOL)


def test_the_regime_plane_map_is_the_regime_of_each_cell():
    knobs = Knobs(gamma=0.0, beta_pt=2.0, beta_ft=0.5)
    grid = np.array([[math.nan if c is None else c for c in row] for row in point_view(knobs)["phase"]["regime"]])
    assert grid.shape == (len(PHASE_LOG10_C), len(PHASE_LAM))
    assert np.isnan(grid[:, 0]).all() and not np.isnan(grid[:, 1:]).any()  # lam = -1 with gamma = 0: the zero saddle
    for i, j in [(0, 1), (10, 40), (56, 80), (30, 3)]:
        m = metrics(beta_pt=2.0, beta_ft=0.5, c=10.0 ** PHASE_LOG10_C[i], lam=PHASE_LAM[j], gamma=0.0)
        assert REGIME_ORDER[int(grid[i, j])] == regime(m.l_order, m.pd)
    assert len(set(grid[~np.isnan(grid)].astype(int))) >= 3  # the map is not flat


def test_curve_and_corner_views_are_the_library_learning_curves():
    knobs = Knobs(c=1e-2, lam=-0.5, gamma=0.1, rho_pt=0.2, rho_ft=0.05, overlap=0.5, alpha=0.25)
    v = curve_view(knobs)
    assert v["alphas"] == curve_alphas(0.25) and 0.25 in v["alphas"]
    ref = learning_curve(knobs.task(), knobs.scales(), v["alphas"])
    np.testing.assert_allclose(num(v["error"]), ref["error"], **TOL)
    np.testing.assert_allclose(v["error_at_alpha"], float(ref["error"][v["alphas"].index(0.25)]), **TOL)
    corners = corner_view(knobs)
    assert set(corners) == set(CORNERS)
    for name in ("II", "IV"):
        ref = learning_curve(knobs.task(), CORNERS[name], list(ALPHA_GRID))
        np.testing.assert_allclose(num(corners[name]["error"]), ref["error"], **TOL)


def test_an_alpha_without_a_converged_solution_is_flagged_with_a_message(monkeypatch):
    import ftlab.dln.replica.curves as curves

    real = curves.learning_curve

    def failing(spec, scales, alphas, **kw):
        df = real(spec, scales, alphas, **kw)
        df.loc[df["alpha"] == 0.3, "converged"] = False
        return df

    monkeypatch.setattr(curves, "learning_curve", failing)
    v = curve_view(Knobs(alpha=0.3))
    assert v["error_at_alpha"] is None and not v["converged_at_alpha"]
    assert "no converged solution at alpha=0.3" in v["warning"]


def test_simulation_view_is_simulate_ptft():
    knobs = Knobs(lam=0.0, rho_pt=0.3, rho_ft=0.2, overlap=0.5)
    v = simulation_view(knobs, alpha=0.3, seed=1, dim=60, method="gd")
    r = simulate_ptft(knobs.task(), knobs.scales(), alpha=0.3, dim=60, seed=1, method="gd")
    np.testing.assert_allclose([v["error"], v["error_pred"]], [r.error, r.error_pred], **TOL)


@pytest.mark.parametrize("query, words", [
    ({"c": "0"}, "c=0.0 is out of range"), ({"c": "-1e-3"}, "c=-0.001 is out of range"),
    ({"lam": "1.5"}, "lam=1.5 is out of range"), ({"lam": "-1", "gamma": "0"}, "zero saddle"),
    ({"c": "abc"}, "c='abc' is not a number"), ({"alpha": "0"}, "alpha=0.0 is out of range"),
    ({"c": "nan"}, "c=nan is not finite"), ({"overlap": "1", "rho_pt": "0.01", "rho_ft": "0.5"}, "overlap"),
    ({"beta_pt": "1e200"}, "beta_pt=1e+200 is out of range"), ({"sigma": "1"}, "'sigma' is not a knob"),
])
def test_bad_knobs_are_one_line_errors_naming_the_value(query, words):
    with pytest.raises(ValueError) as info:
        parse_knobs(query)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_simulation_plans_are_checked():
    assert sim_plan(dim=50, seeds=2, method="flow", alphas=[0.3, 0.1, 0.3]) == (50, 2, "flow", [0.1, 0.3])
    for kw, words in [({"dim": 1}, "dim=1"), ({"dim": 10**6}, "dim=1000000"), ({"seeds": 0}, "seeds=0"),
                      ({"method": "sgd"}, "method='sgd'"), ({"alphas": []}, "sim_alphas"),
                      ({"alphas": [-0.1]}, "alpha=-0.1")]:
        args = {"dim": 50, "seeds": 2, "method": "flow", "alphas": [0.2]} | kw
        with pytest.raises(ValueError, match=words):
            sim_plan(**args)


def test_to_json_turns_numpy_and_non_finite_values_into_json():
    out = to_json({"a": np.array([1.0, np.nan, np.inf]), "b": np.float64(2.5), "c": np.bool_(True), "d": (np.int64(3),)})
    assert out == {"a": [1.0, None, None], "b": 2.5, "c": True, "d": [3]}
    json.dumps(out, allow_nan=False)

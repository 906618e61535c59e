"""l-order / PD: closed forms against numerical log-derivatives, bounds, corners, regimes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ftlab.dln import k_from_pt, l_order, l_order_of_t, metrics, pretraining_dependence, q_k, regime


@settings(max_examples=300, deadline=None)
@given(
    c=st.floats(1e-8, 1e4), lam=st.floats(-1, 1), gamma=st.floats(0, 1e3),
    b_pt=st.floats(0, 1e6), b_ft=st.floats(0, 1e6),
)
@example(c=1.0, lam=-1.0, gamma=0.0, b_pt=1.0, b_ft=1.0)  # the zero saddle, every run
def test_bounds_hold_everywhere(c, lam, gamma, b_pt, b_ft):
    if lam == -1.0 and gamma == 0.0:  # the zero saddle is refused everywhere (ftlab.dln.bias.check_scales)
        with pytest.raises(ValueError, match="saddle"):
            metrics(beta_pt=b_pt, beta_ft=b_ft, c=c, lam=lam, gamma=gamma)
        return
    m = metrics(beta_pt=b_pt, beta_ft=b_ft, c=c, lam=lam, gamma=gamma)
    assert 1.0 - 1e-12 <= m.l_order <= 2.0 + 1e-12
    assert -1.0 - 1e-12 <= m.pd <= 1e-12
    assert 1.0 - 1e-12 <= m.l_plus_pd <= 2.0 + 1e-12
    assert m.regime in {"I", "II", "III", "IV"}


def test_closed_forms_equal_numerical_log_derivatives():
    # Independent computation: finite differences of log q_k in log|beta_FT| and log|beta_PT| (docs/dln.md).
    rng = np.random.default_rng(0)
    h = 1e-5
    for _ in range(40):
        c, lam, gamma = 10 ** rng.uniform(-4, 0.5), rng.uniform(-0.99, 1), rng.uniform(0, 1.5)
        b_pt, b_ft = 10 ** rng.uniform(-3, 2), 10 ** rng.uniform(-3, 2)

        def logq(lbft, lbpt, c=c, lam=lam, gamma=gamma):
            k = k_from_pt(np.exp(lbpt), c=c, lam=lam, gamma=gamma)
            return np.log(q_k(np.exp(lbft), k))

        x, z = np.log(b_ft), np.log(b_pt)
        fd_l = (logq(x + h, z) - logq(x - h, z)) / (2 * h)
        fd_pd = (logq(x, z + h) - logq(x, z - h)) / (2 * h)
        assert l_order(b_ft, b_pt, c=c, lam=lam, gamma=gamma) == pytest.approx(fd_l, abs=1e-6)
        assert pretraining_dependence(b_ft, b_pt, c=c, lam=lam, gamma=gamma) == pytest.approx(fd_pd, abs=1e-6)


def test_corner_values_of_the_four_regimes():
    # I: lam -> -1, gamma -> 0 : (1, 0)
    m = metrics(beta_pt=1.0, beta_ft=1.0, c=1e-3, lam=-1 + 1e-15, gamma=0.0)
    assert m.l_order == pytest.approx(1.0, abs=0.04) and m.pd == pytest.approx(0.0, abs=0.04) and m.regime == "I"
    # II: c -> 0, lam -> +1, gamma = 0 : (2, -1) for a PT-active coordinate with |beta_FT| << |beta_PT|
    m = metrics(beta_pt=1.0, beta_ft=1e-3, c=1e-9, lam=1.0, gamma=0.0)
    assert m.l_order == pytest.approx(2.0, abs=1e-5) and m.pd == pytest.approx(-1.0, abs=1e-5) and m.regime == "II"
    # III: gamma -> infinity (or c -> infinity) : (2, 0)
    for kw in ({"c": 1e-3, "gamma": 1e4}, {"c": 1e6, "gamma": 0.0}):
        m = metrics(beta_pt=1.0, beta_ft=1.0, lam=0.0, **kw)
        assert m.l_order == pytest.approx(2.0, abs=1e-5) and m.pd == pytest.approx(0.0, abs=1e-5)
        assert m.regime == "III"
    # IV: small c, lam slightly above -1, gamma = 0: strictly inside, rich and PT-dependent
    m = metrics(beta_pt=1.0, beta_ft=1.0, c=1e-3, lam=-0.99, gamma=0.0)
    assert 1.0 < m.l_order < 1.5 and -1.0 < m.pd < -0.1 and m.regime == "IV"


def test_limits_of_l_and_lambda_independence_of_the_ratio():
    assert l_order(0.0, 1.0, c=1.0, lam=0.0, gamma=0.0) == 2.0
    t = np.array([1e-300, 1e-8, 1e-3])  # l = 2 - t^2/6 + O(t^4) for small t, also for subnormal-scale t
    np.testing.assert_allclose(l_order_of_t(t), 2 - t**2 / 6, rtol=1e-12)
    # at beta_PT = 0, c = 0.25, lam = 0: sqrt(k) = 4 c (1 + lam) = 1, so t = 2 |beta_FT|; l ~ 1 + 1/(ln 2t - 1)
    for t in (1e6, 1e12):
        val = l_order(t / 2, 0.0, c=0.25, lam=0.0, gamma=0.0)
        assert val == pytest.approx(1 + 1 / (np.log(2 * t) - 1), rel=2e-3)
    # at gamma = 0 the ratio k(active)/k(inactive) does not depend on lam (docs/dln.md)
    ratios = [k_from_pt(5.0, c=0.1, lam=lam, gamma=0.0) / k_from_pt(0.0, c=0.1, lam=lam, gamma=0.0)
              for lam in (-0.9, 0, 0.7)]
    np.testing.assert_allclose(ratios, ratios[0], rtol=1e-12)


def test_vectorized_and_regime_thresholds():
    b = np.logspace(-3, 3, 7)
    m = metrics(beta_pt=b[:, None], beta_ft=1.0, c=1e-3, lam=-0.5, gamma=0.0)
    assert m.l_order.shape == (7, 1) and m.regime.shape == (7, 1)
    assert regime(1.2, -0.05) == "I" and regime(1.2, -0.3) == "IV" and regime(1.8, -0.5) == "II"
    assert regime(1.8, -0.01) == "III" and regime(1.2, -0.05, pd_split=-0.01) == "IV"
    assert regime(1.4, -0.05, l_split=1.3) == "III" and regime(1.4, -0.3, l_split=1.3) == "II"


def test_bad_inputs():
    with pytest.raises(ValueError, match="lam"):
        metrics(beta_pt=1.0, beta_ft=1.0, c=1.0, lam=-1.5, gamma=0.0)
    with pytest.raises(ValueError, match="beta_ft"):
        metrics(beta_pt=1.0, beta_ft=np.nan, c=1.0, lam=0.0, gamma=0.0)


def test_regime_corners_sit_in_their_regimes():
    from ftlab.dln.regimes import CORNER_C, DRAFT_CORNER_I, REGIME_CORNERS

    got = {}
    for name, (lam, gamma) in REGIME_CORNERS.items():
        m = metrics(beta_pt=1.0, beta_ft=1.0, c=CORNER_C, lam=lam, gamma=gamma)
        got[name] = (float(m.l_order), float(m.pd), str(m.regime))
    lI, pI, _ = got["I"]
    assert lI <= 1.1 and abs(pI) <= 0.02
    lII, pII, _ = got["II"]
    assert lII >= 1.85 and pII <= -0.85
    lIII, pIII, _ = got["III"]
    assert lIII >= 1.95 and abs(pIII) <= 0.05
    lIV, pIV, _ = got["IV"]
    assert 1.1 < lIV < 1.85 and -0.85 < pIV < -0.05
    assert all(r == name for name, (_, _, r) in got.items())
    from ftlab.dln.regimes import REGIMES  # the descriptions name the same split as the thresholds

    for name, (lo, pd_, _) in got.items():
        assert REGIMES[name].startswith("rich" if lo < 1.5 else "lazy")
        assert ("PT-dependent" in REGIMES[name]) == (pd_ < -0.1)
    # the authors' draft corner is PT-weighted, not PT-independent: it fails the regime-I test on PD
    md = metrics(beta_pt=1.0, beta_ft=1.0, c=CORNER_C, lam=DRAFT_CORNER_I[0], gamma=DRAFT_CORNER_I[1])
    assert abs(float(md.pd)) > 0.05


def test_regime_one_is_pretraining_independent_on_every_coordinate():
    from ftlab.dln.bias import k_from_pt
    from ftlab.dln.regimes import REGIME_CORNERS

    lam, gamma = REGIME_CORNERS["I"]
    k = k_from_pt(np.array([0.0, 1e-3, 1.0, 50.0]), c=1e-3, lam=lam, gamma=gamma)
    np.testing.assert_allclose(np.sqrt(k), gamma**2, rtol=1e-12)  # sqrt(k) = gamma^2 whatever PT learned


def test_the_zero_saddle_is_refused_by_every_entry_point():
    # the keyword closed forms and InitScales, the one way into simulate / replica / advisor
    from ftlab.dln import InitScales, k_from_pt

    for call in (lambda: metrics(beta_pt=1.0, beta_ft=1.0, c=1e-3, lam=-1.0, gamma=0.0),
                 lambda: k_from_pt(np.ones(3), c=1e-3, lam=-1.0, gamma=0.0),
                 lambda: InitScales(c=1e-3, lam=-1.0, gamma=0.0)):
        with pytest.raises(ValueError, match="zero saddle"):
            call()
    with pytest.raises(ValueError, match="1e50"):
        metrics(beta_pt=1.0, beta_ft=1.0, c=1e308, lam=0.0, gamma=0.0)


@pytest.mark.parametrize("kw, error, match", [
    ({"c": 0.0}, ValueError, "c=0.0 is out of range"), ({"lam": 1.5}, ValueError, "lam=1.5 is out of range"),
    ({"gamma": -1.0}, ValueError, "gamma=-1.0 is out of range"), ({"c": float("nan")}, ValueError, "c="),
    ({"gamma": 1e51}, ValueError, "1e50"), ({"lam": True}, TypeError, "InitScales.lam"),
    ({"c": "0.1"}, TypeError, "InitScales.c"), ({"gamma": np.ones(2)}, TypeError, "InitScales.gamma"),
])
def test_init_scales_refuse_bad_values_and_types(kw, error, match):
    from ftlab.dln import InitScales

    with pytest.raises(error, match=match):
        InitScales(**({"c": 1e-3, "lam": 0.0, "gamma": 0.0} | kw))


def test_init_scales_are_plain_floats_and_agree_with_the_keyword_closed_forms():
    import dataclasses

    from ftlab.dln import InitScales

    s = InitScales(c=np.float64(1e-3), lam=np.int64(0), gamma=10)
    assert [type(v) for v in dataclasses.astuple(s)] == [float, float, float]
    assert s == InitScales(c=1e-3, lam=0.0, gamma=10.0) and hash(s) == hash(InitScales(1e-3, 0.0, 10.0))
    m = metrics(beta_pt=1.0, beta_ft=1.0, **dataclasses.asdict(s))
    assert m.regime == "III" and m.k == pytest.approx(float(k_from_pt(1.0, c=1e-3, lam=0.0, gamma=10.0)))

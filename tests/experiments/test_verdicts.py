"""The one verdict vocabulary: planted effects give the verdict they must, Holm adjusts as defined."""

import math

import numpy as np
import pytest

from ftlab.experiments.verdicts import VERDICTS, correlation_interval, holm, judge, judge_exact, judge_family, t_interval


def test_planted_effects_get_their_verdicts():
    rng = np.random.default_rng(0)
    big = 0.05 + 0.005 * rng.standard_normal(10)
    assert judge("up", big, margin=0.01).verdict == "reproduced"
    assert judge("down", -big, margin=0.01).verdict == "reversed"
    tiny = 0.0005 * rng.standard_normal(10)
    assert judge("flat", tiny, margin=0.01).verdict == "no effect"
    noisy = 0.05 * rng.standard_normal(4)
    assert judge("noisy", noisy, margin=0.01).verdict == "inconclusive"
    assert judge("one seed", [0.3], margin=0.01).verdict == "inconclusive"


def test_interval_matches_the_t_formula():
    x = np.array([1.0, 2.0, 4.0, 7.0])
    m, lo, hi = t_interval(x)
    half = 3.182446305284263 * x.std(ddof=1) / 2  # t_{0.975, 3}
    assert m == 3.5 and lo == pytest.approx(m - half) and hi == pytest.approx(m + half)


def test_holm_adjustment():
    assert holm([0.01, 0.04, 0.03, float("nan")])[:3] == pytest.approx([0.03, 0.06, 0.06])
    assert math.isnan(holm([0.01, float("nan")])[1])
    adj = holm([0.2, 0.001])
    assert adj == pytest.approx([0.2, 0.002])


def test_family_correction_can_turn_a_marginal_effect_inconclusive():
    rng = np.random.default_rng(3)
    marginal = 0.02 + 0.03 * rng.standard_normal(8)
    alone = judge("m", marginal, margin=0.001)
    family = judge_family({"m": marginal, **{f"x{i}": 0.001 * rng.standard_normal(8) for i in range(9)}}, margins=0.001)
    assert family[0].p_holm >= alone.p
    assert {j.verdict for j in family} <= set(VERDICTS)


def test_correlation_interval_and_exact_judgement():
    p, lo, hi = correlation_interval(0.8, 30)
    assert p < 1e-5 and lo < 0.8 < hi and -1 < lo and hi < 1
    assert judge_exact("theory", 0.2, margin=0.01).verdict == "reproduced"
    assert judge_exact("theory", -0.2, margin=0.01).verdict == "reversed"
    assert judge_exact("theory", 0.001, margin=0.01).verdict == "no effect"


def test_curve_judgement_on_planted_contrasts():
    from ftlab.experiments.verdicts import judge_curve, ranges

    grid = np.geomspace(0.005, 0.5, 21)
    inf = grid < 0.2  # the curves tie from 0.2 on
    holds_early = judge_curve("c", grid, np.where(grid < 0.05, 1.0, -1.0) * inf)
    assert holds_early.informative == ranges(grid, inf) and holds_early.informative[0][0] == 0.005
    share = float(np.sum((grid < 0.05) & inf) / np.sum(inf))
    assert holds_early.share == pytest.approx(share)
    assert holds_early.verdict == ("reproduced" if share >= 0.5 else "inconclusive")
    assert judge_curve("c", grid, np.ones(21)).verdict == "reproduced"
    assert judge_curve("c", grid, -np.ones(21)).verdict == "reversed"
    assert judge_curve("c", grid, np.full(21, 1e-4)).verdict == "no effect"
    assert ranges([1, 2, 3, 4, 5], [True, False, True, True, False]) == [(1, 1), (3, 4)]

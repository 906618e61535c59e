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


# ------------------------------------------------------------------ the project's rule (judge_claims)
def _brute_force_p(x):
    """Two-sided equal-tailed sign-flip p by enumerating every sign vector (an independent computation)."""
    import itertools

    t = sum(x)
    sums = [sum(s * v for s, v in zip(signs, x)) for signs in itertools.product((1, -1), repeat=len(x))]
    up = sum(v >= t - 1e-12 for v in sums) / len(sums)
    down = sum(v <= t + 1e-12 for v in sums) / len(sums)
    return min(1.0, 2 * min(up, down))


def test_sign_flip_p_equals_brute_force_enumeration_and_the_interval_inverts_the_test():
    from ftlab.experiments.verdicts import sign_flip_test

    rng = np.random.default_rng(5)
    for n in (3, 6, 9):
        for _ in range(4):
            x = rng.normal(0.3, 1.0, n)
            t = sign_flip_test(x)
            assert t.p == pytest.approx(_brute_force_p(x))
            # mu is inside the interval exactly when the test of "mean = mu" does not reject at 5%
            for mu in np.linspace(t.low - 0.2, t.high + 0.2, 9):
                if math.isfinite(t.low) and abs(mu - t.low) > 1e-9 and abs(mu - t.high) > 1e-9:
                    assert (t.low < mu < t.high) == (_brute_force_p(x - mu) > 0.05)


def test_two_seeds_with_identical_differences_are_inconclusive():
    from ftlab.experiments.verdicts import Evidence, judge_claims, sign_flip_test

    t = sign_flip_test([0.031, 0.031])
    assert t.p == 0.5 and t.low == -math.inf and t.high == math.inf  # not a degenerate [0.031, 0.031], p = 0
    j = judge_claims({"c": Evidence([0.031, 0.031], 0.01)})[0]
    assert j.verdict == "inconclusive" and j.n == 2


def test_the_minimum_of_seeds_is_a_floor_and_the_exact_test_reaches_it():
    from ftlab.experiments.verdicts import MIN_SEEDS, Evidence, judge_claims

    assert MIN_SEEDS == 6
    big = [0.10, 0.11, 0.09, 0.12, 0.10, 0.11]
    assert judge_claims({"c": Evidence(big[:5], 0.01)})[0].verdict == "inconclusive"  # p >= 2/32 at 5 seeds
    six = judge_claims({"c": Evidence(big, 0.01)})[0]
    assert six.verdict == "reproduced" and six.p == pytest.approx(2 / 64)
    assert judge_claims({"c": Evidence(big, 0.01)}, min_n=7)[0].verdict == "inconclusive"


def test_clear_effects_at_the_chosen_seeds_are_decided_both_ways():
    from ftlab.experiments.verdicts import Evidence, judge_claims

    rng = np.random.default_rng(11)
    up = 0.03 + 0.02 * rng.standard_normal(12)
    fam = judge_claims({"up": Evidence(up, 0.01), "down": Evidence(-up, 0.01),
                        **{f"x{i}": Evidence(0.02 * rng.standard_normal(12), 0.01) for i in range(3)}})
    v = {j.claim: j for j in fam}
    assert v["up"].verdict == "reproduced" and v["down"].verdict == "reversed"
    assert v["up"].p_holm <= 5 * v["up"].p and v["up"].ci_low > 0
    # the family-level interval that decides "no effect" is wider than the 95% one
    assert v["up"].fam_low < v["up"].ci_low and v["up"].fam_high > v["up"].ci_high


def test_no_effect_is_judged_at_the_family_level():
    from ftlab.experiments.verdicts import Evidence, judge_claims

    rng = np.random.default_rng(2)
    small = 0.01 * rng.standard_normal(12)
    small -= small.mean() - 0.0015  # mean 0.15 points, 95% interval just inside +-1 point
    alone = judge_claims({"c": Evidence(small, 0.01)}, no_effect="row")[0]
    assert alone.verdict == "no effect" and alone.ci_high <= 0.01
    family = judge_claims({"c": Evidence(small, 0.01), **{f"x{i}": Evidence(small, 0.01) for i in range(9)}})[0]
    assert family.fam_high > 0.01 and family.verdict == "inconclusive"  # not "no effect" at the level of 10 claims
    tight = 0.001 * rng.standard_normal(12)
    assert judge_claims({"c": Evidence(tight, 0.01), "d": Evidence(tight, 0.01)})[0].verdict == "no effect"


def test_a_heterogeneous_no_effect_is_task_dependent():
    from ftlab.experiments.verdicts import Evidence, heterogeneity, judge_claims, pool_strata

    rng = np.random.default_rng(4)
    mat = np.column_stack([0.05 + 0.01 * rng.standard_normal(12), -0.05 + 0.01 * rng.standard_normal(12),
                           0.002 * rng.standard_normal(12)])
    h = heterogeneity(mat, ["a", "b", "c"])
    assert h.significant() and h.i2 > 0.9 and h.df == 2
    j = judge_claims({"c": Evidence(pool_strata(mat), 0.01, mat, ("a", "b", "c"))})[0]
    assert abs(j.effect) < 0.01 and j.verdict == "task-dependent"
    same = np.column_stack([0.001 * rng.standard_normal(12) for _ in range(3)])
    assert judge_claims({"c": Evidence(pool_strata(same), 0.01, same)})[0].verdict == "no effect"
    # strata that differ significantly but all inside the margin do not stop a "no effect"
    near = np.column_stack([0.004 + 0.0005 * rng.standard_normal(12), -0.004 + 0.0005 * rng.standard_normal(12)])
    j = judge_claims({"c": Evidence(pool_strata(near), 0.01, near)})[0]
    assert j.het.significant() and j.verdict == "no effect"


def test_heterogeneity_matches_cochrans_formula():
    from ftlab.experiments.verdicts import heterogeneity

    mat = np.array([[1.0, 3.0], [2.0, 5.0], [3.0, 4.0]])
    m, se = mat.mean(0), mat.std(0, ddof=1) / np.sqrt(3)
    w = 1 / se ** 2
    q = float(np.sum(w * (m - np.sum(w * m) / w.sum()) ** 2))
    h = heterogeneity(mat, ["a", "b"])
    assert h.q == pytest.approx(q) and h.i2 == pytest.approx(max(0, (q - 1) / q))
    assert [s[1] for s in h.strata] == pytest.approx(list(m))
    floored = heterogeneity(np.array([[0.0, 0.1], [0.0, 0.3], [0.0, 0.2]]), se_floor=0.01)
    assert math.isfinite(floored.q) and floored.strata[0][2] == 0.01


def test_a_two_part_claim_needs_both_parts_and_a_missed_premise_is_said():
    from ftlab.experiments.verdicts import Evidence, judge_claims

    rng = np.random.default_rng(8)
    main = 0.1 + 0.02 * rng.standard_normal(12)
    good = Evidence(main, 0.05, requires=(0.02 * rng.standard_normal(12), -0.05))
    bad = Evidence(main, 0.05, requires=(-0.2 + 0.02 * rng.standard_normal(12), -0.05))
    g, b = judge_claims({"g": good, "b": bad})
    assert g.verdict == "reproduced" and g.p_requires < 0.01
    assert b.verdict == "inconclusive" and b.p == 1.0  # the second part fails: max of the two p-values
    out = judge_claims({"c": Evidence(main, 0.05, premise_missed=0.2)})[0]
    assert out.verdict == "outside the premise" and out.premise_missed == 0.2


def test_the_subgroup_test_keeps_its_level_for_many_seeds():
    from ftlab.experiments.verdicts import sign_flip_test

    rng = np.random.default_rng(0)
    ps = [sign_flip_test(rng.standard_normal(24)).p for _ in range(200)]
    assert 0.02 <= np.mean(np.array(ps) <= 0.05) <= 0.09  # exact level 5% under a symmetric null
    x = 0.5 + rng.standard_normal(24)
    t = sign_flip_test(x)
    m, lo, hi = t_interval(x)  # for normal data the two intervals nearly agree
    assert t.method == "sign-flip subgroup" and t.low < t.mean < t.high
    assert t.low == pytest.approx(lo, abs=0.1 * (hi - lo)) and t.high == pytest.approx(hi, abs=0.1 * (hi - lo))


def test_power_matches_a_simulation_of_the_sign_flip_test_and_inverts_to_seeds_and_mde():
    from ftlab.experiments.verdicts import minimal_detectable_effect, power, seeds_for_power, sign_flip_test

    rng = np.random.default_rng(3)
    n, sd, eff, m = 12, 1.0, 1.0, 5
    sim = np.mean([sign_flip_test(eff + sd * rng.standard_normal(n)).p < 0.05 / m for _ in range(400)])
    assert sim == pytest.approx(power(eff, sd, n, m=m), abs=0.08)
    k = seeds_for_power(0.02, 0.03, m=5)
    assert power(0.02, 0.03, k, m=5) >= 0.8 > power(0.02, 0.03, k - 1, m=5)
    mde = minimal_detectable_effect(0.03, k, m=5)
    assert mde <= 0.02 and power(mde, 0.03, k, m=5) == pytest.approx(0.8, abs=1e-6)


def test_the_student_t_settings_are_unchanged_for_their_callers():
    x = [0.05, 0.06, 0.04]
    j = judge("c", x, margin=0.01)
    m, lo, hi = t_interval(x)
    assert (j.effect, j.ci_low, j.ci_high, j.method) == (m, lo, hi, "t") and j.verdict == "reproduced"

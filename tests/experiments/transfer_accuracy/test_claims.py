"""Claims judged from planted benchmark records: the paper's (as issue 14 states them) and ftlab's own."""

import pandas as pd
import pytest

from ftlab.experiments.transfer_accuracy.claims import (
    PAPER_CLAIMS,
    ftlab_findings,
    judge_claims,
    judge_findings,
    paired_effect,
)

REAL = ["lite0->lite1", "lite1->lite2"]


def _raw(acc_of, settings=REAL, seeds=(0, 1, 2, 3), tasks=("a", "b")):
    rows = []
    for s in settings:
        for seed in seeds:
            for t in tasks:
                for method, cal in (("probe", "-"), ("finetuned", "-"), ("naive", "-"), ("activation_only", "n100"),
                                    ("bico_input_only", "n100"), ("bico_output_only", "n100"), ("bico", "n100"),
                                    ("bico", "k5")):
                    for mode in ("fixed", "searched"):
                        rows.append({"record": "accuracy", "setting": s, "task": t, "seed": seed, "method": method,
                                     "calibration": cal, "alpha_mode": mode, "alpha": 1.0, "n_cal": 100,
                                     "accuracy": acc_of(s, seed, t, method, cal, mode), "seconds": 0.0})
    return pd.DataFrame(rows)


def _acc(s, seed, t, method, cal, mode):
    noise = 0.004 * ((seed * 7 + len(t)) % 3 - 1)
    base = {"probe": 0.60, "finetuned": 0.80, "naive": 0.55, "activation_only": 0.62, "bico_input_only": 0.61,
            "bico_output_only": 0.62}.get(method)
    if method == "bico":
        base = 0.75 if cal == "n100" else 0.74  # closes 75% of the gap
        if mode == "searched":
            base += 0.01
    return base + noise


def test_planted_wins_are_reproduced_and_a_planted_goal_is_met():
    raw = _raw(_acc)
    res = {c.key: j for c, j in judge_claims(raw, PAPER_CLAIMS, REAL)}
    assert res["half_gap"].verdict == "reproduced" and res["half_gap"].effect == pytest.approx(0.25, abs=0.03)
    for k in ("gain_width", "beats_theseus", "input_only", "output_only", "grad_output"):
        assert res[k].verdict == "reproduced", k
    # claims tied to settings this run lacks (lite0->lite2; the controlled `pretraining` ViTs) are left out, not
    # judged on the wrong rows
    assert "gain_depth_width" not in res and "gain_5pc" not in res
    assert all(c.key != "naive_degrades" for c in PAPER_CLAIMS)  # not a claim issue 14 states: ftlab's finding


def test_the_5_per_class_claim_reads_k5_rows_of_the_pretraining_setting_only():
    def acc(s, seed, t, method, cal, mode):
        v = _acc(s, seed, t, method, cal, mode)
        if s == "pretraining" and method == "bico" and cal == "n100":
            v = 0.0  # must not be read: the claim is about 5 per class
        return v

    raw = _raw(acc, settings=[*REAL, "pretraining"])
    raw.loc[(raw["setting"] == "pretraining") & (raw["method"] == "probe"), "method"] = "zero_shot"
    res = {c.key: j for c, j in judge_claims(raw, PAPER_CLAIMS, REAL)}
    assert res["gain_5pc"].verdict == "reproduced" and res["gain_5pc"].effect == pytest.approx(0.14, abs=0.01)
    mine = {c.key for c, _ in judge_findings(raw, ftlab_findings(raw, REAL, ()), REAL)}
    assert "naive_degrades" in mine


def test_planted_failure_is_reversed_and_a_tie_is_no_effect():
    def acc(s, seed, t, method, cal, mode):
        v = _acc(s, seed, t, method, cal, mode)
        if method == "bico":
            v = 0.55 + (v - 0.75)  # below the probe
        if method == "activation_only":
            v = 0.55 + (v - 0.62)  # tied with BiCo
        return v

    res = {c.key: j for c, j in judge_claims(_raw(acc), PAPER_CLAIMS, REAL)}
    assert res["half_gap"].verdict == "reversed"
    assert res["gain_width"].verdict == "reversed"
    assert res["beats_theseus"].verdict == "no effect"
    mine = {c.key: j for c, j in judge_findings(_raw(acc), ftlab_findings(_raw(acc), REAL, ()), REAL)}
    assert mine["below_probe:lite0->lite1"].verdict == "reproduced"
    assert mine["alpha_search"].verdict in ("reproduced", "inconclusive")


def test_effects_are_paired_by_seed_and_averaged_over_tasks_and_pairs():
    raw = _raw(lambda s, seed, t, m, c, mode: 0.5 + 0.01 * seed + (0.1 if m == "bico" and s == REAL[0] else 0.0))
    claim = next(c for c in PAPER_CLAIMS if c.key == "beats_theseus")
    e = paired_effect(raw, claim, REAL)
    assert list(e) == pytest.approx([0.05] * 4)  # +0.1 on one of two pairs, the seed offset cancels

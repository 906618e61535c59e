"""ftlab's rule "expected below the target's own accuracy" on planted cells and planted transfers."""

from __future__ import annotations

import copy
import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from ftlab.transfer import diagnose, fit_transfer
from ftlab.transfer.diagnose import BELOW_TARGET_ESTIMATE, Diagnosis, expectation, fit_threshold

pytestmark = pytest.mark.filterwarnings("ignore::ftlab.transfer.align.RankWarning")


def test_threshold_separates_planted_cells_and_counts_errors_like_brute_force():
    rng = np.random.default_rng(0)
    est = np.concatenate([rng.uniform(0.0, 0.3, 20), rng.uniform(0.6, 1.0, 20)])
    below = np.arange(40) < 20                      # low estimates are the harmful transfers
    t, errors = fit_threshold(est, below)
    assert errors == 0 and 0.3 > est[:20].max() - 1e-12 and est[:20].max() < t < est[20:].min()
    noisy = below.copy()
    noisy[[3, 25]] = ~noisy[[3, 25]]                # two cells on the wrong side
    t2, e2 = fit_threshold(est, noisy)
    brute = min(int(np.sum(noisy & (est >= c)) + np.sum(~noisy & (est < c)))
                for c in np.concatenate([[-1.0], est, [2.0]]))
    assert e2 == brute == 2 and est[:20].max() < t2 < est[20:].min()
    with pytest.raises(ValueError, match="one length"):
        fit_threshold([0.1, 0.2], [True])


def _diagnosis(estimate: float) -> Diagnosis:
    layers = [{"target": f"l{i}", "tau_share": s, "carry": c} for i, (s, c) in
              enumerate([(0.6, 0.1), (0.3, 0.9), (0.1, 0.2)])]
    return Diagnosis(layers=layers, estimate=estimate, estimate_cka=estimate, zeroed_share=0.0, method="bico",
                     n_batches=1)


def test_expectation_calls_an_estimate_below_the_threshold_low_and_names_the_losing_layers():
    low = expectation(_diagnosis(0.2), threshold=0.5)
    assert low.below and low.layers[0] == "l0" and set(low.layers) == {"l0", "l1", "l2"}
    assert low.message().startswith("note: low estimated carried share 0.20 < 0.50") and "l0, l2, l1" in low.message()
    assert low.record()["low_estimate"] is True and "expected" not in low.message()  # an estimate, not a prediction
    high = expectation(_diagnosis(0.8), threshold=0.5)
    assert not high.below and high.message().startswith("estimated carried share 0.80 >= 0.50")
    assert "held-out data" in high.message()  # a high estimate does not make a transfer safe
    assert expectation(_diagnosis(0.8)).threshold == BELOW_TARGET_ESTIMATE
    with pytest.raises(ValueError, match="no finite estimate"):
        expectation(_diagnosis(float("nan")))


def _mlp(width, seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 3)).double()


def test_expectation_from_a_finished_fit_matches_diagnose_and_orders_related_before_unrelated():
    """A permuted copy carries everything (estimate 1, no warning); an unrelated model of the same shape carries
    little and is warned about; the plain fit's result gives the same estimate as a diagnose run."""
    a = _mlp(8, 0)
    a_ft = copy.deepcopy(a)
    with torch.no_grad():
        for p in a_ft.parameters():
            p.add_(0.1 * torch.randn_like(p))
    perm = torch.randperm(8)
    b = copy.deepcopy(a)
    with torch.no_grad():
        b[0].weight.copy_(a[0].weight[perm])
        b[0].bias.copy_(a[0].bias[perm])
        b[2].weight.copy_(a[2].weight[:, perm])
    x = torch.randn(200, 6, dtype=torch.float64)
    y = torch.randint(0, 3, (200,))
    batches = [(x[i:i + 50], y[i:i + 50]) for i in range(0, 200, 50)]

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    related = expectation(fit_transfer(a, a_ft, b, batches, loss), threshold=0.5)
    assert related.estimate == pytest.approx(1.0, abs=1e-6) and not related.below
    other = _mlp(8, 7)
    res = fit_transfer(a, a_ft, other, batches, loss)
    unrelated = expectation(res, threshold=0.5)
    assert unrelated.estimate < related.estimate
    assert unrelated.estimate == pytest.approx(diagnose(a, a_ft, other, batches, loss).estimate, rel=1e-9)
    # without second moments (what ftlab transfer --diagnose runs): the same estimate from the fit's own statistics,
    # no CKA
    lean = diagnose(a, a_ft, other, batches, loss, cka=False)
    assert lean.estimate == pytest.approx(unrelated.estimate, rel=1e-9) and math.isnan(lean.estimate_cka)


def test_rule_check_on_planted_cells_counts_hits_false_alarms_and_misses():
    from ftlab.experiments.transfer_accuracy.records import rule_check

    rows = []
    for setting, est, gain, val_gain in itertools.chain(
            (("permuted", 0.95, 0.3, 0.3), ("independent", 0.3, -0.05, -0.04), ("width", 0.25, -0.04, -0.02),
             ("pretraining", 0.6, 0.02, 0.03), ("lite0->lite1", 0.2, -0.03, -0.02), ("lite1->lite2", 0.7, 0.01, 0.01)),
            (("minilm_l3->minilm_l6", 0.45, 0.02, 0.0), ("minilm_l6->mpnet_base", 0.1, -0.02, 0.0))):
        for seed in range(3):
            vg = -0.01 if (setting, seed) == ("lite1->lite2", 0) else val_gain  # below on validation only
            rows.append({"setting": setting, "task": "t", "seed": seed, "estimate": est, "gain": gain,
                         "below": gain < 0, "val_gain": vg, "below_val": vg < 0})
    out = rule_check(pd.DataFrame(rows))
    # set on validation: one lite1->lite2 cell (0.7) is below on validation but not on test; the best threshold on
    # the design's validation cells separates {0.2, 0.25, 0.3} from {0.6, 0.7, 0.95} (one validation cell wrong)
    assert 0.3 < out["fitted"] < 0.6
    assert out["design"]["error_rate"] == 0.0  # judged on test, where lite1->lite2 is above: all right
    held = out["held_out"]                     # the text pairs did not set the threshold
    assert held["cells"] == 6 and held["below"] == 3 and held["hits"] == 3 and held["misses"] == 0
    assert held["false_alarms"] == (3 if out["fitted"] > 0.45 else 0)

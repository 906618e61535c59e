"""Tiny end-to-end runs (seconds) and the claim/verdict logic on planted effects."""

import numpy as np
import pandas as pd
import pytest
import torch

from ftlab.experiments.deep_claims import claims as C
from ftlab.experiments.deep_claims import modular as M
from ftlab.experiments.deep_claims import resnet as R
from ftlab.experiments.deep_claims.pipeline import run_modular_part, run_resnet_part, write_claims


@pytest.mark.usefixtures("tiny_images")
def test_tiny_pretrain_intervene_finetune_end_to_end(tmp_path):
    torch.set_num_threads(1)
    proto = R.ResNetProtocol(width=2, n_pt=48, pt_epochs=1, batch_size=16, ft_max_steps=3, n_test=60, n_geometry=16,
                             geometry_at=(10,))
    grid = R.ResNetGrid(seeds=(0, 1), tasks=("fmnist_heldout",), n_ft=(4, 10), kappa=(0.5,), s=(2.0,), gamma=(0.1,))
    pt, ft, claims = run_resnet_part(tmp_path, proto=proto, grid=grid, workers=1)
    assert len(pt) == 2 and len(ft) == 2 * 2 * 4  # seeds x n_ft x (baseline, kappa, s, gamma)
    assert ft.acc.between(0, 1).all()
    geo = ft[ft.n_ft == 10]
    assert geo["pr_post:pool"].notna().all() and ft[ft.n_ft == 4]["pr_post:pool"].isna().all()
    assert {"relative scale kappa<1 improves FT accuracy [fmnist_heldout]"} <= {c.claim for c in claims}
    # resumable: a second call recomputes nothing and returns the same table
    n_lines = (tmp_path / "resnet_ft.jsonl").read_text().count("\n")
    _, ft2, _ = run_resnet_part(tmp_path, proto=proto, grid=grid, workers=1)
    assert (tmp_path / "resnet_ft.jsonl").read_text().count("\n") == n_lines
    pd.testing.assert_frame_equal(ft.reset_index(drop=True), ft2.reset_index(drop=True), check_like=True)
    mproto = M.ModularProtocol(modulus=6, d_model=8, n_heads=2, d_mlp=8, pt_steps=3, ft_steps=3)
    mgrid = M.ModularGrid(seeds=(0, 1), reuse=(2, 3), new=(5,), balancedness=(-0.5, 0.5))
    _, mft, mclaims = run_modular_part(tmp_path, proto=mproto, grid=mgrid, workers=1)
    assert len(mft) == 2 * 3 * 2 and mft.acc.between(0, 1).all()
    table = write_claims(claims + mclaims, tmp_path / "claims.csv")
    assert list(table.columns[:6]) == ["claim", "verdict", "effect", "ci_low", "ci_high", "seeds"]
    assert (tmp_path / "fig_resnet_accuracy.png").exists() and (tmp_path / "fig_modular.png").exists()


def test_modular_reuse_and_new_prime_are_validated(tmp_path):
    with pytest.raises(ValueError, match="does not divide"):
        M.run_modular(M.ModularProtocol(), M.ModularGrid(reuse=(7,)), tmp_path)
    with pytest.raises(ValueError, match="divides"):
        M.run_modular(M.ModularProtocol(), M.ModularGrid(new=(5,)), tmp_path)


def test_modular_data_labels():
    X, y = M.modular_data(6, 4)
    assert X.shape == (36, 3) and bool((X[:, 2] == 6).all())
    assert torch.equal(y, (X[:, 0] + X[:, 1]) % 4)




def _planted_ft(effects: dict, seeds=range(6), noise=0.002):
    rng = np.random.default_rng(0)
    rows = []
    for s in seeds:
        for n in (10, 30, 100):
            base = 0.6 + 0.1 * np.log10(n) + 0.05 * rng.standard_normal()
            rows.append(dict(seed=s, task="t", n_ft=n, intervention="none", value=1.0, acc=base))
            for (knob, val), eff in effects.items():
                rows.append(dict(seed=s, task="t", n_ft=n, intervention=knob, value=val,
                                 acc=base + eff + noise * rng.standard_normal()))
    return pd.DataFrame(rows)


def test_claim_verdicts_on_planted_effects():
    ft = _planted_ft({("kappa", 0.5): 0.05, ("s", 0.25): -0.04, ("s", 4.0): 0.0, ("gamma", 0.1): -0.03})
    got = {c.claim.split(" [")[0]: c for c in C.resnet_claims(ft)}
    k = got["relative scale kappa<1 improves FT accuracy"]
    assert k.verdict == "reproduced" and k.effect == pytest.approx(0.05, abs=0.005) and k.seeds == 6
    assert k.ci_low < 0.05 < k.ci_high
    assert got["decreasing absolute scale s<1 degrades FT accuracy"].verdict == "reproduced"
    assert got["increasing absolute scale s>1 degrades FT accuracy"].verdict == "not reproduced"  # no effect
    g = got["smaller readout scale gamma helps at intermediate n_FT"]
    assert g.verdict == "not reproduced" and g.effect == pytest.approx(-0.03, abs=0.005)


def test_verdict_rule_and_interval():
    m, lo, hi = C.t_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and hi - m == pytest.approx(4.302652729911275 * 1.0 / np.sqrt(3), rel=1e-9)  # t_{0.975, 2}
    assert C.verdict(0.001, 0.2, margin=0.01) == "reproduced"
    assert C.verdict(-0.2, 0.005, margin=0.01) == "not reproduced"
    assert C.verdict(-0.2, 0.2, margin=0.01) == "inconclusive"
    assert C.verdict(float("nan"), float("nan"), margin=0.01) == "inconclusive"


def test_modular_claims_difference_in_differences():
    rows = []
    for s in range(5):
        for p, kind, gain in ((3, "reuse", 0.02), (7, "new", 0.10)):
            for b in (-0.8, 0.0, 0.8):
                rows.append(dict(seed=s, p=p, kind=kind, ft_frac=0.3, balancedness=b,
                                 acc=0.5 + (gain if b == -0.8 else 0.0) + 0.001 * s))
    got = {c.claim: c for c in C.modular_claims(pd.DataFrame(rows))}
    assert got["lower balancedness helps Transformer FT on new-prime tasks"].effect == pytest.approx(0.10)
    assert got["lower balancedness helps most on new-prime tasks"].effect == pytest.approx(0.08)
    assert got["lower balancedness helps most on new-prime tasks"].verdict == "reproduced"


@pytest.mark.usefixtures("tiny_images")
def test_report_section_renders_claims_and_figures(tmp_path, monkeypatch):
    from ftlab.report import ReportContext
    from ftlab.report.deep import run

    monkeypatch.setattr(R, "QUICK", (
        R.ResNetProtocol(width=2, n_pt=32, pt_epochs=1, batch_size=16, ft_max_steps=2, n_test=40, n_geometry=12,
                         geometry_at=(6,)),
        R.ResNetGrid(seeds=(0, 1), tasks=("mnist",), n_ft=(6,), kappa=(0.5,), s=(2.0,), gamma=(0.1,))))
    monkeypatch.setattr(M, "QUICK", (M.ModularProtocol(modulus=6, d_model=8, n_heads=2, d_mlp=8, pt_steps=2, ft_steps=2),
                                     M.ModularGrid(seeds=(0, 1), reuse=(3,), new=(5,), balancedness=(-0.5, 0.5))))
    md = run(ReportContext(out_dir=tmp_path, workers=1))
    table = pd.read_csv(tmp_path / "deep" / "claims.csv")
    assert set(table.verdict) <= {"reproduced", "not reproduced", "inconclusive"}
    for claim in table.claim:
        assert claim in md
    assert "](deep/fig_resnet_accuracy.png)" in md and (tmp_path / "deep" / "fig_resnet_accuracy.png").exists()


@pytest.mark.usefixtures("tiny_images")
def test_interventions_at_init_pretrain_one_network_per_condition(tmp_path):
    torch.set_num_threads(1)
    proto = R.ResNetProtocol(width=2, n_pt=32, pt_epochs=1, batch_size=16, ft_max_steps=2, n_test=30, n_geometry=0,
                             when="init")
    grid = R.ResNetGrid(seeds=(0,), tasks=("mnist",), n_ft=(10,), kappa=(0.5,), s=(2.0,), gamma=(0.0,))
    pt, ft = R.run_resnet(proto, grid, tmp_path, workers=1)
    assert sorted(zip(pt.intervention, pt.value)) == [("kappa", 0.5), ("none", 1.0), ("s", 2.0)]
    assert len(ft) == 4 and ft.acc.between(0, 1).all()
    mproto = M.ModularProtocol(modulus=6, d_model=8, n_heads=2, d_mlp=8, pt_steps=2, ft_steps=2, when="init")
    mpt, mft = M.run_modular(mproto, M.ModularGrid(seeds=(0,), reuse=(3,), new=(5,), balancedness=(-0.5, 0.5)),
                             tmp_path, workers=1)
    assert len(mpt) == 2 and len(mft) == 4

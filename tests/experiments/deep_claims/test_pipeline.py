"""Tiny end-to-end runs (seconds, on the IDX stand-ins of conftest) and the claim logic on planted effects."""

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from ftlab.experiments.deep_claims import claims as C
from ftlab.experiments.deep_claims import modular as M
from ftlab.experiments.deep_claims import vision as V
from ftlab.experiments.deep_claims.pipeline import (
    export_tables,
    judge,
    run_modular_part,
    run_vision_part,
    verdicts_from_folder,
)

TINY_V = (V.VisionProtocol(width=2, n_pt=48, pt_epochs=2, pt_lrs=(0.02, 0.1), pt_tune_epochs=1, ft_lrs=(0.01, 0.05),
                           ft_max_steps=3, ft_tune_n=8, n_test=30, n_geometry=16, geometry_at=10),
          V.VisionGrid(seeds=(0, 1), tasks=("mnist",), n_ft=(4, 10), kappa=(0.5,), s=(0.5, 1.25), gamma=(0.1,)))
TINY_M = (M.ModularProtocol(modulus=6, d_model=8, n_heads=2, d_mlp=8, lrs=(3e-3, 1e-2), pt_steps=3, ft_steps=3,
                            tune_p=5),
          M.ModularGrid(seeds=(0, 1), reuse=(3,), new=(5,), balancedness=(-0.5, 0.0, 0.5)))


@pytest.mark.usefixtures("tiny_images")
def test_tiny_vision_and_modular_end_to_end(tmp_path, tmp_path_factory):
    torch.set_num_threads(1)
    proto, grid = TINY_V
    tabs = run_vision_part(tmp_path, proto=proto, grid=grid, workers=1)
    ft, pt = tabs["ft"], tabs["pt"]
    n_arms = len(V.arms(grid))  # baseline, kappa init, kappa post, s init (2), gamma
    assert n_arms == 6
    assert len(ft) == 2 * 2 * n_arms * 2  # archs x seeds x arms x n_ft
    # archs x (2 seeds x PT arms (baseline, kappa, s x 2) + the tuning seed's baseline only)
    assert len(pt) == 2 * (2 * 4 + 1)
    # equal learning rates: tuned on the baseline arm only, one rate per architecture and stage for every arm
    assert set(tabs["pt_tune"].knob) == {"none"} and len(tabs["pt_tune"]) == 2 * 2
    assert set(tabs["ft_tune"].knob) == {"none"} and len(tabs["ft_tune"]) == 2 * 2
    assert ft.groupby("arch").lr.nunique().max() == 1 and pt.groupby("arch").lr.nunique().max() == 1
    assert proto.tune_seed not in set(ft.seed)
    ok = ft.acc.notna()  # a missing accuracy only where fine-tuning diverged (loss inf, stored as null)
    assert ft[ok].acc.between(0, 1).all() and not np.isfinite(ft[~ok].ft_loss).any() and ok.mean() > 0.8
    # kappa after PT holds at the start of fine-tuning: (b) moves norm into the fresh readout, (a) cannot
    post = ft[(ft.knob == "kappa") & (ft.when == "post")]
    assert (post.kappa_fn_change < 1e-3).all() and (post.kappa_stem_factor < 1).all()
    assert (post[post.arch == "nf_resnet18"].kappa_readout_factor > 1.5).all()
    assert np.allclose(post[post.arch == "resnet18"].kappa_readout_factor, 1.0)
    geo = ft[(ft.n_ft == proto.geometry_at) & ok]
    assert geo["cka:pool"].notna().all() and geo["pr_post_c:layer2"].notna().all()
    assert ft[ft.n_ft != proto.geometry_at]["pr_post_c:pool"].isna().all()
    # resumable: a second call recomputes nothing and returns the same table
    n_lines = (tmp_path / "vision_ft.jsonl").read_text().count("\n")
    ft2 = run_vision_part(tmp_path, proto=proto, grid=grid, workers=1)["ft"]
    assert (tmp_path / "vision_ft.jsonl").read_text().count("\n") == n_lines
    pd.testing.assert_frame_equal(ft.reset_index(drop=True), ft2.reset_index(drop=True), check_like=True)
    mproto, mgrid = TINY_M
    mod = run_modular_part(tmp_path, proto=mproto, grid=mgrid, workers=1)
    assert len(mod["ft"]) == 2 * 2 * 2 * 3 and set(mod["ft"].kind) == {"reuse", "new"}
    assert len(mod["pt"]) == 2 * (1 + 3) + 1  # 2 seeds x (unrescaled + 3 at init) + the tuning seed's unrescaled
    mpost = mod["ft"][mod["ft"].when == "post"]
    assert np.allclose(mpost.b_ft_start, mpost.b, atol=1e-6)  # balancedness set after the fresh readout
    assert mod["ft"].lr.nunique() == 1
    res = judge(tmp_path, tabs, mod, geometry_at=proto.geometry_at, stages=proto.stages)
    assert list(res.claims.columns) == C.COLUMNS
    levels = list(dict.fromkeys(res.claims.level))
    assert levels == ["primary", "secondary", "ftlab"]  # primaries first, then secondary rows, then ftlab's own
    assert {1, 2, 3, 5} <= set(res.level("primary").claim)
    # two seeds are below the minimum: nothing can be decided, whatever the numbers
    assert set(res.claims.verdict) == {"inconclusive"} and (res.claims.seeds <= 2).all()
    for fig in ("fig_primaries", "fig_claim1_kappa", "fig_claim2_s", "fig_claim3_gamma", "fig_claim5_balancedness",
                "fig_accuracy", "fig_geometry"):
        assert (tmp_path / fig).with_suffix(".png").exists(), fig
    again = verdicts_from_folder(tmp_path, out=tmp_path_factory.mktemp("again"), figures=())  # never into the run
    pd.testing.assert_frame_equal(again.claims, res.claims)
    # the compact tables recompute the same verdicts (floats kept to 5 significant digits)
    export_tables(tmp_path, tmp_path / "compact")
    compact = verdicts_from_folder(tmp_path / "compact", out=tmp_path / "recomputed", figures=("fig_primaries",))
    assert (tmp_path / "recomputed" / "fig_primaries.png").exists() and not (tmp_path / "compact" / "claims.csv").exists()
    pd.testing.assert_frame_equal(compact.claims.drop(columns=["mde", "power_2pt"]),
                                  res.claims.drop(columns=["mde", "power_2pt"]), rtol=1e-3, atol=1e-4)


@pytest.mark.usefixtures("tiny_images")
def test_arms_are_paired_a_null_arm_reproduces_the_baseline_exactly(tmp_path):
    """gamma = gamma_default and kappa = 1 after PT change nothing: with everything else paired (data,
    readout draw, batch order), they must give the baseline's numbers bit for bit."""
    torch.set_num_threads(1)
    proto = dataclasses.replace(TINY_V[0], archs=("nf_resnet18",), ft_max_steps=4)
    pdict = dataclasses.asdict(proto)
    cache = str(tmp_path)
    V.pretrain_point(arch="nf_resnet18", seed=3, knob="none", value=1.0, lr=0.05, protocol=pdict, cache=cache)
    kw = dict(arch="nf_resnet18", seed=3, task="heldout", n_ft=10, lr=0.05, protocol=pdict, cache=cache)

    def run(**arm):
        rec = V.finetune_point(**arm, **kw)
        rec.pop("cpu_s")
        return rec

    base = run(knob="none", when="-", value=1.0)
    assert run(knob="gamma", when="ft", value=proto.gamma_default) == base
    null_kappa = run(knob="kappa", when="post", value=1.0)
    assert {k: null_kappa.pop(k) for k in ("kappa_stem_factor", "kappa_readout_factor", "kappa_fn_change")} == {
        "kappa_stem_factor": 1.0, "kappa_readout_factor": 1.0, "kappa_fn_change": 0.0}
    assert null_kappa == base
    assert run(knob="gamma", when="ft", value=0.1) != base


def test_fallback_rates_and_health():
    assert V.fallback_rates(0.1, (0.01, 0.02, 0.05, 0.1)) == [0.1, 0.05, 0.02, 0.01]
    assert V.fallback_rates(0.01, (0.01, 0.1)) == [0.01]
    assert V.healthy(0.3, math.log(8)) and not V.healthy(math.inf, math.log(8))
    assert not V.healthy(math.log(8), math.log(8))  # collapsed to chance
    with pytest.raises(ValueError, match="lr"):
        V.fallback_rates(0.0, (0.1,))


@pytest.mark.usefixtures("tiny_images")
def test_an_unhealthy_evaluation_run_is_redone_from_the_same_start_at_a_lower_rate(tmp_path):
    """A rate tuned on one seed can diverge on another: the evaluation run is redone at the next lower
    rate of the grid from the same initialization and batch order (identical to a direct run at that
    rate) and records it; a tuning run keeps its failure."""
    torch.set_num_threads(1)
    proto = dataclasses.replace(TINY_V[0], archs=("nf_resnet18",), pt_lrs=(0.02, 1e4), ft_lrs=(0.01, 1e4),
                                ft_max_steps=4)
    pdict = dataclasses.asdict(proto)
    pt = dict(arch="nf_resnet18", seed=3, knob="none", value=1.0, protocol=pdict)
    tuned = V.pretrain_point(**pt, lr=1e4, cache=str(tmp_path / "t"), tune=True)
    assert not V.healthy(tuned["pt_loss"], math.log(8)) and tuned["pt_retries"] == 0
    direct = V.pretrain_point(**pt, lr=0.02, cache=str(tmp_path / "d"))
    redone = V.pretrain_point(**pt, lr=1e4, cache=str(tmp_path / "r"))
    assert redone["pt_retries"] == 1 and redone["pt_lr_used"] == 0.02 and direct["pt_retries"] == 0
    assert redone["pt_loss"] == direct["pt_loss"] and redone["pt_acc"] == direct["pt_acc"]
    ft = dict(arch="nf_resnet18", seed=3, task="heldout", n_ft=10, knob="none", when="-", value=1.0, protocol=pdict,
              cache=str(tmp_path / "r"))
    a = V.finetune_point(**ft, lr=1e4)
    b = V.finetune_point(**ft, lr=0.01)
    assert a["ft_retries"] == 1 and a["ft_lr_used"] == 0.01 and math.isfinite(a["ft_loss"])
    assert (a["ft_loss"], a["acc"]) == (b["ft_loss"], b["acc"])


def test_pick_lr_prefers_fastest_healthy_and_stays_off_the_edge_of_stability():
    t = pd.DataFrame({"g": ["a"] * 3 + ["b"] * 3 + ["c"] * 3, "lr": [0.01, 0.1, 1.0] * 3,
                      "loss": [0.005, 0.008, math.nan, 0.3, 0.2, 0.1, 0.05, 0.04, 2.3],
                      "steps": [90, 40, 3, 100, 100, 100, 100, 100, 100],
                      "conv": [True, True, False] + [False] * 6})
    got = V.pick_lr(t, ["g"], loss="loss", steps="steps", converged="conv", chance=math.log(10))
    # a: 0.1 converged fastest, but 1.0 diverged next to it -> one step down; b: lowest loss at 1.0;
    # c: 1.0 collapsed to chance (2.3 ~ log 10) and 0.1 has the lowest loss but sits next to it
    assert got == {("a",): 0.01, ("b",): 1.0, ("c",): 0.01}
    # nothing healthy: the smallest rate, whose runs then record the failure
    assert V.pick_lr(t.assign(loss=math.nan), ["g"], loss="loss", steps="steps", converged="conv",
                     chance=1.0)[("a",)] == 0.01


def test_truncated_training_keeps_the_planned_schedule():
    from ftlab.experiments.training import TrainConfig, train_

    X, y = torch.randn(32, 5), torch.randint(0, 3, (32,))

    def params(**cfg):
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 3)
        res = train_(model, X, y, config=TrainConfig(lr=0.1, batch_size=8, **cfg), seed=1)
        return res, torch.cat([p.detach().flatten() for p in model.parameters()])

    r, a = params(epochs=10, schedule="warmup_cosine", stop_steps=6)
    assert r.n_iter == 6 and r.epochs == 2
    _, b = params(epochs=10, schedule="warmup_cosine", max_steps=6)  # a 6-step schedule: different rates
    _, c = params(epochs=3, schedule="warmup_cosine", stop_steps=6)
    assert not torch.allclose(a, b) and not torch.allclose(a, c)
    _, d = params(epochs=10, stop_steps=6)  # constant rate: truncating = capping
    _, e = params(epochs=10, max_steps=6)
    assert torch.equal(d, e)


def test_modular_tasks_are_validated(tmp_path):
    assert M.task_kind(30, 10) == "reuse" and M.task_kind(30, 14) == "new" and M.task_kind(30, 7) == "new"
    with pytest.raises(ValueError, match="does not divide"):
        M.run_modular(M.ModularProtocol(), M.ModularGrid(reuse=(7,)), tmp_path)
    with pytest.raises(ValueError, match="reuse task"):
        M.run_modular(M.ModularProtocol(), M.ModularGrid(new=(6,)), tmp_path)
    with pytest.raises(ValueError, match="must include 0"):
        M.ModularGrid(balancedness=(-0.5, 0.5))


def test_modular_data_labels():
    X, y = M.modular_data(6, 4)
    assert X.shape == (36, 3) and bool((X[:, 2] == 6).all())
    assert torch.equal(y, (X[:, 0] + X[:, 1]) % 4)


@pytest.mark.usefixtures("tiny_images")
def test_report_section_says_the_quick_run_cannot_decide_and_puts_primaries_first(tmp_path, monkeypatch):
    from ftlab.experiments.deep_claims.claims import PRIMARIES
    from ftlab.report import ReportContext
    from ftlab.report.deep import run

    monkeypatch.setattr(V, "QUICK", (dataclasses.replace(TINY_V[0], archs=("nf_resnet18",)),
                                     dataclasses.replace(TINY_V[1], tasks=("mnist", "heldout"))))
    monkeypatch.setattr(M, "QUICK", TINY_M)
    md = run(ReportContext(out_dir=tmp_path, workers=1, figures=("fig_primaries",)))
    table = pd.read_csv(tmp_path / "deep" / "claims.csv")
    assert md.startswith("> **Quick run: it cannot decide.**") and "minimum of 6 seeds" in md.split("\n")[0]
    assert set(table.verdict) == {"inconclusive"}
    for p in PRIMARIES:
        assert p.statistic in md
    first = {lvl: md.index(key) for lvl, key in (("primary", "**Primary tests**"), ("secondary", "**Secondary rows**"),
                                                 ("ftlab", "**ftlab's own findings**"))}
    assert first["primary"] < first["secondary"] < first["ftlab"]
    assert "](deep/fig_primaries.png)" in md and (tmp_path / "deep" / "fig_primaries.png").exists()
    assert "rate (PT / FT), every arm" in md

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
from ftlab.experiments.deep_claims.pipeline import judge, run_modular_part, run_vision_part, verdicts_from_folder

TINY_V = (V.VisionProtocol(width=2, n_pt=48, pt_epochs=2, pt_lrs=(0.02, 0.1), pt_tune_epochs=1, ft_lrs=(0.01, 0.05),
                           ft_max_steps=3, ft_tune_n=8, n_test=30, n_geometry=16, geometry_at=10),
          V.VisionGrid(seeds=(0, 1), tasks=("mnist",), n_ft=(4, 10), kappa=(0.5,), s=(0.5, 1.25), gamma=(0.1,)))
TINY_M = (M.ModularProtocol(modulus=6, d_model=8, n_heads=2, d_mlp=8, lrs=(3e-3, 1e-2), pt_steps=3, ft_steps=3,
                            tune_p=5),
          M.ModularGrid(seeds=(0, 1), reuse=(3,), new=(5,), balancedness=(-0.5, 0.0, 0.5)))


@pytest.mark.usefixtures("tiny_images")
def test_tiny_vision_and_modular_end_to_end(tmp_path):
    torch.set_num_threads(1)
    proto, grid = TINY_V
    tabs = run_vision_part(tmp_path, proto=proto, grid=grid, workers=1)
    ft, pt = tabs["ft"], tabs["pt"]
    n_arms = len(V.arms(grid))  # baseline, kappa init, kappa post, s init (2), gamma
    assert n_arms == 6
    assert len(ft) == 2 * 2 * n_arms * 2  # archs x seeds x arms x n_ft
    assert len(pt) == 2 * 3 * 4  # archs x (tune seed + 2 seeds) x PT arms (baseline, kappa, s x 2)
    assert len(tabs["pt_tune"]) == 2 * 4 * 2 and len(tabs["ft_tune"]) == 2 * n_arms * 2
    ok = ft.acc.notna()  # a missing accuracy only where fine-tuning diverged (loss inf, stored as null)
    assert ft[ok].acc.between(0, 1).all() and not np.isfinite(ft[~ok].ft_loss).any() and ok.mean() > 0.8
    assert set(ft.lr) <= set(proto.ft_lrs) and set(pt.lr) <= set(proto.pt_lrs)
    # one learning rate per (arch, arm), chosen on the tuning seed, never an evaluation seed
    assert ft.groupby(["arch", "knob", "when", "value"]).lr.nunique().max() == 1
    assert proto.tune_seed not in set(ft.seed)
    geo = ft[(ft.n_ft == proto.geometry_at) & ok]
    assert geo["ensd_c:pool"].notna().all() and geo["pr_post_c:layer2"].notna().all()
    assert ft[ft.n_ft != proto.geometry_at]["pr_post_c:pool"].isna().all()
    elr = tabs["elr"]
    bn = elr[(elr.arch == "resnet18") & (elr.knob == "s") & (elr.value == 0.5)]
    assert np.allclose(bn[bn.stage != "fc"].elr_factor, 1 / 0.5)  # (a): params x sqrt(s); convs' ELR x 1/s
    assert elr[elr.arch == "nf_resnet18"].elr_factor.isna().all()  # no scale-invariant weights without BN
    # resumable: a second call recomputes nothing and returns the same table
    n_lines = (tmp_path / "vision_ft.jsonl").read_text().count("\n")
    ft2 = run_vision_part(tmp_path, proto=proto, grid=grid, workers=1)["ft"]
    assert (tmp_path / "vision_ft.jsonl").read_text().count("\n") == n_lines
    pd.testing.assert_frame_equal(ft.reset_index(drop=True), ft2.reset_index(drop=True), check_like=True)
    mproto, mgrid = TINY_M
    mod = run_modular_part(tmp_path, proto=mproto, grid=mgrid, workers=1)
    assert len(mod["ft"]) == 2 * 2 * 2 * 3 and set(mod["ft"].kind) == {"reuse", "new"}
    assert len(mod["pt"]) == 3 * (1 + 3)  # (tune + 2 seeds) x (unrescaled + 3 balancedness at init)
    post = mod["ft"][mod["ft"].when == "post"]
    assert np.allclose(post.groupby(["seed", "p"]).b_pt_end.nunique(), 1)  # post arms share one PT network
    res = judge(tmp_path, tabs, mod, geometry_at=proto.geometry_at, stages=proto.stages)
    assert list(res.claims.columns[:14]) == C.COLUMNS
    assert set(res.claims.claim) == {1, 2, 3, 4, 5} and set(res.own.claim) == {"own"}
    assert set(res.claims.verdict) <= {"reproduced", "reversed", "no effect", "inconclusive"}
    assert (res.claims.p_holm.dropna() <= 1).all() and res.claims.pt_train_loss.notna().all()
    for fig in ("fig_claim1_kappa", "fig_claim2_s", "fig_claim3_gamma", "fig_claim4_signature",
                "fig_claim5_balancedness", "fig_accuracy", "fig_geometry"):
        assert (tmp_path / f"{fig}.png").exists(), fig
    again = verdicts_from_folder(tmp_path, figures=())
    pd.testing.assert_frame_equal(again.claims, res.claims)


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
    assert run(knob="kappa", when="post", value=1.0) == base
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


def _planted(effects: dict, seeds=range(8), noise=0.002, geometry=None):
    """A vision FT table with planted paired effects (knob, when, value) -> accuracy change."""
    rng = np.random.default_rng(0)
    rows = []
    for arch in ("resnet18", "nf_resnet18"):
        for s in seeds:
            for n in (10, 30, 100, 300):
                base = 0.6 + 0.1 * np.log10(n) + 0.05 * rng.standard_normal()
                rows.append(dict(arch=arch, seed=s, task="t", n_ft=n, knob="none", when="-", value=1.0, acc=base,
                                 ft_loss=0.005))
                for (knob, when, val), eff in effects.items():
                    e = eff(n) if callable(eff) else eff
                    rows.append(dict(arch=arch, seed=s, task="t", n_ft=n, knob=knob, when=when, value=val,
                                     acc=base + e + noise * rng.standard_normal(), ft_loss=0.007))
    return pd.DataFrame(rows)


def test_claim_effects_and_verdicts_on_planted_effects():
    ft = _planted({("kappa", "init", 0.5): 0.05, ("kappa", "post", 0.5): -0.04, ("kappa", "init", 2.0): 0.0,
                   ("s", "init", 0.5): -0.03, ("s", "init", 2.0): 0.0,
                   ("gamma", "ft", 0.1): lambda n: 0.04 if n in (30, 100) else -0.2})
    paper, own = C.vision_effects(ft)
    t = C.claims_table(paper).set_index(["arch", "claim", "when"])
    k = t.loc[("nf_resnet18", 1, "init")]
    assert k.verdict == "reproduced" and k.effect == pytest.approx(0.05, abs=0.003) and k.seeds == 8
    assert k.ci_low < 0.05 < k.ci_high
    assert t.loc[("nf_resnet18", 1, "post")].verdict == "reversed"
    assert t.loc[("resnet18", 2, "init")].verdict == "reproduced"  # s < 1 degrades: positive effect
    g = t.loc[("resnet18", 3, "ft")]  # only the intermediate n_FT (30, 100) count
    assert g.verdict == "reproduced" and g.effect == pytest.approx(0.04, abs=0.003)
    o = C.claims_table(own)
    assert set(o.claim) == {"own"} and set(o.verdict) == {"no effect"}  # kappa = 2 and s = 2 planted at 0
    assert (o.ft_train_loss == 0.007).all()


def test_holm_correction_spans_the_family():
    ft = _planted({("kappa", "init", 0.5): 0.004, ("s", "init", 0.5): -0.004}, noise=0.006)
    t = C.claims_table(C.vision_effects(ft)[0])
    from ftlab.experiments.verdicts import t_pvalue

    raw = [t_pvalue(r.values) for r in C.vision_effects(ft)[0]]
    assert all(ph >= p - 1e-12 for ph, p in zip(t.p_holm, raw))
    assert min(t.p_holm) == pytest.approx(min(1.0, len(raw) * min(raw)))


def test_signature_correlation_recovers_planted_compression():
    rows = []
    rng = np.random.default_rng(1)
    for s in range(8):
        for knob, val in [("none", 1.0), ("kappa", 0.5), ("kappa", 2.0), ("s", 0.5), ("gamma", 0.1), ("gamma", 10.0)]:
            gain = 0.0 if knob == "none" else rng.normal(0, 0.05)
            rows.append(dict(arch="nf_resnet18", seed=s, task="t", n_ft=100, knob=knob, when="init", value=val,
                             acc=0.7 + gain, ft_loss=0.005, **{"pr_post_c:pool": 5.0 - 20 * gain + rng.normal(0, 0.05),
                                                               "ensd_c:pool": 3.0 + 10 * gain + rng.normal(0, 0.05)}))
    paper, _ = C.vision_effects(pd.DataFrame(rows), geometry_at=100)
    t = C.claims_table(paper)
    sig = t[t.claim == 4].set_index("knob")
    assert sig.loc["all arms (PR)"].verdict == "reproduced" and sig.loc["all arms (PR)"].effect > 0.9
    assert sig.loc["all arms (ENSD)"].effect > 0.9 and sig.loc["all arms (ENSD)"].ci_high <= 1


def test_modular_claims_difference_in_differences():
    rows = []
    for s in range(6):
        for p, kind, gain in ((3, "reuse", 0.02), (7, "new", 0.10)):
            for when in ("init", "post"):
                for b in (-0.9, -0.5, 0.0, 0.5):
                    rows.append(dict(seed=s, p=p, kind=kind, when=when, b=b, ft_loss=0.004,
                                     acc=0.5 + (gain if b < 0 else 0.0) + 0.001 * s + 0.0005 * (b == -0.5)))
    t = C.claims_table(C.modular_effects(pd.DataFrame(rows))).set_index(["when", "task"])
    assert t.loc[("init", "new primes")].effect == pytest.approx(0.10025)
    assert t.loc[("post", "new minus reuse")].effect == pytest.approx(0.08)
    assert t.loc[("post", "new minus reuse")].verdict == "reproduced"


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
def test_report_section_renders_claims_and_figures(tmp_path, monkeypatch):
    from ftlab.report import ReportContext
    from ftlab.report.deep import run

    monkeypatch.setattr(V, "QUICK", (dataclasses.replace(TINY_V[0], archs=("nf_resnet18",)),
                                     dataclasses.replace(TINY_V[1], tasks=("mnist",))))
    monkeypatch.setattr(M, "QUICK", TINY_M)
    md = run(ReportContext(out_dir=tmp_path, workers=1, figures=("fig_claim1_kappa",)))
    table = pd.read_csv(tmp_path / "deep" / "claims.csv")
    assert set(table.verdict) <= {"reproduced", "reversed", "no effect", "inconclusive"}
    assert "indicative only" in md and "](deep/fig_claim1_kappa.png)" in md
    assert "redone from the same start at the next lower rate" in md
    assert (tmp_path / "deep" / "fig_claim1_kappa.png").exists()
    for statement in set(table.paper_statement):
        assert statement in md


def test_report_counts_the_runs_redone_at_a_lower_rate():
    from ftlab.report.deep import _redone

    pt = pd.DataFrame({"pt_retries": [0, 1, 2, float("nan")]})
    ft = pd.DataFrame({"ft_retries": [0, 0, 1]})
    old = pd.DataFrame({"acc": [0.5]})  # a table from before retries were recorded
    assert _redone(pt, ft, old) == 3 and _redone(old) == 0

"""A tiny end-to-end benchmark run (seconds) with planted properties, its determinism, and the table arithmetic."""

import copy

import numpy as np
import pandas as pd
import pytest
import torch

from ftlab.experiments.training import accuracy
from ftlab.experiments.transfer_accuracy import family
from ftlab.experiments.transfer_accuracy.compare import PairData, PairModels, evaluate_pair
from ftlab.experiments.transfer_accuracy.design import (
    BenchmarkConfig,
    FamilyDesign,
    MethodPlan,
    TextDesign,
    TransferSettings,
    VisionDesign,
)
from ftlab.experiments.transfer_accuracy.finetune import finetune, recipe, task_loss
from ftlab.experiments.transfer_accuracy.run import run_benchmark, tiny_config
from ftlab.experiments.transfer_accuracy.table import (
    gap_closed,
    layer_table,
    per_seed_gaps,
    real_pairs_gap,
    summary_table,
)
from ftlab.experiments.verdicts import t_interval
from ftlab.models.vit import ViT


def _data(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, 8, generator=g)
    y = (x.mean((1, 2)) > 0).long()
    return x, y


@pytest.fixture(scope="module")
def identical_bases_rows():
    torch.manual_seed(0)
    base = ViT(image_size=8, patch=4, width=8, depth=2, heads=2, n_classes=4)
    with torch.no_grad():
        base.head.weight.mul_(50.0)  # a confident "pretrained" head, so that the frozen-head recipe learns fast
    twin = ViT(image_size=8, patch=4, width=8, depth=2, heads=2, n_classes=4)
    twin.load_state_dict(base.state_dict())
    classes = (1, 3)
    splits = {"train": _data(0, 128), "val": _data(1, 64), "test": _data(2, 128)}
    cfg = recipe(optimizer="sgd", lr=0.05, epochs=10, batch_size=16)
    src_ft = finetune(base, *splits["train"], classes, config=cfg, seed=0)
    tgt_ft = finetune(twin, *splits["train"], classes, config=cfg, seed=0)
    rows = evaluate_pair(
        PairModels("same", "toy", 0, base, src_ft, twin, tgt_ft, baseline="zero_shot"),
        PairData(splits["train"], task_loss(classes), lambda m, s: accuracy(m, *splits[s], classes=classes),
                 {"zero_params": ()}),  # carry every parameter
        {c: ("identity", "naive", "bico") for c in ("n100", "k5")}, alpha_grid=(0.5, 1.0, 2.0), cal_batch_size=16)
    return pd.DataFrame(rows), accuracy(src_ft, *splits["test"], classes=classes)


def test_transfer_between_identical_bases_reproduces_the_source_fine_tuning(identical_bases_rows):
    df, src_acc = identical_bases_rows
    acc = df[df["record"] == "accuracy"]
    fixed = acc[acc["alpha_mode"] == "fixed"].set_index(["method", "calibration"])["accuracy"]
    assert fixed[("identity", "-")] == src_acc and fixed[("naive", "-")] == src_acc
    # direct fine-tuning of an identical twin with the same recipe and seed is the same model
    assert fixed[("finetuned", "-")] == src_acc
    # a self-transfer returns tau_A (exact completion of the undetermined directions), with 100 rows or 5 per class
    assert fixed[("bico", "n100")] == src_acc and fixed[("bico", "k5")] == src_acc
    assert fixed[("finetuned", "-")] > fixed[("zero_shot", "-")]  # the planted task is learnable


def test_rows_cover_methods_modes_calibrations_and_layers(identical_bases_rows):
    df, _ = identical_bases_rows
    acc = df[df["record"] == "accuracy"]
    assert set(acc["alpha_mode"]) == {"fixed", "searched"}
    assert set(acc[acc["method"] == "bico"]["calibration"]) == {"n100", "k5"}
    # methods whose calibration pass collects nothing (the registry says so) run once, with calibration "-"
    assert set(acc[acc["method"].isin(["naive", "identity"])]["calibration"]) == {"-"}
    assert set(acc[acc["method"] == "bico"]["n_cal"]) == {100, 10}  # 5 per class of 2 classes
    assert set(acc[acc["alpha_mode"] == "searched"].dropna(subset=["alpha"])["alpha"]) <= {0.5, 1.0, 2.0}
    lay = df[df["record"] == "layer"]
    assert len(lay) > 0 and set(lay["calibration"]) == {"n100"}
    # a self-transfer: the two row sets are identical, so their Procrustes similarity is 1 wherever it is defined
    ok = lay["in_similarity"].dropna()
    assert len(ok) and np.allclose(ok, 1.0, atol=1e-6)
    assert abs(lay.drop_duplicates("source_point")["tau_share"].sum() - 1.0) < 1e-6


def _raw(values):
    rows = []
    for (setting, method, cal, seed, task), acc in values.items():
        for mode in ("fixed", "searched"):
            rows.append({"record": "accuracy", "setting": setting, "task": task, "seed": seed, "method": method,
                         "calibration": cal, "alpha_mode": mode, "alpha": 1.0, "n_cal": 100, "accuracy": acc,
                         "seconds": 0.0})
    return pd.DataFrame(rows)


def _planted():
    vals = {}
    for setting, lift in (("p1", 0.0), ("p2", 0.05)):
        for task, shift in (("t1", 0.0), ("t2", 0.1)):
            for seed, noise in ((0, -0.02), (1, 0.0), (2, 0.02)):
                vals[(setting, "probe", "-", seed, task)] = 0.2 + shift
                vals[(setting, "finetuned", "-", seed, task)] = 0.6 + shift
                vals[(setting, "naive", "-", seed, task)] = 0.1 + shift
                vals[(setting, "bico", "n100", seed, task)] = 0.4 + shift + noise + lift
                vals[(setting, "bico", "k5", seed, task)] = 0.3 + shift
    return _raw(vals)


def test_summary_intervals_and_shared_rows_on_planted_numbers():
    table = summary_table(_planted())
    r = table[(table.setting == "p1") & (table.task == "t1") & (table.method == "bico") & (table.calibration == "n100")
              & (table.alpha_mode == "fixed")].iloc[0]
    m, lo, hi = t_interval([0.38, 0.40, 0.42])
    assert r.accuracy_mean == pytest.approx(m) and r.ci_low == pytest.approx(lo) and r.ci_high == pytest.approx(hi)
    assert r.accuracy_std == pytest.approx(0.02) and r.seeds == 3
    # baselines, fine-tuned and naive appear in every calibration's table
    for cal in ("n100", "k5"):
        sub = table[(table.setting == "p1") & (table.calibration == cal)]
        assert {"probe", "finetuned", "naive", "bico"} <= set(sub.method)


def test_gap_closed_per_seed_and_over_real_pairs():
    raw = _planted()
    g = per_seed_gaps(raw)
    one = g[(g.setting == "p1") & (g.method == "bico") & (g.calibration == "n100") & (g.alpha_mode == "fixed")]
    np.testing.assert_allclose(sorted(one.gap_closed), [0.45, 0.5, 0.55])
    gaps = gap_closed(raw).set_index(["setting", "calibration", "alpha_mode", "method"])
    assert gaps.loc[("p1", "n100", "fixed", "bico"), "gap_closed"] == pytest.approx(0.5)
    assert gaps.loc[("p1", "k5", "fixed", "bico"), "gap_closed"] == pytest.approx(0.25)
    assert gaps.loc[("p1", "n100", "fixed", "naive"), "gap_closed"] == pytest.approx(-0.25)
    assert gaps.loc[("p1", "n100", "fixed", "probe"), "gap_closed"] == pytest.approx(0.0)
    lo, hi = gaps.loc[("p1", "n100", "fixed", "bico"), ["gap_low", "gap_high"]]
    assert lo < 0.5 < hi
    both = real_pairs_gap(raw, ["p1", "p2"]).set_index(["calibration", "alpha_mode", "method"])
    assert both.loc[("n100", "fixed", "bico"), "gap_closed"] == pytest.approx((0.5 + 0.625) / 2)
    only = real_pairs_gap(raw, ["p2"]).set_index(["calibration", "alpha_mode", "method"])
    assert only.loc[("n100", "fixed", "bico"), "gap_closed"] == pytest.approx(0.625)


def test_layer_table_bins_and_shares():
    rows = []
    for seed in (0, 1):
        for i in range(10):
            rows.append({"record": "layer", "setting": "s", "task": "t", "seed": seed, "order": i, "point": f"l{i}",
                         "calibration": "n100", "in_cka": 0.9, "out_cka": i / 10, "out_similarity": 0.5,
                         "tau_share": 0.1})
    lt = layer_table(pd.DataFrame(rows))
    assert len(lt) == 5 and np.allclose(lt["tau_share"], 0.2)
    assert lt["out_cka"].is_monotonic_increasing and lt["layers"].tolist() == [2, 2, 2, 2, 2]


def test_config_validation_and_round_trip():
    cfg = tiny_config()
    assert BenchmarkConfig.from_dict(cfg.to_dict()) == cfg
    # every flat key belongs to exactly one part of the design
    parts = (VisionDesign, TextDesign, FamilyDesign, MethodPlan, TransferSettings)
    assert len(cfg.to_dict()) == sum(len(p.keys()) for p in parts)
    assert all(getattr(cfg, k) == getattr(getattr(cfg, part), k) for part in ("vision", "text", "family", "plan",
                                                                              "settings")
               for k in getattr(cfg, part).keys())  # flat keys read as attributes
    with pytest.raises(AttributeError, match="n_trian"):
        cfg.n_trian  # noqa: B018
    other = cfg.replace(family_seeds=(5,))
    assert other.family == FamilyDesign.from_flat({**cfg.to_dict(), "family_seeds": (5,)}) != cfg.family
    assert (other.vision, other.text, other.plan, other.settings) == (cfg.vision, cfg.text, cfg.plan, cfg.settings)
    with pytest.raises(ValueError, match="image task"):
        VisionDesign(image_tasks=("cifar",))
    with pytest.raises(ValueError, match="n100 needs at least 100"):
        BenchmarkConfig.from_dict({"n_train": 50})
    assert BenchmarkConfig.from_dict({"n_train": 50, "calibrations": ["k5"]}).vision.n_train == 50
    with pytest.raises(ValueError, match="alpha_grid"):
        TransferSettings(alpha_grid=(0.5, 2.0))
    with pytest.raises(ValueError, match="cal_loss"):
        BenchmarkConfig.from_dict({"cal_loss": "hinge"})
    with pytest.raises(ValueError, match="'fashion' is both a design task and a held-out task"):
        VisionDesign(image_tasks=("fashion",), heldout_image_tasks=("fashion",))
    with pytest.raises(ValueError, match="unknown benchmark configuration key 'n_trian'"):
        BenchmarkConfig.from_dict({"n_trian": 500})
    kinds = [p["kind"] for p in BenchmarkConfig().points(text_available=["minilm_l3->minilm_l6"])]
    assert kinds[0] == "vision" and "text" in kinds and kinds[-1] == "family"


TINY = family.BaseSpec("tiny-src", width=8, depth=1, heads=2, n_per_source=32, epochs=1, batch_size=32)
TINY_PERM = family.BaseSpec("tiny-perm", width=8, depth=1, heads=2, n_per_source=32, seed=9, parent="tiny-src",
                            epochs=0, permute_seed=9)


def test_tiny_run_is_deterministic_and_recovers_a_permuted_copy(tmp_path, monkeypatch, tiny_images):
    monkeypatch.setattr(family, "FAMILY", {"tiny-src": TINY, "tiny-perm": TINY_PERM})
    monkeypatch.setattr(family, "SETTINGS", {"permuted": ("tiny-src", "tiny-perm")})
    cfg = tiny_config(methods=("naive", "bico"))
    a = run_benchmark(cfg, store=tmp_path / "a.jsonl", cache=tmp_path / "cache", workers=1)
    torch.set_num_threads(2)  # a point sets its own thread count: the caller's does not matter
    b = run_benchmark(cfg, store=tmp_path / "b.jsonl", cache=tmp_path / "cache", workers=1)
    cols = ["setting", "task", "seed", "method", "calibration", "alpha_mode", "alpha", "accuracy"]
    ra = a[a["record"] == "accuracy"][cols].sort_values(cols[:6]).reset_index(drop=True)
    rb = b[b["record"] == "accuracy"][cols].sort_values(cols[:6]).reset_index(drop=True)
    pd.testing.assert_frame_equal(ra, rb)
    assert set(ra["seed"]) == {0, 1}
    # an exact permuted copy: BiCo recovers the permuted task vector, so it matches direct fine-tuning's twin
    acc = ra[ra["alpha_mode"] == "fixed"].set_index(["seed", "method"])["accuracy"]
    for seed in (0, 1):
        assert acc[(seed, "bico")] == pytest.approx(acc[(seed, "finetuned")], abs=1e-9)
        assert acc[(seed, "transfusion")] == acc[(seed, "finetuned")]  # weight matching recovers the copy exactly


def test_the_estimate_read_off_the_fit_equals_a_separate_diagnose_run():
    from ftlab.transfer import TransferOptions, diagnose

    torch.manual_seed(1)
    a = ViT(image_size=8, patch=4, width=8, depth=2, heads=2, n_classes=4)
    b = ViT(image_size=8, patch=4, width=12, depth=3, heads=2, n_classes=4)
    classes = (0, 2)
    x, y = _data(3, 120)
    a_ft = finetune(a, x, y, classes, config=recipe(lr=0.05, epochs=2, batch_size=16), seed=0)
    b_ft = finetune(b, x, y, classes, config=recipe(lr=0.05, epochs=2, batch_size=16), seed=0)
    rows = evaluate_pair(PairModels("s", "t", 0, a, a_ft, b, b_ft, baseline="zero_shot"),
                         PairData((x, y), task_loss(classes), lambda m, s: accuracy(m, x, y, classes=classes)),
                         {"n100": ("bico",)}, alpha_grid=(1.0,), diagnose=True)
    est = [r for r in rows if r["record"] == "estimate"]
    assert len(est) == 1
    from ftlab.experiments.transfer_accuracy.compare import calibration_batches

    batches = calibration_batches(x, y, kind="n100", seed=0)
    ref = diagnose(a, a_ft, b, batches, task_loss(classes), options=TransferOptions())
    assert est[0]["estimate"] == pytest.approx(ref.estimate, rel=1e-9, abs=1e-12)
    assert 0.0 < ref.estimate < 1.0


def _bn_net(seed):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 6, 3, padding=1), torch.nn.BatchNorm2d(6), torch.nn.ReLU(),
                              torch.nn.Conv2d(6, 6, 3, padding=1), torch.nn.BatchNorm2d(6), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(6, 2))
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_var.uniform_(0.5, 2.0)
    return net.eval()


def test_variants_share_fits_and_a_repair_is_a_no_op_where_nothing_keeps_running_statistics():
    from ftlab.experiments.transfer_accuracy.compare import Scorer

    torch.manual_seed(2)
    a = ViT(image_size=8, patch=4, width=8, depth=2, heads=2, n_classes=4)
    b = ViT(image_size=8, patch=4, width=12, depth=4, heads=2, n_classes=4)
    classes = (0, 2)
    x, y = _data(4, 120)
    cfg = recipe(lr=0.05, epochs=2, batch_size=16)
    a_ft, b_ft = finetune(a, x, y, classes, config=cfg, seed=0), finetune(b, x, y, classes, config=cfg, seed=0)
    names = ("bico", "bico+repair", "recommended", "recommended/sum", "recommended/split", "recommended/first")
    rows = pd.DataFrame(evaluate_pair(PairModels("s", "t", 0, a, a_ft, b, b_ft, baseline="zero_shot"),
                                      PairData((x, y), task_loss(classes), Scorer({"val": (x, y), "test": (x, y)},
                                                                                  classes)),
                                      {"n100": names}, alpha_grid=(0.0, 1.0, 2.0)))
    acc = rows[rows["record"] == "accuracy"].set_index(["method", "alpha_mode"])
    # one fit for every uncentred BiCo variant
    assert acc.loc[list(names), "seconds"].nunique() == 1
    # a ViT keeps no running statistics: the repair changes nothing, so copies summed without repair is plain BiCo
    for mode in ("fixed", "searched"):
        assert acc.loc[("recommended/sum", mode), "accuracy"] == acc.loc[("bico", mode), "accuracy"]
    # depth 2 -> 4: the copy rules give different task vectors, so their validation curves are scored separately
    mech = rows[rows["record"] == "mechanism"].set_index("method")
    assert set(mech.index) >= {"bico", "recommended", "finetuned", "zero_shot"}
    assert mech["head_drift"].isna().all()  # nothing to drift without running statistics
    assert ((mech["top_share"] >= 0.5) & (mech["top_share"] <= 1.0)).all()  # 2 classes: the larger share


def test_the_repair_variant_of_a_batchnorm_pair_undoes_the_drift_the_plain_transfer_leaves():
    from ftlab.experiments.transfer_accuracy.compare import Scorer

    a, b = _bn_net(0), _bn_net(1)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(160, 1, 6, 6, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long()
    a_ft = copy.deepcopy(a)
    with torch.no_grad():
        a_ft[0].bias.add_(2.0)  # a fine-tuning that shifts channel means, which naive transfer carries over
    rows = pd.DataFrame(evaluate_pair(PairModels("s", "t", 0, a, a_ft, b, copy.deepcopy(b)),
                                      PairData((x, y), task_loss((0, 1)), Scorer({"val": (x, y), "test": (x, y)})),
                                      {"n100": ("naive", "naive+repair")}, alpha_grid=(0.0, 1.0)))
    mech = rows[rows["record"] == "mechanism"].set_index("method")
    assert mech.loc["naive", "head_drift"] > 0.1  # the plain transfer moves the channel means at the last norm
    assert mech.loc["finetuned", "head_drift"] == 0.0 and mech.loc["probe", "head_drift"] == 0.0
    acc = rows[(rows["record"] == "accuracy") & (rows["alpha_mode"] == "fixed")].set_index("method")["accuracy"]
    # repaired, a pure shift of channel means is absorbed: the target computes what it computed before
    assert acc["naive+repair"] == acc["probe"]

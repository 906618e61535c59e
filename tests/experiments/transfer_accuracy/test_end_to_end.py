"""A tiny end-to-end benchmark run (seconds) with planted properties, and the table arithmetic."""

import numpy as np
import pandas as pd
import pytest
import torch

from ftlab.experiments.training import accuracy
from ftlab.experiments.transfer_accuracy.finetune import finetune, recipe, task_loss
from ftlab.experiments.transfer_accuracy.run import BenchmarkConfig, evaluate_transfers
from ftlab.experiments.transfer_accuracy.table import calibration_curve, gap_closed, markdown_tables, summary_table
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
    splits = {"train": _data(0, 96), "val": _data(1, 64), "test": _data(2, 128)}
    cfg = recipe(optimizer="sgd", lr=0.05, epochs=10, batch_size=16)
    src_ft = finetune(base, *splits["train"], classes, config=cfg, seed=0)
    tgt_ft = finetune(twin, *splits["train"], classes, config=cfg, seed=0)
    rows = []
    for seed in (0,):
        rows += evaluate_transfers(
            setting="same", task="toy", seed=seed, source_base=base, source_ft=src_ft, target_base=twin, target_ft=tgt_ft,
            cal_pool=splits["train"], loss=task_loss(classes), score=lambda m, s: accuracy(m, *splits[s], classes=classes),
            methods=("identity", "naive", "bico"), n_cal=32, cal_sizes=(16,), alpha_grid=(0.5, 1.0, 2.0),
            cal_batch_size=16)
    return pd.DataFrame(rows), accuracy(src_ft, *splits["test"], classes=classes)


def test_identity_between_identical_bases_reproduces_source_finetuning(identical_bases_rows):
    df, src_acc = identical_bases_rows
    fixed = df[df["alpha_mode"] == "fixed"].set_index(["seed", "method", "n_cal"])["accuracy"]
    for seed in (0,):
        assert fixed[(seed, "identity", 32)] == src_acc
        assert fixed[(seed, "naive", 32)] == src_acc
        # direct fine-tuning of an identical twin with the same recipe and seed is the same model
        assert fixed[(seed, "finetuned", 32)] == src_acc
    # the planted task is learnable: fine-tuning beats zero-shot
    assert fixed[(0, "finetuned", 32)] > fixed[(0, "zero_shot", 32)]


def test_rows_cover_methods_modes_and_calibration_sizes(identical_bases_rows):
    df, _ = identical_bases_rows
    assert set(df["alpha_mode"]) == {"fixed", "searched"}
    assert set(df[df["method"] == "bico"]["n_cal"]) == {16, 32}
    searched = df[df["alpha_mode"] == "searched"]
    assert set(searched.dropna(subset=["alpha"])["alpha"]) <= {0.5, 1.0, 2.0}


def test_gap_closed_by_identity_is_one(identical_bases_rows):
    df, _ = identical_bases_rows
    gaps = gap_closed(summary_table(df))
    g = gaps[(gaps["alpha_mode"] == "fixed")].set_index("method")["gap_closed"]
    assert g["identity"] == pytest.approx(1.0) and g["finetuned"] == pytest.approx(1.0)
    assert g["zero_shot"] == pytest.approx(0.0)
    text = markdown_tables(summary_table(df), gaps, calibration_curve(df))
    assert "**same**" in text and "100%" in text


def _raw(values):
    rows = []
    for (method, seed, n_cal, task), acc in values.items():
        for mode in ("fixed", "searched"):
            rows.append({"setting": "width", "task": task, "seed": seed, "method": method, "alpha_mode": mode,
                         "alpha": 1.0, "n_cal": n_cal, "accuracy": acc, "seconds": 0.0})
    return pd.DataFrame(rows)


def test_summary_statistics_and_gap_on_planted_numbers():
    vals = {}
    for task, shift in (("t1", 0.0), ("t2", 0.1)):
        for seed, noise in ((0, -0.02), (1, 0.0), (2, 0.02)):
            vals[("zero_shot", seed, 100, task)] = 0.2 + shift
            vals[("finetuned", seed, 100, task)] = 0.6 + shift
            vals[("bico", seed, 100, task)] = 0.4 + shift + noise
            vals[("bico", seed, 10, task)] = 0.3 + shift
    raw = _raw(vals)
    table = summary_table(raw)
    assert list(table.columns) == ["setting", "task", "method", "alpha_mode", "accuracy_mean", "accuracy_std", "seeds"]
    r = table[(table["task"] == "t1") & (table["method"] == "bico") & (table["alpha_mode"] == "fixed")].iloc[0]
    assert r["accuracy_mean"] == pytest.approx(0.4) and r["accuracy_std"] == pytest.approx(0.02) and r["seeds"] == 3
    # the main table only holds the main calibration size
    assert len(table[(table["method"] == "bico") & (table["task"] == "t1")]) == 2
    gaps = gap_closed(table).set_index(["alpha_mode", "method"])
    assert gaps.loc[("fixed", "bico"), "gap_closed"] == pytest.approx(0.5)
    assert gaps.loc[("fixed", "bico"), "gain_over_zero_shot"] == pytest.approx(0.2)
    curve = calibration_curve(raw).set_index(["alpha_mode", "n_cal"])
    assert curve.loc[("fixed", 10), "accuracy_mean"] == pytest.approx(0.35)
    assert curve.loc[("fixed", 100), "accuracy_mean"] == pytest.approx(0.45)


def test_config_validation_and_round_trip():
    cfg = BenchmarkConfig(tasks=("digits",), seeds=(0,), cal_sizes=(10,))
    assert BenchmarkConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="task"):
        BenchmarkConfig(tasks=("cifar",))
    with pytest.raises(ValueError, match="n_cal"):
        BenchmarkConfig(n_train=50, n_cal=100)
    assert np.isfinite(cfg.n_cal)

